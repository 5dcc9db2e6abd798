"""create_app(config, resolver=None): the gateway's routes, a few lines each; the request
stages live in service.GatewayService, the shared skeleton (logIds, health, metrics, JSON
errors) in services.flask_common."""

from __future__ import annotations

import logging
import time

from flask import Flask, Response, g, request, stream_with_context

from services.flask_common import create_service_app, outcome_of, read_ocr_fields
from services.ocr_api.logs import current_log_id

from . import metrics, outputs
from .config import GatewayConfig
from .service import GatewayService

log = logging.getLogger("gateway.http")


def create_app(config: GatewayConfig | None = None, resolver=None, start: bool = True) -> Flask:
    config = config or GatewayConfig.from_env()
    service = GatewayService(config, resolver=resolver)

    def readiness():
        ready, why = service.readiness()
        replicas = [{"url": r.url, "ready": r.ready, "inflight": r.inflight,
                     "served": r.served} for r in service.replicas.replicas()]
        return ready, why, {"detail": why, "replicas": replicas}

    app = create_service_app("gateway", max_file_bytes=config.max_bytes, readiness=readiness,
                             record_request=_record)
    app.extensions["gateway_service"] = service

    @app.post("/ocr")
    def ocr():
        output = outputs.negotiate(request.headers.get("Accept"))
        fields, file_bytes = read_ocr_fields()
        outputs.prepare_fields(output, fields)
        plan = service.plan(fields, file_bytes)
        current_log_id.set(plan.request.log_id)
        if output != outputs.NDJSON:
            return outputs.respond(output, service, plan, config)
        started = g.started

        def lines():
            try:
                yield from service.stream(plan)
            finally:
                _record(200, time.monotonic() - started)

        return Response(stream_with_context(lines()), mimetype=outputs.NDJSON)

    if start:
        service.start()
    return app


def _record(status: int, seconds: float) -> None:
    metrics.DOCUMENTS.labels(outcome_of(status), str(status)).inc()
    metrics.REQUEST_SECONDS.observe(seconds)
    log.info("ocr request", extra={"status": status, "seconds": round(seconds, 4)})
