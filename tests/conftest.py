"""Shared fixtures: servers started on free loopback ports and stopped after the tests, and
the generated documents."""

from __future__ import annotations

import base64
import os
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from samples import documents
from scripts import warmstart
from scripts.fleet import free_port, worker_process

REPO_ROOT = Path(__file__).resolve().parents[1]

# The workers the suite starts run the default backend as shipped (`auto`: onnxruntime fp32
# on every machine, services/ocr_worker/engine_tuning.py), so every real-engine path (worker
# OCR, gateway split, searchable PDF, jobs) tests the default. OpenVINO, an explicit choice, is
# tested against it in tests/test_openvino_backend.py.
MODELS = REPO_ROOT / "models"

# Each pytest process rewrites the test modules' asserts, and each server a test starts
# compiles the project's modules: with PYTHONDONTWRITEBYTECODE (set in many CI images) none of
# it is cached and every process does it again. __pycache__ is ignored by git and by the image
# builds, so the suite writes it.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# The gunicorn servers the tests start are forked from a process that has imported their
# libraries already (scripts/warmstart.py): the same servers, without about 0.5 CPU-s of imports
# each, a hundred times per run. `make run` and the benchmarks start theirs cold.
warmstart.enable()


# Fixtures that start the real engine: a test using one is marked `engine` (so that
# `pytest -m "not engine"` leaves it out) without each test saying so. A test module can name
# its own in a module-level ENGINE_FIXTURES; a test that starts a real worker itself carries
# @pytest.mark.engine explicitly.
ENGINE_FIXTURES = {"worker_url"}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        engine_fixtures = ENGINE_FIXTURES | set(getattr(item.module, "ENGINE_FIXTURES", ()))
        if engine_fixtures & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.engine)
    group_for_xdist(items)


def group_for_xdist(items) -> None:
    """pyproject runs the suite on 4 pytest processes (`--dist loadgroup`); a group's tests
    share one, and a test in no group goes wherever a process is free. Every real-engine test
    goes to one group, so that one engine worker serves them all as in a serial run, in
    whatever module they are; a test that uses a module-scoped fixture (a fleet, a browser)
    is grouped with its module; a test that can run apart from its module (a long one with a
    fleet of its own) names its own xdist_group.

    The processes take groups and tests in collection order (`--no-loadscope-reorder`), so
    the longest go first: the engine group, then what is marked `slow` (tests that start
    servers), then the rest, which fill the gaps at the end. Without this the run ended on
    one process working through the long modules while the others sat idle."""
    engine_modules = {item.module for item in items if item.get_closest_marker("engine")}
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        shares_fixture = _uses_module_fixture(item)
        if item.get_closest_marker("engine") or (item.module in engine_modules
                                                 and shares_fixture):
            item.add_marker(pytest.mark.xdist_group("engine"))
        elif shares_fixture:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    items.sort(key=_longest_first)


def _longest_first(item) -> int:
    group = item.get_closest_marker("xdist_group")
    if group and group.args[0] == "engine":
        return 0
    return (1 if item.get_closest_marker("slow") else 3) + (0 if group else 1)


def pytest_collection_finish(session):
    """On a pytest-xdist process with --dist loadgroup, a grouped test's id carries its group
    ("...@engine"). Without it the groups are silently ignored (pytest 9.2 with pytest-xdist
    3.8: pytest-xdist#1386), and tests that must share a process would not: stop at once."""
    if not getattr(session.config.option, "loadgroup", False):  # set on xdist processes
        return
    for item in session.items:
        if item.get_closest_marker("xdist_group") and "@" not in item.nodeid:
            raise pytest.UsageError(
                "pytest-xdist did not apply --dist loadgroup with this pytest "
                f"({pytest.__version__}); see pyproject.toml's pin, or run with -n 0")


def _uses_module_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(
        definitions[-1].scope in ("module", "package", "class")
        for definitions in info.name2fixturedefs.values() if definitions)


class LoopbackServer:
    """A threaded HTTP server on 127.0.0.1 (a free port) for a test's fake peer, serving
    `handler` until close()."""

    def __init__(self, handler):
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def wait_until(condition, timeout: float = 30.0, interval: float = 0.05, what: str = ""):
    """Poll `condition()` until it returns something truthy (returned), or fail the test at
    the deadline: the way tests wait, instead of sleeping a fixed time."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what or condition}")
        time.sleep(interval)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def post_ocr(base_url: str, body: dict, timeout: float = 120, **kwargs) -> requests.Response:
    return requests.post(f"{base_url}/ocr", json=body, timeout=timeout, **kwargs)


def all_text(response_json: dict) -> list[str]:
    return [" ".join(page["prunedResult"]["rec_texts"])
            for page in response_json["result"]["ocrResults"]]


@pytest.fixture(scope="session")
def tmp_logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="session")
def worker_url(tmp_logs):
    """One real-engine worker (PP-OCRv6 tiny, onnxruntime, CPU) for the whole session."""
    assert (MODELS / "PP-OCRv6_tiny_det" / "inference.onnx").is_file(), "run `make models`"
    port = free_port()
    process = worker_process(port, {"OCR_THREADS": "1", "OCR_QUEUE_SIZE": "8",
                                    "OCR_MAX_PAGES": "20"},
                             log_path=tmp_logs / "worker.log")
    process.start().wait_ready(120)
    yield f"http://127.0.0.1:{port}"
    process.stop()


@pytest.fixture(scope="session")
def cjk_font() -> str:
    font = documents.find_font(documents.CJK_FONTS)
    assert font, "a CJK font is needed: apt-get install fonts-wqy-zenhei"
    return font


# ---- skip policy: a skip passes only where tests/allowed_skips.txt allows it ----------------
# pyproject's addopts print every skip with its reason (`-ra`). A skip whose reason matches no
# entry of tests/allowed_skips.txt is turned into a failure where it happens (a pytest-xdist
# worker sends that failed report on to the controller), so the suite never passes because a
# part it needs (nginx, chromium, redis-server, poppler-utils, the fonts, kubectl) was missing:
# the failure names the part, as the skip's reason did. The summary counts both kinds.
ALLOWED_SKIPS = Path(__file__).with_name("allowed_skips.txt")


def read_allowed_skips(path: Path = ALLOWED_SKIPS) -> list[tuple["re.Pattern[str]", str]]:
    """(pattern, why) for each `PATTERN :: WHY` line: PATTERN a regular expression searched
    in a skip's reason. Blank lines and # comments are left out; an entry without its why, or a
    pattern that does not compile, stops the run."""
    import re

    entries = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        pattern, separator, why = (part.strip() for part in line.partition("::"))
        if not (separator and pattern and why):
            raise pytest.UsageError(f"{path}:{number}: write `PATTERN :: WHY` (why the skip "
                                    f"is expected), not {line!r}")
        try:
            entries.append((re.compile(pattern), why))
        except re.error as exc:
            raise pytest.UsageError(f"{path}:{number}: {pattern!r}: {exc}") from None
    return entries


_ALLOWED_SKIP_ENTRIES: list | None = None


def allowed_skip(reason: str) -> str | None:
    """The why of the entry that allows a skip with this reason, else None."""
    global _ALLOWED_SKIP_ENTRIES
    if _ALLOWED_SKIP_ENTRIES is None:
        _ALLOWED_SKIP_ENTRIES = read_allowed_skips()
    return next((why for pattern, why in _ALLOWED_SKIP_ENTRIES if pattern.search(reason)),
                None)


def skip_reason(report) -> str | None:
    """A skipped test's or collector's reason; None when it did not skip (an xfail is no skip)."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return None
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def fail_unlisted_skip(report) -> None:
    reason = skip_reason(report)
    if reason is None or allowed_skip(reason) is not None:
        return
    report.outcome = "failed"
    report.unlisted_skip = reason  # kept through pytest-xdist's report serialization
    report.longrepr = (
        f"unexpected skip: {reason}\n"
        f"A skip passes only where {ALLOWED_SKIPS.relative_to(REPO_ROOT)} allows it. A missing "
        "Debian package: `bash scripts/install_system_deps.sh --require` installs it (or says "
        "why it cannot); an expected skip: add its reason there, with why.")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    fail_unlisted_skip(report)
    return report


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_make_collect_report(collector):
    report = yield
    fail_unlisted_skip(report)
    return report


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """On the controller: the skips allowed (by entry) and those that failed the run."""
    if hasattr(config, "workerinput"):
        return
    from collections import Counter

    stats = terminalreporter.stats
    allowed = Counter(allowed_skip(skip_reason(r) or "") or "?"
                      for r in stats.get("skipped", []) if skip_reason(r) is not None)
    unlisted = Counter(r.unlisted_skip for key in ("failed", "error")
                       for r in stats.get(key, []) if getattr(r, "unlisted_skip", None))
    if not (allowed or unlisted):
        return
    terminalreporter.section(f"skip policy ({ALLOWED_SKIPS.relative_to(REPO_ROOT)})")
    for why, count in allowed.items():
        terminalreporter.write_line(f"{count} skipped, allowed: {why}")
    for reason, count in unlisted.items():
        terminalreporter.write_line(f"{count} skipped WITHOUT an allow-list entry, failed: "
                                    f"{reason}", red=True)
