"""The inference thread and admission control, with a scripted engine instead of a model."""

import math
import threading
import time

import numpy as np
import pytest

from services.ocr_api.errors import ApiError
from services.ocr_worker.admission import Admission, AtTarget
from services.ocr_worker.batcher import DeadlineExceeded, EngineNotReady, InferenceBatcher, \
    StartsLater
from tests.conftest import wait_until


class RecordingEngine:
    info = {}

    def __init__(self, delay=0.0, fail_on=None, load_error=None):
        self.calls = []
        self.threads = set()
        self.delay = delay
        self.fail_on = fail_on
        self.load_error = load_error
        self.gate = threading.Event()
        self.gate.set()

    def load(self):
        if self.load_error:
            raise RuntimeError(self.load_error)

    def predict(self, images, params):
        self.gate.wait(5)
        self.threads.add(threading.get_ident())
        self.calls.append(([int(image[0, 0, 0]) for image in images], dict(params)))
        if self.fail_on is not None and any(int(i[0, 0, 0]) == self.fail_on for i in images):
            raise ValueError("bad page")
        time.sleep(self.delay)
        return [int(image[0, 0, 0]) for image in images]


def page(value):
    return np.full((2, 2, 3), value, np.uint8)


def started(engine, **kwargs):
    options = dict(queue_pages=16, max_batch=4, batch_wait_s=0.05, warmup=False)
    options.update(kwargs)
    batcher = InferenceBatcher(engine, **options)
    batcher.start()
    assert batcher.ready.wait(5)
    return batcher


def test_pages_with_same_params_are_batched_and_results_keep_order():
    engine = RecordingEngine()
    engine.gate.clear()  # hold the thread so the pages queue up
    batcher = started(engine)
    futures = [batcher.submit(page(i), {"text_det_thresh": 0.3}) for i in range(1, 6)]
    engine.gate.set()
    assert [f.result(5) for f in futures] == [1, 2, 3, 4, 5]
    sizes = [len(pages) for pages, _ in engine.calls]
    assert max(sizes) > 1, sizes
    assert sum(sizes) == 5
    batcher.stop(5)


def test_different_params_are_never_mixed_in_one_call():
    engine = RecordingEngine()
    engine.gate.clear()
    batcher = started(engine)
    futures = [batcher.submit(page(i), {"text_det_thresh": 0.3 if i % 2 else 0.5})
               for i in range(1, 7)]
    engine.gate.set()
    assert [f.result(5) for f in futures] == list(range(1, 7))
    for pages, params in engine.calls:
        expected = 0.3 if pages[0] % 2 else 0.5
        assert all((0.3 if p % 2 else 0.5) == expected for p in pages)
        assert params == {"text_det_thresh": expected}
    batcher.stop(5)


def test_one_thread_calls_the_engine():
    engine = RecordingEngine()
    batcher = started(engine, max_batch=1)
    results = []
    threads = [threading.Thread(target=lambda i=i: results.append(
        batcher.submit(page(i), {}).result(5))) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == list(range(20))
    assert len(engine.threads) == 1
    batcher.stop(5)


def test_a_failing_page_fails_alone():
    engine = RecordingEngine(fail_on=3)
    engine.gate.clear()
    batcher = started(engine)
    futures = [batcher.submit(page(i), {}) for i in range(1, 6)]
    engine.gate.set()
    with pytest.raises(ValueError):
        futures[2].result(5)
    assert [futures[i].result(5) for i in (0, 1, 3, 4)] == [1, 2, 4, 5]
    batcher.stop(5)


def test_cancelled_pages_are_skipped():
    engine = RecordingEngine()
    engine.gate.clear()
    batcher = started(engine, max_batch=1)
    first = batcher.submit(page(1), {})
    second = batcher.submit(page(2), {})
    assert second.cancel()
    engine.gate.set()
    assert first.result(5) == 1
    batcher.stop(5)
    assert all(2 not in pages for pages, _ in engine.calls)


def test_a_first_page_goes_before_the_queued_ones_but_not_before_the_one_in_the_engine():
    """X-Ocr-Priority: high (a one-page interactive request): it waits for the page being
    read, not for the pages other callers queued; the rest keep their order, and stop()
    still finishes every queued page."""
    engine = RecordingEngine()
    engine.gate.clear()
    batcher = started(engine, max_batch=1)
    running = batcher.submit(page(1), {})
    wait_until(lambda: batcher.progress().in_engine == 1, timeout=5)
    queued = [batcher.submit(page(i), {}) for i in (2, 3)]
    urgent = [batcher.submit(page(i), {}, first=True) for i in (4, 5)]
    engine.gate.set()
    assert [f.result(5) for f in (running, *queued, *urgent)] == [1, 2, 3, 4, 5]
    assert [pages for pages, _ in engine.calls] == [[1], [4], [5], [2], [3]]
    late = batcher.submit(page(6), {})
    batcher.stop(5)
    assert late.result(5) == 6


def test_load_failure_is_reported_not_raised():
    batcher = InferenceBatcher(RecordingEngine(load_error="no model"), queue_pages=2,
                               max_batch=1, batch_wait_s=0, warmup=False)
    batcher.start()
    wait_until(lambda: batcher.load_error, what="the load error")
    assert not batcher.ready.is_set()
    assert "no model" in batcher.load_error
    with pytest.raises(EngineNotReady):
        batcher.submit(page(1), {})


def test_admission_refuses_at_once_when_full_and_when_draining():
    admission = Admission(capacity=2, retry_after_s=3)
    with admission.admit(), admission.admit():
        # at once: on this thread, while the two admitted ones are still held, so a refusal
        # that waited for a slot would never return (the test timeout would end it)
        with pytest.raises(ApiError) as caught:
            with admission.admit():
                pass
        assert caught.value.status == 503
        assert caught.value.headers["Retry-After"] == "3"
    with admission.admit():
        assert admission.admitted == 1
    admission.draining = True
    with pytest.raises(ApiError) as caught:
        with admission.admit():
            pass
    assert caught.value.status == 503 and "shutting down" in caught.value.message


def test_admission_within_a_number_refuses_beyond_it_under_its_lock():
    """`at_most` (the worker's target, when the gateway asks) is checked with the capacity
    under one lock: of requests that arrive together, only that many are let in."""
    admission = Admission(capacity=8, retry_after_s=3)
    with admission.admit(at_most=2), admission.admit(at_most=2):
        with pytest.raises(AtTarget) as caught:
            with admission.admit(at_most=2):
                pass
        assert caught.value.at_most == 2 and admission.admitted == 2
        with admission.admit():  # a page that did not ask: up to the capacity
            assert admission.admitted == 3
    barrier, admitted, refused = threading.Barrier(6), [], []

    def arrive():
        barrier.wait(5)
        try:
            with admission.admit(at_most=2):
                admitted.append(1)
                barrier.wait(5)  # held until all six have asked
        except AtTarget:
            refused.append(1)
            barrier.wait(5)

    threads = [threading.Thread(target=arrive) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert (len(admitted), len(refused)) == (2, 4)


def test_admission_within_a_number_counts_the_pages_held_not_the_images():
    """An image (read before the queued pages) is admitted but not held: a document page
    that asks to stay within the number still comes in beside one, and the image does not
    make room for a second page either."""
    admission = Admission(capacity=8, retry_after_s=3)
    with admission.admit(first=True):
        assert (admission.admitted, admission.held) == (1, 0)
        with admission.admit(at_most=1):
            assert (admission.admitted, admission.held) == (2, 1)
            with pytest.raises(AtTarget):
                with admission.admit(at_most=1):
                    pass
            with admission.admit(first=True):  # another image, beyond the number
                assert (admission.admitted, admission.held) == (3, 1)
    assert (admission.admitted, admission.held) == (0, 0)


def test_a_page_past_its_deadline_is_dropped_not_inferred():
    engine = RecordingEngine()
    engine.gate.clear()
    batcher = started(engine, max_batch=1)
    first = batcher.submit(page(1), {})
    deadline = time.monotonic() + 0.05
    late = batcher.submit(page(2), {}, deadline=deadline)
    wait_until(lambda: time.monotonic() > deadline, interval=0.01)  # the engine held past it
    engine.gate.set()
    assert first.result(5) == 1
    with pytest.raises(DeadlineExceeded):
        late.result(5)
    batcher.stop(5)
    assert all(2 not in pages for pages, _ in engine.calls)


def test_submit_waits_for_room_only_until_the_deadline():
    engine = RecordingEngine()
    engine.gate.clear()
    batcher = started(engine, max_batch=1, queue_pages=1)
    batcher.submit(page(1), {})  # taken by the inference thread, held at the gate
    deadline = time.monotonic() + 5
    while batcher._queue.qsize() and time.monotonic() < deadline:
        time.sleep(0.01)
    batcher.submit(page(2), {})  # fills the queue
    with pytest.raises(DeadlineExceeded):
        batcher.submit(page(3), {}, deadline=time.monotonic() + 0.05)
    with pytest.raises(DeadlineExceeded):
        batcher.submit(page(4), {}, deadline=time.monotonic() - 1)
    engine.gate.set()
    batcher.stop(5)
    assert [pages for pages, _ in engine.calls] == [[1], [2]]


def test_after_batch_hears_the_pixels_of_each_engine_call():
    heard = []
    batcher = started(RecordingEngine(), max_batch=1, after_batch=heard.append)
    batcher.submit(page(1), {}).result(5)
    batcher.submit(np.zeros((10, 20, 3), np.uint8), {}).result(5)
    batcher.stop(5)
    assert heard == [4, 200]


def test_a_first_page_is_told_how_long_the_page_in_the_engine_and_the_first_pages_ahead_take():
    """first_wait_s: the rest of the engine call under way plus the `first` pages queued
    ahead, at the engine's pace as timed (seconds per pixel); 0 with nothing running."""
    engine = RecordingEngine(delay=0.05)
    batcher = started(engine, max_batch=1)
    assert batcher.first_wait_s() == 0.0  # no call timed yet
    batcher.submit(page(1), {}).result(5)  # 4 pixels in >= 50 ms: >= 12.5 ms a pixel
    assert batcher.first_wait_s() == 0.0  # idle
    engine.gate.clear()
    running = batcher.submit(np.full((400, 400, 3), 2, np.uint8), {})
    wait_until(lambda: batcher.progress().in_engine == 1)
    alone = batcher.first_wait_s()
    assert alone > 1000  # 160,000 pixels at >= 12.5 ms each, minus the moments since
    behind = batcher.submit(page(3), {})  # a normal page: an image overtakes it
    assert batcher.first_wait_s() <= alone
    ahead = batcher.submit(np.full((100, 100, 3), 4, np.uint8), {}, first=True)
    assert batcher.first_wait_s() > alone + 100  # 10,000 more pixels
    engine.gate.set()
    for future in (running, ahead, behind):
        future.result(5)
    wait_until(lambda: batcher.progress().idle)
    assert batcher.first_wait_s() == 0.0
    batcher.stop(5)


def test_a_worker_that_has_timed_no_page_promises_no_start_while_one_is_under_way():
    """Before its first engine call ends, a worker cannot tell when a page under way ends:
    idle, a `first` page starts at once (0); busy, there is no telling (inf), so an image
    that asks to start soon is refused and tries another worker instead of waiting out the
    page."""
    engine = RecordingEngine()
    batcher = started(engine, max_batch=1)
    wait_until(lambda: batcher.progress().idle)
    assert batcher.first_wait_s() == 0.0
    engine.gate.clear()
    running = batcher.submit(page(1), {})
    wait_until(lambda: batcher.progress().in_engine == 1)
    assert batcher.first_wait_s() == math.inf
    with pytest.raises(StartsLater):
        batcher.submit(page(2), {}, first=True, start_within_s=10_000)
    engine.gate.set()
    assert running.result(5) == 1
    wait_until(lambda: batcher.progress().idle)
    assert batcher.first_wait_s() == 0.0  # timed now, and idle
    batcher.stop(5)


def test_a_first_page_that_would_start_later_than_asked_is_not_queued():
    engine = RecordingEngine(delay=0.05)
    batcher = started(engine, max_batch=1)
    batcher.submit(page(1), {}).result(5)  # timed: >= 12.5 ms a pixel
    engine.gate.clear()
    running = batcher.submit(np.full((400, 400, 3), 2, np.uint8), {})
    wait_until(lambda: batcher.progress().in_engine == 1)
    with pytest.raises(StartsLater) as refused:
        batcher.submit(page(3), {}, first=True, start_within_s=1.0)
    assert refused.value.wait_s > 1000
    before = batcher.first_wait_s()
    assert batcher.progress().queued == 0 and before <= refused.value.wait_s  # not counted
    taken = batcher.submit(page(4), {}, first=True, start_within_s=10_000)
    engine.gate.set()
    assert (running.result(5), taken.result(5)) == (2, 4)
    assert [values for values, _ in engine.calls] == [[1], [2], [4]]
    batcher.stop(5)
