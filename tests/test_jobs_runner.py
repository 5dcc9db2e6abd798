"""The job runner without servers: the gateway's real planning (GatewayService.plan) and a
fake page path in place of the replicas, over the embedded store. A job runs at batch
priority; a resumed job sends only the pages not stored; a cancelled job stops sending; a
failed page fails the job unless partial results were asked for; a full gateway queue
postpones the job; callbacks are retried with backoff; the result reads back as /ocr's."""

from __future__ import annotations

import io
import json
import threading
import time
import uuid

import pypdfium2 as pdfium
import pytest

from gateway.assemble import PageOutcome
from gateway.config import GatewayConfig, JobsConfig
from gateway.jobs import results
from gateway.jobs.api import job_spec
from gateway.jobs.callbacks import Delivery
from gateway.outputs.paddlex import document_result, envelope_chunks
from samples import documents
from gateway.jobs.model import (CANCELLED, CB_DELIVERED, CB_FAILED, CB_PENDING, FAILED,
                                QUEUED, RUNNING, SUCCEEDED, Job, StoredPage)
from gateway.jobs.runner import JobRunner
from gateway.jobs.store import Limits
from gateway.jobs.store_sqlite import SqliteJobStore
from gateway.service import GatewayService
from services.ocr_api import envelope
from services.ocr_api.errors import ApiError

LIMITS = Limits(10, 10 ** 9)


def envelope_of(store, job) -> dict:
    answer = results.answer(store, job)
    return json.loads(b"".join(envelope_chunks(answer.log_id, answer.pages(),
                                               answer.page_range_given)))


def sized_pdf(pages: int) -> bytes:
    """Page i is 100 + i points wide: a page is recognisable by its width."""
    pdf = pdfium.PdfDocument.new()
    for index in range(pages):
        pdf.new_page(100 + index, 100)
    buffer = io.BytesIO()
    pdf.save(buffer)
    return buffer.getvalue()


class FakePages(GatewayService):
    """The real plan(); pages_in_order answers each selected page itself and records what it
    sent, with what priority. `on_page(index)` runs before each page is answered."""

    def __init__(self, fail=(), on_page=None, error: ApiError | None = None):
        super().__init__(GatewayConfig.from_env({"GATEWAY_REPLICAS": "http://127.0.0.1:9"}))
        self.sent: list[int] = []
        self.priorities: list[str] = []
        self.fail = set(fail)
        self.on_page = on_page or (lambda index: None)
        self.error = error

    def pages_in_order(self, plan, keep_sending=lambda: True, priority="interactive"):
        self.priorities.append(priority)
        if self.error is not None:
            raise self.error
        if plan.kind not in ("pdf", "tiff"):
            self.sent.append(0)
            yield PageOutcome(0, {"prunedResult": {"rec_texts": ["img"]}},
                              {"width": 5, "height": 5}, doc_type="image")
            return
        for index in (i for group in plan.groups for i in group):
            if not keep_sending():
                return
            self.on_page(index)
            self.sent.append(index)
            if index in self.fail:
                yield PageOutcome(index, error_code=422, error_msg="page too large",
                                  doc_type=plan.kind)
            else:
                yield PageOutcome(index, {"prunedResult": {"rec_texts": [f"page {index}"]}},
                                  {"width": 100 + index, "height": 100}, doc_type=plan.kind)


class FakeSender:
    def __init__(self, answers):
        self.answers = list(answers)
        self.bodies: list[dict] = []

    def send(self, url, body, job_id):
        self.bodies.append(json.loads(body))
        return Delivery(*self.answers.pop(0))


@pytest.fixture
def store(tmp_path):
    store = SqliteJobStore(str(tmp_path / "jobs.sqlite3"))
    yield store
    store.close()


def submit(store, service, fields, document, callback_url=None) -> Job:
    plan = service.plan(dict(fields), document)
    job = Job(id=uuid.uuid4().hex, client="addr:test",
              spec=job_spec(plan, dict(fields), callback_url, "http://gw"))
    store.create(job, plan.request.file_bytes, LIMITS)
    return job


def runner_for(store, service, sender=None, **config) -> JobRunner:
    settings = JobsConfig(**{"lease_s": 30, "callback_backoff_s": 5, "callback_attempts": 3,
                             **config})
    return JobRunner(store, service, settings, sender, owner="test-runner")


def test_a_job_runs_every_page_once_at_batch_priority(store):
    service = FakePages()
    job = submit(store, service, {"visualize": False}, sized_pdf(12))
    assert runner_for(store, service).run_once()
    assert service.sent == list(range(12)) and service.priorities == ["batch"]
    done = store.get(job.id)
    assert done.state == SUCCEEDED and done.pages_done == 12 and done.expires_at > done.created
    body = envelope_of(store, done)
    pages = [p.outcome() for p in store.pages(job.id)]
    assert body == envelope.success(job.spec.log_id, document_result(pages, False))
    assert [r["prunedResult"]["rec_texts"] for r in body["result"]["ocrResults"]] == \
        [[f"page {i}"] for i in range(12)]


def test_a_resumed_job_sends_only_the_pages_not_stored(store):
    service = FakePages()
    job = submit(store, service, {"pageRange": "3-30"}, sized_pdf(40))
    # a runner that died after storing pages 3..12 (index 2..11): its lease has run out
    dead = store.claim("dead-runner", lease_s=0)
    for index in range(2, 12):
        store.put_page(job.id, dead.token, StoredPage.of(PageOutcome(index, {}, {})), job.client)
    assert runner_for(store, service).run_once()
    assert service.sent == list(range(12, 30))
    done = store.get(job.id)
    assert done.state == SUCCEEDED and done.pages_done == 28
    assert [p.index for p in store.pages(job.id)] == list(range(2, 30))
    lines = [json.loads(line) for line in results.ndjson_lines(store, done)]
    assert [line.get("pageIndex") for line in lines[:-1]] == list(range(2, 30))
    assert lines[-1]["done"] is True and lines[-1]["result"]["dataInfo"]["pageIndices"] == \
        list(range(2, 30))
    # the dead runner can no longer write
    assert not store.put_page(job.id, dead.token, StoredPage.of(PageOutcome(5, {}, {})),
                              job.client)


def test_a_cancelled_job_sends_no_more_pages(store):
    service = FakePages()
    runner = runner_for(store, service)
    job = submit(store, service, {}, sized_pdf(40))

    def cancel_at_page_5(index):
        if index == 5:
            store.cancel(job.id, expires_at=2e9)
            runner.cancelled(job.id)

    service.on_page = cancel_at_page_5
    assert runner.run_once()
    assert service.sent == [0, 1, 2, 3, 4, 5]
    cancelled = store.get(job.id)
    assert cancelled.state == CANCELLED and list(store.pages(job.id)) == []
    assert not runner.run_once()  # nothing left to do


def test_a_failed_page_fails_the_job_unless_partial_results_are_asked(store):
    service = FakePages(fail={3})
    job = submit(store, service, {}, sized_pdf(8))
    runner_for(store, service).run_once()
    failed = store.get(job.id)
    assert failed.state == FAILED and failed.error_code == 422
    assert failed.error_msg.startswith("Page(s) 4 could not be processed")
    assert service.sent == [0, 1, 2, 3]

    service = FakePages(fail={3})
    job = submit(store, service, {"returnPartialResults": True}, sized_pdf(8))
    runner_for(store, service).run_once()
    done = store.get(job.id)
    assert done.state == SUCCEEDED and done.pages_failed == 1
    assert store.failed_pages(job.id) == [{"pageIndex": 3, "errorCode": 422,
                                           "errorMsg": "page too large"}]
    body = envelope_of(store, done)
    assert body["result"]["failedPages"][0]["pageIndex"] == 3
    assert body["result"]["ocrResults"][3]["error"]["errorCode"] == 422


def test_a_full_gateway_queue_postpones_the_job(store):
    service = FakePages(error=ApiError(429, "queue full", {"Retry-After": "7"}))
    job = submit(store, service, {}, sized_pdf(3))
    assert runner_for(store, service).run_once()
    postponed = store.get(job.id)
    assert postponed.state == RUNNING and postponed.lease_token == ""
    assert store.claim("other", 30) is None  # due again in 7 s, not before
    assert store.claim("other", 30, now=postponed.started + 8) is not None


def test_an_image_job_is_one_request(store):
    from samples import documents

    service = FakePages()
    png = documents.to_png(documents.text_image(["x"]))
    job = submit(store, service, {"fileType": 1}, png)
    assert job.spec.kind == "image" and job.spec.fields["fileType"] == 1
    runner_for(store, service).run_once()
    assert service.sent == [0] and store.get(job.id).state == SUCCEEDED
    body = envelope_of(store, store.get(job.id))
    assert body["result"]["dataInfo"] == {"width": 5, "height": 5, "type": "image"}


def test_callbacks_are_retried_with_backoff_then_recorded(store):
    service = FakePages()
    sender = FakeSender([(False, "HTTP 500"), (True, "HTTP 204")])
    runner = runner_for(store, service, sender)
    job = submit(store, service, {}, sized_pdf(2), callback_url="https://example.test/hook")
    runner.run_once()  # the pages
    assert runner.run_once()  # the first attempt: due at once, on a delivery thread
    runner.wait_deliveries()
    first = store.get(job.id)
    assert first.callback_state == CB_PENDING and first.callback_attempts == 1
    assert not runner.run_once()  # the next one is due 5 s later
    retry = store.claim("test-runner", 30, now=first.finished + 6)
    assert retry is not None
    store.release(job.id, retry.token, retry_at=0)
    assert runner.run_once()
    runner.wait_deliveries()
    assert store.get(job.id).callback_state == CB_DELIVERED
    assert [b["state"] for b in sender.bodies] == [SUCCEEDED, SUCCEEDED]
    assert sender.bodies[0]["resultUrl"] == f"http://gw/jobs/{job.id}/result"
    assert sender.bodies[0]["pagesDone"] == 2 and sender.bodies[0]["error"] is None


def test_callbacks_give_up_after_the_configured_attempts(store):
    service = FakePages()
    sender = FakeSender([(False, "HTTP 500")] * 3)
    runner = runner_for(store, service, sender, callback_backoff_s=0.01)
    job = submit(store, service, {}, sized_pdf(1), callback_url="https://example.test/hook")
    runner.run_once()
    deadline = time.monotonic() + 30
    while store.get(job.id).callback_state == CB_PENDING and time.monotonic() < deadline:
        if not runner.run_once():
            threading.Event().wait(0.01)  # the next attempt is due in 0.01 s, 0.02 s
        runner.wait_deliveries()
    gave_up = store.get(job.id)
    assert gave_up.callback_state == CB_FAILED and gave_up.callback_attempts == 3


def test_queued_state_before_a_runner_takes_it(store):
    service = FakePages()
    job = submit(store, service, {}, sized_pdf(2))
    assert store.get(job.id).state == QUEUED


def test_a_stopping_gateway_gives_its_job_back_at_once(store):
    service = FakePages()
    runner = runner_for(store, service)
    job = submit(store, service, {}, sized_pdf(20))
    service.on_page = lambda index: runner.stop() if index == 3 else None  # SIGTERM
    assert runner.run_once()
    assert service.sent == [0, 1, 2, 3]
    handed_over = store.get(job.id)
    assert handed_over.state == RUNNING and handed_over.lease_token == ""
    assert handed_over.pages_done == 4
    successor = FakePages()
    assert runner_for(store, successor).run_once()  # due now, not after the lease
    assert successor.sent == list(range(4, 20)) and store.get(job.id).state == SUCCEEDED


def test_a_runner_error_gives_the_job_back_for_a_later_try(store):
    service = FakePages(error=RuntimeError("cannot schedule new futures after shutdown"))
    job = submit(store, service, {}, sized_pdf(2))
    assert runner_for(store, service).run_once()
    again = store.get(job.id)
    assert again.state == RUNNING and again.lease_token == ""
    assert store.claim("other", 30) is None
    assert store.claim("other", 30, now=again.started + 6) is not None


def test_receivers_that_drip_hold_no_runner_and_no_other_job(store):
    """Six jobs whose receiver answers one byte every few seconds, and a seventh job: the
    callbacks go out on their own threads (at most GATEWAY_JOBS_CALLBACK_CONCURRENCY at
    once, each cut off at its deadline), so the runner goes on to the seventh job."""
    from gateway.jobs.callbacks import CallbackSender
    from tests.test_jobs_callbacks import SECRET, Dripper, loopback_client

    dripper = Dripper(head=True, every_s=5.0)
    try:
        service = FakePages()
        sender = CallbackSender(SECRET, loopback_client(timeout_s=60))
        runner = runner_for(store, service, sender, callback_concurrency=4)
        hooked = [submit(store, service, {}, sized_pdf(1), callback_url=dripper.url)
                  for _ in range(6)]
        for _ in hooked:
            assert runner.run_once()  # the pages of the six
        for _ in range(6):
            assert runner.run_once()  # their callbacks: four handed over, two put off
        plain = submit(store, service, {}, sized_pdf(3))
        assert runner.run_once()
        assert store.get(plain.id).state == SUCCEEDED
        assert dripper.finished == 0 and all(
            store.get(job.id).callback_attempts == 0 for job in hooked)  # still dripping
    finally:
        dripper.close()
        runner.wait_deliveries(5)


def tiff(frames: int) -> bytes:
    return documents.multipage_tiff([documents.text_image([f"frame {i}"], size=20)
                                     for i in range(frames)])


def test_a_tiff_job_counts_its_frames_at_submit_and_resumes_from_the_missing_ones(store):
    """A runner that stops after 4 of 30 frames (a gateway reload) hands the job over; the
    next one sends frames 5-30 only, and the job succeeds with every frame exactly once."""
    stopping = FakePages()
    job = submit(store, stopping, {}, tiff(30))
    assert job.spec.kind == "tiff" and store.get(job.id).num_pages == 30
    runner = runner_for(store, stopping)
    stopping.on_page = lambda index: runner._stopping.set() if index == 3 else None
    assert runner.run_once()
    stopped = store.get(job.id)
    # given back, not ended: the page in flight at the stop (frame 4) was still stored
    assert stopped.state not in (SUCCEEDED, FAILED) and stopped.pages_done == 4
    resumed = FakePages()
    assert runner_for(store, resumed).run_once()
    assert resumed.sent == list(range(4, 30))
    done = store.get(job.id)
    assert done.state == SUCCEEDED and done.pages_done == done.num_pages == 30
    assert [p.index for p in store.pages(job.id)] == list(range(30))


def test_a_round_that_ends_in_504_plans_only_the_missing_frames_again(store):
    class DeadlineAfterFive(FakePages):
        rounds = 0

        def pages_in_order(self, plan, keep_sending=lambda: True, priority="interactive"):
            self.rounds += 1
            for number, page in enumerate(super().pages_in_order(plan, keep_sending, priority)):
                if self.rounds == 1 and number == 5:
                    raise ApiError(504, "The request deadline passed")
                yield page

    service = DeadlineAfterFive()
    job = submit(store, service, {}, tiff(12))
    assert runner_for(store, service).run_once()
    assert service.sent == list(range(6)) + list(range(5, 12))  # frame 6 was in flight
    assert store.get(job.id).state == SUCCEEDED and store.get(job.id).pages_done == 12
