"""GatewayService: one /ocr request through the gateway — decode it (the shared parser), plan
its chunks (an image or a short PDF whole, a longer PDF cut into pages), fan the chunks out to
replicas (bounded per request and globally), and hand back the pages in order, either as one
PaddleX envelope or as a stream. No Flask here."""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping

from services.ocr_api import envelope
from services.ocr_api.errors import ApiError, too_large, unprocessable
from services.ocr_api.request import OcrRequest, parse_ocr_request, resolve_page_range
from services.ocr_api.sniff import KIND_PDF
from services.ocr_api.url_input import make_url_fetcher

from . import assemble, metrics
from .assemble import PageOutcome
from .config import GatewayConfig
from .dispatch import ChunkFailed, Dispatcher, DispatchSettings, make_pool, probe_ready
from .split import Chunk, count_pages, iter_chunks
from .upstreams import MODE_DNS, MODE_LIST, MODE_LOAD_BALANCER, ReplicaSet

log = logging.getLogger("gateway")


@dataclass
class Plan:
    """How one request is cut: its kind, its chunks (made lazily), how many pages."""

    request: OcrRequest
    kind: str
    chunks: Iterable[Chunk]
    num_pages: int
    split: bool
    partial: bool
    deadline: float


def build_replica_set(config: GatewayConfig, probe: Callable[[str], bool],
                      resolver=None) -> ReplicaSet:
    options: dict[str, Any] = dict(probe=probe, eject_s=config.eject_s)
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
        self.replicas = build_replica_set(config, lambda url: probe_ready(self.pool, url),
                                          resolver)
        self.dispatcher = Dispatcher(self.replicas, self.pool, DispatchSettings(
            page_timeout_s=config.page_timeout_s, connect_timeout_s=config.connect_timeout_s,
            max_attempts=config.max_attempts, backoff_s=config.backoff_s))
        self.executor = ThreadPoolExecutor(config.max_inflight, thread_name_prefix="fanout")
        self.fetch_url = (make_url_fetcher(config.max_bytes, config.url_timeout_s)
                          if config.allow_url_input else None)

    def start(self) -> None:
        self.replicas.start_background(
            self.config.dns_refresh_s, self.config.health_interval_s,
            after_probe=lambda replicas: metrics.record_replicas(replicas, time.monotonic()))

    def readiness(self) -> tuple[bool, str]:
        replicas = self.replicas.replicas()
        if self.replicas.any_ready():
            ready = sum(1 for r in replicas if r.ready)
            return True, f"{ready} of {len(replicas)} replica(s) ready"
        return False, f"no replica is ready ({len(replicas)} known)"

    # ---- stages ------------------------------------------------------------------------------
    def plan(self, fields: Mapping[str, Any], file_bytes: bytes | None) -> Plan:
        deadline = time.monotonic() + self.config.request_timeout_s
        request = parse_ocr_request(fields, max_bytes=self.config.max_bytes,
                                    file_bytes=file_bytes, fetch_url=self.fetch_url)
        partial = fields.get("returnPartialResults", False)
        if not isinstance(partial, bool):
            raise unprocessable("returnPartialResults must be true or false")
        if request.kind != KIND_PDF:
            chunk = Chunk((0,), request.file_bytes)
            return Plan(request, request.kind, [chunk], 1, False, partial, deadline)
        total = count_pages(request.file_bytes)
        if total == 0:
            raise unprocessable("The PDF has no pages")
        indices = resolve_page_range(request.page_range, total)
        if len(indices) > self.config.max_pages:
            raise too_large(f"The request selects {len(indices)} PDF pages, over this "
                            f"gateway's limit of {self.config.max_pages}: send fewer pages "
                            "(pageRange) or split the document")
        if len(indices) <= self.config.pages_per_chunk:
            chunk = Chunk(tuple(indices), request.file_bytes)
            return Plan(request, KIND_PDF, [chunk], len(indices), False, partial, deadline)
        chunks = iter_chunks(request.file_bytes, indices, self.config.pages_per_chunk)
        return Plan(request, KIND_PDF, chunks, len(indices), True, partial, deadline)

    def _chunk_body(self, plan: Plan, chunk: Chunk) -> bytes:
        request = plan.request
        page_range = None if plan.split else request.page_range
        body = request.forward_body(chunk.pdf, plan.kind, page_range)
        return json.dumps(body).encode()

    def _process_chunk(self, plan: Plan, chunk: Chunk) -> list[PageOutcome]:
        label = (f"page(s) {chunk.page_indices[0] + 1}-{chunk.page_indices[-1] + 1}"
                 if len(chunk.page_indices) > 1 else f"page {chunk.page_indices[0] + 1}")
        try:
            reply = self.dispatcher.send(self._chunk_body(plan, chunk),
                                         log_id=plan.request.log_id, deadline=plan.deadline,
                                         label=label)
            return assemble.pages_from_reply(reply, chunk.page_indices, plan.kind)
        except ChunkFailed as exc:
            return assemble.failed_pages(chunk.page_indices, exc.status, exc.message,
                                         plan.kind)
        except assemble.MalformedReply as exc:
            return assemble.failed_pages(chunk.page_indices, 502, str(exc), plan.kind)

    def pages_in_order(self, plan: Plan, keep_sending: Callable[[], bool] = lambda: True
                       ) -> Iterator[PageOutcome]:
        """Every page's outcome in page order, each as soon as it and all before it are done.
        At most max_inflight_per_request chunks are outstanding. Once `keep_sending()` turns
        False no new chunk goes out (the ones in flight still come back); closing the iterator
        cancels the chunks not yet sent."""
        chunks = iter(plan.chunks)
        window = self.config.max_inflight_per_request
        futures: dict[int, Future] = {}
        next_position, head = 0, 0
        exhausted = False
        try:
            while True:
                while not exhausted and sum(not f.done() for f in futures.values()) < window:
                    chunk = next(chunks, None) if keep_sending() else None
                    if chunk is None:
                        exhausted = True
                        break
                    futures[next_position] = self.executor.submit(self._process_chunk, plan,
                                                                  chunk)
                    next_position += 1
                while head in futures and futures[head].done():
                    yield from futures.pop(head).result()
                    head += 1
                if exhausted and head == next_position:
                    return
                pending = [f for f in futures.values() if not f.done()]
                remaining = plan.deadline - time.monotonic() + 5.0
                if remaining <= 0:
                    raise ApiError(504, "The request deadline passed before all pages were "
                                        "processed")
                wait(pending, timeout=remaining, return_when=FIRST_COMPLETED)
        finally:
            for future in futures.values():
                future.cancel()
            close = getattr(chunks, "close", None)
            if close:
                close()

    def collect(self, plan: Plan) -> dict[str, Any]:
        """The whole document as one PaddleX envelope. Without partial results, the first
        failed page stops new pages going out; the error names every page that failed among
        those already sent."""
        pages: list[PageOutcome] = []
        failed: list[PageOutcome] = []
        outcomes = self.pages_in_order(plan, keep_sending=lambda: plan.partial or not failed)
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

    def stream(self, plan: Plan) -> Iterator[bytes]:
        """NDJSON: one line per page in order, then a summary line."""
        pages: list[PageOutcome] = []
        outcomes = self.pages_in_order(plan)
        try:
            for page in outcomes:
                pages.append(page)
                yield _line(assemble.stream_page_line(plan.request.log_id, page))
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
        self.executor.shutdown(wait=False, cancel_futures=True)


def _count_pages(pages: list[PageOutcome]) -> None:
    failed = sum(1 for page in pages if page.error_code)
    metrics.PAGES.labels("ok").inc(len(pages) - failed)
    metrics.PAGES.labels("failed").inc(failed)


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode() + b"\n"
