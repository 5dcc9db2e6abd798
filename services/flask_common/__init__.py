"""Flask glue both services share: reading an /ocr body (JSON or multipart) into fields,
answering every error (ours, Flask's 404/405/413, and unexpected ones) as a PaddleX JSON
envelope with `errorCode` equal to the HTTP status, and never a stack trace."""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from services.ocr_api import envelope
from services.ocr_api.errors import ApiError, unprocessable
from services.ocr_api.logs import current_log_id
from services.ocr_api.request import form_fields_to_json, parse_json_body

log = logging.getLogger("http")


def read_ocr_fields() -> tuple[dict[str, Any], bytes | None]:
    """(fields, uploaded file bytes or None) from a JSON or multipart/form-data body."""
    if request.mimetype == "multipart/form-data":
        upload = request.files.get("file")
        fields = form_fields_to_json(request.form.to_dict())
        if upload is None:
            if "file" in fields:
                return fields, None
            raise unprocessable("multipart/form-data request without a 'file' part: "
                                "send -F file=@document.pdf")
        return fields, upload.read()
    return parse_json_body(request.get_data(cache=False)), None


def json_response(body: dict[str, Any], status: int = 200,
                  headers: dict[str, str] | None = None) -> Response:
    response = jsonify(body)
    response.status_code = status
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


def error_response(status: int, message: str, headers: dict[str, str] | None = None,
                   log_id: str | None = None) -> Response:
    log_id = log_id or current_log_id.get() or envelope.new_log_id()
    return json_response(envelope.no_result(log_id, status, message), status, headers)


def install_error_handlers(app: Flask, max_body_bytes: int) -> None:
    @app.errorhandler(ApiError)
    def _api_error(exc: ApiError):
        return error_response(exc.status, exc.message, exc.headers,
                              getattr(exc, "log_id", None))

    @app.errorhandler(RequestEntityTooLarge)
    def _too_large(exc):
        return error_response(413, f"The request body is over this server's limit of "
                                   f"{max_body_bytes} bytes")

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
