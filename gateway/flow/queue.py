"""The fair page queue: admitted documents (`Document`) wait here, one ring of them per
priority class (`FairQueue`), until the scheduler (gateway.scheduler) has room for a page.

Fair share: within a priority class, the next free slot goes to the document with the fewest
chunks in flight, ties taken in turn (round-robin); interactive documents (/ocr) go before
batch ones (jobs). Documents thus hold equal shares of the fleet's slots, and a 1-page request
that arrives behind eight 40-page PDFs takes the very next free slot, not the 321st.

A document's chunks are cut from its source (gateway.plan) only when they are about to go out
(`Task`: one chunk on its way); request threads read the answers in page order
(`Document.in_order`). Plain objects under the scheduler's lock, which the tests drive with a
fake clock."""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Protocol

from services.ocr_api import tracing
from services.ocr_api.errors import ApiError

from .. import metrics
from ..assemble import PageOutcome
from ..endpoint import OCR, Endpoint
from ..split import Chunk
from . import lead

INTERACTIVE = "interactive"
BATCH = "batch"
PRIORITIES = (INTERACTIVE, BATCH)
CLIENT_CHECK_S = 0.5  # how often a waiting request checks that its client is still there


class Source(Protocol):
    """A document's chunks (gateway.plan.ChunkSource): each group of pages cut as a
    standalone document when it is about to go out, and the request body that carries it."""

    def cut(self, group: tuple[int, ...]) -> Chunk: ...

    def body(self, chunk: Chunk) -> bytes: ...

    def close(self) -> None: ...


class Ticket(Protocol):
    """The document's room in the gateway's queue (gateway.admission): given back, whole,
    when the document is finished."""

    def release(self) -> None: ...


@dataclass
class Task:
    """One chunk of a document on its way: `position` is its place in the document's order."""

    position: int
    chunk: Chunk | None = None  # cut just before it is first sent
    attempts: int = 0
    tried: set[str] = field(default_factory=set)
    not_before: float = 0.0
    sent: bool = False  # counted in the retry budget's sends
    later: set[str] = field(default_factory=set)  # replicas that would start it too late
    refusals: int = 0  # how often (Outcome.LATER): the next try may wait longer
    cache: Any = None  # its gateway.cache Entry, once looked up


class Document:
    """One admitted document. The scheduler side (take, put_back) runs under the scheduler's
    lock; the request side reads `answers` in order (`in_order`)."""

    _ids = itertools.count(1)

    def __init__(self, groups: list[tuple[int, ...]], source: Source, ticket: Ticket | None = None,
                 *, log_id: str, deadline: float, kind: str, priority: str = INTERACTIVE,
                 cache: Any = None, endpoint: Endpoint = OCR):
        self.id = next(self._ids)
        self.endpoint = endpoint  # the worker route its chunks go to (gateway/endpoint.py)
        self.cache = cache  # gateway.cache.DocumentCache, or None: every chunk is sent
        self.groups = groups
        self.num_chunks = len(groups)
        self.ticket = ticket
        self.log_id = log_id
        self.deadline = deadline
        self.admitted_at = time.monotonic()
        self.kind = kind
        self.priority = priority
        self.pending: deque[Task] = deque()  # chunks put back (busy or retry), by position
        self.next_position = 0
        self.inflight = 0
        self.sent = 0  # chunks sent at least once (gateway.flow.lead)
        self.weight = lead.Weight()  # its share of the fleet, in equal shares
        self.moved = 0.0  # of a share, from or to its process's other documents (gateway.flow.lead)
        self.stopped = False  # nothing more is sent (deadline, cancel, or failure)
        self.finished = False
        self.answers: queue.Queue = queue.Queue()
        self.trace = tracing.capture()  # its span (the request's): the send threads' parent
        self._source = source
        self._cut_lock = threading.Lock()  # the source is used or closed under it

    @property
    def share(self) -> float:
        """Its part of its process's room, in equal shares: its weight in the fleet, and what
        is moved to or from the process's other documents (gateway.flow.lead)."""
        return max(lead.STEP, self.weight.value + self.moved)

    @property
    def urgent(self) -> bool:
        """An interactive document of one chunk (one page by default: an image, say): the
        worker reads it before the pages queued there, so it waits at most for the page in
        the engine, not for pages other gateways queued there (X-Ocr-Priority: high)."""
        return self.priority == INTERACTIVE and self.num_chunks == 1

    # ---- scheduler side ----------------------------------------------------------------------
    def has_queued(self) -> bool:
        """Chunks still to send (now or after a backoff): what makes it count in the fleet's
        shares (gateway.flow.share)."""
        return not self.stopped and (self.next_position < self.num_chunks or bool(self.pending))

    def sendable(self, now: float) -> bool:
        if self.stopped or now >= self.deadline:  # past it: stopped at the next tidy
            return False
        return self.next_position < self.num_chunks or any(
            t.not_before <= now for t in self.pending)

    def take(self, now: float) -> Task:
        for task in self.pending:
            if task.not_before <= now:
                self.pending.remove(task)
                return task
        task = Task(self.next_position)
        self.next_position += 1
        metrics.observe_queue_wait(now - self.admitted_at, self.deadline - self.admitted_at)
        if task.position == 0:
            tracing.record("queue wait", self.admitted_at, now, self.trace, self.log_id)
        return task

    def put_back(self, task: Task) -> None:
        """Back in position order, so the earliest page goes out first."""
        index = next((i for i, t in enumerate(self.pending) if t.position > task.position),
                     len(self.pending))
        self.pending.insert(index, task)

    def earliest_retry(self) -> float | None:
        return min((t.not_before for t in self.pending), default=None)

    def cut(self, position: int) -> Chunk:
        with self._cut_lock:
            if self.finished:
                raise ApiError(499, "the document was cancelled")
            return self._source.cut(self.groups[position])

    def body(self, chunk: Chunk) -> bytes:
        return self._source.body(chunk)

    def close(self) -> None:
        """The document is done with: its source closed, its pages' room in the queue given
        back (its bytes go back when its answer has gone: whoever opened it)."""
        with self._cut_lock:
            self._source.close()
        if self.ticket is not None:
            self.ticket.release_pages()

    # ---- request side ------------------------------------------------------------------------
    def in_order(self, client_gone: Callable[[], bool] = lambda: False,
                 grace_s: float = 5.0) -> Iterator[list[PageOutcome]]:
        """Each chunk's pages in document order, as soon as it and all before it are done.
        Ends early once the document is stopped and nothing more can arrive; raises 504 when
        the deadline (plus a grace for pages in flight) passes, 499 if the client is gone."""
        waiting: dict[int, list[PageOutcome]] = {}
        head = 0
        next_check = time.monotonic() + CLIENT_CHECK_S
        while head < self.num_chunks:
            if time.monotonic() >= next_check:
                if client_gone():
                    raise ApiError(499, "The client closed the connection")
                next_check = time.monotonic() + CLIENT_CHECK_S
            if head in waiting:
                yield waiting.pop(head)
                head += 1
                continue
            if self.stopped and self.inflight == 0 and self.answers.empty():
                if time.monotonic() >= self.deadline:
                    break
                return  # stopped on purpose (a failed page without partial results)
            remaining = self.deadline + grace_s - time.monotonic()
            if remaining <= 0:
                break
            try:
                position, pages = self.answers.get(timeout=min(remaining, CLIENT_CHECK_S))
                waiting[position] = pages
            except queue.Empty:
                pass
        if head < self.num_chunks:
            raise ApiError(504, "The request deadline passed before all pages were processed")


class FairQueue:
    """Round-robin over the documents of each priority class, interactive first. Pure."""

    def __init__(self):
        self._rings: dict[str, deque[Document]] = {p: deque() for p in PRIORITIES}

    def add(self, doc: Document) -> None:
        self._rings[doc.priority].append(doc)

    def remove(self, doc: Document) -> None:
        try:
            self._rings[doc.priority].remove(doc)
        except ValueError:
            pass

    def documents(self) -> list[Document]:
        return [doc for ring in self._rings.values() for doc in ring]

    def pick(self, now: float, quota: int | None = None,
             urgent_only: bool = False) -> Document | None:
        """The next document with a chunk to send now: of the first priority class that has
        one, the document with the fewest chunks in flight, ties in turn (it then moves to the
        back of its ring; an urgent one first among equals). So documents share the fleet's
        slots evenly (each one's in flight counted over its weight, gateway.flow.lead), and a new
        document (nothing in flight yet) gets the very next free slot. A document already at
        `quota` chunks in flight (its equal share of the whole fleet, gateway.flow.share; times its
        weight) waits: the room another document leaves is not its to take.
        `urgent_only`: only room for an urgent page."""
        for priority in PRIORITIES:
            ring = self._rings[priority]
            ready = [(doc.inflight / doc.share, not doc.urgent, turn, doc)
                     for turn, doc in enumerate(ring)
                     if doc.sendable(now) and (doc.urgent or not urgent_only)
                     and (quota is None or doc.inflight < max(1.0, quota * doc.share))]
            if ready:
                doc = min(ready, key=lambda item: item[:3])[3]
                ring.remove(doc)
                ring.append(doc)
                return doc
        return None

    def has_urgent(self, now: float) -> bool:
        """An urgent document has its page to send (`Document.urgent`)."""
        return any(doc.urgent and doc.sendable(now) for doc in self._rings[INTERACTIVE])

    def next_wake(self) -> float | None:
        """The earliest time a waiting retry or a deadline needs the scheduler's attention."""
        times = []
        for doc in self.documents():
            if not doc.stopped:
                times.append(doc.deadline)
                retry = doc.earliest_retry()
                if retry is not None:
                    times.append(retry)
        return min(times) if times else None

    def abandoned(self, now: float, after_s: float) -> list[Document]:
        return [d for d in self.documents()
                if d.stopped and d.inflight == 0 and d.deadline + after_s <= now]

    def expire(self, now: float) -> list[Document]:
        """Stop the documents whose deadline has passed: their queued chunks are never sent."""
        expired = [d for d in self.documents() if not d.stopped and d.deadline <= now]
        for doc in expired:
            doc.stopped = True
        return expired


def let_go(tasks: Iterable[Task]) -> None:
    """Chunks that will not be sent (again) by this document: whatever page they hold in
    flight in the cache is let go, so a document waiting for it takes it over."""
    for task in tasks:
        if task.cache is not None:
            task.cache.release()
