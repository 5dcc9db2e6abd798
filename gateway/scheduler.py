"""The gateway's page scheduler: admitted documents wait in the fair queue
(gateway.flow.queue), and a page goes out only when a replica has room for it
(gateway.flow.replicas keeps each replica's adaptive limit).

Fair share: within a priority class, the next free slot goes to the document with the fewest
chunks in flight, ties taken in turn (round-robin); interactive documents (/ocr) go before
batch ones (jobs). Documents thus hold equal shares of the fleet's slots, and a 1-page request
that arrives behind eight 40-page PDFs takes the very next free slot, not the 321st.

Busy is not down: a chunk answered 503/429 goes back to the front of its document's queue
without spending an attempt. A real failure (connection error, timeout, 5xx) is retried on
another replica after a jittered backoff while the page has attempts left and the fleet-wide
retry budget (gateway.budget) allows (gateway.flow.settle). A document past its deadline sends
nothing more; a cancelled one (the client went away) drops its queued chunks.

Threads: one scheduler thread per gateway process picks the next chunk (`_run`), cuts it from
its document (lazily, gateway.split) and hands it to the executor, whose threads send it
(`_send`) and book the answer (`Settler.settle`). Request threads read answers in page order
(`Document.in_order`) and cancel; one with an image that can start now sends it itself
(`submit`). The send threads' attempt spans go under the span the document was admitted in
(`Document.trace`: contexts do not cross threads by themselves). All document and queue state
is guarded by one condition variable, the scheduler's; the Settler and the Demand (what this
process tells the fleet, gateway.flow.demand) work under it."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from services.ocr_api import tracing
from services.ocr_api.errors import ApiError

from . import assemble, metrics
from .budget import RetryBudget
from .dispatch import ReplicaClient
from .flow.demand import Demand
from .flow.queue import Document, FairQueue, Task, let_go
from .flow.replicas import NoReplicas, Replica, ReplicaSet
from .flow.reserve import START_WITHIN_S
from .flow.settle import Settler
from .flow.share import REBALANCE_S
from .outcome import Attempt, Outcome

log = logging.getLogger("gateway.scheduler")

ABANDON_AFTER_S = 60.0  # past its deadline, a document nobody reads is dropped from the queue


@dataclass(frozen=True)
class SchedulerSettings:
    max_attempts: int = 4
    backoff_s: float = 0.2


class Scheduler:
    """Picks the next chunk from the fair queue (gateway.flow.queue) when a replica has room,
    cuts it (looked up in the page cache first, when there is one) and sends it; what each
    answer comes to is the Settler's (gateway.flow.settle), what the fleet hears of this
    process the Demand's (gateway.flow.demand)."""

    def __init__(self, replicas: ReplicaSet, client: ReplicaClient, executor: ThreadPoolExecutor,
                 settings: SchedulerSettings, budget: RetryBudget):
        self.replicas = replicas
        self.client = client
        self.executor = executor
        self.budget = budget
        self.fair = FairQueue()
        self.failure: str | None = None
        self._cond = threading.Condition()
        self._stop = False
        self._tidied_at = float("-inf")
        self.demand = Demand(replicas, self.fair)  # what the fleet hears of this process
        self.settler = Settler(self._cond, self.demand, settings, budget)  # each answer booked
        self._thread = threading.Thread(target=self._run, name="scheduler", daemon=True)
        replicas.on_change(self._wake)

    def start(self) -> None:
        """Idempotent; also called by the first submit (an app built with start=False, as in
        tests, still serves)."""
        with self._cond:
            if self._thread.ident is None and not self._stop:  # never started (not: died)
                self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """No more pages go out; with `timeout`, wait that long for the thread to end."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if timeout is not None and self._thread.ident is not None:
            self._thread.join(timeout)

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # ---- request-thread side -----------------------------------------------------------------
    def submit(self, doc: Document) -> Document:
        """Queue the document. An urgent one (one page) that a replica has room for, with no
        urgent page queued before it, is sent at once from the calling thread, which would
        only wait for it otherwise: the scheduler thread and a send thread are two hand-offs
        an image does not need (`_at_once`)."""
        self.start()
        with self._cond:
            task = self._at_once(doc)
            self.fair.add(doc)
            if not doc.urgent:  # its first page goes out after a tidy (`Demand.reweigh`), not
                self._tidied_at = float("-inf")  # within REBALANCE_S of the last one
            self.demand.tell()
            if task is None or time.monotonic() - self._tidied_at >= REBALANCE_S:
                self._cond.notify_all()
        if task is not None:
            self._guarded(doc, task, self._send)
        return doc

    def _at_once(self, doc: Document) -> Task | None:
        """Under the lock: the urgent document's page, taken to be sent from the caller's
        thread, when nothing urgent is queued before it and a replica has room for it."""
        now = time.monotonic()
        if not doc.urgent or self.fair.has_urgent(now) or not self.replicas.look().urgent:
            return None
        doc.inflight += 1
        return doc.take(now)

    def finish(self, doc: Document) -> None:
        """The request is done with the document (answered, failed or gone): nothing more of
        it is sent, and its place in the queue is freed."""
        with self._cond:
            if doc.finished:
                return
            doc.stopped = doc.finished = True
            let_go(doc.pending)
            doc.pending.clear()
            self.fair.remove(doc)
            self.demand.tell()
        doc.close()

    def stop_sending(self, doc: Document) -> None:
        with self._cond:
            doc.stopped = True
            let_go(doc.pending)
            doc.pending.clear()
            self.demand.tell()

    def reweigh(self, now: float) -> None:
        """What the scheduler thread does at each tidy (`_tidy`): tell the board, weigh the
        documents (gateway.flow.demand)."""
        with self._cond:
            self.demand.reweigh(now)

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
                self._guarded(doc, task, self._send_later)
        except BaseException as exc:
            self.failure = f"the page scheduler stopped: {type(exc).__name__}: {exc}"
            log.critical(self.failure)
            raise

    @property
    def alive(self) -> bool:
        """False once the scheduler thread has died (not merely not started yet)."""
        return self.failure is None

    def _pick(self) -> tuple[Document, Task] | None:
        """Under the lock: the next (document, chunk) to send, or None after waiting a while
        for room, a retry's time or a new document."""
        now = time.monotonic()
        if now - self._tidied_at >= REBALANCE_S:
            self._tidy(now)
        room = self.replicas.look()
        urgent_only = not room.documents and room.urgent and self.fair.has_urgent(now)
        doc = (self.fair.pick(now, room.quota, urgent_only)
               if room.documents or urgent_only else None)
        if doc is None:  # about to wait: tidy first, then wait for what comes first
            if self._tidied_at != now:
                self._tidy(now)
            wake = self.fair.next_wake()
            if not room.documents:
                wake = min(filter(None, (wake, room.next_change)), default=None)
            self._cond.wait(timeout=_until(wake, now, cap=5.0 if room.documents else 1.0))
            return None
        task = doc.take(now)
        doc.inflight += 1
        if not doc.urgent and not doc.has_queued():  # (an urgent one held its slot already)
            self.demand.tell()
        return doc, task

    def _tidy(self, now: float) -> None:
        """Under the lock: stop the documents past their deadline, finish the abandoned ones.
        Before every wait, and at least every REBALANCE_S while pages flow (not on every page: it
        looks at every document)."""
        self._tidied_at = now
        self.demand.reweigh(now)
        expired = self.fair.expire(now)
        if expired:
            self.demand.tell()
        for doc in expired:
            metrics.EXPIRED.inc()
            log.warning("deadline passed with pages queued; they are not sent",
                        extra={"logId": doc.log_id})
        for doc in self.fair.abandoned(now, ABANDON_AFTER_S):
            self.finish(doc)  # its request never read it (e.g. a stream nobody started)

    def _guarded(self, doc: Document, task: Task, send) -> None:
        """Dispatch one chunk; a fault in doing so fails that chunk (as a real failure:
        retried elsewhere within the budget), never the thread that dispatched it."""
        try:
            self._dispatch(doc, task, send)
        except Exception as exc:
            log.exception("dispatching a chunk failed", extra={"logId": doc.log_id})
            self.settler.fault(doc, task, None, exc)

    def _send_later(self, doc: Document, task: Task, replica: Replica) -> None:
        self.executor.submit(self._send, doc, task, replica)

    def _dispatch(self, doc: Document, task: Task, send) -> None:
        """Look the chunk up in the cache, place it and `send` it (now, or on a send thread)."""
        if doc.cache is not None and task.cache is None:
            if self._cut(doc, task, None) and self._from_cache(doc, task):
                return  # answered from the cache, now or once the same page in flight is
            if task.chunk is None:
                return  # it could not be cut: its pages failed
        try:
            replica = self.replicas.acquire(task.tried | task.later, urgent=doc.urgent,
                                            failed=task.tried)
        except NoReplicas:
            replica = None
        if replica is None:  # the room seen was taken meanwhile, or the replica set changed
            self.settler.requeue(doc, task, delay=0.05)
            return
        try:
            if task.chunk is None and not self._cut(doc, task, replica):
                return
            if not task.sent:
                task.sent = True
                doc.sent += 1
                self.budget.record_send()
            send(doc, task, replica)
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
            self.settler.settle_pages(doc, task, assemble.failed_pages(
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
            self.settler.requeue(doc, task, delay=0.0)  # sent after all

    def _settle_cached(self, doc: Document, task: Task) -> None:
        try:
            pages = assemble.pages_from_reply({"result": task.cache.result},
                                              task.chunk.page_indices, doc.kind,
                                              doc.endpoint.results)
        except assemble.MalformedReply:  # not what was stored: read it again
            task.cache.result = None
            self.settler.requeue(doc, task, delay=0.0)
            return
        for page in pages:
            page.cached = True
        doc.cache.hits += len(pages)
        metrics.CACHE_PAGES.inc(len(pages))
        self.settler.settle_pages(doc, task, pages)

    def _send(self, doc: Document, task: Task, replica: Replica) -> None:
        """A send thread (or the caller's, `_at_once`): one attempt, then book its answer."""
        if doc.stopped:
            self.replicas.give_back(replica)
            self.settler.requeue(doc, task, delay=0.0)
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
                    self.demand.page_timed(attempt.seconds, doc.urgent, attempt.page_s)
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
            self.settler.settle(doc, task, replica.url, attempt)
        except Exception as exc:  # an answer nothing expected: that chunk fails, not the rest
            log.exception("handling a replica's answer failed", extra={"logId": doc.log_id})
            self.settler.fault(doc, task, replica.url, exc)

def _start_within(doc: Document, task: Task) -> float | None:
    """How soon an urgent page asks to start at the worker it goes to (START_WITHIN_S)."""
    if not doc.urgent or task.refusals >= len(START_WITHIN_S):
        return None
    return START_WITHIN_S[task.refusals]


def _until(when: float | None, now: float, cap: float) -> float:
    return cap if when is None else max(0.001, min(cap, when - now))

