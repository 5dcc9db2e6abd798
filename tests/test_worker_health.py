"""A hung inference thread is detected: while pages wait and none goes into or comes out of
the engine for OCR_STALL_TIMEOUT_S, /healthz (liveness) and /readyz answer 503, so Kubernetes
restarts the worker; once the engine moves again both are 200. The rule itself
(health.stall_reason) is pure and tested on snapshots; the rest with an engine whose predict
blocks on an Event, through the Flask test client."""

import threading
from dataclasses import replace

import pytest

from samples import documents
from services.ocr_api.settings import ConfigError
from services.ocr_worker.app import create_app
from services.ocr_worker.batcher import InferenceBatcher, Progress
from services.ocr_worker.config import WorkerConfig
from services.ocr_worker.engine import SimEngine
from services.ocr_worker.health import stall_reason
from tests.conftest import b64, wait_until

BUSY = Progress(loaded=True, running=True, stopping=False, idle=False, in_engine=1, queued=3,
                since_progress_s=121.0)


# ---- the rule ----------------------------------------------------------------------------------
def test_a_page_stuck_past_the_limit_with_work_waiting_is_a_stall():
    reason = stall_reason(BUSY, 120)
    assert reason and "121 s" in reason and "4 page(s) waiting" in reason


@pytest.mark.parametrize("change", [
    dict(since_progress_s=119.0),  # still within the limit
    dict(in_engine=0, queued=0),  # nothing waiting: an idle worker is not stuck
    dict(in_engine=0, idle=True),  # a page just arrived at a thread that was waiting for one
    dict(loaded=False),  # loading: the startup probe's business
    dict(stopping=True, running=False),  # shutting down
    dict(in_engine=2, since_progress_s=200.0),  # a batch of 2 pages may take 2 x the limit
])
def test_no_stall(change):
    assert stall_reason(replace(BUSY, **change), 120) is None


def test_a_dead_inference_thread_is_a_stall_at_once():
    progress = replace(BUSY, running=False, in_engine=0, queued=0, since_progress_s=0.0)
    assert stall_reason(progress, 120) == "the inference thread has exited"


def test_the_timeout_is_configured_and_validated():
    assert WorkerConfig.from_env({}).stall_timeout_s == 120
    assert WorkerConfig.from_env({"OCR_STALL_TIMEOUT_S": "300"}).stall_timeout_s == 300
    with pytest.raises(ConfigError, match="OCR_STALL_TIMEOUT_S"):
        WorkerConfig.from_env({"OCR_STALL_TIMEOUT_S": "0"})


# ---- the batcher's record ------------------------------------------------------------------------
class HangingEngine(SimEngine):
    """The sim engine, except that predict blocks until `release` is set."""

    def __init__(self):
        super().__init__(WorkerConfig(engine="sim", sim_page_ms=0))
        self.release = threading.Event()
        self.entered = threading.Event()

    def predict(self, images, params):
        self.entered.set()
        self.release.wait(60)
        return super().predict(images, params)


def test_the_batcher_records_pages_in_the_engine_and_waiting():
    import numpy as np

    engine = HangingEngine()
    batcher = InferenceBatcher(engine, queue_pages=4, max_batch=1, batch_wait_s=0, warmup=False)
    batcher.start()
    try:
        assert batcher.ready.wait(5)
        wait_until(lambda: batcher.progress().idle)
        assert batcher.progress().in_engine == 0
        futures = [batcher.submit(np.zeros((8, 8, 3), np.uint8), {}) for _ in range(3)]
        assert engine.entered.wait(5)
        progress = batcher.progress()
        assert (progress.in_engine, progress.queued, progress.idle) == (1, 2, False)
        first = progress.since_progress_s
        wait_until(lambda: batcher.progress().since_progress_s > first)  # the clock runs on
        engine.release.set()
        assert all(f.result(5) for f in futures)
        wait_until(lambda: batcher.progress().idle)
        progress = batcher.progress()
        assert (progress.in_engine, progress.queued) == (0, 0)
        assert progress.running and not progress.stopping
    finally:
        engine.release.set()
        batcher.stop(5)
    assert not batcher.progress().running and batcher.progress().stopping


# ---- the worker's probes ---------------------------------------------------------------------
def test_a_hung_engine_fails_liveness_and_readiness_until_it_moves_again():
    engine = HangingEngine()
    config = WorkerConfig(engine="sim", warmup=False, stall_timeout_s=0.3, queue_size=4)
    app = create_app(config, engine=engine)
    service = app.extensions["ocr_service"]
    client = app.test_client()
    try:
        wait_until(lambda: client.get("/readyz").status_code == 200)
        assert client.get("/healthz").status_code == 200
        image = b64(documents.to_png(documents.text_image(["x"])))
        answers = []
        request = threading.Thread(target=lambda: answers.append(
            app.test_client().post("/ocr", json={"file": image, "visualize": False})))
        request.start()
        assert engine.entered.wait(10)
        wait_until(lambda: client.get("/healthz").status_code == 503)
        health = client.get("/healthz")
        body = health.get_json()
        assert body["errorCode"] == 503 and "no progress" in body["errorMsg"]
        assert "1 page(s) waiting" in body["errorMsg"]
        ready = client.get("/readyz")
        assert ready.status_code == 503 and "no progress" in ready.get_json()["errorMsg"]

        engine.release.set()
        request.join(30)
        assert answers and answers[0].status_code == 200
        wait_until(lambda: client.get("/healthz").status_code == 200)
        assert client.get("/readyz").status_code == 200
    finally:
        engine.release.set()
        service.shutdown(timeout=5)
