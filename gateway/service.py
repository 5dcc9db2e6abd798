"""GatewayService: one /ocr (or /layout-parsing) request through the gateway, stage by stage:

    plan (parse, count pages, group them into chunks) -> open (front-door admission: 429 at
    once when the queue is full) -> the scheduler's fair queue -> replicas -> pages in order
    -> collect (one PaddleX envelope) or stream (NDJSON)

A /layout-parsing document takes the same path; its plan's Endpoint (gateway/endpoint.py)
says where its chunks go and what its answer calls its pages.

No Flask here; sending pages lives in gateway.scheduler, the queue and flow control in
gateway/flow/ (queue, replicas, share), talking to a replica in gateway.dispatch."""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Mapping

from services.ocr_api import envelope
from services.ocr_api import headers as h
from services.ocr_api import tracing
from services.ocr_api.errors import ApiError
from services.ocr_api.sniff import KIND_PDF
from services.ocr_api.url_input import make_url_fetcher

from . import metrics, outputs
from .outputs import paddlex
from .admission import FrontDoor, Ticket
from .auth import worker_auth_headers
from .assemble import PageOutcome
from .budget import RetryBudget
from .cache import Policy, build_cache
from .config import GatewayConfig
from .connections import Connections
from .dispatch import DispatchSettings, ReplicaClient, probe_ready
from .endpoint import OCR, Endpoint
from .scheduler import Scheduler, SchedulerSettings
from .outputs.sandbox import PdfBuilder, SandboxLimits
from .outputs.spool import DiskBudget, PageSpool
from .plan import Plan, PlanLimits, plan_document
from .split import KIND_TIFF
from .flow.queue import INTERACTIVE, Document
from .flow.share import FleetView
from .flow import BalancedReplicas, DnsReplicas, HealthLoop, ListedReplicas, Probe, ReplicaSet

log = logging.getLogger("gateway")
READ_COST_JSON = 4.0  # memory while a body is read and planned, per byte of its length
READ_COST_MULTIPART = 2.5


def build_replica_set(config: GatewayConfig, probe: Probe, fleet: FleetView,
                      resolver=None) -> ReplicaSet:
    """The placement the configuration names: one balancer URL, a list, or a DNS name."""
    options: dict[str, Any] = dict(probe=probe, eject_s=config.eject_s, fleet=fleet)
    if config.upstream_url:
        return BalancedReplicas(urls=[config.upstream_url.rstrip("/")], **options)
    if config.replicas:
        return ListedReplicas(urls=list(config.replicas), **options)
    if resolver is not None:
        options["resolver"] = resolver
    return DnsReplicas(dns=config.replica_dns, **options)


class GatewayService:
    def __init__(self, config: GatewayConfig, resolver=None):
        self.config = config
        # the send threads', and request threads sending their own image (gateway.scheduler)
        self.connections = Connections(per_replica=config.max_inflight + config.http_threads)
        auth = worker_auth_headers(config)
        self.fleet = FleetView(default_target=config.replica_target)
        self.cache = build_cache(config)  # None: the page cache is off
        self.replicas = build_replica_set(
            config, lambda url, headers: self._probe(url, {**auth, **headers}),
            self.fleet, resolver)
        self.health = HealthLoop(self.replicas)
        self.executor = ThreadPoolExecutor(config.max_inflight, thread_name_prefix="send")
        self.front = FrontDoor(config.queue_pages, config.queue_bytes)
        self.answer_memory = config.answer_memory_mb * 2**20
        # every answer's spooled pages and ZIP, on this process's share of the temporary disk
        self.answer_disk = DiskBudget(config.temp_disk_mb * 2**20, config.answer_disk_mb * 2**20)
        self.scheduler = Scheduler(
            self.replicas,
            ReplicaClient(self.connections, DispatchSettings(page_timeout_s=config.page_timeout_s,
                                                      connect_timeout_s=config.connect_timeout_s,
                                                      headers=auth,
                                                      balanced=bool(config.upstream_url)),
                           self.fleet),
            self.executor,
            SchedulerSettings(max_attempts=config.max_attempts, backoff_s=config.backoff_s),
            RetryBudget(config.retry_budget_ratio, config.retry_budget_min))
        self.fetch_url = (make_url_fetcher(config.max_bytes, config.url_timeout_s)
                          if config.allow_url_input else None)
        self.pdf_builder = PdfBuilder(SandboxLimits(config.output_memory_mb,
                                                    config.output_timeout_s,
                                                    config.output_processes))
        self.plan_limits = PlanLimits(config.max_bytes, config.max_pages,
                                      config.pages_per_chunk, config.request_timeout_s)

    def _probe(self, url: str, headers: Mapping[str, str]):
        """GET /readyz of one replica; the engine it says it runs goes to the page cache."""
        ready, answer = probe_ready(self.connections, url, headers)
        if self.cache is not None and ready:
            self.cache.engines.observe(url, answer.get(h.ENGINE))
        return ready, answer

    def cache_policy(self, client: str | None, cache_control: str | None) -> Policy | None:
        """How a request uses the page cache (None: it is off)."""
        return None if self.cache is None else self.cache.policy(client, cache_control)

    def start(self) -> None:
        self.scheduler.start()
        self.health.start(
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
    def reserve(self, content_length: int | None, is_json: bool) -> Ticket:
        """Before the body is read: room in this process's memory budget for reading and
        planning it and for the answer's pages in memory (outputs/spool.py), or 429 at once.
        What reading costs, measured (`make bench-gateway-memory`): about 4x a JSON body's
        length (the body, its base64 text, the decoded file, the PDF library's copy), about
        2.5x a multipart upload's (the file read from the form parser's spool, and the copy)."""
        length = content_length if content_length is not None else self.config.max_bytes
        factor = READ_COST_JSON if is_json else READ_COST_MULTIPART
        try:
            return self.front.reserve(int(length * factor) + self.answer_memory)
        except ApiError:
            metrics.REFUSED.labels("queue_full").inc()
            raise

    def check_answer_disk(self) -> None:
        """Before an answer that spools (anything but NDJSON) reads its body: 503 with
        Retry-After while this process's temporary disk is taken."""
        try:
            self.answer_disk.check(self.answer_memory)
        except ApiError:
            metrics.REFUSED.labels("disk_full").inc()
            raise

    def plan(self, fields: Mapping[str, Any], file_bytes: bytes | None,
             endpoint: Endpoint = OCR) -> Plan:
        return plan_document(fields, file_bytes, self.plan_limits, self.fetch_url, endpoint)

    def open(self, plan: Plan, priority: str = INTERACTIVE,
             reserved: Ticket | None = None, cache: Policy | None = None) -> Document:
        """Admit the document into the queue (429 when it does not fit, 503 when no replica
        is ready) and start sending its pages as replicas have room. The admission ticket
        (`reserved` while the body was read) goes with the document: its pages come back
        when the document is finished, its bytes (the file, and the answer's pages in memory
        when `reserved`) when whoever opened it has answered."""
        with tracing.span("admission", plan.request.log_id, pages=plan.num_pages,
                          priority=priority):
            if not self.replicas.any_not_known_down():
                metrics.REFUSED.labels("no_replica").inc()
                raise ApiError(503, "No OCR replica is ready: retry shortly",
                               {"Retry-After": "2"})
            held = len(plan.request.file_bytes) + (self.answer_memory if reserved else 0)
            try:
                ticket = self.front.admit(plan.num_pages, held, reserved)
            except ApiError:
                metrics.REFUSED.labels("queue_full").inc()
                raise
        try:
            source = plan.source()
        except BaseException:
            ticket.release()
            raise
        request = plan.request
        document_cache = None if self.cache is None else self.cache.document(
            cache, request.api_params, request.visualize, not plan.split, request.page_range,
            plan.kind, plan.endpoint.path)
        return self.scheduler.submit(Document(plan.groups, source, ticket,
                                              log_id=plan.request.log_id,
                                              deadline=plan.deadline, kind=plan.kind,
                                              priority=priority, cache=document_cache,
                                              endpoint=plan.endpoint))

    def pages_in_order(self, plan: Plan, keep_sending: Callable[[], bool] = lambda: True, *,
                       priority: str = INTERACTIVE, document: Document | None = None,
                       client_gone: Callable[[], bool] = lambda: False,
                       cache: Policy | None = None) -> Iterator[PageOutcome]:
        """Every page's outcome in page order, each as soon as it and all before it are done.
        Once `keep_sending()` turns False no new chunk goes out (those in flight still come
        back). Closing the iterator, or the client going away, takes the document's queued
        pages out of the queue."""
        doc = document or self.open(plan, priority, cache=cache)
        try:
            for pages in doc.in_order(client_gone):
                doc.ticket.pages_done(len(pages))
                yield from pages
                if not keep_sending():
                    self.scheduler.stop_sending(doc)
        finally:
            self.scheduler.finish(doc)
            if document is None:  # opened here: nothing else holds its bytes
                doc.ticket.release()

    def collect(self, plan: Plan, document: Document | None = None,
                client_gone: Callable[[], bool] = lambda: False) -> PageSpool:
        """Every page of the document, in order, spooled (outputs/spool.py) for outputs/ to
        answer with; the caller closes the spool once answered. Without partial results,
        the first failed page stops new pages going out, and the error (a 4xx/5xx JSON
        answer) names every page that failed among those already sent."""
        pages = PageSpool(self.answer_memory, self.answer_disk.answer_bytes, self.answer_disk)
        failed: list[PageOutcome] = []
        outcomes = self.pages_in_order(plan, lambda: plan.partial or not failed,
                                       document=document, client_gone=client_gone)
        try:
            for page in outcomes:
                pages.append(page)
                if page.error_code:
                    failed.append(page)
        except BaseException:
            pages.close()
            raise
        finally:
            outcomes.close()
        _count_pages(pages.light)
        if failed and not plan.partial:
            pages.close()
            status, message = paddlex.describe_failures(failed)
            skipped = plan.num_pages - len(pages)
            if skipped:
                message += f" ({skipped} later page(s) were not attempted)"
            raise ApiError(status, message)
        return pages

    def answer(self, plan: Plan, pages: PageSpool) -> outputs.Answer:
        """What outputs/ writes an answer from, for these pages of the planned document."""
        request = plan.request
        return outputs.Answer(request.log_id, plan.kind, request.page_range is not None,
                              lambda: iter(pages), lambda: request.file_bytes, len(pages),
                              plan.endpoint)

    def stream(self, plan: Plan, document: Document | None = None,
               client_gone: Callable[[], bool] = lambda: False) -> Iterator[bytes]:
        """NDJSON: one line per page in order (each with the document's page count), then a
        summary line. A client that closes the stream (the web page's Cancel) frees its
        queued pages within a client check, not at the next line that fails to be written."""
        pages: list[PageOutcome] = []
        log_id = plan.request.log_id
        extra = {"numPages": plan.num_pages} if plan.kind in (KIND_PDF, KIND_TIFF) else {}
        outcomes = self.pages_in_order(plan, document=document, client_gone=client_gone)

        def until_a_failure() -> Iterator[PageOutcome]:
            for page in outcomes:
                yield page
                if page.error_code and not plan.partial:
                    return

        try:
            yield from paddlex.ndjson_pages(log_id, until_a_failure(), pages, plan.endpoint,
                                            **extra)
        except ApiError as exc:
            yield paddlex.line(envelope.no_result(log_id, exc.status, exc.message))
            return
        finally:
            outcomes.close()
        _count_pages(pages)
        yield paddlex.line(paddlex.stream_summary_line(log_id, pages,
                                                       plan.request.page_range is not None))

    def shutdown(self) -> None:
        if self.cache is not None:
            self.cache.close()
        self.pdf_builder.close()
        self.health.stop()
        self.scheduler.stop()
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.connections.close()


def _count_pages(pages: list[PageOutcome]) -> None:
    failed = sum(1 for page in pages if page.error_code)
    metrics.PAGES.labels("ok").inc(len(pages) - failed)
    metrics.PAGES.labels("failed").inc(failed)

