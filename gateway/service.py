"""GatewayService: one /ocr request through the gateway, stage by stage:

    plan (parse, count pages, group them into chunks) -> open (front-door admission: 429 at
    once when the queue is full) -> the scheduler's fair queue -> replicas -> pages in order
    -> collect (one PaddleX envelope) or stream (NDJSON)

No Flask here; the queue and its policy live in gateway.scheduler, talking to a replica in
gateway.dispatch, replica limits and health in gateway.upstreams."""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

from services.ocr_api import envelope
from services.ocr_api.errors import ApiError, unprocessable
from services.documents.pages import select_pages
from services.documents.tiff import count_tiff_frames
from services.ocr_api.request import OcrRequest, parse_ocr_request
from services.ocr_api.sniff import KIND_PDF, is_tiff
from services.ocr_api.url_input import make_url_fetcher

from . import assemble, metrics
from .admission import FrontDoor
from .auth import worker_auth_headers
from .assemble import PageOutcome
from .budget import RetryBudget
from .config import GatewayConfig
from .dispatch import DispatchSettings, ReplicaClient, make_pool, probe_ready
from .scheduler import INTERACTIVE, Document, Scheduler, SchedulerSettings
from .split import KIND_TIFF, Chunk, PdfCutter, TiffCutter, WholeFile, count_pages, group_pages
from .fleet import FleetView
from .upstreams import MODE_DNS, MODE_LIST, MODE_LOAD_BALANCER, Probe, ReplicaSet

log = logging.getLogger("gateway")


@dataclass
class Plan:
    """How one request is cut: its kind, its groups of pages (one chunk each), how many
    pages, whether it is split at all, and its one deadline."""

    request: OcrRequest
    kind: str
    groups: list[tuple[int, ...]]
    num_pages: int
    split: bool
    partial: bool
    deadline: float

    def make_cutter(self):
        if not self.split:
            return WholeFile(self.request.file_bytes)
        if self.kind == KIND_TIFF:
            return TiffCutter(self.request.file_bytes)
        return PdfCutter(self.request.file_bytes)


def build_replica_set(config: GatewayConfig, probe: Probe, fleet: FleetView,
                      resolver=None) -> ReplicaSet:
    options: dict[str, Any] = dict(probe=probe, eject_s=config.eject_s, fleet=fleet)
    if resolver is not None:
        options["resolver"] = resolver
    if config.upstream_url:
        return ReplicaSet(mode=MODE_LOAD_BALANCER, urls=[config.upstream_url.rstrip("/")],
                          **options)
    if config.replicas:
        return ReplicaSet(mode=MODE_LIST, urls=list(config.replicas), **options)
    return ReplicaSet(mode=MODE_DNS, dns=config.replica_dns, **options)


class GatewayService:
    def __init__(self, config: GatewayConfig, resolver=None):
        self.config = config
        self.pool = make_pool(maxsize=config.max_inflight)
        auth = worker_auth_headers(config)
        self.fleet = FleetView(default_target=config.replica_target)
        self.replicas = build_replica_set(
            config, lambda url, headers: probe_ready(self.pool, url, {**auth, **headers}),
            self.fleet, resolver)
        self.executor = ThreadPoolExecutor(config.max_inflight, thread_name_prefix="send")
        self.front = FrontDoor(config.queue_pages, config.queue_bytes)
        self.scheduler = Scheduler(
            self.replicas,
            ReplicaClient(self.pool, DispatchSettings(page_timeout_s=config.page_timeout_s,
                                                      connect_timeout_s=config.connect_timeout_s,
                                                      headers=auth), self.fleet),
            self.executor,
            SchedulerSettings(max_attempts=config.max_attempts, backoff_s=config.backoff_s),
            RetryBudget(config.retry_budget_ratio, config.retry_budget_min))
        self.fetch_url = (make_url_fetcher(config.max_bytes, config.url_timeout_s)
                          if config.allow_url_input else None)

    def start(self) -> None:
        self.scheduler.start()
        self.replicas.start_background(
            self.config.dns_refresh_s, self.config.health_interval_s,
            after_probe=lambda replicas: metrics.record_replicas(replicas, time.monotonic()))

    def liveness(self) -> str | None:
        """Why this process must be restarted (its page scheduler died), or None."""
        return self.scheduler.failure

    def readiness(self) -> tuple[bool, str]:
        if self.scheduler.failure:
            return False, self.scheduler.failure
        replicas = self.replicas.replicas()
        if self.replicas.any_ready():
            ready = sum(1 for r in replicas if r.ready)
            return True, f"{ready} of {len(replicas)} replica(s) ready"
        return False, f"no replica is ready ({len(replicas)} known)"

    def fleet_status(self) -> dict[str, Any]:
        """What the web page's fleet panel shows: replicas, the queue, recent pages/s."""
        now = time.monotonic()
        queue = self.scheduler.snapshot()
        return {
            "mode": self.replicas.mode,
            "replicas": [{"url": r.url, "ready": bool(r.ready) and r.ejected_until <= now,
                          "inflight": r.inflight, "served": r.served, "limit": r.slots,
                          "ejected": r.ejected_until > now}
                         for r in self.replicas.replicas()],
            "queue": {"queuedPages": self.front.queued_pages,
                      "queuedDocuments": queue["queuedDocuments"],
                      "inflightPages": queue["inflightChunks"] * self.config.pages_per_chunk,
                      "capacityPages": self.config.queue_pages},
            "pagesPerSecond": round(self.front.pages_per_second(), 3),
            "share": self.fleet.status(),
        }

    # ---- stages ------------------------------------------------------------------------------
    def check_room(self) -> None:
        """Before the body is read: 429 at once when this gateway's queue is already full."""
        try:
            self.front.check_room()
        except ApiError:
            metrics.REFUSED.labels("queue_full").inc()
            raise

    def plan(self, fields: Mapping[str, Any], file_bytes: bytes | None) -> Plan:
        deadline = time.monotonic() + self.config.request_timeout_s
        request = parse_ocr_request(fields, max_bytes=self.config.max_bytes,
                                    file_bytes=file_bytes, fetch_url=self.fetch_url)
        partial = fields.get("returnPartialResults", False)
        if not isinstance(partial, bool):
            raise unprocessable("returnPartialResults must be true or false")
        if is_tiff(request.file_bytes):
            return self._plan_tiff(request, partial, deadline)
        if request.kind != KIND_PDF:
            return Plan(request, request.kind, [(0,)], 1, False, partial, deadline)
        indices = select_pages(request.page_range, count_pages(request.file_bytes),
                               self.config.max_pages, server="gateway")
        return self._split_or_whole(request, KIND_PDF, indices, partial, deadline)

    def _plan_tiff(self, request: OcrRequest, partial: bool, deadline: float) -> Plan:
        """A multi-page TIFF is split by frames like a PDF by pages (frames counted cheaply
        and capped); a single-frame one is an image."""
        frames = count_tiff_frames(request.file_bytes, self.config.max_pages)
        if frames <= 1:
            return Plan(request, request.kind, [(0,)], 1, False, partial, deadline)
        indices = select_pages(request.page_range, frames, self.config.max_pages,
                               what="TIFF", server="gateway")
        plan = self._split_or_whole(request, KIND_TIFF, indices, partial, deadline)
        if not plan.split:  # sent whole: the worker selects the frames and names them
            plan.kind = request.kind
        return plan

    def _split_or_whole(self, request: OcrRequest, kind: str, indices: list[int],
                        partial: bool, deadline: float) -> Plan:
        if len(indices) <= self.config.pages_per_chunk:
            return Plan(request, kind, [tuple(indices)], len(indices), False, partial,
                        deadline)
        groups = group_pages(indices, self.config.pages_per_chunk)
        return Plan(request, kind, groups, len(indices), True, partial, deadline)

    def open(self, plan: Plan, priority: str = INTERACTIVE) -> Document:
        """Admit the document into the queue (429 when it does not fit, 503 when no replica
        is ready) and start sending its pages as replicas have room."""
        if not self.replicas.any_not_known_down():
            metrics.REFUSED.labels("no_replica").inc()
            raise ApiError(503, "No OCR replica is ready: retry shortly", {"Retry-After": "2"})
        try:
            ticket = self.front.admit(plan.num_pages, len(plan.request.file_bytes))
        except ApiError:
            metrics.REFUSED.labels("queue_full").inc()
            raise
        metrics.QUEUED_PAGES.set(self.front.queued_pages)
        try:
            cutter = plan.make_cutter()
        except BaseException:
            self._close_ticket(ticket)
            raise
        doc = Document(plan.groups, cutter, lambda chunk: self._chunk_body(plan, chunk),
                       log_id=plan.request.log_id, deadline=plan.deadline, kind=plan.kind,
                       priority=priority, on_finish=lambda _: self._close_ticket(ticket))
        doc.ticket = ticket
        return self.scheduler.submit(doc)

    def _close_ticket(self, ticket) -> None:
        self.front.release(ticket)
        metrics.QUEUED_PAGES.set(self.front.queued_pages)

    def _chunk_body(self, plan: Plan, chunk: Chunk) -> bytes:
        request = plan.request
        page_range = None if plan.split else request.page_range
        kind = chunk.kind if plan.split else plan.kind
        return json.dumps(request.forward_body(chunk.data, kind, page_range)).encode()

    def pages_in_order(self, plan: Plan, keep_sending: Callable[[], bool] = lambda: True, *,
                       priority: str = INTERACTIVE, document: Document | None = None,
                       client_gone: Callable[[], bool] = lambda: False
                       ) -> Iterator[PageOutcome]:
        """Every page's outcome in page order, each as soon as it and all before it are done.
        Once `keep_sending()` turns False no new chunk goes out (those in flight still come
        back). Closing the iterator, or the client going away, takes the document's queued
        pages out of the queue."""
        doc = document or self.open(plan, priority)
        try:
            for pages in doc.in_order(client_gone):
                self.front.pages_done(doc.ticket, len(pages))
                metrics.QUEUED_PAGES.set(self.front.queued_pages)
                yield from pages
                if not keep_sending():
                    self.scheduler.stop_sending(doc)
        finally:
            self.scheduler.finish(doc)

    def collect(self, plan: Plan, document: Document | None = None,
                client_gone: Callable[[], bool] = lambda: False) -> dict[str, Any]:
        """The whole document as one PaddleX envelope. Without partial results, the first
        failed page stops new pages going out; the error names every page that failed among
        those already sent."""
        pages: list[PageOutcome] = []
        failed: list[PageOutcome] = []
        outcomes = self.pages_in_order(plan, lambda: plan.partial or not failed,
                                       document=document, client_gone=client_gone)
        try:
            for page in outcomes:
                pages.append(page)
                if page.error_code:
                    failed.append(page)
        finally:
            outcomes.close()
        _count_pages(pages)
        if failed and not plan.partial:
            status, message = assemble.describe_failures(failed)
            skipped = plan.num_pages - len(pages)
            if skipped:
                message += f" ({skipped} later page(s) were not attempted)"
            raise ApiError(status, message)
        return envelope.success(plan.request.log_id,
                                assemble.document_result(pages,
                                                         plan.request.page_range is not None))

    def stream(self, plan: Plan, document: Document | None = None) -> Iterator[bytes]:
        """NDJSON: one line per page in order (each with the document's page count), then a
        summary line."""
        pages: list[PageOutcome] = []
        outcomes = self.pages_in_order(plan, document=document)
        try:
            for page in outcomes:
                pages.append(page)
                line = assemble.stream_page_line(plan.request.log_id, page)
                if plan.kind in (KIND_PDF, KIND_TIFF):
                    line["numPages"] = plan.num_pages
                yield _line(line)
                if page.error_code and not plan.partial:
                    break
        except ApiError as exc:
            yield _line(envelope.no_result(plan.request.log_id, exc.status, exc.message))
            return
        finally:
            outcomes.close()
        _count_pages(pages)
        yield _line(assemble.stream_summary_line(plan.request.log_id, pages,
                                                 plan.request.page_range is not None))

    def shutdown(self) -> None:
        self.replicas.stop()
        self.scheduler.stop()
        self.executor.shutdown(wait=False, cancel_futures=True)


def _count_pages(pages: list[PageOutcome]) -> None:
    failed = sum(1 for page in pages if page.error_code)
    metrics.PAGES.labels("ok").inc(len(pages) - failed)
    metrics.PAGES.labels("failed").inc(failed)


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode() + b"\n"
