"""The worker's OpenAPI document (GET /openapi.json): its /ocr, which speaks PaddleX's body
and envelope and the flow-control headers the gateway sends and reads
(services/ocr_worker/capacity.py), and the probes; shared pieces in
services/ocr_api/openapi.py."""

from __future__ import annotations

from typing import Any

from flask import Flask

from services.layout import openapi as layout_openapi
from services.ocr_api import headers as h
from services.ocr_api import openapi as api

from .capacity import MAX_DEADLINE_MS
from .config import WorkerConfig

ANSWER_HEADERS = (h.CAPACITY, h.FREE, h.HELD, h.WORKER, h.BOARD)  # on every /ocr and /readyz
SOME_ANSWERS = (h.ENGINE, h.PAGE_MS)  # once the engine has loaded, once a page was read
DESCRIPTION = ("One OCR worker: PaddleX serving's `POST /ocr` (the same body, fields and "
               "envelope), flow-control headers for the gateway, and the probes. "
               "Reference: docs/api.md")


def build(app: Flask, config: WorkerConfig) -> dict[str, Any]:
    paths = {"/ocr": {"post": ocr_operation(config)},
             "/layout-parsing": {"post": layout_operation(config)},
             **api.probe_paths(readiness_fields(), ANSWER_HEADERS)}
    return api.document("ocrfleet worker", DESCRIPTION, paths, api_keys=bool(config.api_tokens),
                        schemas={})


def ocr_operation(config: WorkerConfig) -> dict[str, Any]:
    busy = api.error_response(503, (h.STARTS_IN_MS, *SOME_ANSWERS), ANSWER_HEADERS)
    return {
        "operationId": "ocr", "tags": ["ocr"],
        "summary": "OCR an image or a PDF (PaddleX serving's /ocr)",
        "parameters": [*api.request_headers(), *flow_control_headers()],
        "requestBody": api.ocr_body(api.ocr_fields(), config.max_bytes),
        "responses": {
            "200": {"description": "The PaddleX envelope: one `ocrResults` entry per page",
                    "headers": api.response_headers(200, SOME_ANSWERS, ANSWER_HEADERS),
                    "content": api.json_content(api.ref("schemas", "OcrEnvelope"))},
            **{str(status): api.error_response(status, SOME_ANSWERS, ANSWER_HEADERS)
               for status in (400, 401, 413, 422, 500, 504)},
            "503": busy,
        },
    }


def layout_operation(config: WorkerConfig) -> dict[str, Any]:
    """POST /layout-parsing: /ocr's stages and headers, PP-StructureV3's body and answer."""
    busy = api.error_response(503, (h.STARTS_IN_MS, *SOME_ANSWERS), ANSWER_HEADERS)
    return layout_openapi.layout_operation(
        config.max_bytes, [*api.request_headers(), *flow_control_headers()],
        api.response_headers(200, SOME_ANSWERS, ANSWER_HEADERS),
        {**{str(status): api.error_response(status, SOME_ANSWERS, ANSWER_HEADERS)
            for status in (400, 401, 413, 422, 500, 504)}, "503": busy})


def flow_control_headers() -> list[dict[str, Any]]:
    """What the gateway sends with a page (docs/api.md, "Worker capacity and deadlines")."""
    whole_ms = {"type": "string", "pattern": f"^[0-9]{{1,{len(str(MAX_DEADLINE_MS))}}}$"}
    return [
        {"name": h.DEADLINE_MS, "in": "header", "schema": whole_ms,
         "description": "Whole milliseconds the caller will still wait; else 400"},
        {"name": h.PRIORITY, "in": "header", "schema": {"type": "string",
                                                       "enum": ["high", "normal"]},
         "description": "`high`: read before the pages queued here (any case); else 400"},
        {"name": h.START_WITHIN_MS, "in": "header", "schema": whole_ms,
         "description": f"With `{h.PRIORITY}: high` only (else 400): refuse with 503 and "
                        f"`{h.STARTS_IN_MS}` unless the page would start this soon"},
        {"name": h.WITHIN_TARGET, "in": "header", "schema": {"type": "string"},
         "description": "`1`: refuse with 503 when this worker already holds its target"},
        {"name": h.BOARD, "in": "header", "schema": {"type": "string"},
         "description": "The caller's fleet board, merged into this worker's"},
    ]


def readiness_fields() -> dict[str, Any]:
    integer = {"type": "integer"}
    return {"engine": {"type": "object", "description": "The engine, backend and models"},
            "capacity": {"type": "object", "required": ["slots", "free"],
                         "properties": {"slots": integer, "free": integer}},
            "pid": integer}
