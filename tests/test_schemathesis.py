"""Schemathesis against a live sim fleet (scripts/fuzz_api.py: `make run`'s launcher on free
loopback ports, API keys on, stopped whatever happens), driven by the documents the gateway
and a worker serve at /openapi.json: every operation, a bounded number of cases each, the
job links followed (submit, then status, result and cancel). No 5xx but the refusals a
request asked for, no answer outside the document, no answer slower than the fleet's own
request deadline. `make fuzz` is the longer run (its figures: docs/openapi.md)."""

from __future__ import annotations

import pytest

from scripts import fuzz_api

pytestmark = pytest.mark.slow  # starts servers: scheduled first (tests/conftest.py)

EXAMPLES = 15  # per operation and phase: about 1000 gateway and 400 worker cases, 20 s


def test_the_fleet_answers_as_its_documents_say(tmp_path):
    reports = fuzz_api.fuzz(tmp_path, EXAMPLES, seed=1)
    for name, report in reports.items():
        assert report["returncode"] == 0, report["output"]
        assert report["test_cases"]["unique_failures"] == 0, report["output"]
        assert report["operations"]["tested"] == report["operations"]["total"], report["output"]
        print(fuzz_api.summary(name, report))
    gateway = reports["gateway"]
    assert gateway["phases"]["stateful"]["status"] == "success", gateway["output"]
    followed = gateway["valid_rates"]
    for operation in ("GET /jobs/{jobId}", "GET /jobs/{jobId}/result", "DELETE /jobs/{jobId}"):
        reached = sum(phase["accepted"] for phase in followed[operation].values())
        assert reached > 0, f"no real job reached {operation}: {followed[operation]}"
