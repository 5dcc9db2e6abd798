"""What becomes of a chunk once its attempt is over, or once it cannot go out now: its pages
settled (answered, or failed for good), or the chunk put back in its document's queue.

Busy is not down: a chunk answered 503/429 (Outcome.BUSY), or refused by a worker that would
start it too late (Outcome.LATER), goes back to the front of its document's queue at once,
without spending an attempt. A real failure (connection error, timeout, 5xx) is retried on
another replica after a jittered backoff while the page has attempts left and the fleet-wide
retry budget (gateway.budget) allows; otherwise its pages fail, with the status the caller
gets. One owner for it, apart from the scheduler (gateway.scheduler), which picks and sends:
the send threads book every answer here, and the scheduler thread a chunk it could not cut or
place; both change the queue under the scheduler's lock, as the scheduler does."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from .. import assemble, metrics
from ..assemble import PageOutcome
from ..backoff import Backoff
from ..budget import RetryBudget
from ..outcome import Attempt, Outcome
from .demand import Demand
from .queue import Document, Task, let_go

if TYPE_CHECKING:
    from ..scheduler import SchedulerSettings

log = logging.getLogger("gateway.scheduler")

RETRY_CAP_S = 30.0  # the longest wait before a failed page is tried again


class Settler:
    """Books each chunk's outcome: its pages answered or failed (`settle_pages`), or the chunk
    queued again (`requeue`), now or after a backoff. `cond` is the scheduler's: it guards the
    documents and the queue, and waking it lets the scheduler pick again."""

    def __init__(self, cond: threading.Condition, demand: Demand,
                 settings: SchedulerSettings, budget: RetryBudget):
        self._cond = cond
        self.demand = demand
        self.settings = settings
        self.budget = budget

    def settle(self, doc: Document, task: Task, url: str, attempt: Attempt) -> None:
        """A replica's answer to the chunk (a send thread)."""
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
            self.settle_pages(doc, task, pages)
        elif outcome is Outcome.REJECTED:
            self.settle_pages(doc, task, assemble.failed_pages(
                task.chunk.page_indices, attempt.status, attempt.message, doc.kind))
        elif outcome is Outcome.BUSY:
            self.requeue(doc, task, delay=0.0)
        elif outcome is Outcome.LATER:
            task.refusals += 1
            task.later.add(url)
            self.requeue(doc, task, delay=0.0)
        else:
            self._retry_or_fail(doc, task, url, attempt)

    def fault(self, doc: Document, task: Task, url: str | None, exc: Exception) -> None:
        """A bug or an answer nothing expected, while handling one chunk: a failed attempt."""
        self._retry_or_fail(doc, task, url, Attempt(
            Outcome.FAILED, None, {}, f"gateway error handling the chunk: {type(exc).__name__}"))

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
            self.requeue(doc, task, delay=self._backoff(task.attempts))
            return
        why = ("the fleet's retry budget is spent"
               if task.attempts < self.settings.max_attempts else
               f"after {task.attempts} attempt(s) on {len(task.tried)} replica(s)")
        if task.attempts < self.settings.max_attempts:
            metrics.RETRIES_DENIED.inc()
        code = 504 if attempt.status == 504 or attempt.timed_out else 502
        if attempt.status and attempt.status >= 500 and attempt.status not in (502, 504):
            code = attempt.status
        self.settle_pages(doc, task, assemble.failed_pages(
            pages, code, f"{label} failed {why}: {attempt.message}", doc.kind))

    def _backoff(self, attempts: int) -> float:
        return Backoff(self.settings.backoff_s, RETRY_CAP_S, (0.5, 1.5)).delay(attempts)

    def requeue(self, doc: Document, task: Task, delay: float) -> None:
        """The chunk goes back in its document's queue, to go out again `delay` from now (let
        go instead if the document is finished)."""
        with self._cond:
            doc.inflight -= 1
            if doc.finished:
                let_go([task])
            else:
                task.not_before = time.monotonic() + delay
                was_queued = doc.has_queued()
                doc.put_back(task)
                if not was_queued:
                    self.demand.tell()
            self._cond.notify_all()

    def settle_pages(self, doc: Document, task: Task, pages: list[PageOutcome]) -> None:
        """The chunk is done: its pages (answered or failed) go to the document's reader."""
        let_go([task])
        with self._cond:
            doc.answers.put((task.position, pages))  # before inflight drops: see in_order
            doc.inflight -= 1
            if not doc.has_queued():
                self.demand.tell()
            self._cond.notify_all()


def _label(page_indices: tuple[int, ...]) -> str:
    first, last = page_indices[0] + 1, page_indices[-1] + 1
    return f"page(s) {first}-{last}" if last != first else f"page {first}"
