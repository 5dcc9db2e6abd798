"""The gateway's front door: a document is admitted only if its pages (and bytes) fit the
queue, so once admitted it is never failed for lack of capacity; otherwise it gets 429 with a
Retry-After estimated from the pages/s the fleet has been doing, before any page is sent.
Also keeps that rate (pages done over the last minute) for Retry-After and the fleet panel.
Pure apart from a lock and the queued-pages gauge; the clock is injected."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

from services.ocr_api.errors import ApiError

from . import metrics

RATE_WINDOW_S = 60.0


@dataclass
class Ticket:
    """One request's room in the queue: its bytes (the body while it is read, then the
    document and its answer until the answer is sent) and its pages, which count down as
    they are done. The pages left go back when the document is finished (`release_pages`),
    the bytes when the answer has gone (`release`); both idempotent."""

    door: "FrontDoor"
    pages: int
    nbytes: int
    done_pages: int = 0
    released: bool = False

    def pages_done(self, count: int) -> None:
        self.door.pages_done(self, count)

    def release_pages(self) -> None:
        self.door.release_pages(self)

    def release(self) -> None:
        self.door.release(self)


class FrontDoor:
    def __init__(self, max_pages: int, max_bytes: int,
                 clock: Callable[[], float] = time.monotonic):
        self.max_pages = max_pages
        self.max_bytes = max_bytes
        self._clock = clock
        self._lock = threading.Lock()
        self.queued_pages = 0
        self.queued_bytes = 0
        self._done: deque[tuple[float, int]] = deque()

    def reserve(self, nbytes: int) -> Ticket:
        """Before a body is read: room for the memory reading it takes, or 429 at once (also
        when the queue's pages are already full: the body is never read for nothing). The
        bytes are a budget of the process's memory: what a request holds counts until it is
        answered. One request larger than the budget goes through when nothing else is held
        (the request size limit bounds it)."""
        with self._lock:
            if self.queued_pages >= self.max_pages or (
                    self.queued_bytes and self.queued_bytes + nbytes > self.max_bytes):
                raise self._full()
            self.queued_bytes += nbytes
            self._gauges()
            return Ticket(self, 0, nbytes)

    def admit(self, pages: int, nbytes: int, ticket: Ticket | None = None) -> Ticket:
        """Room for a whole document's pages, or 429; `nbytes` is what it holds from now on
        (replacing what `ticket` reserved to read it). A document larger than the whole
        queue is admitted when the queue is empty (the page limit per request bounds it)."""
        with self._lock:
            held = ticket.nbytes if ticket is not None else 0
            empty = self.queued_pages == 0
            if not empty and (self.queued_pages + pages > self.max_pages
                              or self.queued_bytes - held + nbytes > self.max_bytes):
                raise self._full()
            ticket = ticket or Ticket(self, 0, 0)
            self.queued_pages += pages
            self.queued_bytes += nbytes - held
            ticket.pages, ticket.nbytes = pages, nbytes
            self._gauges()
            return ticket

    def pages_done(self, ticket: Ticket, count: int) -> None:
        with self._lock:
            count = min(count, ticket.pages - ticket.done_pages)
            if ticket.released or count <= 0:
                return
            ticket.done_pages += count
            self.queued_pages -= count
            self._done.append((self._clock(), count))
            self._gauges()

    def release_pages(self, ticket: Ticket) -> None:
        """The pages not done go back (the document is finished); its bytes stay held."""
        with self._lock:
            if not ticket.released:
                self.queued_pages -= ticket.pages - ticket.done_pages
                ticket.pages = ticket.done_pages
                self._gauges()

    def release(self, ticket: Ticket) -> None:
        with self._lock:
            if ticket.released:
                return
            ticket.released = True
            self.queued_pages -= ticket.pages - ticket.done_pages
            self.queued_bytes -= ticket.nbytes
            self._gauges()

    def _gauges(self) -> None:
        metrics.QUEUED_PAGES.set(self.queued_pages)
        metrics.HELD_BYTES.set(self.queued_bytes)

    def pages_per_second(self) -> float:
        with self._lock:
            return self._rate_locked()

    def _rate_locked(self) -> float:
        now = self._clock()
        while self._done and self._done[0][0] <= now - RATE_WINDOW_S:
            self._done.popleft()
        if not self._done:
            return 0.0
        span = max(1.0, min(RATE_WINDOW_S, now - self._done[0][0]))
        return sum(count for _, count in self._done) / span

    def _full(self) -> ApiError:
        rate = self._rate_locked()
        wait = self.queued_pages / rate if rate > 0 else 5.0
        retry_after = max(1, min(300, math.ceil(wait)))
        return ApiError(429, f"The gateway's queue is full ({self.queued_pages} pages queued, "
                             f"limit {self.max_pages}; {self.queued_bytes // 2**20} MB held, "
                             f"limit {self.max_bytes // 2**20} MB): retry after "
                             f"{retry_after} s", {"Retry-After": str(retry_after)})
