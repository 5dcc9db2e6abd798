"""Worker behaviour under overload and shutdown, with the sim engine (a fixed service time, so
the queue can be filled on purpose): a full queue answers 503 + Retry-After at once, SIGTERM
refuses new work but finishes what was admitted, and a worker that cannot find its models
stays up and says why in /readyz."""

import concurrent.futures
import re
import signal
import tempfile
import time
from pathlib import Path

import pytest
import requests

from samples import documents
from scripts.fleet import free_port, gateway_process, http_status, stop_all, worker_process
from tests.conftest import b64, wait_until

pytestmark = pytest.mark.slow  # starts servers: scheduled first (tests/conftest.py)

PNG = b64(documents.to_png(documents.text_image(["x"])))


def inflight(url: str) -> float:
    text = requests.get(f"{url}/metrics", timeout=5).text
    match = re.search(r"^ocr_worker_inflight_requests ([0-9.]+)", text, re.M)
    return float(match.group(1)) if match else 0.0


def start_sim_worker(tmp_path, **env):
    port = free_port()
    settings = {"OCR_ENGINE": "sim", "OCR_SIM_PAGE_MS": "300", "OCR_QUEUE_SIZE": "2",
                "OCR_RETRY_AFTER_S": "2", **env}
    process = worker_process(port, settings, log_path=tmp_path / f"worker-{port}.log")
    return process.start().wait_ready(60), f"http://127.0.0.1:{port}"


def test_full_queue_answers_503_with_retry_after_at_once(tmp_path):
    process, url = start_sim_worker(tmp_path)
    try:
        def send(_):
            response = requests.post(f"{url}/ocr", json={"file": PNG}, timeout=30)
            return response, time.monotonic()

        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            results = list(pool.map(send, range(12)))
        ok = [(r, done) for r, done in results if r.status_code == 200]
        refused = [(r, done) for r, done in results if r.status_code == 503]
        assert len(ok) + len(refused) == 12
        assert 2 <= len(ok) < 12 and refused
        last_read = max(done for _, done in ok)
        for response, done in refused:
            assert response.headers["Retry-After"] == "2"
            assert response.json()["errorCode"] == 503
            assert "queue is full" in response.json()["errorMsg"]
            # refused while the queue was full, so before the admitted pages were all read:
            # an answer after the last of them was parked behind them
            assert done < last_read
        assert all(r.json()["result"]["ocrResults"][0]["prunedResult"]["rec_texts"][0]
                   .startswith("[simulated]") for r, _ in ok)
        assert requests.get(f"{url}/readyz", timeout=5).status_code == 200
    finally:
        process.stop()


def test_sigterm_finishes_admitted_work_and_refuses_new(tmp_path):
    process, url = start_sim_worker(tmp_path, OCR_SIM_PAGE_MS="400", OCR_QUEUE_SIZE="4")
    try:
        pdf = b64(documents.labelled_pdf(3, lines_per_page=0))
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            admitted = pool.submit(requests.post, f"{url}/ocr", json={"file": pdf}, timeout=30)
            wait_until(lambda: inflight(url) >= 1, what="the request to be admitted")
            process.signal_group(signal.SIGTERM)
            wait_until(lambda: http_status(f"{url}/readyz") != 200, what="draining")
            try:
                # long enough for a connection left in the listen backlog to be reset when
                # the process exits after its admitted work (a loaded machine is slow)
                late = requests.post(f"{url}/ocr", json={"file": PNG}, timeout=60)
                assert late.status_code == 503
            except requests.ConnectionError:
                pass  # listening socket already closed: also a refusal
            response = admitted.result(30)
        assert response.status_code == 200
        assert len(response.json()["result"]["ocrResults"]) == 3
        assert process.process.wait(30) == 0
    finally:
        process.stop()


@pytest.mark.engine  # the paddleocr engine's load path (no models: it fails, as it should)
def test_missing_models_keep_the_process_up_and_not_ready(tmp_path):
    port = free_port()
    process = worker_process(port, {"OCR_MODEL_DIR": str(tmp_path / "nothing")},
                             log_path=tmp_path / "worker.log").start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except (requests.ConnectionError, requests.Timeout):  # still starting
                time.sleep(0.2)
        ready = requests.get(f"{url}/readyz", timeout=5)
        assert ready.status_code == 503
        assert "make models" in ready.json()["errorMsg"]
        # broken, not busy: 500 (503 would tell callers to come back later)
        response = requests.post(f"{url}/ocr", json={"file": PNG}, timeout=5)
        assert response.status_code == 500 and "make models" in response.json()["errorMsg"]
    finally:
        process.stop()


def test_stopped_services_leave_nothing_in_the_temporary_directory(tmp_path):
    """Each service's master names a metrics (and the worker a recycle) directory after its
    port in the temporary directory, and removes it at exit: a host that starts services on
    many ports (tests, benchmarks, restarts) does not fill up with them."""
    worker, url = start_sim_worker(tmp_path)
    port = free_port()
    gateway = gateway_process(port, {"GATEWAY_REPLICAS": url}, tmp_path / "gateway.log")
    try:
        gateway.start().wait_ready(60)
        ours = [Path(tempfile.gettempdir()) / f"ocrfleet-{name}-127.0.0.1-{p}"
                for name, p in (("worker-metrics", url.rsplit(":", 1)[1]),
                                ("recycle", url.rsplit(":", 1)[1]),
                                ("gateway-metrics", port))]
        assert all(path.is_dir() for path in ours)
    finally:
        stop_all([worker, gateway])
    assert [path for path in ours if path.exists()] == []
