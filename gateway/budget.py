"""The fleet-wide retry budget (Envoy's and Finagle's idea): retries of real failures may add
at most `ratio` extra attempts over a sliding window, plus a small floor so that a quiet gateway
can still retry. A poison page or a dying replica then cannot multiply the load. Busy answers
are not retries and never spend budget. Pure: the clock is injected."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable


class RetryBudget:
    def __init__(self, ratio: float = 0.2, min_retries: int = 10, window_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic):
        self.ratio = ratio
        self.min_retries = min_retries
        self.window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._sends: deque[float] = deque()
        self._retries: deque[float] = deque()

    def _trim(self, now: float) -> None:
        for events in (self._sends, self._retries):
            while events and events[0] <= now - self.window_s:
                events.popleft()

    def record_send(self) -> None:
        """A first attempt of a chunk went out."""
        with self._lock:
            self._sends.append(self._clock())

    def try_spend(self) -> bool:
        """True (and the retry is booked) if one more retry fits the budget now."""
        with self._lock:
            now = self._clock()
            self._trim(now)
            if len(self._retries) >= self.min_retries + self.ratio * len(self._sends):
                return False
            self._retries.append(now)
            return True
