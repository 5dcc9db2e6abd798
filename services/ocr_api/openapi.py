"""The OpenAPI 3.1 document both services serve at `/openapi.json`: the pieces the gateway
and the worker share (the PaddleX `/ocr` body and envelope, the error envelope with one
response per status, the headers, the probes), each built from the code's own field lists,
validators and limits, and `register`, which serves a service's document.

Why a builder of plain dicts rather than apispec, spectree or flask-openapi3: those wrap or
decorate the routes, validate bodies with pydantic on the request path, or need schema
classes beside the validators we have. This reads what the request path already uses
(`PIPELINE_PARAMS` and the schema each validator carries, the header names, the limits in
the config, the app's URL map) and adds nothing to a request: the document is built once,
on the first GET /openapi.json. tests/test_openapi.py holds it to the routes, to PaddleX's
pydantic models, to docs/api.md and to live answers; tests/test_schemathesis.py fuzzes a
fleet with it (docs/openapi.md)."""

from __future__ import annotations

from typing import Any, Callable

from flask import Flask

from services.flask_common import json_response

from . import headers as h
from . import request as ocr_request
from .page_range import MAX_SPEC_CHARS

PATH = "/openapi.json"
OPENAPI_VERSION = "3.1.0"
LOG_ID_PATTERN = r"^[A-Za-z0-9._:\-]{1,128}$"  # envelope.usable_log_id

# Why each error status is answered, per tier: the `description` of its response object
ERROR_REASONS = {
    400: "The body is empty, not JSON, holds more than "
         f"{ocr_request.MAX_JSON_VALUES} JSON values or is nested too deeply",
    401: "API keys are on and the request carries no key or a wrong one",
    404: "No such endpoint, or no such job",
    405: "The method is not allowed on this path",
    406: "`Accept` names no format this answers in",
    409: "The job's result was asked for while the job is queued or running",
    410: "The job was cancelled",
    413: "The body, the file or its pages are over this server's limits",
    422: "A field is missing, of the wrong type or out of range, or the file is not a "
         "readable PDF or image",
    429: "The client's job limits, or this gateway's queue or memory budget, are full",
    500: "An unexpected failure; it was logged with this logId",
    502: "A page failed on every replica",
    503: "Busy, draining, not ready, or the job store cannot be reached",
    504: "The request's deadline passed",
}
RETRY_STATUSES = (429, 503)


# ---- small helpers ------------------------------------------------------------------------------
def ref(kind: str, name: str) -> dict[str, str]:
    return {"$ref": f"#/components/{kind}/{name}"}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` or null (PaddleX's Optional fields: null is the same as leaving it out)."""
    widened = {**schema, "enum": [*schema["enum"], None]} if "enum" in schema else dict(schema)
    if "type" in schema:
        kind = schema["type"]
        widened["type"] = [*(kind if isinstance(kind, list) else [kind]), "null"]
    return widened


def json_content(schema: dict[str, Any], example: Any = None) -> dict[str, Any]:
    content: dict[str, Any] = {"schema": schema}
    if example is not None:
        content["example"] = example
    return {"application/json": content}


# ---- the /ocr request -------------------------------------------------------------------------
def ocr_fields(extra: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """The /ocr fields: PaddleX's (`file`, `fileType`, the pipeline parameters as
    `PIPELINE_PARAMS` validates them, `visualize`, `logId`) and our `pageRange` and
    `textLayer`, plus the tier's `extra` ones."""
    fields: dict[str, dict[str, Any]] = {
        "file": {"type": "string", "description":
                 "The document, base64 (a `data:` URI prefix is accepted), or an http(s) "
                 "URL where URL input is on"},
        "fileType": {"enum": [ocr_request.FILE_TYPE_PDF, ocr_request.FILE_TYPE_IMAGE, None],
                     "description": "0 PDF, 1 image, null: detected from the bytes"},
    }
    for name, (_, validate) in ocr_request.PIPELINE_PARAMS.items():
        fields[name] = nullable(validate.schema)
    fields["visualize"] = {**nullable(ocr_request._boolean.schema), "description":
                           "Return the visualization images (the default unless OCR_VISUALIZE "
                           "says otherwise)"}
    fields["logId"] = {"description": "Any value: a string of at most 128 characters from "
                       "`A-Za-z0-9._:-` is kept as the request's logId, anything else is "
                       "replaced by a fresh one"}
    fields["pageRange"] = {"type": ["string", "integer", "null"], "maxLength": MAX_SPEC_CHARS,
                           "description": "1-based pages or ranges, such as `1-3,7,10-`"}
    fields["textLayer"] = {**nullable(ocr_request._one_of(*ocr_request.TEXT_LAYER_MODES).schema),
                           "description": "`auto`: a PDF page whose own text covers it is "
                           "answered from that text (docs/text-layer.md)"}
    fields.update(extra or {})
    return fields


def ocr_body(fields: dict[str, dict[str, Any]], max_bytes: int) -> dict[str, Any]:
    """The request body: JSON (`file` as base64) or multipart/form-data (`file` a part).
    A form's typed fields (numbers, booleans) are read as JSON text (`-F visualize=false`),
    the others as text: the `encoding` says which (request.TYPED_FORM_FIELDS)."""
    upload = {"type": "string", "contentMediaType": "application/octet-stream",
              "description": f"The document's bytes (at most {max_bytes} bytes)"}
    as_json = {name: {"contentType": "application/json"}
               for name in fields if name in ocr_request.TYPED_FORM_FIELDS}
    return {"required": True, "content": {
        "application/json": {"schema": {"type": "object", "required": ["file"],
                                        "properties": fields}},
        "multipart/form-data": {"schema": {"type": "object", "required": ["file"],
                                           "properties": {**fields, "file": upload}},
                                "encoding": as_json},
    }}


# ---- the answers ------------------------------------------------------------------------------
def shared_schemas() -> dict[str, dict[str, Any]]:
    """The envelopes and PaddleX's OCR result models (paddlex/inference/serving/schemas)."""
    integer = {"type": "integer"}
    page_size = {"type": "object", "required": ["width", "height"],
                 "properties": {"width": integer, "height": integer}}
    paged = {"type": "object", "required": ["numPages", "pages", "type"], "properties": {
        "numPages": integer, "pages": {"type": "array", "items": ref("schemas", "PageInfo")},
        "pageIndices": {"type": "array", "items": integer,
                        "description": "With pageRange: each page's 0-based index in the file"}}}
    error_fields = {"errorCode": integer, "errorMsg": {"type": "string"}}
    return {
        "ErrorEnvelope": {"type": "object", "required": ["logId", "errorCode", "errorMsg"],
                          "properties": {"logId": {"type": "string"}, **error_fields},
                          "additionalProperties": False},
        "PageError": {"type": "object", "required": ["errorCode", "errorMsg"],
                      "properties": error_fields},
        "PrunedResult": {"type": "object", "description":
                         "PaddleOCR's result for the page (PaddleX: `dict`)", "properties": {
                             **{name: {"type": "array"} for name in (
                                 "rec_texts", "rec_scores", "rec_polys", "rec_boxes",
                                 "dt_polys")}, "text_det_params": {"type": "object"}}},
        "OcrPageResult": {"type": "object", "required": ["prunedResult"], "properties": {
            "prunedResult": {"anyOf": [ref("schemas", "PrunedResult"), {"type": "null"}]},
            **{name: {"type": ["string", "null"], "description": "base64 JPEG, or null"}
               for name in ("ocrImage", "docPreprocessingImage", "inputImage")},
            "error": ref("schemas", "PageError")}},
        "PageInfo": page_size,
        "ImageInfo": {**page_size, "required": ["width", "height", "type"], "properties": {
            **page_size["properties"], "type": {"const": "image"}}},
        "PDFInfo": {**paged, "properties": {**paged["properties"], "type": {"const": "pdf"}}},
        "TIFFInfo": {**paged, "properties": {**paged["properties"], "type": {"const": "tiff"}}},
        "DataInfo": {"anyOf": [ref("schemas", name)
                               for name in ("ImageInfo", "PDFInfo", "TIFFInfo")]},
        "OcrResult": {"type": "object", "required": ["ocrResults", "dataInfo"], "properties": {
            "ocrResults": {"type": "array", "items": ref("schemas", "OcrPageResult")},
            "dataInfo": ref("schemas", "DataInfo"),
            "failedPages": {"type": "array", "items": {
                "type": "object", "required": ["pageIndex", "errorCode", "errorMsg"],
                "properties": {"pageIndex": integer, **error_fields}}}}},
        "OcrEnvelope": success_envelope(ref("schemas", "OcrResult")),
    }


def success_envelope(result: dict[str, Any]) -> dict[str, Any]:
    """PaddleX's AIStudioResultResponse: errorCode 0, errorMsg "Success"."""
    return {"type": "object", "required": ["logId", "result", "errorCode", "errorMsg"],
            "properties": {"logId": {"type": "string"}, "result": result,
                           "errorCode": {"const": 0}, "errorMsg": {"const": "Success"}}}


def probe_envelope(message: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": ["logId", "errorCode", "errorMsg", *extra],
            "properties": {"logId": {"type": "string"}, "errorCode": {"const": 0},
                           "errorMsg": {"const": message}, **extra}}


def header(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"description": description, "schema": schema or {"type": "string"}}


COUNT = {"type": "string", "pattern": "^[0-9]+$"}
# Every response header either tier sends, by its name in services/ocr_api/headers.py
HEADERS = {
    h.LOG_ID: header("The request's logId, on every answer"),
    "Retry-After": header("Seconds to wait before trying again", COUNT),
    "WWW-Authenticate": header('`Bearer realm="ocrfleet"`, with `error="invalid_token"` for '
                               "a wrong key"),
    "Allow": header("The methods the path allows"),
    "Location": header("The new job's status URL"),
    h.PAGES: header("Pages OCR'd (not on an NDJSON stream)", COUNT),
    h.NUM_PAGES: header("A streamed PDF's or TIFF's pages, before page 1", COUNT),
    h.CACHED_PAGES: header("Pages answered from the page cache (while it is on)", COUNT),
    h.CAPACITY: header("Admission slots (OCR_QUEUE_SIZE)", COUNT),
    h.FREE: header("Slots free as the answer leaves (0 while draining)", COUNT),
    h.HELD: header(f"Requests admitted, less those sent `{h.PRIORITY}: high`", COUNT),
    h.PAGE_MS: header("How long its engine takes over a batch of pages (a moving mean), once "
                      "it has read one", COUNT),
    h.WORKER: header("The answering process's id"),
    h.BOARD: header("The fleet board, with this worker's entries"),
    h.ENGINE: header("The engine's identity (a digest; the page cache's key)"),
    h.STARTS_IN_MS: header("On a 503 refusal: when the page would have started", COUNT),
}


def response_headers(status: int, optional: tuple[str, ...] = (),
                     required: tuple[str, ...] = (), busy: bool = True) -> dict[str, Any]:
    """The headers an answer of `status` carries: X-Log-Id always, Retry-After on 429/503
    (`busy`: not a probe's 503, which says the process is not ready, not that it is busy),
    WWW-Authenticate on 401, Allow on 405, and the tier's own (`required`: on every answer
    of this status; `optional`: on some)."""
    always = [h.LOG_ID, *required]
    if status in RETRY_STATUSES and busy:
        always.append("Retry-After")
    if status == 401:
        always.append("WWW-Authenticate")
    if status == 405:
        always.append("Allow")
    found = {name: {**HEADERS[name], "required": True} for name in always}
    found.update({name: HEADERS[name] for name in optional if name not in found})
    return found


def error_response(status: int, optional: tuple[str, ...] = (),
                   required: tuple[str, ...] = (), busy: bool = True) -> dict[str, Any]:
    """One error status: the envelope with `errorCode` equal to it."""
    schema = {"allOf": [ref("schemas", "ErrorEnvelope"),
                        {"properties": {"errorCode": {"const": status}}}]}
    return {"description": ERROR_REASONS[status],
            "headers": response_headers(status, optional, required, busy),
            "content": json_content(schema)}


def errors(*statuses: int) -> dict[str, Any]:
    """`statuses` as the shared response objects (components/responses)."""
    return {str(status): ref("responses", f"Error{status}") for status in statuses}


def error_responses() -> dict[str, dict[str, Any]]:
    return {f"Error{status}": error_response(status) for status in ERROR_REASONS}


# ---- the routes both tiers have ----------------------------------------------------------------
def probe_paths(readiness_extra: dict[str, Any], answer_headers: tuple[str, ...] = ()) -> dict:
    """/healthz, /readyz (with the tier's extra fields and `answer_headers`), /metrics and
    /openapi.json."""
    def probe(summary, message, extra, names=()):
        return {"get": {"operationId": message.lower(), "summary": summary, "security": [],
                        "tags": ["probes"], "responses": {
                            "200": {"description": message,
                                    "headers": response_headers(200, required=names),
                                    "content": json_content(probe_envelope(message, extra))},
                            "503": {**error_response(503, required=names, busy=False),
                                    "description": f"Not {message.lower()}: `errorMsg` "
                                                   "says why"}}}}

    return {
        "/healthz": probe("Liveness: 503 when the process must be restarted", "Healthy", {}),
        "/readyz": probe("Readiness: 503 until this can serve /ocr", "Ready", readiness_extra,
                         answer_headers),
        "/metrics": {"get": {"operationId": "metrics", "tags": ["probes"],
                             "summary": "Prometheus metrics (404 here when they have a "
                                        "port of their own)", "responses": {
                                 "200": {"description": "The text exposition format",
                                         "headers": response_headers(200),
                                         "content": {"text/plain": {"schema": {
                                             "type": "string"}}}},
                                 **errors(401, 404)}}},
        PATH: {"get": {"operationId": "openapi", "tags": ["probes"],
                       "summary": "This document", "responses": {
                           "200": {"description": "OpenAPI 3.1",
                                   "headers": response_headers(200),
                                   "content": json_content({"type": "object"})},
                           **errors(401)}}},
    }


def request_headers() -> list[dict[str, Any]]:
    """Headers a caller may send to /ocr at either tier."""
    return [
        {"name": h.LOG_ID, "in": "header", "required": False, "schema": {"type": "string"},
         "description": "A logId to use (the body's `logId` wins); an unusable one is "
                        "replaced"},
        {"name": "traceparent", "in": "header", "required": False,
         "schema": {"type": "string"},
         "description": "W3C trace context: this request's spans join the caller's trace"},
    ]


def document(title: str, description: str, paths: dict[str, Any], *, api_keys: bool,
             schemas: dict[str, Any]) -> dict[str, Any]:
    """The whole document. With API keys on, every operation without its own `security`
    (the probes and the web page have an empty one) needs a key."""
    return {
        "openapi": OPENAPI_VERSION,
        "info": {"title": title, "version": "1", "description": description},
        "paths": paths,
        "components": {
            "schemas": {**shared_schemas(), **schemas},
            "responses": error_responses(),
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": h.API_KEY}},
        },
        "security": [{"bearer": []}, {"apiKey": []}] if api_keys else [{}],
    }


def register(app: Flask, build: Callable[[Flask], dict[str, Any]]) -> None:
    """GET /openapi.json on `app`: `build(app)`, built once, on the first call (the app's
    routes are all registered by then)."""
    built: list[dict[str, Any]] = []

    @app.get(PATH)
    def openapi():
        if not built:
            built.append(build(app))
        return json_response(built[0])
