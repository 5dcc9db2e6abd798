"""The gateway's page queue: admitted documents wait here, and a page goes out only when a
replica has room for it (gateway.flow.replicas keeps each replica's adaptive limit).

Fair share: within a priority class, the next free slot goes to the document with the fewest
chunks in flight, ties taken in turn (round-robin); interactive documents (/ocr) go before
batch ones (jobs). Documents thus hold equal shares of the fleet's slots, and a 1-page request
that arrives behind eight 40-page PDFs takes the very next free slot, not the 321st.

Busy is not down: a chunk answered 503/429 goes back to the front of its document's queue
without spending an attempt. A real failure (connection error, timeout, 5xx) is retried on
another replica after a jittered backoff while the page has attempts left and the fleet-wide
retry budget (gateway.budget) allows. A document past its deadline sends nothing more; a
cancelled one (the client went away) drops its queued chunks.

Threads: one scheduler thread per gateway process picks the next chunk (`_run`), cuts it from
its document (lazily, gateway.split) and hands it to the executor, whose threads send it
(`_send`) and book the answer (`_settle`). Request threads only read answers in page order
(`Document.in_order`) and cancel. The send threads' attempt spans go under the span the
document was admitted in (`Document.trace`: contexts do not cross threads by themselves). All
document and queue state is guarded by one condition variable; `FairQueue` and `Document` are
plain objects the tests drive with a fake clock."""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol

from services.ocr_api import tracing
from services.ocr_api.errors import ApiError

from . import assemble, metrics
from .flow import lead
from .assemble import PageOutcome
from .backoff import Backoff
from .budget import RetryBudget
from .dispatch import ReplicaClient
from .endpoint import OCR, Endpoint
from .outcome import Attempt, Outcome
from .flow.reserve import PageTime, UrgentLoad
from .split import Chunk
from .flow.replicas import NoReplicas, Replica, ReplicaSet

log = logging.getLogger("gateway.scheduler")

INTERACTIVE = "interactive"
BATCH = "batch"
PRIORITIES = (INTERACTIVE, BATCH)
CLIENT_CHECK_S = 0.5  # how often a waiting request checks that its client is still there
ABANDON_AFTER_S = 60.0  # past its deadline, a document nobody reads is dropped from the queue
RETRY_CAP_S = 30.0  # the longest wait before a failed page is tried again
TIDY_S = 0.05  # deadlines and abandoned documents are looked at least this often
# an urgent page asks to start within these, one per try (X-Ocr-Start-Within-Ms): a worker
# whose page under way ends later refuses it at once (Outcome.LATER) and the next try goes to
# another; after the last, to whichever worker comes
START_WITHIN_S = (0.25, 0.35, 0.5, 0.7, 1.0, 1.4, 2.0, 2.8)


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
        return max(lead.MIN, self.weight.value + self.moved)

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


@dataclass(frozen=True)
class SchedulerSettings:
    max_attempts: int = 4
    backoff_s: float = 0.2


class Scheduler:
    def __init__(self, replicas: ReplicaSet, client: ReplicaClient, executor: ThreadPoolExecutor,
                 settings: SchedulerSettings, budget: RetryBudget):
        self.replicas = replicas
        self.client = client
        self.executor = executor
        self.settings = settings
        self.budget = budget
        self.fair = FairQueue()
        self.failure: str | None = None
        self._cond = threading.Condition()
        self._stop = False
        self._tidied_at = float("-inf")
        self._page_s: float | None = None  # what a page's attempt took lately (`_reweigh`)
        self._urgent = UrgentLoad()  # workers this process's urgent pages keep busy
        self._page_time = PageTime()  # whether pages are long (gateway.flow.reserve)
        self._reserving = False  # the fleet keeps workers idle for urgent pages (gateway.flow.reserve)
        self._thread = threading.Thread(target=self._run, name="scheduler", daemon=True)
        replicas.on_change(self._wake)

    def start(self) -> None:
        """Idempotent; also called by the first submit (an app built with start=False, as in
        tests, still serves)."""
        with self._cond:
            if self._thread.ident is None and not self._stop:  # never started (not: died)
                self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # ---- request-thread side -----------------------------------------------------------------
    def submit(self, doc: Document) -> Document:
        self.start()
        with self._cond:
            self.fair.add(doc)
            if not doc.urgent:  # its first page goes out after a tidy (`_reweigh`), not
                self._tidied_at = float("-inf")  # within TIDY_S of the last one
            self._tell_demand()
            self._cond.notify_all()
        return doc

    def finish(self, doc: Document) -> None:
        """The request is done with the document (answered, failed or gone): nothing more of
        it is sent, and its place in the queue is freed."""
        with self._cond:
            if doc.finished:
                return
            doc.stopped = doc.finished = True
            _let_go(doc.pending)
            doc.pending.clear()
            self.fair.remove(doc)
            self._tell_demand()
        doc.close()

    def stop_sending(self, doc: Document) -> None:
        with self._cond:
            doc.stopped = True
            _let_go(doc.pending)
            doc.pending.clear()
            self._tell_demand()

    def _tell_demand(self) -> None:
        """Under the lock: this process's weight in the fleet (gateway.flow.share): its documents
        with chunks still to send, and the chunks in flight of those with none left (they
        hold a slot each, and no more). An urgent document holds its one slot from the
        start: waiting for a worker to start it, it must not take a whole document's quota
        of the fleet from the others' documents; none while the fleet keeps workers idle for
        urgent pages (gateway.flow.reserve), which it runs on (and a process serving only images
        then stays quiet, instead of telling every worker as it wakes and goes quiet with each
        one). A document with pages to send counts its weight (gateway.flow.lead)."""
        queued, held = 0.0, 0
        for doc in self.fair.documents():
            if doc.urgent:
                if not self._reserving:
                    held += 1 if doc.has_queued() else doc.inflight
            elif doc.has_queued():
                queued += doc.weight.value
            else:
                held += doc.inflight
        self.replicas.set_demand(queued, held)

    def reweigh(self, now: float) -> None:
        """What the scheduler thread does at each tidy (`_tidy`): tell the board, weigh the
        documents (below)."""
        with self._cond:
            self._reweigh(now)

    def _reweigh(self, now: float) -> None:
        """Under the lock: tell the board the workers this process's urgent pages keep busy
        (`_say_urgent`) and the rate its documents were sent at, and weigh each by its lead
        on the fleet's (gateway.flow.lead). Not before a page has come back: until then no lead
        can show."""
        page_s = self._page_s
        docs = [d for d in self.fair.documents() if not d.urgent and d.has_queued()]
        self._say_urgent(now, bool(docs))
        share = self.replicas.share()
        if share is not None and self._reserving != (share.reserve > 0):
            self._reserving = share.reserve > 0
            self._tell_demand()
        if share is None or page_s is None:
            return
        rates = [lead.rate(d.sent, now - d.admitted_at, page_s) for d in docs]
        mine = sum(rates) / len(rates) if rates else 0.0
        self.replicas.fleet.set_rate(mine)
        if share.rate is None:
            return
        weights = [doc.weight.value for doc in docs]
        spans = [now - doc.admitted_at + page_s for doc in docs]  # a lead is a rate's over these
        for doc, own, span in zip(docs, rates, spans):
            doc.weight.follow((own - share.rate) * span, share.quota, now, page_s)
        leads = [(own - mine) * span for own, span in zip(rates, spans)]  # on its process's
        for doc, moved in zip(docs, lead.moves(leads, share.quota)):
            doc.moved = moved
        if weights != [doc.weight.value for doc in docs]:
            self._tell_demand()

    def _say_urgent(self, now: float, documents: bool) -> None:
        """Under the lock: the workers this process's urgent pages keep busy, said while pages
        are long (or may be: none timed yet), and whether it has
        `documents` with pages to send and no page timed yet (gateway.flow.reserve); without
        documents and a page timed, as the processes with documents say (FleetView)."""
        unknown = not self._page_time.known()
        self.replicas.fleet.set_urgent(
            self._urgent.load(now) if unknown or self._page_time.long() else 0.0,
            page_time_unknown=documents and unknown,
            follow=unknown and not documents)

    def snapshot(self) -> dict[str, int]:
        with self._cond:
            docs = self.fair.documents()
            queued = sum(d.num_chunks - d.next_position + len(d.pending)
                         for d in docs if not d.stopped)
            return {"queuedChunks": queued, "queuedDocuments": len(docs),
                    "inflightChunks": sum(d.inflight for d in docs)}

    # ---- scheduler thread --------------------------------------------------------------------
    def _run(self) -> None:
        """The scheduler thread. A fault while handling one chunk fails that chunk (as a
        real failure: retried elsewhere within the budget), never the loop; if the loop
        itself ever ends otherwise, `failure` says why (and /readyz, /healthz with it)."""
        try:
            while True:
                with self._cond:
                    if self._stop:
                        return
                    picked = self._pick()
                    if picked is None:
                        continue
                    doc, task = picked
                try:
                    self._dispatch(doc, task)
                except Exception as exc:
                    log.exception("dispatching a chunk failed", extra={"logId": doc.log_id})
                    self._chunk_fault(doc, task, None, exc)
        except BaseException as exc:
            self.failure = f"the page scheduler stopped: {type(exc).__name__}: {exc}"
            log.critical(self.failure)
            raise

    @property
    def alive(self) -> bool:
        """False once the scheduler thread has died (not merely not started yet)."""
        return self.failure is None

    def _chunk_fault(self, doc: Document, task: Task, url: str | None,
                     exc: Exception) -> None:
        """A bug or an answer nothing expected, while handling one chunk: a failed attempt."""
        self._retry_or_fail(doc, task, url, Attempt(
            Outcome.FAILED, None, {}, f"gateway error handling the chunk: {type(exc).__name__}"))

    def _pick(self) -> tuple[Document, Task] | None:
        """Under the lock: the next (document, chunk) to send, or None after waiting a while
        for room, a retry's time or a new document."""
        now = time.monotonic()
        if now - self._tidied_at >= TIDY_S:
            self._tidy(now)
        room = self.replicas.has_room()
        urgent_only = not room and self.fair.has_urgent(now) and self.replicas.has_room(True)
        doc = (self.fair.pick(now, self.replicas.document_quota(), urgent_only)
               if room or urgent_only else None)
        if doc is None:  # about to wait: tidy first, then wait for what comes first
            if self._tidied_at != now:
                self._tidy(now)
            wake = self.fair.next_wake()
            if not room:
                wake = min(filter(None, (wake, self.replicas.next_change())), default=None)
            self._cond.wait(timeout=_until(wake, now, cap=1.0 if not room else 5.0))
            return None
        task = doc.take(now)
        doc.inflight += 1
        if not doc.urgent and not doc.has_queued():  # (an urgent one held its slot already)
            self._tell_demand()
        return doc, task

    def _tidy(self, now: float) -> None:
        """Under the lock: stop the documents past their deadline, finish the abandoned ones.
        Before every wait, and at least every TIDY_S while pages flow (not on every page: it
        looks at every document)."""
        self._tidied_at = now
        self._reweigh(now)
        expired = self.fair.expire(now)
        if expired:
            self._tell_demand()
        for doc in expired:
            metrics.EXPIRED.inc()
            log.warning("deadline passed with pages queued; they are not sent",
                        extra={"logId": doc.log_id})
        for doc in self.fair.abandoned(now, ABANDON_AFTER_S):
            self.finish(doc)  # its request never read it (e.g. a stream nobody started)

    def _dispatch(self, doc: Document, task: Task) -> None:
        if doc.cache is not None and task.cache is None:
            if self._cut(doc, task, None) and self._from_cache(doc, task):
                return  # answered from the cache, now or once the same page in flight is
            if task.chunk is None:
                return  # it could not be cut: its pages failed
        try:
            replica = self.replicas.acquire(task.tried | task.later, urgent=doc.urgent)
        except NoReplicas:
            replica = None
        if replica is None:  # only possible when the replica set changed under us
            self._requeue(doc, task, delay=0.05)
            return
        try:
            if task.chunk is None and not self._cut(doc, task, replica):
                return
            if not task.sent:
                task.sent = True
                doc.sent += 1
                self.budget.record_send()
            self.executor.submit(self._send, doc, task, replica)
        except Exception:
            self.replicas.give_back(replica)  # the fault itself is the caller's to book
            raise

    def _cut(self, doc: Document, task: Task, replica: Replica | None) -> bool:
        """Cut the task's chunk; False when it cannot be (its pages have failed)."""
        try:
            task.chunk = doc.cut(task.position)
            return True
        except ApiError as exc:  # a damaged page, or the document was cancelled
            if replica is not None:
                self.replicas.give_back(replica)
            self._settle_pages(doc, task, assemble.failed_pages(
                doc.groups[task.position], exc.status, exc.message, doc.kind))
            return False

    def _from_cache(self, doc: Document, task: Task) -> bool:
        """Look the chunk up (gateway.cache): True when it is answered from the cache, or
        waits for the same page in flight elsewhere (the waiters' thread then settles it, or
        puts it back to be sent); False: send it."""
        entry = task.cache = doc.cache.lookup(task.chunk.data, task.chunk.kind)
        if entry.result is not None:
            self._settle_cached(doc, task)
            return True
        if entry.waiting:
            entry.wait(doc.deadline, lambda: self._waited(doc, task))
            return True
        return False

    def _waited(self, doc: Document, task: Task) -> None:
        """The waiters' thread: the page in flight elsewhere is done (or given up on)."""
        if task.cache.result is not None:
            self._settle_cached(doc, task)
        else:
            self._requeue(doc, task, delay=0.0)  # sent after all

    def _settle_cached(self, doc: Document, task: Task) -> None:
        try:
            pages = assemble.pages_from_reply({"result": task.cache.result},
                                              task.chunk.page_indices, doc.kind,
                                              doc.endpoint.results)
        except assemble.MalformedReply:  # not what was stored: read it again
            task.cache.result = None
            self._requeue(doc, task, delay=0.0)
            return
        for page in pages:
            page.cached = True
        doc.cache.hits += len(pages)
        metrics.CACHE_PAGES.inc(len(pages))
        self._settle_pages(doc, task, pages)

    def _send(self, doc: Document, task: Task, replica: Replica) -> None:
        """Executor thread: one attempt, then book its answer."""
        if doc.stopped:
            self.replicas.give_back(replica)
            self._requeue(doc, task, delay=0.0)
            return
        with tracing.span("attempt", doc.log_id, doc.trace, tracing.CLIENT, replica=replica.url,
                          pages=[i + 1 for i in doc.groups[task.position]],
                          attempt=task.attempts + 1) as span:
            try:
                attempt = self.client.post(replica, doc.body(task.chunk), log_id=doc.log_id,
                                           deadline=doc.deadline, first=doc.urgent,
                                           start_within_s=_start_within(doc, task),
                                           path=doc.endpoint.path)
                if attempt.outcome is Outcome.OK:
                    self.page_timed(attempt.seconds, doc.urgent)
            except Exception as exc:  # never lose a page to a bug in the send path
                log.exception("sending a chunk failed")
                attempt = Attempt(Outcome.FAILED, None, {},
                                  f"gateway error: {type(exc).__name__}")
            failed = attempt.outcome not in (Outcome.OK, Outcome.BUSY, Outcome.LATER)
            tracing.settle(span, attempt.message if failed else None,
                           outcome=attempt.outcome.value, status=attempt.status,
                           worker=attempt.worker)
        try:
            self.replicas.release(replica, attempt)
            self._settle(doc, task, replica.url, attempt)
        except Exception as exc:  # an answer nothing expected: that chunk fails, not the rest
            log.exception("handling a replica's answer failed", extra={"logId": doc.log_id})
            self._chunk_fault(doc, task, replica.url, exc)

    def page_timed(self, seconds: float, urgent: bool = False) -> None:
        """A page's attempt came back in `seconds` (the send threads book each): how long
        pages take (gateway.flow.reserve, the weighing's window) and, for an urgent page, the
        workers urgent pages keep busy."""
        if urgent:
            self._urgent.record(seconds, time.monotonic())
            return
        self._page_time.record(seconds)
        self.replicas.fleet.page_back()
        page_s = self._page_s  # (a lost update between send threads changes nothing much)
        self._page_s = seconds if page_s is None else page_s + 0.1 * (seconds - page_s)

    def _settle(self, doc: Document, task: Task, url: str, attempt: Attempt) -> None:
        outcome = attempt.outcome
        metrics.ATTEMPTS.labels(outcome.value).inc()
        if outcome is Outcome.OK:
            try:
                pages = assemble.pages_from_reply(attempt.payload, task.chunk.page_indices,
                                                  doc.kind, doc.endpoint.results)
            except assemble.MalformedReply as exc:
                pages = assemble.failed_pages(task.chunk.page_indices, 502, str(exc), doc.kind)
            else:
                if task.cache is not None:
                    task.cache.finish(attempt.payload["result"], attempt.engine, url)
            self._settle_pages(doc, task, pages)
        elif outcome is Outcome.REJECTED:
            self._settle_pages(doc, task, assemble.failed_pages(
                task.chunk.page_indices, attempt.status, attempt.message, doc.kind))
        elif outcome is Outcome.BUSY:
            self._requeue(doc, task, delay=0.0)
        elif outcome is Outcome.LATER:
            task.refusals += 1
            task.later.add(url)
            self._requeue(doc, task, delay=0.0)
        else:
            self._retry_or_fail(doc, task, url, attempt)

    def _retry_or_fail(self, doc: Document, task: Task, url: str | None,
                       attempt: Attempt) -> None:
        task.attempts += 1
        if url is not None:
            task.tried.add(url)
        reason = str(attempt.status) if attempt.status else "connection"
        pages = doc.groups[task.position]
        label = _label(pages)
        if (task.attempts < self.settings.max_attempts
                and doc.deadline > time.monotonic() and self.budget.try_spend()):
            metrics.RETRIES.labels(reason).inc()
            log.warning("retrying chunk on another replica",
                        extra={"chunk": label, "replica": url, "attempt": task.attempts,
                               "status": attempt.status, "reason": attempt.message,
                               "logId": doc.log_id})
            self._requeue(doc, task, delay=self._backoff(task.attempts))
            return
        why = ("the fleet's retry budget is spent"
               if task.attempts < self.settings.max_attempts else
               f"after {task.attempts} attempt(s) on {len(task.tried)} replica(s)")
        if task.attempts < self.settings.max_attempts:
            metrics.RETRIES_DENIED.inc()
        code = 504 if attempt.status == 504 or attempt.timed_out else 502
        if attempt.status and attempt.status >= 500 and attempt.status not in (502, 504):
            code = attempt.status
        self._settle_pages(doc, task, assemble.failed_pages(
            pages, code, f"{label} failed {why}: {attempt.message}", doc.kind))

    def _backoff(self, attempts: int) -> float:
        return Backoff(self.settings.backoff_s, RETRY_CAP_S, (0.5, 1.5)).delay(attempts)

    def _requeue(self, doc: Document, task: Task, delay: float) -> None:
        with self._cond:
            doc.inflight -= 1
            if doc.finished:
                _let_go([task])
            else:
                task.not_before = time.monotonic() + delay
                was_queued = doc.has_queued()
                doc.put_back(task)
                if not was_queued:
                    self._tell_demand()
            self._cond.notify_all()

    def _settle_pages(self, doc: Document, task: Task, pages: list[PageOutcome]) -> None:
        _let_go([task])
        with self._cond:
            doc.answers.put((task.position, pages))  # before inflight drops: see in_order
            doc.inflight -= 1
            if not doc.has_queued():
                self._tell_demand()
            self._cond.notify_all()


def _let_go(tasks) -> None:
    """Chunks that will not be sent (again) by this document: whatever page they hold in
    flight in the cache is let go, so a document waiting for it takes it over."""
    for task in tasks:
        if task.cache is not None:
            task.cache.release()


def _start_within(doc: Document, task: Task) -> float | None:
    """How soon an urgent page asks to start at the worker it goes to (START_WITHIN_S)."""
    if not doc.urgent or task.refusals >= len(START_WITHIN_S):
        return None
    return START_WITHIN_S[task.refusals]


def _until(when: float | None, now: float, cap: float) -> float:
    return cap if when is None else max(0.001, min(cap, when - now))


def _label(page_indices: tuple[int, ...]) -> str:
    first, last = page_indices[0] + 1, page_indices[-1] + 1
    return f"page(s) {first}-{last}" if last != first else f"page {first}"

