"""A job's result, read from the store a few pages at a time (a 1,000-page result is never
held whole), handed to gateway/outputs/, the one writer of answers: every format /ocr
answers in, with the same text and the same envelope: /ocr's for an /ocr job, /layout-parsing's
(`layoutParsingResults`, `layoutParsingResult` lines, the document's Markdown) for a layout
job. NDJSON also works while the job runs: the pages done so far, then a line saying where
the job is."""

from __future__ import annotations

from typing import Iterator

from services.ocr_api import envelope

from .. import outputs
from ..assemble import PageOutcome
from ..outputs import paddlex
from .model import FAILED, Job
from .store import JobStore


def answer(store: JobStore, job: Job) -> outputs.Answer:
    def pages() -> Iterator[PageOutcome]:
        return (stored.outcome() for stored in store.pages(job.id))

    return outputs.Answer(job.spec.log_id, job.spec.kind, job.spec.page_range_given, pages,
                          lambda: store.document(job.id) or b"", job.pages_done,
                          job.spec.route)


def ndjson_lines(store: JobStore, job: Job) -> Iterator[bytes]:
    """One line per page done, in page order, then a summary: /ocr's summary line once the
    job has ended, else `{"done": false, "state", "pagesDone", "numPages", "cachedPages"}`."""
    seen: list[PageOutcome] = []
    yield from paddlex.ndjson_pages(job.spec.log_id, answer(store, job).pages(), seen,
                                    job.spec.route)
    if job.active:
        summary = {"logId": job.spec.log_id, "state": job.state, "done": False,
                   "pagesDone": len(seen), "numPages": job.num_pages,
                   "cachedPages": paddlex.cached_pages(seen)}
    elif job.state == FAILED:
        summary = {**envelope.no_result(job.spec.log_id, job.error_code, job.error_msg),
                   "done": True, "numPages": len(seen), "cachedPages": paddlex.cached_pages(seen)}
    else:
        summary = paddlex.stream_summary_line(job.spec.log_id, seen, job.spec.page_range_given)
    yield paddlex.line({**summary, "jobId": job.id, "state": job.state})
