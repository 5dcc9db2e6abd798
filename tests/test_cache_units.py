"""The page cache's parts without servers, and its stores against both backends (an SQLite
file, and a real redis-server on a free loopback port): keys decided by everything that
decides a page (and stable for the same PDF page in another file), scope and Cache-Control,
the byte budget evicting least recently used entries of its own only, claims held by one,
and a page in flight elsewhere waited for, taken over when its first attempt lets go, and
never waited for past its limit."""

from __future__ import annotations

import io
import threading
import time
import uuid

import pypdfium2 as pdfium
import pytest
import redis

from gateway.cache import key as keys
from gateway.cache.pages import EngineView, PageCache, Policy, policy_for
from gateway.cache.redis_store import RedisCacheStore
from gateway.cache.store import SqliteCacheStore
from gateway.split import PdfCutter, TiffCutter
from samples import documents
from scripts.fleet import free_port, redis_process
from tests.conftest import wait_until


def cut(data: bytes, index: int) -> bytes:
    cutter = PdfCutter(data)
    try:
        return cutter.cut((index,)).data
    finally:
        cutter.close()


def reordered(data: bytes, order: list[int]) -> bytes:
    source, target = pdfium.PdfDocument(data), pdfium.PdfDocument.new()
    target.import_pages(source, order)
    buffer = io.BytesIO()
    target.save(buffer)
    return buffer.getvalue()


# ---- keys ------------------------------------------------------------------------------------
def test_a_pdf_page_has_one_digest_in_any_file_and_each_page_its_own():
    pdf = documents.labelled_pdf(4)
    other = reordered(pdf, [2, 0, 1, 3, 2])  # other object numbers, metadata, /ID
    assert cut(pdf, 0) != cut(pdf, 0)  # pdfium writes a fresh /ID (and date) every time
    digest = keys.pdf_chunk_digest(cut(pdf, 0))
    assert digest.startswith("pdfgraph:")
    assert keys.pdf_chunk_digest(cut(other, 1)) == digest
    assert keys.pdf_chunk_digest(cut(other, 0)) == keys.pdf_chunk_digest(cut(pdf, 2)) \
        == keys.pdf_chunk_digest(cut(other, 4))
    assert len({keys.pdf_chunk_digest(cut(pdf, i)) for i in range(4)}) == 4


def test_a_pdf_not_written_by_pdfium_is_keyed_by_its_bytes():
    data = cut(documents.labelled_pdf(1), 0)
    damaged = data.replace(b"endobj", b"endobj junk", 1)
    assert keys.pdf_chunk_digest(damaged) == "bytes:" + keys.sha256(damaged)
    assert keys.pdf_chunk_digest(b"%PDF-1.7\n1 0 obj <</Type/ObjStm>> endobj") \
        .startswith("bytes:")


def test_tiff_frames_cut_from_two_files_are_the_same_bytes():
    pages = [documents.text_image([f"frame {i}"]) for i in range(3)]
    one, two = documents.multipage_tiff(pages), documents.multipage_tiff(pages[::-1])
    assert TiffCutter(one).cut((0,)).data == TiffCutter(two).cut((2,)).data


def test_every_parameter_that_changes_a_page_changes_the_key():
    base = keys.params_digest({"textDetThresh": 0.3}, None, None, "pdf")
    assert keys.params_digest({"textDetThresh": 0.3, "logId": "x"}, None, None, "pdf") == base
    assert keys.params_digest({"textDetThresh": 0.4}, None, None, "pdf") != base
    assert keys.params_digest({"textDetThresh": 1}, None, None, "pdf") == \
        keys.params_digest({"textDetThresh": 1.0}, None, None, "pdf")
    assert keys.params_digest({"textDetThresh": 0.3}, True, None, "pdf") != base
    assert keys.params_digest({"textDetThresh": 0.3}, False, None, "pdf") != base
    assert keys.params_digest({"textDetThresh": 0.3, "returnWordBox": True}, None, None,
                              "pdf") != base
    assert keys.params_digest({"textDetThresh": 0.3}, None, "1-2", "pdf") != base
    assert keys.params_digest({"textDetThresh": 0.3}, None, None, "image") != base
    parts = ("scope", "engine", "params", "content")
    key = keys.cache_key(*parts)
    for i in range(4):
        changed = list(parts)
        changed[i] += "!"
        assert keys.cache_key(*changed) != key


def test_scope_is_the_api_key_unless_global_and_cache_control_is_obeyed():
    assert policy_for("key:abc", None, False) == Policy("key:abc", True, True)
    assert policy_for("addr:10.0.0.1", None, False).scope == "gateway"
    assert policy_for(None, None, False).scope == "gateway"
    assert policy_for("key:abc", None, True).scope == "global"
    assert policy_for("key:a", "no-cache", False) == Policy("key:a", False, True)
    assert policy_for("key:a", "max-age=0, No-Store", False) == Policy("key:a", False, False)


def test_the_fleet_engine_is_known_only_while_every_replica_agrees():
    clock = [0.0]
    view = EngineView(window_s=10, clock=lambda: clock[0])
    assert view.current() is None
    view.observe("http://a", "e1")
    view.observe("http://b", "e1")
    assert view.current() == "e1"
    view.observe("http://b", "e2")  # a rollout: b now runs e2
    assert view.current() is None
    clock[0] = 11  # b said e1 long ago, a still does
    view.observe("http://a", "e1")
    view.observe("http://b", "e2")
    assert view.current() is None
    view.observe("http://a", "e2")
    clock[0] = 22
    view.observe("http://a", "e2")
    assert view.current() == "e2"
    view.observe("http://c", None)  # a replica that does not say
    assert view.current() is None


# ---- stores ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    directory = tmp_path_factory.mktemp("redis")
    server = redis_process(free_port(), directory, directory / "redis.log").start()
    server.wait_ready(30)
    yield f"redis://127.0.0.1:{server.cmd[server.cmd.index('--port') + 1]}/0"
    server.stop()


@pytest.fixture(params=["sqlite", "redis"])
def make_store(request, tmp_path):
    made = []

    def make(max_bytes=10_000, ttl_s=3600.0, clock=time.time):
        if request.param == "sqlite":
            store = SqliteCacheStore(str(tmp_path / "cache.sqlite3"), max_bytes, ttl_s, clock)
        else:
            store = RedisCacheStore(request.getfixturevalue("redis_url"), max_bytes, ttl_s,
                                    prefix=f"test-{uuid.uuid4().hex[:8]}:", clock=clock)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


def test_put_get_and_least_recently_used_eviction_by_bytes(make_store):
    clock = [1000.0]
    store = make_store(max_bytes=10_000, clock=lambda: clock[0])
    for name in "abcd":
        clock[0] += 1
        store.put(name, name.encode() * 2000)
    clock[0] += 1
    assert store.get("a") == b"a" * 2000  # a is now the most recently used
    clock[0] += 1
    store.put("e", b"e" * 2000)
    clock[0] += 1
    store.put("f", b"f" * 2000)  # 12000 bytes: b, the least recently used, goes
    assert store.get("b") is None
    assert all(store.get(n) is not None for n in "acdef")
    assert store.size_bytes() == 10_000
    store.put("huge", b"x" * 3000)  # over a quarter of the budget: not stored
    assert store.get("huge") is None


def test_an_entry_unused_for_its_ttl_is_gone(make_store):
    clock = [1000.0]
    store = make_store(ttl_s=1.0, clock=lambda: clock[0])
    store.put("a", b"1")
    clock[0] += 0.6
    assert store.get("a") == b"1"  # used: its TTL starts again (Redis: a real PX)
    if isinstance(store, SqliteCacheStore):
        clock[0] += 1.5
        assert store.get("a") is None
    else:
        wait_until(lambda: not store.redis.exists(f"{store.prefix}v:a"), 5,
                   what="the entry to expire")  # (a get would renew it)
        assert store.get("a") is None


def test_one_claim_at_a_time_released_only_by_its_holder(make_store):
    store = make_store()
    assert store.claim("k", "t1", 30)
    assert not store.claim("k", "t2", 30)
    assert store.claimed("k")
    store.release("k", "t2")  # not its holder: nothing happens
    assert store.claimed("k")
    store.release("k", "t1")
    assert not store.claimed("k")
    winners = []
    barrier = threading.Barrier(8)

    def race(token):
        barrier.wait()
        if store.claim("race", token, 30):
            winners.append(token)

    threads = [threading.Thread(target=race, args=(f"t{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(winners) == 1


def test_a_claim_lapses_by_itself(make_store):
    store = make_store()
    assert store.claim("k", "t1", 0.2)
    wait_until(lambda: store.claim("k", "t2", 30), 5, what="the claim to lapse")


def test_redis_eviction_touches_only_the_caches_own_keys(redis_url):
    client = redis.Redis.from_url(redis_url)
    client.set("ocrfleet:jobs:job:x", b"y" * 5000)
    client.set("someone-else", b"z" * 5000)
    store = RedisCacheStore(redis_url, 4000, 3600, prefix=f"t-{uuid.uuid4().hex[:6]}:")
    try:
        for i in range(50):
            store.put(f"k{i}", bytes(900))
        assert store.size_bytes() <= 4000
        assert client.get("ocrfleet:jobs:job:x") == b"y" * 5000
        assert client.get("someone-else") == b"z" * 5000
        own = list(client.scan_iter(match=f"{store.prefix}v:*"))
        assert 1 <= len(own) <= 4
    finally:
        store.close()
        client.delete("ocrfleet:jobs:job:x", "someone-else")


# ---- in flight -------------------------------------------------------------------------------
@pytest.fixture
def cache(tmp_path):
    cache = PageCache(SqliteCacheStore(str(tmp_path / "c.sqlite3"), 10**7, 3600),
                      inflight_s=30, poll_s=0.01)
    cache.engines.observe("http://w", "engine-1")
    yield cache
    cache.close()


def document(cache, scope="gateway"):
    return cache.document(Policy(scope), {}, None, False, None, "pdf")


RESULT = {"ocrResults": [{"prunedResult": {"rec_texts": ["x"]}}],
          "dataInfo": {"type": "pdf", "numPages": 1, "pages": [{"width": 1, "height": 1}]}}


def test_the_same_page_is_read_once_and_waiters_get_its_answer(cache):
    first = document(cache).lookup(b"page", "image")
    assert first.token and first.result is None  # claimed: it is sent
    second = document(cache).lookup(b"page", "image")
    assert second.waiting
    done = threading.Event()
    second.wait(time.monotonic() + 30, done.set)
    first.finish(RESULT, "engine-1", "http://w")
    assert done.wait(10) and second.result == RESULT
    assert document(cache).lookup(b"page", "image").result == RESULT
    assert document(cache, "key:other").lookup(b"page", "image").result is None  # scope


def test_one_waiter_takes_over_when_the_first_attempt_fails(cache):
    first = document(cache).lookup(b"page", "image")
    waiters = [document(cache).lookup(b"page", "image") for _ in range(3)]
    finished = []
    for entry in waiters:
        entry.wait(time.monotonic() + 30, lambda entry=entry: finished.append(entry))
    first.release()  # failed: no answer
    wait_until(lambda: finished, 10, what="a waiter to take over")
    taker = finished[0]
    assert taker.token and taker.result is None and len(finished) == 1
    taker.finish(RESULT, "engine-1", "http://w")
    wait_until(lambda: len(finished) == 3, 10, what="the others to get the answer")
    assert all(entry.result == RESULT for entry in finished[1:])


def test_nobody_waits_past_the_document_deadline(cache):
    first = document(cache).lookup(b"page", "image")
    assert first.token
    waiter = document(cache).lookup(b"page", "image")
    done = threading.Event()
    started = time.monotonic()
    waiter.wait(time.monotonic() + 1.3, done.set)  # gives up a second before the deadline
    assert done.wait(10) and waiter.result is None and waiter.token is None
    assert time.monotonic() - started < 5


def test_an_answer_from_another_engine_is_never_served_for_this_one(cache):
    first = document(cache).lookup(b"page", "image")
    first.finish(RESULT, "engine-2", "http://w2")  # stored under engine-2's key
    cache.engines.forget("http://w2")
    assert document(cache).lookup(b"page", "image").result is None
    cache.engines.forget("http://w")
    cache.engines.observe("http://w2", "engine-2")
    assert document(cache).lookup(b"page", "image").result == RESULT


def test_no_cache_reads_nothing_and_no_store_keeps_nothing(cache):
    entry = cache.document(Policy("gateway", read=False, write=False), {}, None, False, None,
                           "pdf")  # no-store: no cache at all for this document
    no_store = cache.document(Policy("gateway", read=True, write=False), {}, None, False,
                              None, "pdf").lookup(b"p", "image")
    no_store.finish(RESULT, "engine-1", "http://w")
    assert document(cache).lookup(b"p", "image").result is None
    no_cache = cache.document(Policy("gateway", read=False, write=True), {}, None, False,
                              None, "pdf").lookup(b"q", "image")
    assert no_cache.result is None and no_cache.token is None and not no_cache.waiting
    no_cache.finish(RESULT, "engine-1", "http://w")
    assert document(cache).lookup(b"q", "image").result == RESULT
    assert entry is None


def stored_meanwhile(cache, holder):
    """cache.get whose first answer is a miss, after which the holder stores its answer and
    lets go: the interleaving of a look, then the holder finishing, then a claim."""
    real_get, calls = cache.get, []

    def get(key):
        result = real_get(key)
        if not calls:
            calls.append(key)
            holder.finish(RESULT, "engine-1", "http://w")
        return result
    return get


@pytest.mark.parametrize("path", ["lookup", "waiting"])
def test_a_page_stored_between_a_look_and_a_claim_is_not_read_again(cache, monkeypatch, path):
    holder = document(cache).lookup(b"page", "image")
    assert holder.token
    if path == "lookup":
        monkeypatch.setattr(cache, "get", stored_meanwhile(cache, holder))
        entry = document(cache).lookup(b"page", "image")
    else:
        entry = document(cache).lookup(b"page", "image")
        assert entry.waiting
        monkeypatch.setattr(cache, "get", stored_meanwhile(cache, holder))
        assert entry.poll(time.monotonic())
    assert entry.result == RESULT and entry.token is None  # answered, not sent
    assert not cache.claimed(entry.key)  # and no claim left behind
