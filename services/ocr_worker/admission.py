"""Admission control: at most `capacity` requests are admitted (queued or being served) at
once; the next one is refused at once, never parked. Draining refuses everything new while
what was admitted finishes (graceful shutdown).

MemoryBudget bounds the bytes of request data held at once (bodies, decoded files, rendered
pages): a request reserves its body when admitted and its pages once its document is opened;
one that does not fit is refused with 503 + Retry-After (busy), not parked. A request larger
than the whole budget is admitted only when it is alone, so it is never refused forever.

A request may also be admitted only while fewer than `at_most` are held (the worker's target,
when the gateway asks: services/ocr_worker/capacity.py): checked under the same lock as the
capacity, so requests that arrive together are not all let in. Held: admitted and not read
first (`first`: an image, read before the queued pages). An image admitted just before the
page under way ends would otherwise take that page's successor's place: the successor refused
and sent elsewhere, the worker idle once the image is read, its gateways told it was full."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

from services.ocr_api.errors import ApiError, overloaded


class AtTarget(RuntimeError):
    """The worker already holds the pages its target says keep it busy (`at_most`)."""

    def __init__(self, at_most: int):
        super().__init__(at_most)
        self.at_most = at_most


class Admission:
    def __init__(self, capacity: int, retry_after_s: int):
        self.capacity = capacity
        self.retry_after_s = retry_after_s
        self._lock = threading.Lock()
        self._admitted = 0
        self._first = 0  # of those, requests read before the queued pages (images)
        self.draining = False

    @property
    def admitted(self) -> int:
        return self._admitted

    @property
    def held(self) -> int:
        """Admitted requests not read first: what `at_most` counts."""
        return self._admitted - self._first

    @property
    def free(self) -> int:
        return 0 if self.draining else max(0, self.capacity - self._admitted)

    @contextmanager
    def admit(self, at_most: int | None = None, first: bool = False) -> Iterator[None]:
        """Hold one admission slot for the body of the `with`, or raise 503 with Retry-After;
        AtTarget when `at_most` requests are held already (`held`). `first`: a request read
        before the queued pages, not held."""
        with self._lock:
            if self.draining:
                raise ApiError(503, "This worker is shutting down: send the request to another "
                                    "replica", {"Retry-After": str(self.retry_after_s)})
            if at_most is not None and self.held >= at_most:
                raise AtTarget(at_most)
            if self._admitted >= self.capacity:
                raise overloaded(f"This worker's queue is full ({self.capacity} requests): "
                                 f"retry after {self.retry_after_s} s or on another replica",
                                 self.retry_after_s)
            self._admitted += 1
            self._first += first
        try:
            yield
        finally:
            with self._lock:
                self._admitted -= 1
                self._first -= first


class MemoryBudget:
    """At most `budget_bytes` reserved at once (0: no limit)."""

    def __init__(self, budget_bytes: int, retry_after_s: int):
        self.budget_bytes = budget_bytes
        self.retry_after_s = retry_after_s
        self._lock = threading.Lock()
        self._reserved = 0
        self._holders = 0

    @property
    def reserved(self) -> int:
        return self._reserved

    @contextmanager
    def reserve(self, nbytes: int) -> Iterator["Reservation"]:
        reservation = Reservation(self)
        with self._lock:
            self._holders += 1
        try:
            reservation.grow_to(nbytes)
            yield reservation
        finally:
            with self._lock:
                self._reserved -= reservation.nbytes
                self._holders -= 1

    def _grow(self, reservation: "Reservation", nbytes: int) -> None:
        with self._lock:
            extra = nbytes - reservation.nbytes
            if extra <= 0:
                return
            alone = self._holders == 1
            if (self.budget_bytes and self._reserved + extra > self.budget_bytes
                    and not alone):
                mib = 1024 * 1024
                raise overloaded(
                    f"This worker's memory budget is taken ({self._reserved // mib} of "
                    f"{self.budget_bytes // mib} MiB reserved; this request needs "
                    f"{nbytes // mib + 1} MiB): retry after {self.retry_after_s} s or on "
                    "another replica", self.retry_after_s)
            self._reserved += extra
            reservation.nbytes = nbytes


class Reservation:
    """One request's share of a MemoryBudget; only grows."""

    def __init__(self, budget: MemoryBudget):
        self._budget = budget
        self.nbytes = 0

    def grow_to(self, nbytes: int) -> None:
        """Hold `nbytes` in all, or raise 503 (busy) if they do not fit."""
        self._budget._grow(self, nbytes)
