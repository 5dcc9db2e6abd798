"""The job store's contract, shared by its two implementations: Redis (a fleet of gateways)
and SQLite (one machine, nothing to start). Everything a runner writes is fenced by its lease
token, so a gateway that lost its lease (it stalled, another took over) can no longer change
the job; every change that must be atomic is one transaction (a Lua script in Redis).

The queue is the store itself: each unfinished job (and each finished job whose callback is
due) has a `next_at` time, and `claim` takes the first job due whose lease is free or
expired. A new job is due at once; a running job is due when its lease runs out, which is how
a job whose gateway died is picked up by another."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Protocol

from .model import Job, StoredPage


@dataclass(frozen=True)
class Limits:
    """Per client (API key or address): unfinished jobs, and bytes stored (documents + results
    of every job not yet expired or deleted)."""

    max_active: int
    max_stored_bytes: int


class LimitExceeded(Exception):
    def __init__(self, what: str, message: str):
        super().__init__(message)
        self.what = what  # "active" or "bytes"
        self.message = message


@dataclass(frozen=True)
class Claim:
    job: Job
    token: str


@dataclass(frozen=True)
class Usage:
    active: int
    stored_bytes: int


class JobStore(Protocol):
    def create(self, job: Job, document: bytes, limits: Limits) -> None:
        """Store a new job (due at once) and its document, or raise LimitExceeded."""

    def get(self, job_id: str, now: float | None = None) -> Job | None:
        """The job, or None when unknown or expired."""

    def document(self, job_id: str) -> bytes | None: ...

    def usage(self, client: str) -> Usage: ...

    def ping(self) -> None:
        """Nothing, or the store's error when it cannot answer now."""

    def claim(self, owner: str, lease_s: float, now: float | None = None) -> Claim | None:
        """Lease the first due job; a queued job becomes running."""

    def renew(self, job_id: str, token: str, lease_s: float, now: float | None = None) -> bool:
        """Extend the lease; False when it is no longer ours (expired and taken, cancelled)."""

    def put_page(self, job_id: str, token: str, page: StoredPage, client: str) -> bool:
        """Store one finished page (a page stored before is kept, not counted twice)."""

    def done_indices(self, job_id: str) -> set[int]: ...

    def pages(self, job_id: str) -> Iterator[StoredPage]:
        """Every stored page in page order, read a few at a time."""

    def failed_pages(self, job_id: str) -> list[dict]:
        """[{pageIndex, errorCode, errorMsg}] in page order."""

    def finish(self, job_id: str, token: str, state: str, error_code: int, error_msg: str,
               expires_at: float, callback_due: bool, client: str,
               now: float | None = None) -> bool:
        """End the job (succeeded or failed), releasing the lease; with a callback to make it
        stays due for a runner to deliver it."""

    def release(self, job_id: str, token: str, retry_at: float) -> bool:
        """Give the lease back; the job is due again at `retry_at`."""

    def callback_done(self, job_id: str, token: str, state: str, attempts: int,
                      next_at: float) -> bool:
        """Record one delivery attempt: delivered, failed for good, or pending until next_at."""

    def cancel(self, job_id: str, expires_at: float, now: float | None = None) -> Job | None:
        """Cancel an unfinished job: state cancelled, document and pages deleted, lease
        revoked; the small record stays until expires_at. Returns the job as it was before,
        or None when unknown. A finished job is returned unchanged."""

    def delete(self, job_id: str) -> bool:
        """Remove a job and everything stored with it."""

    def purge_expired(self, now: float | None = None) -> int: ...

    def close(self) -> None: ...


def check_limits(usage: Usage, new_bytes: int, limits: Limits) -> None:
    if usage.active + 1 > limits.max_active:
        raise LimitExceeded("active", f"This client already has {usage.active} unfinished "
                                      f"job(s), the limit is {limits.max_active}: wait for one "
                                      "to finish or cancel one (DELETE /jobs/{id})")
    if usage.stored_bytes + new_bytes > limits.max_stored_bytes:
        raise LimitExceeded("bytes", f"This client's stored jobs hold {usage.stored_bytes} "
                                     f"bytes; {new_bytes} more would pass the limit of "
                                     f"{limits.max_stored_bytes}: delete finished jobs "
                                     "(DELETE /jobs/{id}) or wait for their results to expire")

