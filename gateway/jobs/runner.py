"""The job runner in each gateway process: a few threads that take due jobs from the store
(new ones, ones whose runner died, callbacks to deliver), run their remaining pages through
the gateway's own page path at batch priority, store each page as it comes back, and keep
their leases alive.

Resuming is planning the pages not yet stored: the runner builds the /ocr plan for the
original document with a pageRange of the missing pages, so page indices stay those of the
document and finished pages are never sent again. No two gateways send a job's pages at once:
only the lease holder sends, it stops sending as soon as it cannot prove its lease (renewal
failed, or the lease would run out before the next renewal), and the store refuses writes
from any other token."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from services.ocr_api import tracing
from services.ocr_api.errors import ApiError

from ..outputs.paddlex import describe_failures
from ..config import JobsConfig
from . import metrics
from ..backoff import Backoff
from .callbacks import CallbackSender
from .model import (CB_DELIVERED, CB_FAILED, CB_PENDING, FAILED, FINAL_STATES, SUCCEEDED, Job,
                    StoredPage, iso, page_range_text)
from .store import Claim, JobStore

log = logging.getLogger("gateway.jobs")

POLL_S = 0.5  # how often an idle runner looks for due jobs in the shared store
CANCEL_CHECK_S = 0.5  # how often a running job checks that it was not cancelled elsewhere
PURGE_EVERY_S = 10.0  # at most; with a shorter result TTL, once per TTL
RETRY_BUSY_S = 5.0  # a job whose pages the gateway's queue refused (429/503) is tried again
CALLBACK_SLOT_WAIT_S = 1.0  # a callback due while every delivery slot is taken: again then
CALLBACK_BACKOFF_CAP_S = 600.0


@dataclass
class Lease:
    """A runner's lease on one job, as this process knows it: held until `valid_until`
    (monotonic), which is kept short of the store's expiry by a margin."""

    job_id: str
    token: str
    valid_until: float
    lost: bool = False
    checked_at: float = field(default_factory=time.monotonic)

    def held(self) -> bool:
        return not self.lost and time.monotonic() < self.valid_until


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class JobRunner:
    def __init__(self, store: JobStore, service, config: JobsConfig,
                 sender: CallbackSender | None, owner: str | None = None):
        self.store = store
        self.service = service
        self.config = config
        self.sender = sender
        self.owner = owner or default_owner()
        self.margin_s = min(2.0, config.lease_s * 0.2)
        self._leases: dict[str, Lease] = {}
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._last_purge = 0.0
        # callbacks go out on threads of their own, a bounded number at once: a receiver
        # that takes its whole deadline holds one of these, never a runner
        self._delivery_slots = threading.BoundedSemaphore(config.callback_concurrency)
        self._deliveries = ThreadPoolExecutor(config.callback_concurrency,
                                              thread_name_prefix="job-callback")
        self._pending: set[Future] = set()
        self._backoff = Backoff(config.callback_backoff_s, CALLBACK_BACKOFF_CAP_S)

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        for number in range(self.config.runners):
            self._spawn(self._loop, f"job-runner-{number}")
        if self.config.runners:
            self._spawn(self._keep_leases, "job-leases")

    def _spawn(self, target, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def wake(self) -> None:
        """A job was submitted here: look now rather than at the next poll."""
        self._wake.set()

    def cancelled(self, job_id: str) -> None:
        """A job was cancelled through this process: stop sending its pages at once."""
        lease = self._leases.get(job_id)
        if lease is not None:
            lease.lost = True

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop taking jobs; running ones store the pages in flight and give their lease back
        so another gateway resumes them at once (not after the lease runs out)."""
        self._stopping.set()
        self._wake.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self.wait_deliveries(max(0.0, deadline - time.monotonic()))
        self._deliveries.shutdown(wait=False, cancel_futures=True)

    def wait_deliveries(self, timeout_s: float | None = None) -> None:
        """Until the callback attempts under way have ended (or `timeout_s`)."""
        for future in list(self._pending):
            try:
                future.result(timeout_s)
            except Exception:
                pass

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                if not self.run_once():
                    self._wake.wait(POLL_S)
                    self._wake.clear()
            except Exception:  # the store unreachable, a bug: log, wait, go on
                log.exception("job runner error")
                self._stopping.wait(2.0)

    def _keep_leases(self) -> None:
        interval = self.config.lease_s / 3
        while not self._stopping.wait(interval):
            for lease in list(self._leases.values()):
                self._renew(lease)

    def _renew(self, lease: Lease) -> None:
        if lease.lost:
            return
        started = time.monotonic()
        try:
            renewed = self.store.renew(lease.job_id, lease.token, self.config.lease_s)
        except Exception as exc:  # keep what we have; it runs out by itself
            log.warning("lease renewal failed", extra={"jobId": lease.job_id,
                                                       "error": repr(exc)})
            return
        if renewed:
            lease.valid_until = started + self.config.lease_s - self.margin_s
        else:
            lease.lost = True

    # ---- one job -----------------------------------------------------------------------------
    def run_once(self) -> bool:
        """Take one due job and work on it; False when none was due."""
        now = time.time()
        if now - self._last_purge > min(PURGE_EVERY_S, self.config.result_ttl_s):
            self._last_purge = now
            self.store.purge_expired(now)
        started = time.monotonic()
        claim = self.store.claim(self.owner, self.config.lease_s)
        if claim is None:
            return False
        lease = Lease(claim.job.id, claim.token,
                      started + self.config.lease_s - self.margin_s)
        if claim.job.state in FINAL_STATES:
            self._hand_over_callback(claim.job, lease)
            return True
        self._leases[lease.job_id] = lease
        try:
            metrics.JOBS_RUNNING.inc()
            try:
                with tracing.span("job", claim.job.spec.log_id, job=claim.job.id):  # its trace
                    self._run_pages(claim, lease)
            finally:
                metrics.JOBS_RUNNING.dec()
        except Exception:  # give the job back to be tried again (GATEWAY_JOBS_TIMEOUT_S ends it)
            log.exception("job failed in this runner", extra={"jobId": lease.job_id})
            self._give_back(lease, time.time() + RETRY_BUSY_S)
        finally:
            self._leases.pop(lease.job_id, None)
        return True

    def _keep_sending(self, lease: Lease) -> Callable[[], bool]:
        def keep_sending() -> bool:
            if self._stopping.is_set() or not lease.held():
                return False
            now = time.monotonic()
            if now - lease.checked_at >= CANCEL_CHECK_S:
                lease.checked_at = now
                job = self.store.get(lease.job_id)
                if job is None or job.lease_token != lease.token:
                    lease.lost = True  # cancelled, deleted or taken over
            return lease.held()
        return keep_sending

    def _run_pages(self, claim: Claim, lease: Lease) -> None:
        job = claim.job
        document = self.store.document(job.id)
        if document is None:
            return  # cancelled between the claim and now
        if job.pages_done:
            metrics.JOB_RESUMES.inc()
            log.info("resuming job", extra={"jobId": job.id, "logId": job.spec.log_id,
                                            "pagesDone": job.pages_done})
        keep_sending = self._keep_sending(lease)
        whole_done = False  # an image (a TIFF's frames) is one request: all or nothing
        while True:
            remaining = self._remaining(job, whole_done)
            if not remaining:
                self._finish(job, lease, SUCCEEDED)
                return
            if time.time() > job.created + self.config.timeout_s:
                self._finish(job, lease, FAILED, 504, "The job did not finish within "
                             f"{self.config.timeout_s:.0f} s (GATEWAY_JOBS_TIMEOUT_S)")
                return
            if not keep_sending():
                self._give_back(lease, time.time())
                return
            try:
                stored, failure = self._send(job, lease, document, remaining, keep_sending)
            except ApiError as exc:
                if exc.status == 504:
                    continue  # this round's deadline passed: plan the rest again
                if exc.status in (429, 503):
                    retry = float(exc.headers.get("Retry-After", RETRY_BUSY_S))
                    self._give_back(lease, time.time() + retry)
                    return
                self._finish(job, lease, FAILED, exc.status, exc.message)
                return
            if lease.lost:
                return
            if failure is not None:
                self._finish(job, lease, FAILED, *failure)
                return
            whole_done = stored > 0 and job.spec.kind == "image"

    def _remaining(self, job: Job, whole_done: bool) -> list[int]:
        """The selected pages (frames) not stored yet: a job ends only when there are none.
        An image is sent whole: all or nothing."""
        if job.spec.kind == "image":
            return [] if whole_done else list(job.spec.page_indices)
        done = self.store.done_indices(job.id)
        return [index for index in job.spec.page_indices if index not in done]

    def _send(self, job: Job, lease: Lease, document: bytes, remaining: list[int],
              keep_sending) -> tuple[int, tuple[int, str] | None]:
        """Send the remaining pages and store each as it comes back: (pages stored, and
        (status, message) when a page failed and the job does not want partial results)."""
        fields = dict(job.spec.fields)
        if job.spec.kind != "image":
            fields["pageRange"] = page_range_text(remaining)
        plan = self.service.plan(fields, document, job.spec.route)  # /ocr or /layout-parsing
        # batch priority: jobs never starve interactive /ocr calls
        policy = self.service.cache_policy(job.client, job.spec.cache_control)
        outcomes = self.service.pages_in_order(plan, keep_sending=keep_sending,
                                               priority="batch",
                                               **({"cache": policy} if policy else {}))
        stored = 0
        try:
            for page in outcomes:
                if not self.store.put_page(job.id, lease.token, StoredPage.of(page),
                                           job.client):
                    lease.lost = True
                    return stored, None
                stored += 1
                metrics.JOB_PAGES.labels("failed" if page.error_code else "ok").inc()
                if page.error_code and not job.spec.partial:
                    return stored, describe_failures([page])
        finally:
            outcomes.close()
        return stored, None

    def _finish(self, job: Job, lease: Lease, state: str, code: int = 0,
                message: str = "") -> None:
        now = time.time()
        finished = self.store.finish(job.id, lease.token, state, code, message,
                                     now + self.config.result_ttl_s,
                                     bool(job.spec.callback_url), job.client, now)
        if finished:
            metrics.JOBS_ENDED.labels(state).inc()
            log.info("job ended", extra={"jobId": job.id, "logId": job.spec.log_id,
                                         "state": state, "errorCode": code})
            self.wake()  # its callback is due now

    def _give_back(self, lease: Lease, retry_at: float) -> None:
        if not lease.lost:
            self.store.release(lease.job_id, lease.token, retry_at)

    # ---- callbacks ---------------------------------------------------------------------------
    def _hand_over_callback(self, job: Job, lease: Lease) -> None:
        """To a delivery thread if one is free (the lease kept alive meanwhile), else back
        to the store, due again shortly."""
        if not self._delivery_slots.acquire(blocking=False):
            self.store.release(job.id, lease.token, time.time() + CALLBACK_SLOT_WAIT_S)
            return
        self._leases[lease.job_id] = lease

        def deliver() -> None:
            try:
                self._deliver_callback(job, lease)
            except Exception:
                log.exception("callback delivery failed", extra={"jobId": job.id})
                self._give_back(lease, time.time() + RETRY_BUSY_S)
            finally:
                self._leases.pop(lease.job_id, None)
                self._delivery_slots.release()

        future = self._deliveries.submit(deliver)
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)

    def _deliver_callback(self, job: Job, lease: Lease) -> None:
        attempts = job.callback_attempts + 1
        if self.sender is None:
            delivered, detail = False, "GATEWAY_JOBS_CALLBACK_SECRET is not set"
            attempts = self.config.callback_attempts
        else:
            body = json.dumps(callback_payload(job, self.config.public_url)).encode()
            delivery = self.sender.send(job.spec.callback_url or "", body, job.id)
            delivered, detail = delivery.delivered, delivery.detail
        if delivered:
            state, next_at = CB_DELIVERED, 0.0
        elif attempts >= self.config.callback_attempts:
            state, next_at = CB_FAILED, 0.0
        else:
            state = CB_PENDING
            next_at = time.time() + self._backoff.delay(attempts)
        metrics.CALLBACKS.labels("delivered" if delivered else "failed").inc()
        log.info("callback attempt", extra={"jobId": job.id, "logId": job.spec.log_id,
                                            "attempt": attempts, "result": detail,
                                            "callbackState": state})
        self.store.callback_done(job.id, lease.token, state, attempts, next_at)


def job_urls(job_id: str, base_url: str) -> dict[str, str]:
    base = base_url.rstrip("/")
    return {"statusUrl": f"{base}/jobs/{job_id}", "resultUrl": f"{base}/jobs/{job_id}/result"}


def callback_payload(job: Job, public_url: str | None) -> dict:
    """The small JSON a callback carries: enough to decide whether to fetch the result."""
    error = {"errorCode": job.error_code, "errorMsg": job.error_msg} if job.error_code else None
    return {"jobId": job.id, "state": job.state, "numPages": job.num_pages,
            "pagesDone": job.pages_done, "pagesFailed": job.pages_failed, "error": error,
            "finishedAt": iso(job.finished), **job_urls(job.id, public_url or job.spec.base_url)}
