"""create_app(config, resolver=None): the gateway's routes, a few lines each; the request
stages live in service.GatewayService."""

from __future__ import annotations

import logging
import time

from flask import Flask, Response, g, request, stream_with_context

from services.flask_common import install_error_handlers, json_response, read_ocr_fields
from services.ocr_api import envelope
from services.ocr_api.envelope import new_log_id, usable_log_id
from services.ocr_api.errors import ApiError
from services.ocr_api.logs import current_log_id

from . import metrics
from .config import GatewayConfig
from .service import GatewayService

log = logging.getLogger("gateway.http")
NDJSON = "application/x-ndjson"


def create_app(config: GatewayConfig | None = None, resolver=None, start: bool = True) -> Flask:
    config = config or GatewayConfig.from_env()
    service = GatewayService(config, resolver=resolver)
    app = Flask("gateway")
    app.json.sort_keys = False
    max_body = config.max_bytes * 4 // 3 + 1024 * 1024
    app.config["MAX_CONTENT_LENGTH"] = max_body
    app.config["MAX_FORM_MEMORY_SIZE"] = max_body
    app.extensions["gateway_service"] = service
    install_error_handlers(app, max_body)

    @app.before_request
    def _begin():
        g.started = time.monotonic()
        g.log_id = usable_log_id(request.headers.get("X-Log-Id")) or new_log_id()
        current_log_id.set(g.log_id)

    @app.after_request
    def _finish(response: Response):
        if request.path == "/ocr" and not response.is_streamed:
            _record(response.status_code, time.monotonic() - g.started)
        response.headers["X-Log-Id"] = current_log_id.get() or ""
        return response

    @app.post("/ocr")
    def ocr():
        fields, file_bytes = read_ocr_fields()
        if usable_log_id(fields.get("logId")) is None:
            fields = {**fields, "logId": g.log_id}
        plan = service.plan(fields, file_bytes)
        current_log_id.set(plan.request.log_id)
        if NDJSON in request.headers.get("Accept", ""):
            started = g.started

            def lines():
                try:
                    yield from service.stream(plan)
                finally:
                    _record(200, time.monotonic() - started)

            return Response(stream_with_context(lines()), mimetype=NDJSON)
        return json_response(service.collect(plan))

    @app.get("/healthz")
    def healthz():
        return json_response(envelope.no_result(g.log_id, 0, "Healthy"))

    @app.get("/readyz")
    def readyz():
        ready, why = service.readiness()
        if not ready:
            raise ApiError(503, f"Not ready: {why}")
        return json_response({**envelope.no_result(g.log_id, 0, "Ready"), "detail": why,
                              "replicas": [{"url": r.url, "ready": r.ready,
                                            "inflight": r.inflight, "served": r.served}
                                           for r in service.replicas.replicas()]})

    @app.get("/metrics")
    def prometheus_metrics():
        service.readiness()  # refresh the replica gauges
        payload, content_type = metrics.render()
        return Response(payload, content_type=content_type)

    if start:
        service.start()
    return app


def _record(status: int, seconds: float) -> None:
    outcome = "ok" if status < 400 else ("rejected" if status in (429, 503) else "error")
    metrics.DOCUMENTS.labels(outcome, str(status)).inc()
    metrics.REQUEST_SECONDS.observe(seconds)
    log.info("ocr request", extra={"status": status, "seconds": round(seconds, 4)})
