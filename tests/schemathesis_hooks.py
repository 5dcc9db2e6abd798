"""Schemathesis hooks for tests/test_schemathesis.py and `make fuzz` (loaded through
SCHEMATHESIS_HOOKS): a generated `file` is random text that is never a document, so every
/ocr and /jobs case would stop at the same 422. A positive case instead carries a real one
(an image, a PDF, a multi-page TIFF) in half of its cases, chosen by the case's own content,
so the other fields, the answer formats and the job's links are reached too. Negative cases
keep what was generated: their one wrong field must still be refused."""

from __future__ import annotations

import base64
import hashlib
from functools import lru_cache

import schemathesis
from schemathesis import GenerationMode
from schemathesis.core.failures import ServerError
from schemathesis.openapi.checks import UseAfterFree
from schemathesis.core.parameters import ParameterLocation

from gateway.outputs import OFFERED
from services.ocr_api import headers

SUBMITS = ("POST /ocr", "POST /jobs")
ANSWERED = ("POST /ocr", "GET /jobs/{jobId}/result")
# the formats `Accept` picks from (gateway/outputs.OFFERED), and none (the default, JSON)
ACCEPT = (*OFFERED, "*/*", None, None)


@lru_cache(maxsize=1)
def documents() -> tuple[bytes, ...]:
    from samples import documents as samples  # PIL and reportlab: loaded once, when needed

    image = samples.text_image(["ocrfleet fuzz"], size=24)
    return (samples.to_png(image), samples.labelled_pdf(2, lines_per_page=1),
            samples.multipage_tiff([image, image]))


@schemathesis.hook
def map_case(context, case):
    """A positive case's document (/ocr, /jobs) and answer format (/ocr, a job's result)."""
    meta = case.meta
    if meta is None or meta.generation.mode != GenerationMode.POSITIVE:
        return case
    operation = f"{case.operation.method.upper()} {case.operation.path}"
    if operation in ANSWERED:
        accept = ACCEPT[draw(case, len(ACCEPT))]
        if accept is not None:
            case.headers = {**(case.headers or {}), "Accept": accept}
            meta.clear_dirty(ParameterLocation.HEADER)
    if operation in SUBMITS and isinstance(case.body, dict):
        with_document(case, meta)
    return case


def draw(case, choices: int) -> int:
    """A choice among `choices`, made by the case's own content (reproducible from it)."""
    seen = repr((case.path_parameters, case.query, case.body)).encode()
    return int.from_bytes(hashlib.sha256(seen).digest()[:4], "big") % choices


def with_document(case, meta) -> None:
    pick = draw(case, 2 * len(documents()))
    if pick < len(documents()):
        data = documents()[pick]
        multipart = (case.media_type or "").startswith("multipart/")
        case.body = {**case.body, "file": data if multipart else base64.b64encode(data).decode()}
        case.body.pop("fileType", None)  # detected from the bytes
        # still a positive case: a valid document in a valid body (schemathesis would check
        # it again, and takes any body with bytes in it for a negative one)
        meta.clear_dirty(ParameterLocation.BODY)


@schemathesis.hook
def filter_failure(context, failure, case, response):
    """Every failure counts but the worker's 5xx that the request itself asked for, and a
    cancelled job that still answers: DELETE cancels an unfinished job, whose status then
    says `cancelled` until its record expires (docs/api.md); a finished one is gone."""
    if isinstance(failure, UseAfterFree):
        return not said_cancelled(response)
    return not (isinstance(failure, ServerError) and asked_for(case, response))


def said_cancelled(response) -> bool:
    try:
        return response.json()["result"]["state"] == "cancelled"
    except (ValueError, KeyError, TypeError):
        return False


def asked_for(case, response) -> bool:
    """A worker's 504 once the request's own X-Deadline-Ms has passed, and its 503 refusal
    (with X-Ocr-Starts-In-Ms) of a request that said to refuse it rather than wait
    (X-Ocr-Start-Within-Ms, X-Ocr-Within-Target: 1): the protocol at work, documented as
    such (docs/api.md), not a server failing."""
    sent = {name.lower(): value for name, value in (case.headers or {}).items()}
    if response.status_code == 504:
        deadline = sent.get(headers.DEADLINE_MS.lower(), "").strip()
        return deadline.isdigit() and response.elapsed * 1000 >= int(deadline) - 1
    refusal = headers.STARTS_IN_MS.lower() in response.headers
    return response.status_code == 503 and refusal and (
        headers.START_WITHIN_MS.lower() in sent
        or sent.get(headers.WITHIN_TARGET.lower(), "").strip() == "1")
