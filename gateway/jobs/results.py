"""A job's result in the formats /ocr answers in, read from the store a few pages at a time
(a 1,000-page result is never held whole): the PaddleX JSON envelope, NDJSON (also while the
job runs: the pages done so far), and plain text.

TODO(merge with gateway/outputs/): `text/plain` here is a stand-in (page texts, pages
separated by form feeds) until the shared output formats land; then text and the searchable
PDF come from there."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Iterator

from services.ocr_api import envelope

from .. import assemble
from ..assemble import PageOutcome
from .model import FAILED, Job
from .store import JobStore

JSON, NDJSON, TEXT = "application/json", "application/x-ndjson", "text/plain"
FORMATS = (JSON, NDJSON, TEXT)


def _dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode()


def _outcomes(store: JobStore, job: Job) -> Iterator[PageOutcome]:
    for stored in store.pages(job.id):
        yield stored.outcome()


def envelope_chunks(store: JobStore, job: Job) -> Iterator[bytes]:
    """The same envelope /ocr returns (envelope.success(logId, document_result(...))), written
    out page by page: only each page's size is kept for dataInfo at the end."""
    light: list[PageOutcome] = []
    yield b'{"logId":' + _dumps(job.spec.log_id) + b',"result":{"ocrResults":['
    for number, page in enumerate(_outcomes(store, job)):
        entry = page.ocr_result if not page.error_code else assemble.failed_page_entry(page)
        yield (b"," if number else b"") + _dumps(entry)
        light.append(replace(page, ocr_result=None))
    tail = assemble.document_result(light, job.spec.page_range_given)
    yield b'],"dataInfo":' + _dumps(tail["dataInfo"])
    if "failedPages" in tail:
        yield b',"failedPages":' + _dumps(tail["failedPages"])
    yield b'},"errorCode":0,"errorMsg":"Success"}'


def ndjson_lines(store: JobStore, job: Job) -> Iterator[bytes]:
    """One line per page done, in page order, then a summary: /ocr's summary line once the
    job has ended, else `{"done": false, "state", "pagesDone", "numPages"}`."""
    light: list[PageOutcome] = []
    for page in _outcomes(store, job):
        yield _dumps(assemble.stream_page_line(job.spec.log_id, page)) + b"\n"
        light.append(replace(page, ocr_result=None))
    if job.active:
        summary = {"logId": job.spec.log_id, "jobId": job.id, "state": job.state,
                   "done": False, "pagesDone": len(light), "numPages": job.num_pages}
    elif job.state == FAILED:
        summary = {**envelope.no_result(job.spec.log_id, job.error_code, job.error_msg),
                   "done": True, "numPages": len(light)}
    else:
        summary = assemble.stream_summary_line(job.spec.log_id, light,
                                               job.spec.page_range_given)
    yield _dumps({**summary, "jobId": job.id, "state": job.state}) + b"\n"


def text_chunks(store: JobStore, job: Job) -> Iterator[bytes]:
    """Each page's recognized lines, pages separated by a form feed (as pdftotext does)."""
    for number, page in enumerate(_outcomes(store, job)):
        texts = ((page.ocr_result or {}).get("prunedResult") or {}).get("rec_texts") or []
        yield (b"\f" if number else b"") + "\n".join(texts).encode() + b"\n"
