"""Busy is never failure, on each path that turned a busy worker's refusal into a 502: a
worker that refuses before reading the body (a page that would start too late, no API key)
reads the rest of it before answering, so the connection stays whole. Behind nginx the
refusal arrives as the worker's 503, and nginx never counts a busy worker as failed ("upstream
prematurely closed connection", then "temporarily disabled", then 502 for everyone). Sim
workers: the fleet's mechanics, not OCR (tests/test_real_load.py runs the real engine)."""

from __future__ import annotations

import base64
import concurrent.futures
import json
import threading

import numpy as np
import pytest
import requests
from PIL import Image

from samples import documents
from tests.conftest import wait_until
from tests.test_flow_integration import start_gateway, start_nginx, start_workers

pytestmark = pytest.mark.slow  # starts servers: scheduled first (tests/conftest.py)

REFUSE_SOON = {"X-Ocr-Priority": "high", "X-Ocr-Start-Within-Ms": "250"}


@pytest.fixture
def processes():
    from scripts.fleet import stop_all

    started = []
    yield started
    stop_all(started)


def noisy_png_body() -> bytes:
    """An /ocr JSON body well over the 64 KiB gunicorn drains by itself (~0.6 MB)."""
    pixels = np.random.default_rng(0).integers(0, 255, (400, 400, 3), dtype=np.uint8)
    png = documents.to_png(Image.fromarray(pixels))
    assert len(png) > 256 * 1024
    return json.dumps({"file": base64.b64encode(png).decode(), "fileType": 1}).encode()


def busy(urls: list[str], body: bytes) -> list[threading.Thread]:
    """One long page under way at each worker, sent straight to it; returns once every worker
    refuses a page that asks to start soon."""
    threads = [threading.Thread(target=requests.post, args=(f"{url}/ocr",),
                                kwargs={"data": body, "timeout": 60}, daemon=True)
               for url in urls]
    for thread in threads:
        thread.start()
    for url in urls:
        wait_until(lambda: requests.post(f"{url}/ocr", data=b"{}", headers=REFUSE_SOON,
                                         timeout=5).status_code == 503,
                   10, what=f"{url} to be busy")
    return threads


def test_a_busy_workers_refusal_reaches_nginxs_client_as_its_503(processes, tmp_path):
    urls = start_workers(processes, tmp_path, 2, {"OCR_ENGINE": "sim", "OCR_SIM_PAGE_MS": "8000",
                                                  "OCR_VISUALIZE": "false"})
    balancer = start_nginx(processes, tmp_path, urls)
    body = noisy_png_body()
    pages = busy(urls, body)

    def refused(_):
        answer = requests.post(f"{balancer}/ocr", data=body, headers=REFUSE_SOON, timeout=30)
        return answer.status_code, answer.headers.get("X-Ocr-Starts-In-Ms")

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(refused, range(40)))
    statuses = [status for status, _ in answers]
    assert statuses == [503] * 40, f"refusals came back as {sorted(set(statuses))}"
    assert all(starts for _, starts in answers)  # the worker's own refusal, not nginx's
    log = (tmp_path / "nginx" / "error.log").read_text()
    assert "prematurely closed" not in log and "temporarily disabled" not in log, log[-2000:]
    for thread in pages:
        thread.join(30)


def test_images_on_a_busy_fleet_behind_nginx_wait_their_turn(processes, tmp_path):
    """Through the gateway: images sent while every worker reads a long page are refused
    (they ask to start soon) until one can start them; none fails."""
    urls = start_workers(processes, tmp_path, 2, {"OCR_ENGINE": "sim", "OCR_SIM_PAGE_MS": "1500",
                                                  "OCR_VISUALIZE": "false"})
    gateway = start_gateway(processes, tmp_path,
                            {"GATEWAY_UPSTREAM_URL": start_nginx(processes, tmp_path, urls)})
    body = noisy_png_body()
    pdf = base64.b64encode(documents.labelled_pdf(8)).decode()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        long_doc = pool.submit(requests.post, f"{gateway}/ocr",
                               json={"file": pdf, "fileType": 0}, timeout=120)
        wait_until(lambda: requests.get(f"{gateway}/readyz", timeout=5).ok, 10)
        images = [pool.submit(requests.post, f"{gateway}/ocr", data=body, timeout=120,
                              headers={"Content-Type": "application/json"}) for _ in range(6)]
        statuses = [future.result().status_code for future in images]
        assert long_doc.result().status_code == 200
    assert statuses == [200] * 6, [f.result().text[:200] for f in images]
    log = (tmp_path / "nginx" / "error.log").read_text()
    assert "temporarily disabled" not in log, log[-2000:]
