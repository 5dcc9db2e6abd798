"""The /jobs routes: submit (the /ocr or /layout-parsing body plus `callbackUrl` and
`endpoint`), follow (with long-poll), fetch the result, cancel or delete. Each route is a few lines over `Jobs` (store, runner, limits);
a store that cannot be reached is a 503, never a 500, and a stalled one is a 503 at once:
what a route reads before it answers goes through `Jobs.request_store`, whose calls fail
fast, and a submit asks that store first, so that it never writes into a stalled one (the
write might be done after its 503 and the job run twice)."""

from __future__ import annotations

import hashlib
import re
import sqlite3
import threading
import time
import uuid
from dataclasses import replace

import redis
from flask import Blueprint, Response, request, stream_with_context

from services.flask_common import error_response, json_response, read_ocr_fields
from services.ocr_api import envelope
from services.ocr_api.headers import API_KEY as API_KEY_HEADER
from services.ocr_api.errors import ApiError, excerpt, unprocessable
from services.ocr_api.logs import current_log_id
from services.ocr_api.sniff import KIND_PDF

from .. import outputs
from ..endpoint import ENDPOINTS, LAYOUT, OCR, Endpoint
from ..split import KIND_TIFF
from . import results
from .callbacks import check_callback_url
from .model import ACTIVE_STATES, CANCELLED, FAILED, FINAL_STATES, Job, JobSpec, iso
from .runner import job_urls
from .store import LimitExceeded

JOB_ID = re.compile(r"^[0-9a-f]{32}$")
PAGED = (KIND_PDF, KIND_TIFF)  # documents whose pages are sent, stored and resumed one by one
WAIT_POLL_S = 0.2
MAX_WAITERS = 16  # long-polls held at once per process; more answer at once
LIMIT_RETRY_AFTER_S = 30
# what a job's result answers in, by the endpoint it runs as (as that route answers)
OFFERED = {OCR.path: outputs.OFFERED, LAYOUT.path: outputs.LAYOUT_OFFERED}


def client_identity() -> str:
    """Whose limits a request counts against: its API key (Authorization: Bearer, or
    X-API-Key; only a hash is kept), else its address."""
    auth = request.headers.get("Authorization", "")
    key = auth[7:].strip() if auth[:7].lower() == "bearer " else \
        request.headers.get(API_KEY_HEADER, "").strip()
    if key:
        return "key:" + hashlib.sha256(key.encode()).hexdigest()[:32]
    return "addr:" + (request.remote_addr or "unknown")


def create_blueprint(jobs) -> Blueprint:
    """`jobs`: gateway.jobs.Jobs (config, service, store, runner, callback client)."""
    blueprint = Blueprint("jobs", __name__)
    waiters = threading.BoundedSemaphore(MAX_WAITERS)

    def base_url() -> str:
        return (jobs.config.public_url or request.url_root).rstrip("/")

    def load(job_id: str) -> Job:
        job = jobs.request_store.get(job_id) if JOB_ID.match(job_id) else None
        if job is None or (job.client.startswith("key:") and job.client != client_identity()):
            raise ApiError(404, f"No job {job_id}: it never existed, was deleted, or its "
                                "result expired")
        current_log_id.set(job.spec.log_id)
        return job

    @blueprint.post("/jobs")
    def submit():
        # reading the body takes room in the memory budget, as for /ocr (429 before reading)
        ticket = jobs.service.reserve(request.content_length,
                                      request.mimetype != "multipart/form-data")
        try:
            return create()
        finally:
            ticket.release()

    def create():
        fields, file_bytes = read_ocr_fields()
        callback_url = fields.pop("callbackUrl", None)
        endpoint = job_endpoint(fields.pop("endpoint", None))
        if callback_url is not None:
            if not jobs.config.callback_secret:
                raise unprocessable("callbackUrl needs a signing secret on the gateway "
                                    "(GATEWAY_JOBS_CALLBACK_SECRET); poll GET /jobs/{id} "
                                    "instead")
            check_callback_url(callback_url, jobs.client)
        plan = jobs.service.plan(fields, file_bytes, endpoint)
        current_log_id.set(plan.request.log_id)
        job = Job(id=uuid.uuid4().hex, client=client_identity(),
                  spec=replace(job_spec(plan, fields, callback_url, base_url()),
                               cache_control=request.headers.get("Cache-Control")))
        jobs.request_store.ping()  # a stalled store: 503 now, before anything is written
        try:
            jobs.store.create(job, plan.request.file_bytes, jobs.limits)
        except LimitExceeded as exc:
            raise ApiError(429, exc.message,
                           {"Retry-After": str(LIMIT_RETRY_AFTER_S)}) from None
        jobs.wake()
        status = status_body(job, [], base_url())
        return json_response(envelope.success(job.spec.log_id, status), 202,
                             {"Location": status["statusUrl"]})

    @blueprint.get("/jobs/<job_id>")
    def status(job_id: str):
        job = load(job_id)
        wait_s = wait_seconds(request.args.get("wait"), jobs.config.max_wait_s)
        if wait_s and job.state not in FINAL_STATES and waiters.acquire(blocking=False):
            try:
                job = wait_for_change(jobs.request_store, job, wait_s) or load(job_id)
            finally:
                waiters.release()
        body = status_body(job, jobs.request_store.failed_pages(job.id), base_url())
        return json_response(envelope.success(job.spec.log_id, body))

    @blueprint.get("/jobs/<job_id>/result")
    def result(job_id: str):
        job = load(job_id)
        chosen = outputs.negotiate(request.headers.get("Accept"), OFFERED[job.spec.endpoint])
        if job.state == CANCELLED:
            raise ApiError(410, f"Job {job.id} was cancelled; its pages were deleted")
        if chosen == outputs.NDJSON:
            return stream(results.ndjson_lines(jobs.store, job), chosen)
        if job.state in ACTIVE_STATES:
            raise ApiError(409, f"Job {job.id} is {job.state} ({job.pages_done} of "
                                f"{job.num_pages} pages done): wait with GET /jobs/{job.id}"
                                "?wait=60, or ask for Accept: application/x-ndjson to get the "
                                "pages done so far")
        if job.state == FAILED:
            raise ApiError(job.error_code or 500, job.error_msg)
        # the body is read on the runners' patient store: once an answer has begun there is
        # no 503 to give, and a stall waited out is better than a body cut short
        return outputs.respond(chosen, results.answer(jobs.store, job), jobs.pdf_fonts,
                               jobs.service.pdf_builder, jobs.service.answer_disk)

    @blueprint.delete("/jobs/<job_id>")
    def cancel(job_id: str):
        job = load(job_id)
        now = time.time()
        before = jobs.store.cancel(job.id, now + jobs.config.result_ttl_s, now)
        if before is not None and before.state in ACTIVE_STATES:
            jobs.cancelled(job.id)
            job = jobs.store.get(job.id) or job
            body = {**status_body(job, [], base_url()), "deleted": True}
        else:
            jobs.store.delete(job.id)
            body = {"jobId": job.id, "state": job.state, "deleted": True}
        return json_response(envelope.success(job.spec.log_id, body))

    @blueprint.errorhandler(redis.RedisError)
    @blueprint.errorhandler(sqlite3.Error)
    @blueprint.errorhandler(OSError)
    def store_unavailable(exc: Exception):
        jobs.log_store_error(exc)
        return error_response(503, "The job store cannot be reached right now; try again "
                                   "shortly", {"Retry-After": "5"})

    return blueprint


def job_endpoint(value) -> Endpoint:
    """The `endpoint` a job runs as: `/ocr` (the default: absent or null) or
    `/layout-parsing`, with or without the leading slash."""
    if value is None:
        return OCR
    if isinstance(value, str):
        path = value if value.startswith("/") else "/" + value
        if path in ENDPOINTS:
            return ENDPOINTS[path]
    raise unprocessable(f"endpoint must be {OCR.path!r} or {LAYOUT.path!r} (the route whose "
                        f"answer the job gives), got {excerpt(value)}")


def job_spec(plan, fields: dict, callback_url: str | None, base_url: str) -> JobSpec:
    """What the runner needs to plan the job again on any gateway: the fields without the
    file, and the selected pages as the plan selected them (a PDF's pages, a multi-page
    TIFF's frames: each stored on its own, so a job resumes from the missing ones; the
    document is not opened again to count them)."""
    request_ = plan.request
    kept = {k: v for k, v in fields.items() if k not in ("file", "pageRange", "fileType")}
    kept["logId"] = request_.log_id
    kept["fileType"] = 0 if plan.kind == KIND_PDF else 1
    if plan.kind in PAGED:
        indices = tuple(plan.page_indices)
        kind = plan.kind
    else:
        kept["pageRange"] = request_.page_range  # an image sent whole
        indices, kind = (0,), "image"
    return JobSpec(kind=kind, log_id=request_.log_id,
                   fields={k: v for k, v in kept.items() if v is not None},
                   page_indices=indices, page_range_given=request_.page_range is not None,
                   partial=fields.get("returnPartialResults") is True,
                   callback_url=callback_url, base_url=base_url,
                   endpoint=plan.endpoint.path)


def wait_seconds(raw: str | None, max_wait_s: float) -> float:
    if raw is None:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise unprocessable(f"wait must be a number of seconds (at most {max_wait_s:g}), "
                            f"got {raw!r}")
    return min(value, max_wait_s)


def wait_for_change(store, job: Job, wait_s: float) -> Job | None:
    """Poll until the job's state differs from `job.state` (or it is gone), at most
    `wait_s`; the job as last read."""
    deadline = time.monotonic() + wait_s
    current: Job | None = job
    while time.monotonic() < deadline:
        time.sleep(min(WAIT_POLL_S, max(0.0, deadline - time.monotonic())))
        current = store.get(job.id)
        if current is None or current.state != job.state:
            break
    return current


def status_body(job: Job, failed_pages: list[dict], base_url: str) -> dict:
    error = {"errorCode": job.error_code, "errorMsg": job.error_msg} if job.error_code else None
    callback = ({"state": job.callback_state or "waiting", "attempts": job.callback_attempts}
                if job.spec.callback_url else None)
    return {"jobId": job.id, "endpoint": job.spec.endpoint, "state": job.state,
            "numPages": job.num_pages,
            "pagesDone": job.pages_done, "pagesFailed": job.pages_failed,
            "cachedPages": job.pages_cached, "failedPages": failed_pages,
            "createdAt": iso(job.created), "startedAt": iso(job.started),
            "finishedAt": iso(job.finished),
            "expiresAt": iso(job.expires_at), "error": error, "callback": callback,
            **job_urls(job.id, base_url)}


def stream(chunks, mimetype: str) -> Response:
    return Response(stream_with_context(chunks), mimetype=mimetype)


