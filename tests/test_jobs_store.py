"""The job store's contract, run against both implementations: the embedded SQLite file and a
real redis-server started on a free loopback port. Leases fence every write; a job is taken
by one runner at a time; limits, cancellation and expiry free what a client holds."""

from __future__ import annotations

import sqlite3
import threading
import uuid

import pytest

from gateway.assemble import PageOutcome
from gateway.jobs.model import (CANCELLED, CB_DELIVERED, CB_PENDING, FAILED, QUEUED, RUNNING,
                                SUCCEEDED, Job, JobSpec, StoredPage, page_range_text)
from gateway.jobs.store import LimitExceeded, Limits
from gateway.jobs.store_redis import RedisJobStore
from gateway.jobs.store_sqlite import SCHEMA, SqliteJobStore
from scripts.fleet import free_port, redis_process

LIMITS = Limits(max_active=3, max_stored_bytes=10_000)
T0 = 1_000_000.0


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    directory = tmp_path_factory.mktemp("redis")
    port = free_port()
    server = redis_process(port, directory, directory / "redis.log").start().wait_ready(30)
    yield f"redis://127.0.0.1:{port}/0"
    server.stop()


@pytest.fixture(params=["sqlite", "redis"])
def store(request, tmp_path):
    if request.param == "sqlite":
        store = SqliteJobStore(str(tmp_path / "jobs.sqlite3"))
    else:
        store = RedisJobStore(request.getfixturevalue("redis_url"),
                              prefix=f"test-{uuid.uuid4().hex[:8]}:")
    yield store
    store.close()


def new_job(client="key:a", pages=4, created=T0) -> Job:
    spec = JobSpec(kind="pdf", log_id="log-1", fields={"visualize": False},
                   page_indices=tuple(range(pages)), page_range_given=False, partial=False)
    return Job(id=uuid.uuid4().hex, client=client, spec=spec, created=created)


def page(index, error=0) -> StoredPage:
    if error:
        return StoredPage.of(PageOutcome(index, error_code=error, error_msg="too big"))
    return StoredPage.of(PageOutcome(index, {"prunedResult": {"rec_texts": [f"p{index}"]}},
                                     {"width": 10, "height": 20}))


def test_create_get_and_document(store):
    job = new_job()
    store.create(job, b"%PDF-doc", LIMITS)
    got = store.get(job.id)
    assert got.state == QUEUED and got.spec == job.spec and got.stored_bytes == 8
    assert store.document(job.id) == b"%PDF-doc"
    assert store.get("0" * 32) is None
    assert store.usage("key:a").active == 1 and store.usage("key:a").stored_bytes == 8


def test_limits_refuse_a_job_and_store_nothing(store):
    for _ in range(3):
        store.create(new_job(), b"x" * 100, LIMITS)
    refused = new_job()
    with pytest.raises(LimitExceeded) as exc:
        store.create(refused, b"x", LIMITS)
    assert exc.value.what == "active" and store.get(refused.id) is None
    assert store.document(refused.id) is None
    with pytest.raises(LimitExceeded) as exc:
        store.create(new_job(client="key:b"), b"x" * 10_001, LIMITS)
    assert exc.value.what == "bytes"
    store.create(new_job(client="key:b"), b"x" * 10_000, LIMITS)  # exactly the limit


def test_one_runner_holds_a_job_until_its_lease_expires(store):
    job = new_job()
    store.create(job, b"doc", LIMITS)
    first = store.claim("gw-1", lease_s=10, now=T0 + 1)
    assert first.job.id == job.id and first.job.state == RUNNING
    assert first.job.started == T0 + 1 and first.job.lease_owner == "gw-1"
    assert store.claim("gw-2", lease_s=10, now=T0 + 5) is None
    assert store.renew(job.id, first.token, lease_s=10, now=T0 + 5)  # now held until T0+15
    assert store.claim("gw-2", lease_s=10, now=T0 + 12) is None
    second = store.claim("gw-2", lease_s=10, now=T0 + 16)
    assert second.job.id == job.id and second.token != first.token
    # the first runner is fenced off: it can neither write, renew nor finish
    assert not store.put_page(job.id, first.token, page(0), job.client)
    assert not store.renew(job.id, first.token, lease_s=10, now=T0 + 16)
    assert not store.finish(job.id, first.token, SUCCEEDED, 0, "", T0 + 99, False, job.client)
    assert store.done_indices(job.id) == set()
    assert store.put_page(job.id, second.token, page(0), job.client)


def test_concurrent_claims_hand_a_job_to_exactly_one(store):
    job = new_job()
    store.create(job, b"doc", LIMITS)
    claims, barrier = [], threading.Barrier(8)

    def claim(n):
        barrier.wait()
        claims.append(store.claim(f"gw-{n}", lease_s=30, now=T0 + 1))

    threads = [threading.Thread(target=claim, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len([c for c in claims if c is not None]) == 1


def test_pages_are_stored_once_and_read_in_order(store):
    job = new_job(pages=40)
    store.create(job, b"doc", LIMITS)
    claim = store.claim("gw", lease_s=30, now=T0 + 1)
    for index in [3, 0, 39, 1, 2, 5]:
        assert store.put_page(job.id, claim.token, page(index, error=422 if index == 5 else 0),
                              job.client)
    assert store.put_page(job.id, claim.token, page(0), job.client)  # again: kept once
    got = store.get(job.id)
    assert got.pages_done == 6 and got.pages_failed == 1
    assert store.done_indices(job.id) == {0, 1, 2, 3, 5, 39}
    outcomes = [p.outcome() for p in store.pages(job.id)]
    assert [o.page_index for o in outcomes] == [0, 1, 2, 3, 5, 39]
    assert outcomes[0].ocr_result["prunedResult"]["rec_texts"] == ["p0"]
    assert outcomes[4].error_code == 422 and outcomes[4].ocr_result is None
    assert store.failed_pages(job.id) == [{"pageIndex": 5, "errorCode": 422,
                                           "errorMsg": "too big"}]
    assert got.stored_bytes == 3 + sum(page(i, 422 if i == 5 else 0).size
                                       for i in [0, 1, 2, 3, 5, 39])


def test_cached_pages_are_counted_once_and_an_older_database_gains_the_count(store, tmp_path):
    job = new_job(pages=3)
    store.create(job, b"doc", LIMITS)
    claim = store.claim("gw", lease_s=30, now=T0 + 1)
    cached = StoredPage.of(PageOutcome(0, {"prunedResult": {}}, {}, cached=True))
    for stored in (cached, cached, page(1)):  # the same page twice: kept (and counted) once
        assert store.put_page(job.id, claim.token, stored, job.client)
    assert store.get(job.id).pages_cached == 1
    if isinstance(store, SqliteJobStore):  # a file made before the count existed
        older = tmp_path / "older.sqlite3"
        db = sqlite3.connect(older)
        db.executescript(SCHEMA.replace("pages_cached REAL, ", ""))
        db.close()
        reopened = SqliteJobStore(str(older))
        reopened.create(new_job(), b"doc", LIMITS)
        reopened.close()


def test_finish_then_callback_attempts_are_leased_and_due_in_turn(store):
    job = new_job()
    store.create(job, b"doc", LIMITS)
    claim = store.claim("gw", lease_s=30, now=T0 + 1)
    assert store.finish(job.id, claim.token, SUCCEEDED, 0, "", T0 + 1000, True, job.client,
                        now=T0 + 2)
    assert store.usage(job.client).active == 0
    assert not store.finish(job.id, claim.token, FAILED, 500, "x", T0 + 1000, True, job.client)
    delivery = store.claim("gw-2", lease_s=30, now=T0 + 3)
    assert delivery.job.state == SUCCEEDED and delivery.job.callback_state == CB_PENDING
    assert store.callback_done(job.id, delivery.token, CB_PENDING, 1, T0 + 50)
    assert store.claim("gw", lease_s=30, now=T0 + 40) is None
    retry = store.claim("gw", lease_s=30, now=T0 + 51)
    assert retry.job.callback_attempts == 1
    assert store.callback_done(job.id, retry.token, CB_DELIVERED, 2, 0)
    assert store.claim("gw", lease_s=30, now=T0 + 999) is None
    assert store.get(job.id, now=T0 + 100).callback_state == CB_DELIVERED


def test_release_makes_a_job_due_again_later(store):
    job = new_job()
    store.create(job, b"doc", LIMITS)
    claim = store.claim("gw", lease_s=30, now=T0 + 1)
    assert store.release(job.id, claim.token, retry_at=T0 + 10)
    assert store.claim("gw", lease_s=30, now=T0 + 5) is None
    assert store.claim("gw", lease_s=30, now=T0 + 10).job.state == RUNNING


def test_cancel_stops_the_runner_and_frees_what_the_job_held(store):
    job = new_job()
    store.create(job, b"doc" * 100, LIMITS)
    claim = store.claim("gw", lease_s=30, now=T0 + 1)
    assert store.put_page(job.id, claim.token, page(0), job.client)
    before = store.cancel(job.id, expires_at=T0 + 500, now=T0 + 2)
    assert before.state == RUNNING
    got = store.get(job.id, now=T0 + 3)
    assert got.state == CANCELLED and got.finished == T0 + 2
    assert store.document(job.id) is None and list(store.pages(job.id)) == []
    assert not store.put_page(job.id, claim.token, page(1), job.client)
    assert not store.renew(job.id, claim.token, 30)
    assert store.claim("gw", lease_s=30, now=T0 + 100) is None
    assert store.usage(job.client).active == 0 and store.usage(job.client).stored_bytes == 0
    assert store.get(job.id, now=T0 + 501) is None  # the record expires like a result
    assert store.purge_expired(now=T0 + 501) == 1


def test_results_expire_and_are_purged(store):
    job = new_job()
    store.create(job, b"doc", LIMITS)
    claim = store.claim("gw", lease_s=30, now=T0 + 1)
    store.put_page(job.id, claim.token, page(0), job.client)
    store.finish(job.id, claim.token, SUCCEEDED, 0, "", T0 + 60, False, job.client, now=T0 + 2)
    assert store.get(job.id, now=T0 + 59).state == SUCCEEDED
    assert store.purge_expired(now=T0 + 59) == 0
    assert store.get(job.id, now=T0 + 60) is None
    assert store.purge_expired(now=T0 + 61) == 1
    assert store.document(job.id) is None and store.done_indices(job.id) == set()
    assert store.usage(job.client).stored_bytes == 0
    # finished jobs can also be deleted at once
    other = new_job()
    store.create(other, b"doc", LIMITS)
    assert store.delete(other.id) and not store.delete(other.id)
    assert store.usage(other.client).active == 0


def test_page_range_text():
    assert page_range_text([0, 1, 2, 6, 9, 10]) == "1-3,7,10-11"
    assert page_range_text([4]) == "5"
    assert page_range_text([3, 1, 2, 2]) == "2-4"
    assert page_range_text([]) == ""
