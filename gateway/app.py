"""create_app(config, resolver=None): the gateway's routes, a few lines each; the request
stages live in service.GatewayService, the shared skeleton (logIds, health, metrics, JSON
errors) in services.flask_common."""

from __future__ import annotations

import logging
import socket
import time
from typing import Callable

from flask import Flask, Response, g, request, stream_with_context

from services.flask_common import create_service_app, outcome_of, read_ocr_fields
from services.ocr_api import heap, tracing
from services.ocr_api.openapi import register as register_openapi
from services.ocr_api.headers import CACHED_PAGES, NUM_PAGES
from services.ocr_api.logs import current_log_id

from . import metrics, openapi, outputs, web
from .auth import access_policy
from .config import GatewayConfig
from .endpoint import LAYOUT, OCR, Endpoint
from .jobs import install_jobs
from .jobs.api import client_identity
from .service import GatewayService

log = logging.getLogger("gateway.http")

TRIM_AFTER_BYTES = 2 * 2**20  # a request body at least this large: the heap is trimmed after it


def create_app(config: GatewayConfig | None = None, resolver=None, start: bool = True) -> Flask:
    config = config or GatewayConfig.from_env()
    tracing.configure("ocrfleet-gateway")  # after fork: gunicorn builds the app in each worker
    service = GatewayService(config, resolver=resolver)

    def readiness():  # open to probes: counts only, never the replicas' addresses
        ready, why = service.readiness()
        return ready, why, {"detail": why}

    app = create_service_app("gateway", max_file_bytes=config.max_bytes, readiness=readiness,
                             record_request=_record, access=access_policy(config),
                             liveness=service.liveness)
    app.extensions["gateway_service"] = service
    web.register(app, service)  # the web page at / and GET /fleet

    @app.post("/ocr")
    def ocr():
        return serve(OCR, outputs.OFFERED)

    @app.post("/layout-parsing")
    def layout_parsing():
        """PP-StructureV3's endpoint across the fleet: /ocr's path, the pages sent to the
        workers' /layout-parsing; JSON, NDJSON or the document's Markdown."""
        return serve(LAYOUT, outputs.LAYOUT_OFFERED)

    def serve(endpoint: Endpoint, offered: tuple[str, ...]) -> Response:
        # the document's span: its trace's root, or under the caller's span (its traceparent)
        span = tracing.begin("document", parent=tracing.incoming(request.headers),
                             kind=tracing.SERVER)
        try:
            with tracing.active(span):
                response = reserve_and_answer(endpoint, offered)
        except BaseException:
            span.end()
            raise
        response.call_on_close(span.end)  # once the answer (a stream too) has gone
        return response

    def reserve_and_answer(endpoint: Endpoint, offered: tuple[str, ...]) -> Response:
        output = outputs.negotiate(request.headers.get("Accept"), offered)
        if output != outputs.NDJSON:  # its pages (and a ZIP) spool to this process's disk
            service.check_answer_disk()
        # the request's room in the memory budget, taken before its body is read
        length = request.content_length
        ticket = service.reserve(length, request.mimetype != "multipart/form-data")
        try:
            response = answer(output, ticket, endpoint)
        except BaseException:
            bytes_back(ticket, length)
            raise
        response.call_on_close(lambda: bytes_back(ticket, length))  # once the answer has gone
        return response

    def answer(output: str, ticket, endpoint: Endpoint) -> Response:
        fields, file_bytes = read_ocr_fields()
        outputs.prepare_fields(output, fields)
        plan = service.plan(fields, file_bytes, endpoint)
        current_log_id.set(plan.request.log_id)
        tracing.tag(log_id=plan.request.log_id, pages=plan.num_pages, kind=plan.kind)
        cache = service.cache_policy(client_identity(), request.headers.get("Cache-Control"))
        document = service.open(plan, reserved=ticket, cache=cache)
        if output != outputs.NDJSON:
            pages = service.collect(plan, document, client_gone=client_gone())
            try:
                response = outputs.respond(output, service.answer(plan, pages),
                                           config.pdf_fonts, service.pdf_builder,
                                           service.answer_disk)
            except BaseException:
                pages.close()
                raise
            response.call_on_close(pages.close)
            if response.is_streamed:  # create_service_app counts only whole answers
                started = g.started
                response.call_on_close(
                    lambda: _record(response.status_code, time.monotonic() - started))
            if service.cache is not None:  # pages answered from the page cache
                hits = document.cache.hits if document.cache is not None else 0
                response.headers[CACHED_PAGES] = str(hits)
            return response
        started, gone = g.started, client_gone()

        def lines():
            try:
                yield from service.stream(plan, document, gone)
            finally:
                _record(200, time.monotonic() - started)

        response = Response(stream_with_context(lines()), mimetype=outputs.NDJSON)
        if plan.kind in ("pdf", "tiff"):
            response.headers[NUM_PAGES] = str(plan.num_pages)  # totals before page 1
        return response

    install_jobs(app, config, service, start=start)
    register_openapi(app, lambda built: openapi.build(built, config))  # GET /openapi.json
    if start:
        service.start()
    return app


def client_gone() -> Callable[[], bool]:
    """A check whether the client of this request has closed its connection (gunicorn hands
    the socket over in the environ): a peek that reads nothing means the peer hung up."""
    sock = request.environ.get("gunicorn.socket")
    if sock is None:
        return lambda: False

    def gone() -> bool:
        try:
            return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    return gone


def _record(status: int, seconds: float) -> None:
    metrics.DOCUMENTS.labels(outcome_of(status), str(status)).inc()
    metrics.REQUEST_SECONDS.observe(seconds)
    log.info("ocr request", extra={"status": status, "seconds": round(seconds, 4)})


def bytes_back(ticket, length: int | None) -> None:
    """A request's bytes go back to the memory budget once it is answered, and after a large
    body to the OS as well: glibc would keep the request's peak (the body, its base64 text,
    the decoded file, the PDF library's parse of it) in the heap of the thread that served it,
    and over the threads the gateway's resident memory would creep up by one peak each
    (services/ocr_api/heap.py)."""
    ticket.release()
    if length is not None and length >= TRIM_AFTER_BYTES:
        heap.malloc_trim()
