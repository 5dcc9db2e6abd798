"""create_app(config, engine=None): the worker's routes, a few lines each. The request stages
live in service.OcrService; the shared skeleton (logIds, health, metrics, JSON errors) in
services.flask_common."""

from __future__ import annotations

import logging
import os

from flask import Flask, request

from services.flask_common import (create_service_app, json_response, outcome_of,
                                   read_ocr_fields)
from services.flask_common.access import AccessPolicy, KeyCheck, presented_key
from services.ocr_api import tracing
from services.ocr_api.headers import ENGINE, PRIORITY, START_WITHIN_MS, WITHIN_TARGET
from services.ocr_api.logs import current_log_id
from services.ocr_api.openapi import register as register_openapi

from . import metrics, openapi
from .capacity import DEADLINE_HEADER, capacity_headers, parse_deadline_ms, parse_priority
from .config import WorkerConfig
from .engine import Engine
from .health import stall_reason
from .service import OcrService

log = logging.getLogger("ocr_worker.http")


def create_app(config: WorkerConfig | None = None, engine: Engine | None = None,
               start: bool = True) -> Flask:
    config = config or WorkerConfig.from_env()
    tracing.configure("ocrfleet-worker")  # after fork: gunicorn builds the app in each process
    service = OcrService(config, engine)

    def liveness() -> str | None:
        return stall_reason(service.batcher.progress(), config.stall_timeout_s)

    def readiness():
        stalled = liveness()
        ready, why = (False, stalled) if stalled else service.readiness()
        # pid: which of the OCR_INSTANCES_PER_DEVICE processes behind this port answered
        return ready, why, {"engine": service.engine.info, "capacity": service.capacity(),
                            "pid": os.getpid()}

    app = create_service_app("ocr_worker", max_file_bytes=config.max_bytes,
                             readiness=readiness, record_request=_record, liveness=liveness,
                             access=AccessPolicy(keys=config.api_tokens,
                                                 metrics_port=config.metrics_port))
    app.extensions["ocr_service"] = service
    internal = KeyCheck(config.api_tokens)

    def from_the_fleet(status: int) -> bool:
        """Whether to take in the fleet board a request carries: only from a request this
        worker served (not one it refused or rejected), and, with OCR_API_TOKEN set, only
        from a caller that sent it (the probes are open to anyone). Anything else that
        reaches a worker could otherwise tell every gateway how to place its pages."""
        return status < 400 and (not internal or internal.accepts(presented_key(request.headers)))

    @app.post("/ocr")
    def ocr():
        return serve(layout=False)

    @app.post("/layout-parsing")
    def layout_parsing():
        """PP-StructureV3's endpoint: the same stages, each page then parsed into regions,
        tables and Markdown (services/ocr_worker/layout.py)."""
        return serve(layout=True)

    def serve(layout: bool):
        deadline_ms = parse_deadline_ms(request.headers.get(DEADLINE_HEADER))
        first = parse_priority(request.headers.get(PRIORITY))
        start_within_ms = parse_deadline_ms(request.headers.get(START_WITHIN_MS),
                                            START_WITHIN_MS)
        # the gateway's attempt (its traceparent) is this request's parent span
        with tracing.span("ocr request", parent=tracing.incoming(request.headers),
                          kind=tracing.SERVER):
            return json_response(service.handle(read_ocr_fields,
                                                log_id_hook=current_log_id.set,
                                                deadline_ms=deadline_ms, first=first,
                                                start_within_ms=start_within_ms,
                                                within_target=request.headers.get(
                                                    WITHIN_TARGET) == "1",
                                                content_length=request.content_length,
                                                layout=layout))

    @app.after_request
    def _capacity_headers(response):
        """Every /ocr and /readyz answer, errors included, says how much room is left, and
        carries the fleet board (services/ocr_worker/capacity.py); the board it was sent is
        taken in only from the fleet (`from_the_fleet`)."""
        if request.path in ("/ocr", "/layout-parsing", "/readyz"):
            capacity = service.capacity()
            response.headers.update(capacity_headers(capacity["slots"], capacity["free"],
                                                     service.admission.held,
                                                     service.pace.page_s))
            heard = request.headers if from_the_fleet(response.status_code) else {}
            response.headers.update(service.presence.answer_headers(heard))
            identity = service.engine_identity()
            if identity:
                response.headers[ENGINE] = identity
        return response

    register_openapi(app, lambda built: openapi.build(built, config))  # GET /openapi.json
    if start:
        service.start()
    return app


def _record(status: int, seconds: float) -> None:
    metrics.REQUESTS.labels(outcome_of(status), str(status)).inc()
    metrics.REQUEST_SECONDS.observe(seconds)
    log.info("ocr request", extra={"status": status, "seconds": round(seconds, 4)})
