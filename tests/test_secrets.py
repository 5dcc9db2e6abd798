"""Secrets never leave: a gateway and a worker started with known API keys, worker token,
callback secret and a Redis password are used (well and badly: a wrong key, a job store that
cannot be reached, a callback URL that is refused), and none of those values appears in
their logs or answers. Loopback only, sim engine."""

from __future__ import annotations

import base64

import pytest
import requests

from samples import documents
from scripts.fleet import free_port, gateway_process, stop_all, worker_process

pytestmark = pytest.mark.slow  # starts servers: scheduled first (tests/conftest.py)

API_KEY = "client-key-7f3a9c2e5b1d4f60"
WORKER_TOKEN = "worker-token-1c8e4a7b2d9f3e05"
CALLBACK_SECRET = "callback-secret-5e2b8d1f7a3c9e64"
REDIS_PASSWORD = "redis-password-9d4f1b7e3a5c2e80"
SECRETS = (API_KEY, WORKER_TOKEN, CALLBACK_SECRET, REDIS_PASSWORD)


def test_no_secret_reaches_a_log_or_an_answer(tmp_path):
    worker_port, gateway_port, closed = free_port(), free_port(), free_port()
    worker = worker_process(worker_port, {"OCR_ENGINE": "sim", "OCR_API_TOKEN": WORKER_TOKEN,
                                          "OCR_LOG_LEVEL": "DEBUG"},
                            tmp_path / "worker.log")
    gateway = gateway_process(gateway_port, {
        "GATEWAY_REPLICAS": f"http://127.0.0.1:{worker_port}", "GATEWAY_PROCESSES": "1",
        "GATEWAY_API_KEYS": API_KEY, "GATEWAY_WORKER_TOKEN": WORKER_TOKEN,
        "GATEWAY_JOBS_CALLBACK_SECRET": CALLBACK_SECRET, "GATEWAY_LOG_LEVEL": "DEBUG",
        "GATEWAY_REDIS_URL": f"redis://:{REDIS_PASSWORD}@127.0.0.1:{closed}/0"},
        tmp_path / "gateway.log")
    worker.ready_url = None  # /readyz needs the token: wait for the gateway instead
    answers = []
    try:
        worker.start()
        gateway.start().wait_ready(60)
        url = f"http://127.0.0.1:{gateway_port}"
        key = {"X-API-Key": API_KEY}
        body = {"file": base64.b64encode(documents.to_png(documents.text_image(["hi"])))
                .decode(), "visualize": False}
        answers.append(requests.post(f"{url}/ocr", json=body, headers=key, timeout=60))
        assert answers[-1].status_code == 200, answers[-1].text
        answers.append(requests.post(f"{url}/ocr", json=body, timeout=10))
        answers.append(requests.post(f"{url}/ocr", json=body, timeout=10,
                                     headers={"X-API-Key": API_KEY[:-1] + "x"}))
        answers.append(requests.post(f"{url}/jobs", json=body, headers=key, timeout=30))
        assert answers[-1].status_code == 503  # the store cannot be reached
        answers.append(requests.post(f"{url}/jobs", headers=key, timeout=30, json={
            **body, "callbackUrl": "http://169.254.169.254/"}))
        assert answers[-1].status_code == 422
        answers.append(requests.get(f"{url}/metrics", timeout=10))
        answers.append(requests.get(f"{url}/fleet", headers=key, timeout=10))
        answers.append(requests.get(f"http://127.0.0.1:{worker_port}/readyz", timeout=10))
    finally:
        stop_all([gateway, worker])
    logs = (tmp_path / "gateway.log").read_text() + (tmp_path / "worker.log").read_text()
    assert "job store unavailable" in logs  # the store's error was logged...
    texts = [logs] + [a.text + str(dict(a.headers)) for a in answers]
    for secret in SECRETS:  # ...and no secret anywhere
        assert not any(secret in text for text in texts), secret
