"""create_app(config, engine=None): the worker's routes, a few lines each. The request stages
live in service.OcrService; errors become PaddleX envelopes (services.flask_common)."""

from __future__ import annotations

import logging
import time

from flask import Flask, Response, g, request

from services.flask_common import install_error_handlers, json_response, read_ocr_fields
from services.ocr_api import envelope
from services.ocr_api.envelope import new_log_id, usable_log_id
from services.ocr_api.errors import ApiError
from services.ocr_api.logs import current_log_id

from . import metrics
from .config import WorkerConfig
from .engine import Engine
from .service import OcrService

log = logging.getLogger("ocr_worker.http")


def create_app(config: WorkerConfig | None = None, engine: Engine | None = None,
               start: bool = True) -> Flask:
    config = config or WorkerConfig.from_env()
    service = OcrService(config, engine)
    app = Flask("ocr_worker")
    app.json.sort_keys = False  # keep PaddleX's field order
    max_body = config.max_bytes * 4 // 3 + 1024 * 1024
    app.config["MAX_CONTENT_LENGTH"] = max_body
    app.config["MAX_FORM_MEMORY_SIZE"] = max_body
    app.extensions["ocr_service"] = service
    install_error_handlers(app, max_body)

    @app.before_request
    def _begin():
        g.started = time.monotonic()
        g.log_id = usable_log_id(request.headers.get("X-Log-Id")) or new_log_id()
        current_log_id.set(g.log_id)

    @app.after_request
    def _finish(response: Response):
        if request.path == "/ocr":
            seconds = time.monotonic() - g.get("started", time.monotonic())
            outcome = "ok" if response.status_code < 400 else (
                "rejected" if response.status_code in (429, 503) else "error")
            metrics.REQUESTS.labels(outcome, str(response.status_code)).inc()
            metrics.REQUEST_SECONDS.observe(seconds)
            log.info("ocr request", extra={"status": response.status_code,
                                           "seconds": round(seconds, 4),
                                           "bytes_in": request.content_length})
        response.headers["X-Log-Id"] = current_log_id.get() or ""
        return response

    @app.post("/ocr")
    def ocr():
        def read_fields():
            fields, file_bytes = read_ocr_fields()
            if usable_log_id(fields.get("logId")) is None:
                fields = {**fields, "logId": g.log_id}
            return fields, file_bytes

        return json_response(service.handle(read_fields, log_id_hook=current_log_id.set))

    @app.get("/healthz")
    def healthz():
        return json_response(envelope.no_result(g.log_id, 0, "Healthy"))

    @app.get("/readyz")
    def readyz():
        ready, why = service.readiness()
        if not ready:
            raise ApiError(503, f"Not ready: {why}")
        return json_response({**envelope.no_result(g.log_id, 0, "Ready"),
                              "engine": service.engine.info})

    @app.get("/metrics")
    def prometheus_metrics():
        payload, content_type = metrics.render()
        return Response(payload, content_type=content_type)

    if start:
        service.start()
    return app
