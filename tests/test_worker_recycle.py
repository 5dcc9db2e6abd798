"""A worker process over its memory ceiling is replaced without failing a request and without
a moment where the worker is not ready: a real gunicorn worker (sim engine) with a ceiling so
low that every process passes it after its first page, so processes are replaced one after
another while requests and readiness probes keep arriving."""

from __future__ import annotations

import threading
import time

import psutil
import pytest
import requests

from samples import documents
from scripts.fleet import free_port, worker_process
from tests.conftest import b64

pytestmark = pytest.mark.slow  # starts servers: scheduled first (tests/conftest.py)

PNG = b64(documents.to_png(documents.text_image(["recycle"])))


def test_processes_over_the_ceiling_are_replaced_without_a_failure_or_a_readiness_gap(tmp_path):
    port = free_port()
    # each new process takes 1.5 s to "load its model": a replacement that accepted
    # connections before it was ready would answer 503 to requests and probes meanwhile
    process = worker_process(port, {"OCR_ENGINE": "sim", "OCR_SIM_PAGE_MS": "20",
                                    "OCR_SIM_LOAD_MS": "1500", "OCR_MEMORY_CEILING_MB": "1",
                                    "OCR_QUEUE_SIZE": "4"},
                             log_path=tmp_path / "worker.log").start().wait_ready(60)
    url = f"http://127.0.0.1:{port}"
    seen_pids: set[int] = set()
    answers: list[int] = []
    probes: list[object] = []
    stop = threading.Event()

    def probe_readiness():
        with requests.Session() as session:
            while not stop.is_set():
                try:
                    probes.append(session.get(f"{url}/readyz", timeout=10,
                                              headers={"Connection": "close"}).status_code)
                except requests.RequestException as exc:
                    probes.append(type(exc).__name__)
                stop.wait(0.05)

    prober = threading.Thread(target=probe_readiness)
    prober.start()
    try:
        deadline = time.monotonic() + 150
        while len(seen_pids) < 3 and time.monotonic() < deadline:
            response = requests.post(f"{url}/ocr", json={"file": PNG, "visualize": False},
                                     headers={"Connection": "close"}, timeout=30)
            answers.append(response.status_code)
            seen_pids.update([p.pid for p in psutil.Process(process.pid).children()])
    finally:
        stop.set()
        prober.join(15)
        children_at_end = [p.pid for p in psutil.Process(process.pid).children()]
        process.stop()
    assert len(seen_pids) >= 3, f"expected two replacements, saw processes {seen_pids}"
    assert set(answers) == {200}, answers
    assert probes and set(probes) == {200}, [p for p in probes if p != 200][:5]
    assert len(children_at_end) <= 2  # the fleet returns to one process (plus one starting)
