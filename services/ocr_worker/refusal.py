"""Refusals: the worker's cheap 503s that send a page to another replica at once.

Each is decided before the request's body is read, in microseconds: the model is not loaded
yet, the page would not start as soon as the caller asks (an image, X-Ocr-Start-Within-Ms),
or this worker already holds the pages that keep it busy (X-Ocr-Within-Target). A refusal
says when this worker would have started the page (X-Ocr-Starts-In-Ms): the gateway books
it as a refusal (Outcome.LATER), never as a failure, and tries another worker. A worker that
is broken, not busy, answers 500 instead, so that callers stop sending to it."""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterator

from services.ocr_api.errors import ApiError, bad_request
from services.ocr_api.fleet_board import slots_of
from services.ocr_api.headers import PRIORITY, STARTS_IN_MS, START_WITHIN_MS

from .admission import Admission, AtTarget
from .batcher import InferenceBatcher, StartsLater
from .capacity import Pace


class Refusals:
    def __init__(self, admission: Admission, batcher: InferenceBatcher, pace: Pace,
                 retry_after_s: int):
        self.admission = admission
        self.batcher = batcher
        self.pace = pace
        self.retry_after_s = retry_after_s

    def unless_ready(self) -> None:
        """500 when the model failed to load (broken, not busy); 503 while it loads."""
        if self.batcher.load_error:
            raise ApiError(500, self.batcher.load_error)
        if not self.batcher.ready.is_set():
            raise ApiError(503, "The model is still loading: retry shortly",
                           {"Retry-After": str(self.retry_after_s)})

    def if_late(self, start_within_ms: int, first: bool) -> None:
        """503 (with the estimate) when the request's page would not start that soon: the
        caller tries another worker rather than wait out a long page here. (Told again, and
        held to, as the page is queued: `late`.) Only a page read before the queued ones
        (X-Ocr-Priority: high) has a start this worker can tell."""
        if not first:
            raise bad_request(f"{START_WITHIN_MS} goes with {PRIORITY}: high")
        try:
            self.batcher.check_start(start_within_ms / 1000.0)
        except StartsLater as exc:
            raise self.late(exc, start_within_ms) from None

    @contextmanager
    def admit(self, within_target: bool, first: bool) -> Iterator[None]:
        """One admission slot; `within_target`: only while this worker holds fewer requests
        than its target's whole pages (Pace), else the 503 a late page gets. Gateways that
        each place pages by what a worker last told them (a list of replicas) would otherwise
        queue several at a worker that looked emptiest to all of them, pages that wait there
        for page times while others idle. A `first` request (an image) is not held
        (services/ocr_worker/admission.py)."""
        at_most = slots_of(self.pace.target()) if within_target and not first else None
        try:
            with self.admission.admit(at_most, first):
                yield
        except AtTarget as full:
            waits_ms = self._starts_in_ms(self.batcher.first_wait_s())
            raise self._refusal(f"This worker holds the {full.at_most} page(s) that keep it "
                                "busy: send the page to another replica", waits_ms) from None

    def late(self, late: StartsLater, start_within_ms: int) -> ApiError:
        """The refusal of a page that would start later than it asks."""
        waits_ms = self._starts_in_ms(late.wait_s)
        if math.isfinite(late.wait_s):
            why = (f"would start the page in about {waits_ms} ms, later than "
                   f"{START_WITHIN_MS} asks ({start_within_ms} ms)")
        else:
            why = "has a page under way and, having timed none yet, cannot tell when it ends"
        return self._refusal(f"This worker {why}: send the page to another replica", waits_ms)

    def _starts_in_ms(self, wait_s: float) -> int:
        """X-Ocr-Starts-In-Ms for a wait: with no telling yet (no engine call timed), how long
        the page under way has run (as long again is the even guess)."""
        if not math.isfinite(wait_s):
            wait_s = self.batcher.progress().since_progress_s
        return max(1, int(wait_s * 1000))

    def _refusal(self, message: str, waits_ms: int) -> ApiError:
        return ApiError(503, message, {"Retry-After": str(self.retry_after_s),
                                       STARTS_IN_MS: str(waits_ms)})
