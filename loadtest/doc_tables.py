"""The figures tables in the docs, made from the committed results under docs/figures/ by each
benchmark's own table() (`python -m loadtest.doc_tables` rewrites them; tests/test_doc_tables.py
fails when a table and its file disagree). A table lives between `<!-- NAME: ... -->` and
`<!-- /NAME -->` in its document."""

from __future__ import annotations

import functools
import json
import re
import sys

from loadtest import (bench_accuracy, bench_all, bench_cache, bench_fleet, bench_gateway_memory,
                      bench_layout, bench_layout_fleet, bench_memory, bench_paddlex,
                      bench_scaling, memory_sources)
from scripts.fleet import REPO_ROOT

FIGURES = REPO_ROOT / "docs" / "figures"

# (document, table name, result file, renderer)
TABLES = [
    ("docs/capacity.md", "fleet-table", "fleet.json", bench_fleet.table),
    ("docs/capacity.md", "fleet-equal", "fleet-equal.json", bench_fleet.table),
    *[("docs/capacity.md", name, f"{name}.json", bench_fleet.table)
      for name in ("fleet-before", "fleet-equal-shares", "fleet-run-before",
                   "fleet-images-sent-at-once",
                   "fleet-list-1-process", "fleet-list-2-processes")],
    ("docs/capacity.md", "gateway-memory", "gateway-memory.json", bench_gateway_memory.table),
    ("docs/capacity.md", "gateway-memory-real", "gateway-memory-real.json",
     bench_gateway_memory.table),
    ("docs/capacity.md", "gateway-memory-before", "gateway-memory-before.json",
     bench_gateway_memory.table),
    ("docs/benchmarks.md", "scan-pdf", "scan-pdf-accuracy.json", bench_accuracy.scan_pdf_table),
    ("docs/cache.md", "cache", "cache.json", bench_cache.table),
    ("docs/benchmarks.md", "scaling", "scaling.json", bench_scaling.table),
    ("docs/benchmarks.md", "paddlex", "paddlex.json",
     functools.partial(bench_paddlex.table, refuse=True)),
    ("docs/benchmarks.md", "bench", "bench/summary.json", bench_all.table),
    ("docs/benchmarks.md", "accuracy", "accuracy.json", bench_accuracy.settings_table),
    ("docs/benchmarks.md", "layout", "layout.json", bench_layout.table),
    ("docs/benchmarks.md", "layout-fleet", "layout-fleet.json", bench_layout_fleet.table),
    ("docs/operations.md", "memory-soak", "bench/memory.json", bench_memory.table),
    ("docs/operations.md", "memory-sources", "memory_sources.json", memory_sources.table),
    ("docs/operations.md", "memory-sources-before", "memory_sources-before.json",
     memory_sources.table),
]


def rendered(document: str, name: str, result_file: str, render) -> tuple[str, str]:
    """(the document as it is, the document with the table regenerated)."""
    text = (REPO_ROOT / document).read_text()
    table = render(json.loads((FIGURES / result_file).read_text()))
    match = re.search(rf"(<!-- {name}:[^>]*-->\n).*?(<!-- /{name} -->)|(<!-- {name}:[^>]*-->)\n?",
                      text, re.S)
    if match is None:
        raise ValueError(f"{document} has no <!-- {name}: ... --> marker")
    head = match.group(1) or match.group(3) + "\n"
    return text, f"{text[:match.start()]}{head}{table}\n<!-- /{name} -->{text[match.end():]}"


def main() -> int:
    for document, name, result_file, render in TABLES:
        old, new = rendered(document, name, result_file, render)
        if old != new:
            (REPO_ROOT / document).write_text(new)
            print(f"rewrote the {name} table in {document}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
