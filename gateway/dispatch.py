"""Talking to one replica: POST one chunk's body (to its document's endpoint, /ocr or
/layout-parsing) with timeouts always, the caller's
remaining time in `X-Deadline-Ms` (the worker drops pages nobody waits for any more), the
fleet board (gateway.flow.share) and the attempt's span in `traceparent` (services/ocr_api/
tracing.py), and the answer classified once (gateway.outcome). No retries here: whether and
where to try again is decided in gateway.flow.settle."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from services.documents import unicode
from services.ocr_api import headers as h
from services.ocr_api import tracing

from . import metrics
from .connections import Connections, TransportError, TransportTimeout
from .flow.share import FleetView
from .outcome import Attempt, Outcome, classify
from .flow.replicas import Replica

log = logging.getLogger("gateway.dispatch")


@dataclass(frozen=True)
class DispatchSettings:
    page_timeout_s: float
    connect_timeout_s: float
    headers: dict[str, str] = field(default_factory=dict)  # sent on every request (auth)
    # one URL for the whole fleet (a balancer): each try that asks to start soon goes on a
    # new connection. A k8s Service balances connections, not requests, so the try after a
    # refusal would meet the same pod again on a pooled one. (A list picks the worker.)
    balanced: bool = False


def probe_ready(connections: Connections, url: str, headers: Mapping[str, str],
                timeout_s: float = 1.5) -> tuple[bool, Mapping[str, str]]:
    """(ready, the answer's headers) of GET /readyz."""
    try:
        answer = connections.request("GET", url, "/readyz", headers=headers,
                                     connect_s=timeout_s, read_s=timeout_s)
        return answer.status == 200, answer.headers
    except TransportError:
        return False, {}


class ReplicaClient:
    def __init__(self, connections: Connections, settings: DispatchSettings,
                 fleet: FleetView):
        self.connections = connections
        self.settings = settings
        self.fleet = fleet

    def post(self, replica: Replica, body: bytes, *, log_id: str, deadline: float,
             first: bool = False, start_within_s: float | None = None,
             path: str = "/ocr") -> Attempt:
        """One attempt at one chunk. `first`: the worker reads it before its queued pages
        (a one-page interactive request: X-Ocr-Priority high); `start_within_s`: unless it
        would start that soon, the worker refuses it at once (Outcome.LATER); `path`: the
        worker endpoint (gateway/endpoint.py)."""
        remaining = deadline - time.monotonic()
        headers = {"Content-Type": "application/json", h.LOG_ID: log_id,
                   h.DEADLINE_MS: str(max(1, int(remaining * 1000))),
                   h.PRIORITY: "high" if first else "normal", **self.settings.headers,
                   **self.fleet.outgoing(), **tracing.outgoing()}  # traceparent: this attempt
        if not first and not self.settings.balanced:  # services/ocr_worker/refusal.py: several
            headers[h.WITHIN_TARGET] = "1"  # placing processes, each with a stale view
        if start_within_s is not None:
            headers[h.START_WITHIN_MS] = str(max(1, int(start_within_s * 1000)))
            if self.settings.balanced:
                headers["Connection"] = "close"
        metrics.REPLICA_INFLIGHT.labels(replica.url).inc()
        started = time.monotonic()
        try:
            response = self.connections.request(
                "POST", replica.url, path, body=body, headers=headers,
                connect_s=min(self.settings.connect_timeout_s, remaining),
                read_s=min(self.settings.page_timeout_s, remaining))
        except TransportError as exc:
            timed_out = isinstance(exc, TransportTimeout)
            kind = "timed out" if timed_out else "unreachable"
            return Attempt(Outcome.DOWN, None, {}, f"{replica.url} {kind} ({exc})",
                           timed_out=timed_out)
        finally:
            seconds = time.monotonic() - started
            metrics.REPLICA_INFLIGHT.labels(replica.url).dec()
            metrics.PAGE_SECONDS.observe(seconds)
        payload = _json_or_empty(response.data)
        status = response.status
        later = h.STARTS_IN_MS in response.headers
        return Attempt(classify(status, later), status, payload,
                       payload.get("errorMsg") or f"{replica.url} answered HTTP {status}",
                       capacity=h.int_header(response.headers, h.CAPACITY),
                       free=h.int_header(response.headers, h.FREE),
                       held=h.int_header(response.headers, h.HELD),
                       retry_after_s=h.int_header(response.headers, "Retry-After"),
                       worker=response.headers.get(h.WORKER),
                       board=response.headers.get(h.BOARD),
                       engine=response.headers.get(h.ENGINE), seconds=seconds,
                       starts_in_s=_seconds(h.int_header(response.headers, h.STARTS_IN_MS)),
                       page_s=_seconds(h.int_header(response.headers, h.PAGE_MS)))


def _seconds(milliseconds: int | None) -> float | None:
    return None if milliseconds is None else milliseconds / 1000.0


def _json_or_empty(data: bytes) -> dict[str, Any]:
    try:
        parsed = unicode.loads(data)  # a lone surrogate in it becomes U+FFFD
    except (ValueError, RecursionError):
        return {}
    return parsed if isinstance(parsed, dict) else {}
