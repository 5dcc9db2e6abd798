"""Keeping a worker's memory flat (docs/operations.md "Memory"): reading the process's resident
memory, handing freed heap back to the OS after large pages, and noticing when the steady level
passes the configured ceiling (the process is then replaced: services/ocr_worker/recycle.py).

Why trimming: with onnxruntime's CPU arena off, a large page's activations (about 1 GB for a
300-dpi A4 scan) are malloc'ed and freed on every call; glibc keeps much of what was freed in
its heaps (RSS stays hundreds of MB above the idle level, growing with page variety) until
malloc_trim(0) returns it. It costs milliseconds, so it runs only after large pages.

The ceiling is checked on the inference thread right after an engine call and a trim: that is
the steady level (the call's transient peak is gone), not a peak sample."""

from __future__ import annotations

import logging
import time
from typing import Callable

from services.ocr_api.heap import malloc_trim, rss_bytes

log = logging.getLogger("ocr_worker.memory")

MIB = 1024 * 1024


class MemoryKeeper:
    """Runs after every engine call (`after_batch`, on the inference thread): trims the heap
    after a batch of at least `trim_min_pixels`, then compares RSS with `ceiling_bytes`
    (0 = no ceiling) and calls `over_ceiling(rss)` once, again only after `retry_s` if the
    process is still over it (a replacement that failed to start)."""

    def __init__(self, *, trim_min_pixels: int, ceiling_bytes: int,
                 over_ceiling: Callable[[int], None],
                 observe: Callable[[int], None] = lambda rss: None,
                 rss: Callable[[], int] = rss_bytes, trim: Callable[[], bool] = malloc_trim,
                 retry_s: float = 300.0):
        self.trim_min_pixels = trim_min_pixels
        self.ceiling_bytes = ceiling_bytes
        self._over_ceiling = over_ceiling
        self._observe = observe
        self._rss = rss
        self._trim = trim
        self._retry_s = retry_s
        self._asked_at: float | None = None
        self.trims = 0

    def after_batch(self, pixels: int) -> None:
        if self.trim_min_pixels and pixels >= self.trim_min_pixels:
            if self._trim():
                self.trims += 1
        rss = self._rss()
        self._observe(rss)
        if not self.ceiling_bytes or rss <= self.ceiling_bytes:
            return
        now = time.monotonic()
        if self._asked_at is not None and now - self._asked_at < self._retry_s:
            return
        self._asked_at = now
        log.warning("resident memory %d MiB is over the ceiling of %d MiB: asking for a "
                    "replacement process", rss // MIB, self.ceiling_bytes // MIB)
        self._over_ceiling(rss)
