"""Shared fixtures: servers started on free loopback ports and stopped after the tests, and
the generated documents."""

from __future__ import annotations

import base64
import os
import sys
import time
from pathlib import Path

import pytest
import requests

from loadtest import documents
from scripts import warmstart
from scripts.fleet import free_port, worker_process

REPO_ROOT = Path(__file__).resolve().parents[1]

# The suite checks exact text on its documents, so the workers it starts run the exact backend
# (onnxruntime fp32). The default `auto` (OpenVINO bf16 on CPUs with bf16) reads about 1 line
# in 30 differently (README "Engine speed"); its sessions and its text are tested against
# onnxruntime in tests/test_openvino_backend.py, its accuracy measured by `make bench-accuracy`.
os.environ.setdefault("OCR_BACKEND", "onnxruntime")
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
