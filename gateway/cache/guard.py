"""The page cache's store behind a circuit breaker. The cache is an optimisation: a store that
fails (down, full, corrupt) or answers slowly must cost a page nothing, so the first call that
fails or takes longer than the store's timeout marks the store down, and every call after it
is skipped at once (its page is read through) while a background thread pings the store,
more and more rarely (1 s, doubling, at most 30 s), until it answers; then the cache is used
again. The thread that hit the fault waits for at most one timeout; the others not at all.
Each change of state is a log line; each failed call counts in
`ocr_gateway_cache_errors_total{call}`, and a lookup skipped meanwhile in
`ocr_gateway_cache_lookups_total{result="unavailable"}`."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from .. import metrics

log = logging.getLogger("gateway.cache")

FIRST_RETRY_S = 1.0
MAX_RETRY_S = 30.0


class StoreGuard:
    """Calls into `store` (one with `ping()`), each timed against `timeout_s`; `back()` is
    called on the probe's thread once the store answers again."""

    def __init__(self, store: Any, timeout_s: float, first_retry_s: float = FIRST_RETRY_S,
                 max_retry_s: float = MAX_RETRY_S, clock=time.monotonic,
                 back: Callable[[], None] = lambda: None):
        self.store = store
        self.back = back
        self.timeout_s = timeout_s
        self.first_retry_s = first_retry_s
        self.max_retry_s = max_retry_s
        self.clock = clock
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._up_since = float("-inf")
        self._retry_s = first_retry_s
        self._stop = threading.Event()
        self._prober: threading.Thread | None = None

    @property
    def up(self) -> bool:
        return self._down_since is None

    def call(self, what: str, call: Callable[[], Any], default: Any = None) -> Any:
        """`call()`'s answer; `default` at once while the store is down, or when it fails."""
        if self._down_since is not None:
            return default
        started = self.clock()
        try:
            answer = call()
        except Exception as exc:
            self._failed(what, f"{type(exc).__name__}: {exc}")
            return default
        took = self.clock() - started
        if took > self.timeout_s:  # answered, but slowly: the next call may not at all
            self._failed(what, f"took {took:.2f} s (timeout {self.timeout_s:g} s)")
        return answer

    def _failed(self, what: str, why: str) -> None:
        metrics.CACHE_ERRORS.labels(what).inc()
        with self._lock:
            if self._down_since is not None or self._stop.is_set():
                return
            now = self.clock()
            # down again soon after it came back (a full store): wait longer this time
            soon = now - self._up_since < self.max_retry_s
            self._retry_s = min(self.max_retry_s, self._retry_s * 2) if soon \
                else self.first_retry_s
            self._down_since = now
            self._prober = threading.Thread(target=self._probe, name="cache-store-probe",
                                             daemon=True)
            self._prober.start()
        log.warning("page cache store failed (%s: %s): pages are read through without it "
                    "until it answers again (next try in %g s)", what, why, self._retry_s)

    def _probe(self) -> None:
        """Ping the store now and then until it answers within its timeout."""
        retry_s = self._retry_s
        while not self._stop.wait(retry_s):
            started = self.clock()
            try:
                self.store.ping()
                if self.clock() - started <= self.timeout_s:
                    break
            except Exception as exc:
                log.debug("page cache store still failing: %s: %s", type(exc).__name__, exc)
            retry_s = min(self.max_retry_s, retry_s * 2)
        else:
            return
        with self._lock:
            down_for = self.clock() - (self._down_since or self.clock())
            self._down_since = None
            self._up_since = self.clock()
        log.warning("page cache store answers again after %.1f s: the cache is used again",
                    down_for)
        try:
            self.back()
        except Exception:
            log.exception("page cache: catching up after the store came back failed")

    def close(self) -> None:
        self._stop.set()
        prober = self._prober
        if prober is not None:
            prober.join(timeout=5)
