"""The gateway's OpenAPI document (GET /openapi.json): /ocr with every answer format
(gateway/outputs: `OFFERED`), /layout-parsing with its own (`LAYOUT_OFFERED`), the async
jobs (when GATEWAY_JOBS_ENABLED left them on) with links from a submit to its status, result
and cancel, /fleet, the web page and the probes; shared pieces in services/ocr_api/openapi.py.
Built from the app's URL map and config, so a route or a setting that changes changes the
document."""

from __future__ import annotations

from typing import Any

from flask import Flask

from services.layout import openapi as layout_openapi
from services.ocr_api import headers as h
from services.ocr_api import openapi as api

from . import outputs
from .config import GatewayConfig
from .endpoint import ENDPOINTS, LAYOUT, OCR
from .jobs.api import JOB_ID
from .jobs.model import ACTIVE_STATES, FINAL_STATES

DESCRIPTION = ("The ocrfleet gateway: PaddleX serving's `POST /ocr` (the same body, fields "
               "and envelope) for a fleet of workers, with more answer formats, async jobs "
               "and a web page. Reference: docs/api.md")
OCR_ERRORS = (400, 401, 406, 413, 422, 429, 500, 502, 503, 504)
ANSWER_HEADERS = (h.PAGES, h.NUM_PAGES, h.CACHED_PAGES)
JOB_PATH = "/jobs/{jobId}"
JOB_LINKS = {"status": ("getJob", JOB_PATH), "result": ("getJobResult", JOB_PATH + "/result"),
             "cancel": ("cancelJob", JOB_PATH)}


def build(app: Flask, config: GatewayConfig) -> dict[str, Any]:
    routes = {rule.rule for rule in app.url_map.iter_rules()}
    paths = {"/ocr": {"post": ocr_operation(config)},
             "/layout-parsing": {"post": layout_operation(config)}, **web_paths(),
             **api.probe_paths({"detail": {"type": "string"}})}
    if "/jobs" in routes:  # GATEWAY_JOBS_ENABLED=false leaves them out
        paths.update(job_paths(config))
    return api.document("ocrfleet gateway", DESCRIPTION, paths, api_keys=bool(config.api_keys),
                        schemas=schemas())


def formats() -> dict[str, Any]:
    """An answer's content by media type: what `Accept` chooses (outputs.negotiate)."""
    text = {"type": "string"}
    content = {
        outputs.JSON: {"schema": api.ref("schemas", "OcrEnvelope")},
        outputs.NDJSON: {"schema": {**text, "description": "One JSON line per page, in "
                                    "order (#/components/schemas/NdjsonPage), then a summary "
                                    "line (#/components/schemas/NdjsonSummary)"}},
    }
    for media in outputs.OFFERED:
        content.setdefault(media, {"schema": {**text, "contentMediaType": media}})
    return content


def layout_formats() -> dict[str, Any]:
    """/layout-parsing's answer by media type: PaddleX's PP-StructureV3 envelope, a line per
    page, or the document's Markdown."""
    return {
        outputs.JSON: {"schema": layout_openapi.envelope_schema()},
        outputs.NDJSON: {"schema": {"type": "string", "description": "One JSON line per "
                                    "page, in order (#/components/schemas/NdjsonLayoutPage), "
                                    "then a summary line (#/components/schemas/NdjsonSummary)"}},
        outputs.MARKDOWN: {"schema": {"type": "string", "contentMediaType": outputs.MARKDOWN,
                                      "description": "Every page's Markdown, in order, "
                                                     "pages apart by a `---` rule"}},
    }


def job_result_formats() -> dict[str, Any]:
    """A job's result by media type: its endpoint's formats (/ocr's, or /layout-parsing's:
    the JSON is either envelope, and text/markdown only a layout job's)."""
    content = formats()
    content[outputs.JSON] = {"schema": {"anyOf": [
        api.ref("schemas", "OcrEnvelope"), layout_openapi.envelope_schema()]}}
    content[outputs.NDJSON] = {"schema": {
        "type": "string", "description": "One JSON line per page done, in order "
        "(#/components/schemas/NdjsonPage, a layout job's NdjsonLayoutPage), then a summary "
        "line (#/components/schemas/NdjsonSummary)"}}
    content[outputs.MARKDOWN] = layout_formats()[outputs.MARKDOWN]
    return content


def layout_operation(config: GatewayConfig) -> dict[str, Any]:
    """POST /layout-parsing: the worker's body and answer (services/layout/openapi.py), the
    gateway's headers, formats and statuses."""
    fields = {"returnPartialResults": {
        "type": "boolean", "description": "Failed pages get an empty `prunedResult` and "
        "`markdown` and an `error`, and `result.failedPages` lists them"}}
    operation = layout_openapi.layout_operation(
        config.max_bytes, [*api.request_headers(), cache_control()],
        api.response_headers(200, ANSWER_HEADERS), api.errors(*OCR_ERRORS))
    operation["requestBody"]["content"]["application/json"]["schema"]["properties"].update(
        fields)
    operation["responses"]["200"]["content"] = layout_formats()
    operation["responses"]["200"]["description"] = (
        "The document's layout in the format asked for (JSON: PaddleX's envelope, one "
        "`layoutParsingResults` entry per page)")
    return operation


def ocr_fields(**extra: dict[str, Any]) -> dict[str, Any]:
    return api.ocr_fields({"returnPartialResults": {
        "type": "boolean", "description": "Failed pages get `prunedResult: null` and "
        "`error`, and `result.failedPages` lists them"}, **extra})


def ocr_operation(config: GatewayConfig) -> dict[str, Any]:
    return {
        "operationId": "ocr", "tags": ["ocr"],
        "summary": "OCR an image, a PDF or a TIFF, answered in the format `Accept` asks for",
        "parameters": [*api.request_headers(), cache_control()],
        "requestBody": api.ocr_body(ocr_fields(), config.max_bytes),
        "responses": {
            "200": {"description": "The document in the format asked for (JSON: PaddleX's "
                                   "envelope, one `ocrResults` entry per page)",
                    "headers": api.response_headers(200, ANSWER_HEADERS),
                    "content": formats()},
            **api.errors(*OCR_ERRORS)},
    }


def cache_control() -> dict[str, Any]:
    return {"name": "Cache-Control", "in": "header", "required": False,
            "schema": {"type": "string"},
            "description": "`no-cache`: OCR every page again (and store it); `no-store`: "
                           "neither read nor write the page cache (docs/cache.md)"}


# ---- jobs ---------------------------------------------------------------------------------------
def job_paths(config: GatewayConfig) -> dict[str, Any]:
    job_id = {"name": "jobId", "in": "path", "required": True,
              "schema": {"type": "string", "pattern": JOB_ID.pattern}}
    status = {"description": "The job's status", "headers": api.response_headers(200),
              "content": api.json_content(api.ref("schemas", "JobEnvelope")),
              "links": links("status", "result", "cancel")}
    paths = [*ENDPOINTS]
    submit_fields = ocr_fields(callbackUrl={
        "type": ["string", "null"], "description": "POSTed the job's outcome when it ends "
        "(needs GATEWAY_JOBS_CALLBACK_SECRET; public http(s) addresses only)"}, endpoint={
        "enum": [*paths, *(path.lstrip("/") for path in paths), None],
        "description": f"The route whose answer the job gives: `{OCR.path}` (the default) or "
                       f"`{LAYOUT.path}` (layout parsing: that route's fields, its "
                       "`layoutParsingResults` and its Markdown)"})
    return {
        "/jobs": {"post": {
            "operationId": "submitJob", "tags": ["jobs"],
            "summary": "Store a validated document as a job and answer 202 at once",
            "parameters": [*api.request_headers(), cache_control()],
            "requestBody": api.ocr_body(submit_fields, config.max_bytes),
            "responses": {"202": {**status, "description": "Accepted: the job's status",
                                  "headers": api.response_headers(200, required=("Location",))},
                          **api.errors(400, 401, 413, 422, 429, 500, 502, 503, 504)}}},
        JOB_PATH: {
            "get": {"operationId": "getJob", "tags": ["jobs"], "summary": "The job's status",
                    "parameters": [job_id, {
                        "name": "wait", "in": "query", "required": False,
                        "schema": {"type": "number", "minimum": 0},
                        "description": "Long-poll: answer when the state changes, or after "
                                       f"this many seconds (at most {config.jobs.max_wait_s:g}"
                                       ", GATEWAY_JOBS_MAX_WAIT_S)"}],
                    "responses": {"200": status, **api.errors(401, 404, 422, 503)}},
            "delete": {"operationId": "cancelJob", "tags": ["jobs"],
                       "summary": "Cancel an unfinished job, or delete a finished one",
                       "parameters": [job_id],
                       "responses": {"200": {"description": "Cancelled or deleted",
                                             "headers": api.response_headers(200),
                                             "content": api.json_content(api.ref(
                                                 "schemas", "JobDeletedEnvelope"))},
                                     **api.errors(401, 404, 503)}}},
        JOB_PATH + "/result": {"get": {
            "operationId": "getJobResult", "tags": ["jobs"],
            "summary": "The result in the format `Accept` asks for (NDJSON also while it runs)",
            "parameters": [job_id],
            "responses": {"200": {"description": "The result, as the job's endpoint (/ocr "
                                                 "or /layout-parsing) would have answered",
                                  "headers": api.response_headers(200, ANSWER_HEADERS),
                                  "content": job_result_formats()},
                          **api.errors(401, 404, 406, 409, 410, 413, 422, 500, 502, 503,
                                       504)}}},
    }


def links(*names: str) -> dict[str, Any]:
    """Stateful links from an answer carrying a job to the job's other operations."""
    return {name.capitalize(): {"operationId": JOB_LINKS[name][0],
                                "parameters": {"jobId": "$response.body#/result/jobId"}}
            for name in names}


def job_schemas() -> dict[str, Any]:
    integer, text = {"type": "integer"}, {"type": "string"}
    time_or_null = {"type": ["string", "null"], "format": "date-time"}
    error = {"type": "object", "required": ["errorCode", "errorMsg"],
             "properties": {"errorCode": integer, "errorMsg": text}}
    state = {"enum": [*ACTIVE_STATES, *FINAL_STATES]}
    status = {"type": "object", "required": [
        "jobId", "endpoint", "state", "numPages", "pagesDone", "pagesFailed", "cachedPages",
        "failedPages", "createdAt", "startedAt", "finishedAt", "expiresAt", "error",
        "callback", "statusUrl", "resultUrl"], "properties": {
        "jobId": {"type": "string", "pattern": JOB_ID.pattern},
        "endpoint": {"enum": list(ENDPOINTS)}, "state": state,
        "numPages": integer, "pagesDone": integer, "pagesFailed": integer,
        "cachedPages": integer,
        "failedPages": {"type": "array", "items": {
            "type": "object", "required": ["pageIndex", "errorCode", "errorMsg"],
            "properties": {"pageIndex": integer, **error["properties"]}}},
        "createdAt": {"type": "string", "format": "date-time"}, "startedAt": time_or_null,
        "finishedAt": time_or_null, "expiresAt": time_or_null,
        "error": {"anyOf": [error, {"type": "null"}]},
        "callback": {"anyOf": [{"type": "object", "required": ["state", "attempts"],
                                "properties": {"state": text, "attempts": integer}},
                               {"type": "null"}]},
        "statusUrl": text, "resultUrl": text, "deleted": {"const": True}}}
    deleted = {"type": "object", "required": ["jobId", "state", "deleted"],
               "properties": {"jobId": status["properties"]["jobId"], "state": state,
                              "deleted": {"const": True}}}
    return {"JobStatus": status, "JobEnvelope": api.success_envelope(api.ref(
        "schemas", "JobStatus")), "JobDeletedEnvelope": api.success_envelope(deleted)}


# ---- the web page and /fleet -------------------------------------------------------------------
def web_paths() -> dict[str, Any]:
    page = {"200": {"description": "The page", "headers": api.response_headers(200),
                    "content": {"text/html": {"schema": {"type": "string"}}}}}
    asset = {"200": {"description": "The file", "headers": api.response_headers(200),
                     "content": {"*/*": {"schema": {}}}}, **api.errors(404)}
    return {
        "/": {"get": {"operationId": "webPage", "tags": ["web page"], "security": [],
                      "summary": "The web page", "responses": page}},
        "/ui/{filename}": {"get": {
            "operationId": "webAsset", "tags": ["web page"], "security": [],
            "summary": "The web page's files", "parameters": [{
                "name": "filename", "in": "path", "required": True,
                "schema": {"type": "string"}}], "responses": asset}},
        "/fleet": {"get": {
            "operationId": "fleet", "tags": ["web page"],
            "summary": "The fleet as the web page shows it",
            "responses": {"200": {"description": "Replicas, queue, pages per second",
                                  "headers": api.response_headers(200),
                                  "content": api.json_content(api.ref("schemas", "Fleet"))},
                          **api.errors(401)}}},
    }


def schemas() -> dict[str, Any]:
    count_or_null = {"type": ["integer", "null"]}
    replica = {"type": "object", "required": ["url", "ready", "inflight", "served", "limit"],
               "properties": {"url": {"type": "string"}, "ready": {"type": "boolean"},
                              "inflight": count_or_null, "served": count_or_null,
                              "limit": count_or_null, "ejected": {"type": "boolean"}}}
    queue = {"type": "object", "required": [
        "queuedPages", "queuedDocuments", "inflightPages", "capacityPages"],
        "properties": {name: count_or_null for name in (
            "queuedPages", "queuedDocuments", "inflightPages", "capacityPages")}}
    worker = {"type": "object", "required": ["id", "target", "slots", "draining",
                                             "heardSecondsAgo"], "properties": {
        "id": {"type": "string"}, "target": {"type": "number"}, "slots": {"type": "integer"},
        "draining": {"type": "boolean"}, "heardSecondsAgo": {"type": "number"}}}
    fleet = {"type": "object", "required": ["replicas", "queue", "pagesPerSecond", "mode"],
             "properties": {"replicas": {"type": "array", "items": replica}, "queue": queue,
                            "pagesPerSecond": {"type": ["number", "null"]},
                            "mode": {"enum": ["load_balancer", "list", "dns"]},
                            "workers": {"type": "array", "items": worker},
                            "share": {"description": "How this gateway shares the fleet "
                                                     "with other gateways"}}}
    return {"Fleet": fleet, **job_schemas(), **ndjson_schemas()}


def ndjson_schemas() -> dict[str, Any]:
    """The lines of an NDJSON answer (gateway/outputs/paddlex.py; a job's: jobs/results.py),
    which a media type's schema cannot describe one by one."""
    integer, text = {"type": "integer"}, {"type": "string"}
    page = {"type": "object", "required": ["logId", "pageIndex", "cached"], "properties": {
        "logId": text, "pageIndex": integer, "ocrResult": api.ref("schemas", "OcrPageResult"),
        "pageInfo": api.ref("schemas", "PageInfo"), "cached": {"type": "boolean"},
        "numPages": integer, "errorCode": integer, "errorMsg": text}}
    summary = {"type": "object", "required": ["logId", "done"], "properties": {
        "logId": text, "errorCode": integer, "errorMsg": text, "done": {"type": "boolean"},
        "result": {"type": "object", "properties": {"dataInfo": api.ref("schemas",
                                                                        "DataInfo")}},
        "numPages": integer, "cachedPages": integer, "jobId": text, "state": text,
        "pagesDone": integer}}
    layout_page = {**page, "properties": {
        **{k: v for k, v in page["properties"].items() if k != "ocrResult"},
        "layoutParsingResult": layout_openapi.page_schema()}}
    return {"NdjsonPage": page, "NdjsonLayoutPage": layout_page, "NdjsonSummary": summary}
