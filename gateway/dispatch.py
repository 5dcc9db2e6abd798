"""Sending one chunk to a replica and getting its answer: always with timeouts, retried on
another replica with jittered exponential backoff after a connection error, a timeout, a 5xx
or a 429, within the request's one deadline. A 4xx other than 429 is the document's own
problem and is not retried."""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import dataclass
from typing import Any

import urllib3
from urllib3.exceptions import HTTPError as TransportError

from . import metrics
from .upstreams import NoReplicas, Replica, ReplicaSet

log = logging.getLogger("gateway.dispatch")

RETRYABLE_STATUS = {429, 500, 502, 503, 504}


class ChunkFailed(Exception):
    """A chunk could not be processed; `status` is what the caller should see."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class DispatchSettings:
    page_timeout_s: float
    connect_timeout_s: float
    max_attempts: int
    backoff_s: float


def make_pool(maxsize: int) -> urllib3.PoolManager:
    return urllib3.PoolManager(num_pools=256, maxsize=maxsize, block=False, retries=False)


def probe_ready(pool: urllib3.PoolManager, url: str, timeout_s: float = 1.5) -> bool:
    try:
        response = pool.request("GET", f"{url}/readyz", timeout=timeout_s, retries=False)
        return response.status == 200
    except TransportError:
        return False


class Dispatcher:
    def __init__(self, replicas: ReplicaSet, pool: urllib3.PoolManager,
                 settings: DispatchSettings):
        self.replicas = replicas
        self.pool = pool
        self.settings = settings

    def send(self, body: bytes, *, log_id: str, deadline: float, label: str) -> dict[str, Any]:
        """POST an /ocr body to a replica; returns the worker's parsed success envelope."""
        tried: set[str] = set()
        last_status, last_message = 503, "no replica answered"
        for attempt in range(self.settings.max_attempts):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ChunkFailed(504, f"{label}: the request deadline passed "
                                       f"({last_message})")
            try:
                replica = self.replicas.acquire(tried)
            except NoReplicas as exc:
                raise ChunkFailed(503, str(exc)) from None
            tried.add(replica.url)
            outcome, status, payload, retry_after = self._attempt(replica, body, log_id,
                                                                  remaining)
            if outcome == "ok" and status == 200:
                return payload
            if status is not None and status not in RETRYABLE_STATUS:
                raise ChunkFailed(status, payload.get("errorMsg") or f"HTTP {status}")
            last_status = status or 502
            last_message = (payload.get("errorMsg") if payload else None) or \
                f"{replica.url} {outcome}"
            metrics.RETRIES.labels(str(status) if status else outcome).inc()
            log.warning("retrying chunk on another replica",
                        extra={"chunk": label, "replica": replica.url, "attempt": attempt + 1,
                               "status": status, "reason": last_message})
            if attempt + 1 < self.settings.max_attempts:
                self._backoff(attempt, retry_after, deadline)
        code = 504 if last_status == 504 else (503 if last_status in (429, 503) else 502)
        raise ChunkFailed(code, f"{label} failed after {self.settings.max_attempts} attempts on "
                                f"{len(tried)} replica(s): {last_message}")

    def _attempt(self, replica: Replica, body: bytes, log_id: str, remaining: float):
        """(outcome for the replica set, HTTP status or None, parsed body, Retry-After)."""
        timeout = urllib3.Timeout(connect=min(self.settings.connect_timeout_s, remaining),
                                  read=min(self.settings.page_timeout_s, remaining))
        outcome, status, payload, retry_after = "down", None, {}, None
        metrics.REPLICA_INFLIGHT.labels(replica.url).inc()
        started = time.monotonic()
        try:
            response = self.pool.request(
                "POST", f"{replica.url}/ocr", body=body, timeout=timeout, retries=False,
                headers={"Content-Type": "application/json", "X-Log-Id": log_id})
            status = response.status
            payload = _json_or_empty(response.data)
            retry_after = response.headers.get("Retry-After")
            outcome = "busy" if status in (429, 503) else "ok"
            if status >= 500 and status != 503:
                outcome = "down" if status in (502, 504) else "ok"
        except TransportError as exc:
            payload = {"errorMsg": f"{replica.url}: {type(exc).__name__}"}
        finally:
            metrics.REPLICA_INFLIGHT.labels(replica.url).dec()
            self.replicas.release(replica, outcome)
        metrics.PAGE_SECONDS.observe(time.monotonic() - started)
        return outcome, status, payload, retry_after

    def _backoff(self, attempt: int, retry_after: str | None, deadline: float) -> None:
        delay = self.settings.backoff_s * (2 ** attempt) * random.uniform(0.5, 1.5)
        if retry_after and retry_after.isdigit():
            delay = min(max(delay, float(retry_after) * 0.25), float(retry_after))
        time.sleep(max(0.0, min(delay, deadline - time.monotonic() - 0.01)))


def _json_or_empty(data: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(data)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}
