"""A stalled job store: a real redis-server on loopback, paused with SIGSTOP (its own pid)
while a job runs. Every /jobs route answers a JSON 503 with Retry-After at once instead of
holding the request; the gateway stays healthy; nothing a refused submit sent is written
later; and once Redis resumes the job finishes with every page once. No fixed sleeps: each
wait polls a condition with a deadline."""

from __future__ import annotations

import os
import signal
import time

import pytest
import requests

from gateway.jobs.store_redis import RedisJobStore
from samples import documents
from scripts.fleet import (free_port, gateway_process, redis_process, stop_all,
                           worker_process)
from tests.conftest import b64, wait_until

pytestmark = pytest.mark.slow  # starts servers: scheduled first (tests/conftest.py)

PAGES = 16
LEASE_S = 2.0
SIM = {"OCR_ENGINE": "sim", "OCR_VISUALIZE": "false", "OCR_SIM_PAGE_MS": "300"}
CLIENT_TIMEOUT_S = 10.0  # what the caller in the report gave up after
AT_ONCE_S = 5.0  # one fast read's timeout (2 s), and room for a busy machine


def answered_at_once(method: str, url: str, **kwargs) -> requests.Response:
    started = time.monotonic()
    answer = requests.request(method, url, timeout=CLIENT_TIMEOUT_S, **kwargs)
    took = time.monotonic() - started
    assert took < AT_ONCE_S, f"{method} {url} took {took:.1f} s"
    return answer


def assert_store_unavailable(answer: requests.Response) -> None:
    assert answer.status_code == 503, answer.text
    assert int(answer.headers["Retry-After"]) > 0
    body = answer.json()
    assert body["errorCode"] == 503 and "job store" in body["errorMsg"]


@pytest.fixture
def gateway_on_redis(tmp_path):
    """A gateway (one gunicorn process; jobs on a redis-server of this test's own, leases of
    2 s so that the pause outlasts one) and a sim worker."""
    redis_port, worker_port, gateway_port = free_port(), free_port(), free_port()
    redis = redis_process(redis_port, tmp_path / "redis", tmp_path / "redis.log")
    worker = worker_process(worker_port, SIM, tmp_path / "worker.log")
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    gateway = gateway_process(gateway_port, {
        "GATEWAY_REPLICAS": f"http://127.0.0.1:{worker_port}", "GATEWAY_PROCESSES": "1",
        "GATEWAY_REDIS_URL": redis_url, "GATEWAY_JOBS_LEASE_S": str(LEASE_S),
        "GATEWAY_JOBS_RUNNERS": "1"}, tmp_path / "gateway.log")
    try:
        redis.start().wait_ready(30)
        worker.start().wait_ready(60)
        gateway.start().wait_ready(60)
        yield {"url": f"http://127.0.0.1:{gateway_port}", "redis": redis,
               "redis_url": redis_url}
    finally:
        if redis.alive():
            os.kill(redis.pid, signal.SIGCONT)  # a paused process ignores SIGTERM
        stop_all([redis, worker, gateway])


def test_a_stalled_redis_is_a_503_at_once_and_the_job_still_finishes(gateway_on_redis):
    url, redis = gateway_on_redis["url"], gateway_on_redis["redis"]
    body = {"file": b64(documents.labelled_pdf(PAGES, lines_per_page=0))}
    submitted = requests.post(f"{url}/jobs", json=body, timeout=30)
    assert submitted.status_code == 202, submitted.text
    job_url = f"{url}/jobs/{submitted.json()['result']['jobId']}"

    def status() -> dict:
        return requests.get(job_url, timeout=CLIENT_TIMEOUT_S).json()["result"]

    wait_until(lambda: status()["pagesDone"] >= 1, timeout=60, what="a first page stored")
    os.kill(redis.pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    for method, path, kwargs in [("GET", "", {}), ("GET", "?wait=30", {}),
                                 ("GET", "/result", {}), ("POST", "/jobs", {"json": body}),
                                 ("DELETE", "", {})]:
        target = f"{url}{path}" if method == "POST" else f"{job_url}{path}"
        assert_store_unavailable(answered_at_once(method, target, **kwargs))
    assert answered_at_once("GET", f"{url}/healthz").status_code == 200
    assert answered_at_once("GET", f"{url}/readyz").status_code == 200
    # each refusal waited out the fast reads' timeout: the pause outlasted the job's lease
    assert time.monotonic() - stopped_at > LEASE_S

    os.kill(redis.pid, signal.SIGCONT)
    assert answered_at_once("GET", job_url).status_code == 200
    final = wait_until(lambda: (s := status())["state"] not in ("queued", "running") and s,
                       timeout=90, what="the job to end after Redis resumed")
    assert final["state"] == "succeeded" and final["pagesDone"] == PAGES, final
    result = requests.get(f"{job_url}/result", timeout=30)
    assert result.status_code == 200
    assert len(result.json()["result"]["ocrResults"]) == PAGES
    store = RedisJobStore(gateway_on_redis["redis_url"])
    assert len(store.redis.keys("ocrfleet:jobs:job:*")) == 1  # the refused submit left none
    assert store.usage("addr:127.0.0.1").active == 0
    store.close()
