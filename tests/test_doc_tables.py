"""Every figures table in the docs is the one its committed result file makes
(loadtest/doc_tables.py): regenerate with `python -m loadtest.doc_tables`."""

from __future__ import annotations

import pytest

from loadtest import doc_tables


@pytest.mark.parametrize("document,name,result_file,render", doc_tables.TABLES,
                         ids=[t[1] for t in doc_tables.TABLES])
def test_a_table_matches_its_result_file(document, name, result_file, render):
    current, regenerated = doc_tables.rendered(document, name, result_file, render)
    assert current == regenerated, f"{document}: run `python -m loadtest.doc_tables`"


def test_a_result_file_says_how_it_was_made():
    for _, _, result_file, _ in doc_tables.TABLES:
        import json

        result = json.loads((doc_tables.FIGURES / result_file).read_text())
        assert {"measured_at", "command", "commit", "machine"} <= result.keys()
        assert not result["commit"].startswith("unknown")
