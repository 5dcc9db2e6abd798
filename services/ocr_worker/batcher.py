"""The single inference thread and the bounded page queue in front of it.

Request threads `submit()` pages (blocking briefly when the queue is full: that is back-pressure
from an admitted request, bounded by the admission limit) and get a Future per page. The one
inference thread loads the engine, warms it up, then takes pages in arrival order, those
submitted `first` (a one-page interactive request, X-Ocr-Priority: high) before the others,
grouping up to `max_batch` pages with identical parameters that arrive within `batch_wait_s`.
A page waits behind the `first` pages that arrive while it is queued (never behind one in
the engine); the gateway marks only one-page interactive requests, each within its fair
share of the fleet, so a long document's pages are delayed by them, not starved. Each page's
share of an engine call is a span ("engine") under the request that queued it.

`first_wait_s()` says about how long a `first` page queued now would wait to start: the rest
of the engine call under way and the `first` pages ahead of it, at the engine's recent
seconds per pixel. A caller that wants its page started soon (X-Ocr-Start-Within-Ms) is
refused at once when that is too long, and tries another worker."""

from __future__ import annotations

import itertools
import logging
import math
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from services.ocr_api import tracing
from services.ocr_api.logs import current_log_id

from .capacity import ewma
from .engine import Engine, PageOutput

log = logging.getLogger("ocr_worker.batcher")

_STOP = object()
FIRST, NORMAL, LAST = 0, 1, 2  # queue ranks: X-Ocr-Priority high, the rest, the stop mark


@dataclass
class PageJob:
    image: np.ndarray
    params: dict[str, Any]
    future: Future = field(default_factory=Future)
    enqueued_at: float = field(default_factory=time.monotonic)
    deadline: float | None = None  # time.monotonic() after which nobody waits for the page
    # taken on the request thread that queues the page: its engine span goes under that request
    trace: Any = field(default_factory=tracing.capture)
    log_id: str | None = field(default_factory=current_log_id.get)

    @property
    def params_key(self) -> tuple:
        return tuple(sorted(self.params.items()))

    @property
    def pixels(self) -> int:
        return self.image.shape[0] * self.image.shape[1]


class EngineNotReady(RuntimeError):
    pass


class DeadlineExceeded(RuntimeError):
    """The page's request deadline passed before the page could be queued or inferred."""


class StartsLater(RuntimeError):
    """A `first` page would not start within what its caller asked (`submit`)."""

    def __init__(self, wait_s: float):
        super().__init__(f"it would start in about {wait_s:.3f} s")
        self.wait_s = wait_s


@dataclass(frozen=True)
class Progress:
    """What the inference thread is doing, for liveness (see health.py)."""

    loaded: bool  # the model is loaded and warmed up
    running: bool  # the inference thread is alive
    stopping: bool  # stop() was called: the thread is meant to end
    idle: bool  # blocked waiting for a page: not stuck, however long ago the last one was
    in_engine: int  # pages in the engine call under way (0: none)
    queued: int  # pages waiting for the thread
    since_progress_s: float  # since a page last went into or came out of the engine


class InferenceBatcher:
    def __init__(self, engine: Engine, *, queue_pages: int, max_batch: int,
                 batch_wait_s: float, warmup: bool,
                 observe: Callable[[str, Any], None] | None = None,
                 after_batch: Callable[[int], None] | None = None):
        self.engine = engine
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_s
        self.warmup = warmup
        self._queue: queue.PriorityQueue = queue.PriorityQueue(maxsize=queue_pages)
        self._order = itertools.count()  # arrival order within a rank
        self._observe = observe or (lambda event, value: None)
        self._after_batch = after_batch or (lambda pixels: None)
        self._thread = threading.Thread(target=self._run, name="inference", daemon=True)
        self._held_back: PageJob | None = None
        self.ready = threading.Event()
        self.load_error: str | None = None
        self.load_seconds: float | None = None
        self._progress_at = time.monotonic()
        self._in_engine = 0
        self._idle = False
        self._stopping = False
        self._seconds_per_pixel: float | None = None  # the engine's recent pace
        self._engine_pixels = 0  # of the engine call under way
        self._first_pixels = 0  # of the `first` pages queued
        self._first_lock = threading.Lock()

    # ---- request-thread side -------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def submit(self, image: np.ndarray, params: dict[str, Any],
               deadline: float | None = None, first: bool = False,
               start_within_s: float | None = None) -> Future:
        """Queue one page (`first`: before the pages queued now); waits for room at most
        until `deadline` (DeadlineExceeded). `start_within_s` (with `first`): unless it would
        start that soon (`first_wait_s`), StartsLater instead. Told as it is queued, not
        before the request was read: a page under way that ends in the meantime would let a
        queued page start first, and the promise would not hold."""
        if not self.ready.is_set():
            raise EngineNotReady(self.load_error or "the model is still loading")
        job = PageJob(image=image, params=params, deadline=deadline)
        timeout = None if deadline is None else deadline - time.monotonic()
        if first and start_within_s is not None:
            self.check_start(start_within_s)
        if first:  # counted before the inference thread can take it
            self._count_first(job.pixels)
        try:
            if timeout is not None and timeout <= 0:
                raise queue.Full
            self._put(FIRST if first else NORMAL, job, timeout)
        except queue.Full:
            if first:
                self._count_first(-job.pixels)
            raise DeadlineExceeded("the request deadline passed while waiting for room in "
                                   "the page queue") from None
        self._observe("enqueued", self._queue.qsize())
        return job.future

    def check_start(self, start_within_s: float) -> None:
        """StartsLater unless a `first` page queued now would start within `start_within_s`."""
        wait_s = self.first_wait_s()
        if wait_s > start_within_s:
            raise StartsLater(wait_s)

    def first_wait_s(self) -> float:
        """About how long a `first` page queued now would wait to start (module docstring):
        0 with nothing under way or ahead of it. Until an engine call has been timed (a
        worker's first pages), with something under way or ahead: `math.inf`, no telling
        (told 0, a worker reading its first page took images a fleet sent it as it started,
        each promised a start within 250 ms, and kept them a whole page)."""
        rate = self._seconds_per_pixel
        held = self._held_back
        ahead = self._first_pixels + (held.pixels if held is not None else 0)
        if rate is None:
            return math.inf if ahead or not self._idle else 0.0
        running = 0.0
        if self._in_engine:
            left = rate * self._engine_pixels - (time.monotonic() - self._progress_at)
            running = max(0.0, left)
        return running + rate * ahead

    def progress(self) -> Progress:
        return Progress(
            loaded=self.ready.is_set(), running=self._thread.is_alive(),
            stopping=self._stopping, idle=self._idle, in_engine=self._in_engine,
            queued=self._queue.qsize() + (self._held_back is not None),
            since_progress_s=time.monotonic() - self._progress_at)

    def stop(self, timeout: float | None = None) -> None:
        """Finish the pages already queued, then end the inference thread."""
        self._stopping = True
        self._put(LAST, _STOP)
        self._thread.join(timeout)

    def _put(self, rank: int, item: Any, timeout: float | None = None) -> None:
        self._queue.put((rank, next(self._order), item), timeout=timeout)

    def _count_first(self, pixels: int) -> None:
        with self._first_lock:
            self._first_pixels += pixels

    # ---- inference-thread side -----------------------------------------------------------
    def _run(self) -> None:
        started = time.monotonic()
        try:
            self.engine.load()
            if self.warmup:
                self._warm_up()
        except Exception as exc:  # a broken model must show in /readyz, not kill the process
            log.exception("engine failed to load")
            self.load_error = f"the model failed to load: {exc}"
            return
        self.load_seconds = time.monotonic() - started
        self._observe("loaded", self.load_seconds)
        self.ready.set()
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            self._infer(batch)
            pixels = sum(job.pixels for job in batch)
            del batch  # the pages go when their requests have encoded them
            try:
                self._after_batch(pixels)
            except Exception:  # housekeeping must never stop inference
                log.exception("after_batch failed")

    def _warm_up(self) -> None:
        import cv2

        canvas = np.full((96, 480, 3), 255, np.uint8)
        cv2.putText(canvas, "warm up 0123", (8, 64), cv2.FONT_HERSHEY_SIMPLEX, 1.4, (0, 0, 0), 3)
        self.engine.predict([canvas], {})

    def _next_batch(self) -> list[PageJob] | None:
        first = self._held_back
        self._held_back = None
        if first is None:
            self._idle = True
            waited_from = time.monotonic() if self._queue.empty() else None
            first = self._take(self._queue.get())
            self._progress_at, self._idle = time.monotonic(), False
            if waited_from is not None:  # the engine sat idle until this page came
                self._observe("idle", self._progress_at - waited_from)
            if first is _STOP:
                return None
        batch = [first]
        deadline = time.monotonic() + self.batch_wait_s
        while len(batch) < self.max_batch:
            remaining = deadline - time.monotonic()
            try:
                job = self._take(self._queue.get(timeout=remaining) if remaining > 0 else
                                 self._queue.get_nowait())
            except queue.Empty:
                break
            if job is _STOP:
                self._put(LAST, _STOP)  # seen again after this batch
                break
            if job.params_key != first.params_key:
                self._held_back = job
                break
            batch.append(job)
        self._observe("dequeued", self._queue.qsize())
        return batch

    def _take(self, item: tuple[int, int, Any]) -> Any:
        """A queue item's page (or the stop mark), no longer counted as a `first` page ahead."""
        rank, _, job = item
        if rank == FIRST:
            self._count_first(-job.pixels)
        return job

    def _infer(self, batch: list[PageJob]) -> None:
        live = [job for job in batch if job.future.set_running_or_notify_cancel()]
        now = time.monotonic()
        for job in live:
            if job.deadline is not None and job.deadline <= now:
                job.future.set_exception(DeadlineExceeded(
                    "the request deadline passed while the page waited in the queue"))
        live = [job for job in live if not job.future.done()]
        if not live:
            return
        for job in live:
            self._observe("queue_wait", now - job.enqueued_at)
        try:
            outputs = self._predict(live)
        except Exception as exc:
            if len(live) > 1:  # isolate the page that breaks the batch
                for job in live:
                    self._infer_one_of_failed_batch(job)
                return
            log.exception("inference failed")
            live[0].future.set_exception(exc)
            return
        for job, output in zip(live, outputs):
            job.future.set_result(output)

    def _infer_one_of_failed_batch(self, job: PageJob) -> None:
        try:
            job.future.set_result(self._predict([job])[0])
        except Exception as exc:
            log.exception("inference failed")
            job.future.set_exception(exc)

    def _predict(self, jobs: list[PageJob]) -> list[PageOutput]:
        pixels = sum(job.pixels for job in jobs)
        started = self._progress_at = time.monotonic()
        self._engine_pixels, self._in_engine = pixels, len(jobs)
        try:
            outputs = self.engine.predict([job.image for job in jobs], jobs[0].params)
        finally:
            self._progress_at, self._in_engine = time.monotonic(), 0
            for job in jobs:  # each request's span of the batch's engine call
                tracing.record("engine", started, self._progress_at, job.trace, job.log_id,
                               batch=len(jobs), queued_s=round(started - job.enqueued_at, 6))
        seconds = time.monotonic() - started
        self._seconds_per_pixel = ewma(self._seconds_per_pixel, seconds / max(1, pixels), 0.2)
        self._observe("inference", (seconds, len(jobs)))
        if len(outputs) != len(jobs):
            raise RuntimeError(f"engine returned {len(outputs)} results for {len(jobs)} pages")
        return outputs
