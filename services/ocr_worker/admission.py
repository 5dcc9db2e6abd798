"""Admission control: at most `capacity` requests are admitted (queued or being served) at
once; the next one is refused at once, never parked. Draining refuses everything new while
what was admitted finishes (graceful shutdown)."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

from services.ocr_api.errors import ApiError, overloaded


class Admission:
    def __init__(self, capacity: int, retry_after_s: int):
        self.capacity = capacity
        self.retry_after_s = retry_after_s
        self._lock = threading.Lock()
        self._admitted = 0
        self.draining = False

    @property
    def admitted(self) -> int:
        return self._admitted

    @contextmanager
    def admit(self) -> Iterator[None]:
        """Hold one admission slot for the body of the `with`, or raise 503 with Retry-After."""
        with self._lock:
            if self.draining:
                raise ApiError(503, "This worker is shutting down: send the request to another "
                                    "replica", {"Retry-After": str(self.retry_after_s)})
            if self._admitted >= self.capacity:
                raise overloaded(f"This worker's queue is full ({self.capacity} requests): "
                                 f"retry after {self.retry_after_s} s or on another replica",
                                 self.retry_after_s)
            self._admitted += 1
        try:
            yield
        finally:
            with self._lock:
                self._admitted -= 1
