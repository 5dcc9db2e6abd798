"""Flask glue both services share: the app skeleton (request logIds, /healthz, /readyz,
/metrics, body limits), reading an /ocr body (JSON or multipart) into fields, and answering
every error (ours, Flask's 404/405/413, and unexpected ones) as a PaddleX JSON envelope with
`errorCode` equal to the HTTP status, never a stack trace."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from flask import Flask, Response, g, jsonify, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from services.ocr_api import envelope
from services.ocr_api.headers import LOG_ID as LOG_ID_HEADER
from services.ocr_api.errors import ApiError, unprocessable
from services.ocr_api import logs
from services.ocr_api.logs import current_log_id
from services.ocr_api.request import form_fields_to_json, parse_json_body

from .access import AccessPolicy, install_access_control
from .prometheus import render_metrics

log = logging.getLogger("http")

MAX_FORM_PARTS = 100  # a PaddleX form has a file and a dozen fields


def create_service_app(name: str, *, max_file_bytes: int,
                       readiness: Callable[[], tuple[bool, str, dict[str, Any]]],
                       record_request: Callable[[int, float], None],
                       liveness: Callable[[], str | None] = lambda: None,
                       access: AccessPolicy = AccessPolicy()) -> Flask:
    """A Flask app with what both services share; the caller adds POST /ocr.
    `readiness()` -> (ready, why, extra fields for /readyz; nothing internal such as
    addresses: the probes are open); `liveness()` -> why the process must be restarted, or
    None; `record_request(status, seconds)` is called once per /ocr answer that is not
    streamed; `access`: API keys and the metrics port (access.py)."""
    app = Flask(name)
    app.json.sort_keys = False  # keep PaddleX's field order
    max_body = max_file_bytes * 4 // 3 + 1024 * 1024  # base64 and JSON/multipart overhead
    app.config["MAX_CONTENT_LENGTH"] = max_body
    app.config["MAX_FORM_MEMORY_SIZE"] = max_body
    app.config["MAX_FORM_PARTS"] = MAX_FORM_PARTS
    install_error_handlers(app, max_body)

    @app.before_request
    def _begin():
        g.started = time.monotonic()
        g.log_id = logs.begin(request.headers.get(LOG_ID_HEADER))

    install_access_control(app, access)  # after _begin: a 401 carries the logId

    @app.after_request
    def _finish(response: Response):
        if request.path == "/ocr" and not response.is_streamed:
            record_request(response.status_code, time.monotonic() - g.started)
        if response.status_code >= 400:
            drain_unread_body(max_body)
        response.headers[LOG_ID_HEADER] = current_log_id.get() or ""
        return response

    @app.get("/healthz")
    def healthz():
        dead = liveness()
        if dead:
            raise ApiError(503, f"Not live: {dead}")
        return json_response(envelope.no_result(g.log_id, 0, "Healthy"))

    @app.get("/readyz")
    def readyz():
        ready, why, extra = readiness()
        if not ready:
            raise ApiError(503, f"Not ready: {why}")
        return json_response({**envelope.no_result(g.log_id, 0, "Ready"), **extra})

    @app.get("/metrics")
    def prometheus_metrics():
        payload, content_type = render_metrics()
        return Response(payload, content_type=content_type)

    return app


def drain_unread_body(max_bytes: int) -> None:
    """Read and drop what is left of the request body, up to `max_bytes`. An answer sent
    before the body was read (a refusal: busy, at target, not ready, unauthorised) would
    otherwise close the connection with bytes unread (gunicorn drains 64 KiB at most), and
    the kernel resets it: a balancer then reads "upstream prematurely closed connection",
    counts the busy worker as failed, and a client sees a reset instead of the JSON answer.
    A body over `max_bytes` (413) is left to the close."""
    length = request.content_length
    if length is not None and length > max_bytes:
        return
    left = max_bytes
    try:  # werkzeug's stream: bounded by Content-Length (or the chunked body's end)
        while left > 0:
            chunk = request.stream.read(min(64 * 1024, left))
            if not chunk:
                return
            left -= len(chunk)
    except (OSError, ValueError, HTTPException):  # gone, closed, or over a limit
        return


def read_ocr_fields() -> tuple[dict[str, Any], bytes | None]:
    """(fields, uploaded file bytes or None) from a JSON or multipart/form-data body."""
    if request.mimetype == "multipart/form-data":
        upload = request.files.get("file")
        fields = form_fields_to_json(request.form.to_dict())
        if upload is None and "file" not in fields:
            raise unprocessable("multipart/form-data request without a 'file' part: "
                                "send -F file=@document.pdf")
        file_bytes = upload.read() if upload is not None else None
    else:
        fields, file_bytes = parse_json_body(request.get_data(cache=False)), None
    return fields, file_bytes


def outcome_of(status: int) -> str:
    return "ok" if status < 400 else ("rejected" if status in (429, 503) else "error")


def json_response(body: dict[str, Any], status: int = 200,
                  headers: dict[str, str] | None = None) -> Response:
    response = jsonify(body)
    response.status_code = status
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


def error_response(status: int, message: str, headers: dict[str, str] | None = None,
                   log_id: str | None = None) -> Response:
    log_id = log_id or current_log_id.get() or logs.begin()
    return json_response(envelope.no_result(log_id, status, message), status, headers)


def install_error_handlers(app: Flask, max_body_bytes: int) -> None:
    @app.errorhandler(ApiError)
    def _api_error(exc: ApiError):
        return error_response(exc.status, exc.message, exc.headers,
                              getattr(exc, "log_id", None))

    @app.errorhandler(RequestEntityTooLarge)
    def _too_large(exc):
        # werkzeug raises this for a body over MAX_CONTENT_LENGTH, a form field over
        # MAX_FORM_MEMORY_SIZE and a form of more than MAX_FORM_PARTS parts alike
        return error_response(413, f"The request body is over this server's limit of "
                                   f"{max_body_bytes} bytes, or has more than "
                                   f"{app.config['MAX_FORM_PARTS']} multipart parts")

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException):
        messages = {
            404: f"No such endpoint: {request.path}. The OCR endpoint is POST /ocr",
            405: f"{request.method} is not allowed on {request.path}"
                 + (": use POST with a JSON body" if request.path == "/ocr" else ""),
        }
        headers = dict(exc.get_headers()) if exc.code == 405 else {}
        headers.pop("Content-Type", None)
        return error_response(exc.code or 500, messages.get(exc.code, exc.description or
                                                            exc.name), headers)

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):
        log.exception("unhandled error")
        return error_response(500, "Internal server error: the failure was logged with this "
                                   "logId")
