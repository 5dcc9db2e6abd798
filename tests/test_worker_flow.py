"""The worker's side of flow control and bounded memory, in-process with Flask's test client
and the sim engine: capacity headers on every /ocr answer, X-Deadline-Ms (the deadline is
checked while rendering, and queued pages past it are dropped, not inferred), 503 only for
busy, the memory budget, and a many-page request holding at most OCR_PAGE_WINDOW rendered
pages at once."""

from __future__ import annotations

import base64
import math
import threading
import types
import weakref

import numpy as np
import pytest

from samples import documents
from services.ocr_worker import engine as engine_module
from services.ocr_worker import service as service_module
from services.ocr_worker.app import create_app
from services.ocr_worker.config import WorkerConfig
from services.ocr_worker.engine import SimEngine
from tests.conftest import wait_until

PNG = base64.b64encode(documents.to_png(documents.text_image(["x"]))).decode()
PAGES = 24
PDF_MANY = base64.b64encode(documents.image_pdf(
    [documents.text_image([f"page {i}"], size=20, width=200) for i in range(PAGES)],
    dpi=72)).decode()


class CountingSim(SimEngine):
    """The sim engine, recording the size of every page it infers."""

    def __init__(self, config):
        super().__init__(config)
        self.seen: list[tuple[int, int]] = []
        self.gate = threading.Event()
        self.gate.set()

    def predict(self, images, params):
        self.gate.wait(10)
        self.seen.extend((image.shape[1], image.shape[0]) for image in images)
        return super().predict(images, params)


def make_client(page_ms=1.0, **settings):
    config = WorkerConfig(engine="sim", sim_page_ms=page_ms, warmup=False, **settings)
    engine = CountingSim(config)
    app = create_app(config, engine=engine)
    service = app.extensions["ocr_service"]
    assert service.batcher.ready.wait(10)
    return app.test_client(), service, engine


def image_b64(width, height):
    return base64.b64encode(documents.to_png(documents.text_image(
        ["deadline"], size=20, width=width))).decode()


# ---- capacity headers -----------------------------------------------------------------------
def test_every_ocr_answer_carries_capacity_and_free_slots():
    client, service, _ = make_client(queue_size=3)
    ok = client.post("/ocr", json={"file": PNG, "visualize": False})
    assert ok.status_code == 200
    assert ok.headers["X-Ocr-Capacity"] == "3" and ok.headers["X-Ocr-Free"] == "3"
    bad = client.post("/ocr", json={"file": "not base64!"})
    assert bad.status_code == 422 and bad.headers["X-Ocr-Free"] == "3"
    wrong_method = client.get("/ocr")
    assert wrong_method.status_code == 405 and wrong_method.headers["X-Ocr-Capacity"] == "3"
    with service.admission.admit():
        with service.admission.admit():
            with service.admission.admit():
                busy = client.post("/ocr", json={"file": PNG})
    assert busy.status_code == 503 and busy.headers["Retry-After"]
    assert busy.headers["X-Ocr-Capacity"] == "3" and busy.headers["X-Ocr-Free"] == "0"
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.get_json()["capacity"] == {"slots": 3, "free": 3}


def test_free_slots_count_the_requests_in_flight():
    client, service, engine = make_client(queue_size=4)
    engine.gate.clear()
    answers = []
    thread = threading.Thread(target=lambda: answers.append(
        client.post("/ocr", json={"file": PNG, "visualize": False})))
    thread.start()
    try:
        for _ in range(500):
            if service.admission.admitted:
                break
            threading.Event().wait(0.01)
        assert client.get("/readyz").get_json()["capacity"] == {"slots": 4, "free": 3}
    finally:
        engine.gate.set()
        thread.join(10)
    assert answers[0].status_code == 200


# ---- priority ---------------------------------------------------------------------------------
def test_a_high_priority_request_is_read_before_the_pages_queued_before_it():
    """X-Ocr-Priority: high (the gateway's one-page interactive requests) overtakes the pages
    queued at the worker, not the one in the engine."""
    client, service, engine = make_client(queue_size=4)
    engine.gate.clear()
    answers = {}

    def send(name, width, priority):
        answers[name] = client.post("/ocr", json={"file": image_b64(width, 0)},
                                    headers={"X-Ocr-Priority": priority})

    threads = []
    for name, width, priority, queued in (("running", 200, "normal", 0),
                                          ("queued", 260, "normal", 1),
                                          ("image", 320, "high", 2)):
        threads.append(threading.Thread(target=send, args=(name, width, priority)))
        threads[-1].start()
        wait_until(lambda q=queued: service.batcher.progress().queued == q
                   and service.batcher.progress().in_engine == 1, timeout=10)
    engine.gate.set()
    for thread in threads:
        thread.join(10)
    assert all(answer.status_code == 200 for answer in answers.values())
    assert [width for width, _ in engine.seen] == [200, 320, 260]


def test_an_image_asked_to_start_soon_is_refused_at_once_while_a_long_page_runs():
    """X-Ocr-Start-Within-Ms: the worker refuses at once (503 and X-Ocr-Starts-In-Ms, its
    estimate) when the page in the engine would end later, and takes it when idle."""
    client, service, engine = make_client(page_ms=500)
    asked = {"X-Ocr-Priority": "high", "X-Ocr-Start-Within-Ms": "1000"}
    assert client.post("/ocr", json={"file": image_b64(200, 0)}).status_code == 200  # timed
    engine.gate.clear()
    running = threading.Thread(target=client.post, args=("/ocr",),
                               kwargs={"json": {"file": image_b64(2000, 0)}})
    running.start()
    try:
        wait_until(lambda: service.batcher.progress().in_engine == 1, timeout=10)
        answer = client.post("/ocr", json={"file": PNG}, headers=asked)
        assert answer.status_code == 503 and answer.get_json()["errorCode"] == 503
        assert int(answer.headers["X-Ocr-Starts-In-Ms"]) > 1000  # 10x the pixels timed
        assert "X-Ocr-Start-Within-Ms" in answer.get_json()["errorMsg"]
        assert answer.headers["Retry-After"] and answer.headers["X-Ocr-Capacity"]
        normal = client.post("/ocr", json={"file": PNG},
                             headers={"X-Ocr-Start-Within-Ms": "1000"})
        assert normal.status_code == 400 and "X-Ocr-Priority" in normal.get_json()["errorMsg"]
    finally:
        engine.gate.set()
        running.join(10)
    assert [width for width, _ in engine.seen] == [200, 2000]  # not the refused ones
    wait_until(lambda: service.batcher.progress().idle, timeout=10)
    answer = client.post("/ocr", json={"file": PNG}, headers=asked)
    assert answer.status_code == 200 and "X-Ocr-Starts-In-Ms" not in answer.headers


def test_a_document_page_asked_to_stay_within_the_target_is_refused_once_the_worker_holds_it(
        monkeypatch):
    """X-Ocr-Within-Target: 1 (the gateway's, on each document page it places itself): a
    worker that holds the pages its target says keep it busy (one here: a long page next to
    its gap) refuses at once, with the 503 a late page gets (the gateway sends it elsewhere
    at once) and its room; without the header, or for an image, it is queued as before."""
    client, service, engine = make_client(page_ms=500)
    assert client.post("/ocr", json={"file": image_b64(200, 0)}).status_code == 200  # timed
    monkeypatch.setattr(service.pace, "target", lambda: 1.05)
    engine.gate.clear()
    running = threading.Thread(target=client.post, args=("/ocr",),
                               kwargs={"json": {"file": image_b64(2000, 0)}})
    running.start()
    queued = []
    try:
        wait_until(lambda: service.batcher.progress().in_engine == 1, timeout=10)
        answer = client.post("/ocr", json={"file": PNG}, headers={"X-Ocr-Within-Target": "1"})
        assert answer.status_code == 503 and int(answer.headers["X-Ocr-Starts-In-Ms"]) > 0
        assert answer.headers["X-Ocr-Capacity"] and answer.headers["X-Ocr-Free"]
        assert "keep it busy" in answer.get_json()["errorMsg"]
        for headers in ({}, {"X-Ocr-Within-Target": "1", "X-Ocr-Priority": "high"}):
            thread = threading.Thread(target=lambda h=headers: queued.append(
                client.post("/ocr", json={"file": PNG}, headers=h).status_code))
            thread.start()
            queued.append(thread)
        wait_until(lambda: service.admission.admitted == 3, timeout=10)
    finally:
        engine.gate.set()
        running.join(10)
        for thread in [t for t in queued if isinstance(t, threading.Thread)]:
            thread.join(10)
    assert [code for code in queued if isinstance(code, int)] == [200, 200]
    assert len(engine.seen) == 4  # the two timed ones and the two queued, not the refused


def test_an_image_is_not_counted_against_the_target_and_answers_say_the_pages_held(
        monkeypatch):
    """A worker reading an image (X-Ocr-Priority: high) still takes the document page that
    asks to stay within a target of one (the image ends in a moment: refused, the page would
    go elsewhere and this worker idle after the image), and says it holds that one page
    (X-Ocr-Held, what the gateway places by), not two; the next document page is refused."""
    client, service, engine = make_client(page_ms=500)
    assert client.post("/ocr", json={"file": image_b64(200, 0)}).status_code == 200  # timed
    monkeypatch.setattr(service.pace, "target", lambda: 1.05)
    engine.gate.clear()
    codes, threads = [], []
    try:
        for headers in ({"X-Ocr-Priority": "high"}, {"X-Ocr-Within-Target": "1"}):
            threads.append(threading.Thread(target=lambda h=headers: codes.append(
                client.post("/ocr", json={"file": PNG}, headers=h).status_code)))
            threads[-1].start()
            wait_until(lambda: service.admission.admitted == len(threads), timeout=10)
        ready = client.get("/readyz")
        assert (ready.headers["X-Ocr-Held"], ready.headers["X-Ocr-Free"]) == (
            "1", str(service.admission.capacity - 2))
        refused = client.post("/ocr", json={"file": PNG}, headers={"X-Ocr-Within-Target": "1"})
        assert refused.status_code == 503 and refused.headers["X-Ocr-Held"] == "1"
    finally:
        engine.gate.set()
        for thread in threads:
            thread.join(10)
    assert codes == [200, 200]


def test_the_start_is_told_again_as_the_page_is_queued_and_held_to(monkeypatch):
    """The page under way may end while the request is read (a queued page would then start
    first): the worker asks again as it queues the page, and refuses if it is now late."""
    client, service, engine = make_client()
    estimates = iter([0.0, 5.0])  # before the body was read, and as the page is queued
    monkeypatch.setattr(service.batcher, "first_wait_s", lambda: next(estimates))
    failed = service_module.metrics.PAGES.labels("failed")._value.get()
    answer = client.post("/ocr", json={"file": PNG}, headers={
        "X-Ocr-Priority": "high", "X-Ocr-Start-Within-Ms": "1000"})
    assert answer.status_code == 503 and answer.headers["X-Ocr-Starts-In-Ms"] == "5000"
    assert engine.seen == []  # never queued
    assert service_module.metrics.PAGES.labels("failed")._value.get() == failed  # not failed


def test_a_worker_that_cannot_tell_refuses_a_prompt_start_and_says_how_long_so_far(
        monkeypatch):
    """No page timed yet and one under way: the refusal says the worker cannot tell, with how
    long the page under way has run as its X-Ocr-Starts-In-Ms (a whole number, never inf)."""
    client, service, engine = make_client()
    monkeypatch.setattr(service.batcher, "first_wait_s", lambda: math.inf)
    answer = client.post("/ocr", json={"file": PNG}, headers={
        "X-Ocr-Priority": "high", "X-Ocr-Start-Within-Ms": "250"})
    assert answer.status_code == 503 and int(answer.headers["X-Ocr-Starts-In-Ms"]) >= 1
    assert "cannot tell when it ends" in answer.get_json()["errorMsg"]
    assert engine.seen == []


@pytest.mark.parametrize("value", ["soon", "-1", "1.5", ""])
def test_a_malformed_start_within_header_gets_400_json(value):
    client, _, _ = make_client()
    answer = client.post("/ocr", json={"file": PNG}, headers={
        "X-Ocr-Priority": "high", "X-Ocr-Start-Within-Ms": value})
    assert answer.status_code == 400
    assert "X-Ocr-Start-Within-Ms" in answer.get_json()["errorMsg"]


@pytest.mark.parametrize("value", ["urgent", "1", ""])
def test_a_malformed_priority_header_gets_400_json(value):
    client, _, _ = make_client()
    answer = client.post("/ocr", json={"file": PNG}, headers={"X-Ocr-Priority": value})
    assert answer.status_code == 400
    assert "X-Ocr-Priority" in answer.get_json()["errorMsg"]


# ---- deadlines -------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["abc", "-5", "1.5", "", "1e3", "١٢", "9" * 12])
def test_a_malformed_deadline_header_gets_400_json(value):
    client, _, _ = make_client()
    answer = client.post("/ocr", json={"file": PNG}, headers={"X-Deadline-Ms": value})
    assert answer.status_code == 400
    assert answer.get_json()["errorCode"] == 400
    assert "X-Deadline-Ms" in answer.get_json()["errorMsg"]
    assert answer.headers["X-Ocr-Capacity"]


def test_a_deadline_already_passed_gets_504_without_inference():
    client, _, engine = make_client()
    answer = client.post("/ocr", json={"file": PNG}, headers={"X-Deadline-Ms": "0"})
    assert answer.status_code == 504 and answer.get_json()["errorCode"] == 504
    assert engine.seen == []


def test_a_page_queued_past_its_deadline_is_dropped_not_inferred():
    client, service, engine = make_client(page_ms=1.0)
    engine.gate.clear()  # the engine is busy with another request's page
    first = []
    blocker = threading.Thread(target=lambda: first.append(
        client.post("/ocr", json={"file": PNG, "visualize": False})))
    blocker.start()
    try:
        late = client.post("/ocr", json={"file": image_b64(333, 77), "visualize": False},
                           headers={"X-Deadline-Ms": "200"})
        assert late.status_code == 504
        assert "deadline" in late.get_json()["errorMsg"]
    finally:
        engine.gate.set()
        blocker.join(10)
    assert first[0].status_code == 200
    # the late page was queued behind the busy engine; by the time the engine got to it, its
    # deadline had passed, so it was dropped (or it was never queued at all)
    service.batcher.stop(10)
    assert (333, 77) not in engine.seen


def test_rendering_stops_at_the_deadline():
    client, _, engine = make_client(page_ms=100.0)
    answer = client.post("/ocr", json={"file": PDF_MANY, "visualize": False},
                         headers={"X-Deadline-Ms": "350"})
    assert answer.status_code == 504
    assert len(engine.seen) < PAGES


def test_a_long_deadline_changes_nothing():
    client, _, _ = make_client()
    answer = client.post("/ocr", json={"file": PNG, "visualize": False},
                         headers={"X-Deadline-Ms": "60000"})
    assert answer.status_code == 200


# ---- 503 is busy only ------------------------------------------------------------------------
class FailingSim(CountingSim):
    def predict(self, images, params):
        raise RuntimeError("engine broke")


def test_an_engine_exception_is_500_not_503():
    config = WorkerConfig(engine="sim", warmup=False)
    app = create_app(config, engine=FailingSim(config))
    assert app.extensions["ocr_service"].batcher.ready.wait(10)
    answer = app.test_client().post("/ocr", json={"file": PNG})
    assert answer.status_code == 500 and "page 1" in answer.get_json()["errorMsg"]
    assert "Retry-After" not in answer.headers


def test_memory_budget_full_is_503_busy():
    # an 800 x 800 page is 1.9 MB rendered: over a 1 MiB budget that is partly taken
    client, service, _ = make_client(memory_budget_mb=1)
    big = base64.b64encode(documents.to_png(documents.text_image(
        ["big"], size=40, width=800).resize((800, 800)))).decode()
    with service.memory.reserve(256 * 1024):
        busy = client.post("/ocr", json={"file": big, "visualize": False})
    assert busy.status_code == 503 and busy.headers["Retry-After"]
    assert "memory budget" in busy.get_json()["errorMsg"]
    alone = client.post("/ocr", json={"file": big, "visualize": False})
    assert alone.status_code == 200  # alone, a request over the budget still runs
    assert service.memory.reserved == 0


# ---- bounded pages per request -----------------------------------------------------------------
def count_live_pages(monkeypatch):
    """Wrap open_document so every rendered page is tracked; returns the live-count record."""
    record = {"live": 0, "max": 0, "rendered": 0}
    lock = threading.Lock()

    def gone():
        with lock:
            record["live"] -= 1

    original = service_module.open_document

    def tracked_open(request, limits):
        document = original(request, limits)
        pages = document.pages

        def tracked_pages():
            for image in pages():
                with lock:
                    record["live"] += 1
                    record["rendered"] += 1
                    record["max"] = max(record["max"], record["live"])
                weakref.finalize(image, gone)
                yield image
                del image

        document.pages = tracked_pages
        return document

    monkeypatch.setattr(service_module, "open_document", tracked_open)
    return record


@pytest.mark.parametrize("visualize", [False, True])
def test_a_many_page_request_holds_at_most_the_window_of_rendered_pages(monkeypatch,
                                                                         visualize):
    record = count_live_pages(monkeypatch)
    client, _, engine = make_client(page_ms=2.0, page_window=2)
    answer = client.post("/ocr", json={"file": PDF_MANY, "visualize": visualize})
    assert answer.status_code == 200
    results = answer.get_json()["result"]["ocrResults"]
    assert len(results) == PAGES and record["rendered"] == PAGES
    assert 1 <= record["max"] <= 2, record
    assert record["live"] == 0
    if visualize:
        assert all(page["inputImage"] for page in results)


def test_pages_come_back_in_order_through_the_window():
    client, _, engine = make_client(page_ms=1.0, page_window=3)
    pdf = base64.b64encode(documents.image_pdf(
        [documents.text_image(["p"], size=20, width=100 + 10 * i) for i in range(12)],
        dpi=72)).decode()
    answer = client.post("/ocr", json={"file": pdf, "visualize": False})
    assert answer.status_code == 200
    widths = [page["width"] for page in answer.get_json()["result"]["dataInfo"]["pages"]]
    assert widths == sorted(widths) and len(widths) == 12
    assert [w for w, _ in engine.seen] == widths


def test_the_window_is_what_bounds_it(monkeypatch):
    """The same request with a window of 6 holds more pages: the bound is the window's."""
    record = count_live_pages(monkeypatch)
    client, _, engine = make_client(page_ms=20.0, page_window=6, page_buffer=8)
    answer = client.post("/ocr", json={"file": PDF_MANY, "visualize": False})
    assert answer.status_code == 200
    assert 3 <= record["max"] <= 6, record


def test_rendered_page_arrays_are_weakly_referenceable():
    weakref.ref(np.zeros(3))  # the live-page count above relies on it


def test_the_sim_engine_charges_a_small_image_its_share_of_a_full_page():
    import numpy as np

    engine = SimEngine(WorkerConfig(engine="sim", sim_page_ms=1000, sim_page_pixels=1_000_000,
                                    warmup=False))
    assert engine.share_of_page(np.zeros((100, 500, 3), np.uint8)) == 0.05
    assert engine.share_of_page(np.zeros((2000, 1500, 3), np.uint8)) == 1.0
    fixed = SimEngine(WorkerConfig(engine="sim", warmup=False))
    assert fixed.share_of_page(np.zeros((10, 10, 3), np.uint8)) == 1.0


def test_the_sim_engines_jitter_is_drawn_apart_in_each_engine_and_an_image_gets_its_share(
        monkeypatch):
    """Workers whose pages all took the same time would end them in step (waves): each
    engine draws its own jitter. A small image varies by its share of it."""
    slept = []
    monkeypatch.setattr(engine_module, "time", types.SimpleNamespace(sleep=slept.append))
    config = WorkerConfig(engine="sim", sim_page_ms=1000, sim_jitter_ms=200,
                          sim_page_pixels=1_000_000, warmup=False)
    page, image = np.zeros((1000, 1000, 3), np.uint8), np.zeros((100, 500, 3), np.uint8)
    draws = []
    for _ in range(2):
        engine = SimEngine(config)
        engine.predict([page] * 8, {})
        draws.append(slept[-8:])
    assert draws[0] != draws[1]
    assert all(0.8 <= s <= 1.2 for s in draws[0] + draws[1])
    SimEngine(config).predict([image] * 8, {})
    assert all(0.04 <= s <= 0.06 for s in slept[-8:])


def test_answers_say_how_long_the_workers_pages_take_once_it_has_read_one():
    """X-Ocr-Page-Ms: the engine's moving mean per batch, on every answer and probe once a
    page has been read (what the gateways judge "pages are long" by, gateway.flow.reserve);
    nothing before, rather than a guess."""
    client, _, _ = make_client(page_ms=300)
    assert "X-Ocr-Page-Ms" not in client.get("/readyz").headers
    answer = client.post("/ocr", json={"file": image_b64(2000, 0)})
    assert answer.status_code == 200
    said = int(answer.headers["X-Ocr-Page-Ms"])
    assert 250 <= said <= 3000  # a page of the sim's 300 ms, priced by its pixels
    assert int(client.get("/readyz").headers["X-Ocr-Page-Ms"]) == said
