"""Shared fixtures: servers started on free loopback ports and stopped after the tests, and
the generated documents."""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path

import pytest
import requests

from loadtest import documents
from scripts.fleet import free_port, worker_process

REPO_ROOT = Path(__file__).resolve().parents[1]

# The suite checks exact text on its documents, so the workers it starts run the exact backend
# (onnxruntime fp32). The default `auto` (OpenVINO bf16 on CPUs with bf16) reads about 1 line
# in 30 differently (README "Engine speed"); its sessions and its text are tested against
# onnxruntime in tests/test_openvino_backend.py, its accuracy measured by `make bench-accuracy`.
os.environ.setdefault("OCR_BACKEND", "onnxruntime")
MODELS = REPO_ROOT / "models"


# Fixtures that start the real engine: a test using one is marked `engine` (so that
# `pytest -m "not engine"` leaves it out) without each test saying so. A test module can name
# its own in a module-level ENGINE_FIXTURES; a test that starts a real worker itself carries
# @pytest.mark.engine explicitly.
ENGINE_FIXTURES = {"worker_url"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        engine_fixtures = ENGINE_FIXTURES | set(getattr(item.module, "ENGINE_FIXTURES", ()))
        if engine_fixtures & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.engine)


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
