"""The page cache under faults and hostile input: a store that fails, stalls (a redis-server
stopped with SIGSTOP), is slow, full or corrupt costs a page nothing (it is read through at
once, a metric and a log line say so, and the cache comes back by itself); a full cache never
makes the jobs' writes fail; a PDF page whose objects refer back to it many times is digested
in linear work; the fleet's engine is known again after a rollout replaced every replica; and
the engine identity changes with the pixel cap and with the worker's code."""

from __future__ import annotations

import io
import logging
import os
import re
import shutil
import signal
import threading
import time
import uuid
from pathlib import Path

import pikepdf
import pytest
import redis
from prometheus_client import REGISTRY

from gateway.cache import build_cache
from gateway.cache import key as keys
from gateway.cache.guard import StoreGuard
from gateway.cache.pages import EngineView, PageCache, Policy
from gateway.cache.redis_store import RedisCacheStore
from gateway.cache.store import SqliteCacheStore
from gateway.config import GatewayConfig
from gateway.split import PdfCutter
from scripts.fleet import free_port, redis_process
from services.ocr_worker import identity
from services.ocr_worker.config import WorkerConfig
from tests.conftest import wait_until

RESULT = {"ocrResults": [{"prunedResult": {"rec_texts": ["x"]}}],
          "dataInfo": {"type": "pdf", "numPages": 1, "pages": [{"width": 1, "height": 1}]}}


def lookups(result: str) -> float:
    return REGISTRY.get_sample_value("ocr_gateway_cache_lookups_total", {"result": result}) or 0


def errors(call: str) -> float:
    return REGISTRY.get_sample_value("ocr_gateway_cache_errors_total", {"call": call}) or 0


def document(cache):
    return cache.document(Policy("gateway"), {}, None, False, None, "pdf")


@pytest.fixture
def redis_server(tmp_path):
    server = redis_process(free_port(), tmp_path / "redis").start()
    server.wait_ready(30)
    yield server, f"redis://127.0.0.1:{server.cmd[server.cmd.index('--port') + 1]}/0"
    os.kill(server.pid, signal.SIGCONT)
    server.stop()


# ---- a store that fails, stalls or is slow ---------------------------------------------------
class FailingClaims(SqliteCacheStore):
    """A store whose claims fail (a store down between a look and a claim)."""

    def claim(self, key, token, ttl_s):
        raise OSError("the store went away")


def test_a_failed_claim_is_read_through_not_waited_on(tmp_path, caplog):
    cache = PageCache(FailingClaims(str(tmp_path / "c.sqlite3"), 10**7, 3600))
    cache.engines.observe("http://w", "e1")
    cache.guard.first_retry_s = 600  # (no probe finds it back during this test)
    before = lookups("unavailable")
    with caplog.at_level(logging.WARNING, logger="gateway.cache"):
        entry = document(cache).lookup(b"page", "image")
    try:
        assert not entry.waiting and entry.token is None and entry.result is None  # sent
        assert lookups("unavailable") == before + 1
        assert not cache.available
        assert any("read through" in record.getMessage() for record in caplog.records)
        skipped = document(cache).lookup(b"other", "image")  # the store is not asked now
        assert not skipped.waiting and lookups("unavailable") == before + 2
    finally:
        cache.close()


def test_a_slow_store_is_skipped_after_one_slow_call_and_used_again_once_it_answers():
    clock = [0.0]

    class Slow:
        slow = True

        def get(self):
            clock[0] += 2.0 if self.slow else 0.001
            return b"v"

        def ping(self):
            if self.slow:
                raise TimeoutError("still slow")

    store = Slow()
    guard = StoreGuard(store, timeout_s=0.5, first_retry_s=0.01, max_retry_s=0.02,
                       clock=lambda: clock[0])
    try:
        assert guard.call("get", store.get) == b"v"  # answered, slowly: marked down
        assert not guard.up
        calls = clock[0]
        assert guard.call("get", store.get, "skipped") == "skipped" and clock[0] == calls
        store.slow = False
        wait_until(lambda: guard.up, 10, what="the probe to find the store answering")
        assert guard.call("get", store.get) == b"v"
    finally:
        guard.close()


def test_a_stalled_redis_costs_a_page_one_short_timeout_and_the_cache_comes_back(redis_server):
    server, url = redis_server
    cache = PageCache(RedisCacheStore(url, 10**7, 3600, prefix=f"t-{uuid.uuid4().hex[:6]}:"),
                      poll_s=0.01)
    cache.engines.observe("http://w", "e1")
    try:
        first = document(cache).lookup(b"page", "image")
        first.finish(RESULT, "e1", "http://w")
        holder = document(cache).lookup(b"held", "image")
        assert holder.token  # in flight here, and waited on:
        holder_key = holder.key
        waiter = document(cache).lookup(b"held", "image")
        done = threading.Event()
        waiter.wait(time.monotonic() + 120, done.set)
        os.kill(server.pid, signal.SIGSTOP)
        started = time.monotonic()
        entries = [document(cache).lookup(b"page", "image") for _ in range(20)]
        took = time.monotonic() - started
        assert took < 3, f"20 lookups took {took:.1f} s with the store stalled"
        assert all(e.result is None and not e.waiting and e.token is None for e in entries)
        assert done.wait(10) and waiter.result is None  # sent after all, not in 120 s
        holder.release()  # (its attempt failed while the store was down)
        os.kill(server.pid, signal.SIGCONT)
        wait_until(lambda: cache.available, 15, what="the cache to come back")
        assert document(cache).lookup(b"page", "image").result == RESULT
        # the claim let go of meanwhile is let go of now, not when it lapses in 120 s
        wait_until(lambda: not cache.claimed(holder_key), 5, what="the claim to be let go")
    finally:
        os.kill(server.pid, signal.SIGCONT)
        cache.close()


def test_a_corrupt_sqlite_file_is_set_aside_at_start_up_and_a_new_one_used(tmp_path, caplog):
    path = tmp_path / "cache.sqlite3"
    path.write_bytes(b"this is not a database" * 500)
    config = GatewayConfig.from_env({"GATEWAY_REPLICAS": "http://w:1",
                                     "GATEWAY_CACHE_ENABLED": "true",
                                     "GATEWAY_CACHE_PATH": str(path)})
    with caplog.at_level(logging.ERROR, logger="gateway.cache"):
        cache = build_cache(config)
    try:
        cache.engines.observe("http://w", "e1")
        document(cache).lookup(b"page", "image").finish(RESULT, "e1", "http://w")
        assert document(cache).lookup(b"page", "image").result == RESULT
        aside = [p for p in os.listdir(tmp_path) if ".corrupt-" in p]
        assert len(aside) == 1 and (tmp_path / aside[0]).read_bytes().startswith(b"this is")
        assert any("moved aside" in record.getMessage() for record in caplog.records)
    finally:
        cache.close()


def test_a_sqlite_file_damaged_while_in_use_is_read_through_then_replaced(tmp_path):
    path = tmp_path / "cache.sqlite3"
    store = SqliteCacheStore(str(path), 10**8, 3600)
    cache = PageCache(store)
    cache.engines.observe("http://w", "e1")
    try:
        for i in range(100):
            cache.put(f"k{i}", {"n": i, "pad": os.urandom(2000).hex()})
        store.close()  # (its pages written out to the file; it opens the file again)
        with open(path, "r+b") as handle:  # pages of the table overwritten underneath
            handle.seek(4096 * 2)
            handle.write(os.urandom(4096 * 40))
        failed = errors("get")
        for i in range(100):  # read through: no call raises
            cache.get(f"k{i}")
        assert errors("get") == failed + 1  # and after the first, the store is not asked
        wait_until(lambda: any(".corrupt-" in name for name in os.listdir(tmp_path))
                   and cache.available, 15, what="the file to be replaced")
        document(cache).lookup(b"page", "image").finish(RESULT, "e1", "http://w")
        assert document(cache).lookup(b"page", "image").result == RESULT
    finally:
        cache.close()


# ---- a full cache never refuses a job --------------------------------------------------------
def counted(client) -> int:
    """The memory Redis holds against maxmemory (its AOF buffer aside, as Redis does)."""
    memory = client.info("memory")
    return memory["used_memory"] - memory["mem_not_counted_for_evict"]


def test_a_full_cache_on_the_jobs_redis_leaves_the_jobs_room(redis_server):
    _, url = redis_server
    client = redis.Redis.from_url(url)
    limit = 32 * 2**20
    client.config_set("maxmemory", limit)  # noeviction, as the jobs' server runs
    store = RedisCacheStore(url, 10**9, 3600)  # the jobs' server: filled to 0.8 at most
    cache = PageCache(store)
    try:
        for i in range(700):  # 33 MiB of answers that do not compress: more than the server
            cache.put(f"k{i}", {"pad": os.urandom(48 * 1024).hex()})
        for i in range(3):  # the jobs' results still fit
            client.set(f"ocrfleet:jobs:job:{i}", os.urandom(2**20))
        assert cache.available  # and no cache write was refused: it stopped at its mark
        with pytest.raises(redis.exceptions.OutOfMemoryError):  # more jobs fill the server
            for i in range(3, 100):
                client.set(f"ocrfleet:jobs:job:{i}", os.urandom(2**20))
        held = store.size_bytes()
        cache.put("more", {"pad": os.urandom(48 * 1024).hex()})  # the next page's answer:
        wait_until(lambda: store.size_bytes() < held - 3 * 2**20, 15,  # the cache gives back
                   what="the cache to give memory back")
        assert counted(client) < 0.82 * limit
        client.set("ocrfleet:jobs:job:next", os.urandom(2**20))  # and jobs are written again
        wait_until(lambda: cache.available, 15, what="the cache to be used again")
        ttls = [client.pttl(name) for name in client.scan_iter(match="ocrfleet:cache:*")]
        assert ttls and all(ttl > 0 for ttl in ttls)  # every key it writes expires
    finally:
        cache.close()


def test_the_cache_can_have_a_redis_of_its_own(tmp_path):
    config = GatewayConfig.from_env({"GATEWAY_REPLICAS": "http://w:1",
                                     "GATEWAY_CACHE_ENABLED": "true",
                                     "GATEWAY_REDIS_URL": "redis://jobs:6379/0",
                                     "GATEWAY_CACHE_REDIS_URL": "redis://cache:6380/0"})
    cache = build_cache(config)
    try:
        kwargs = cache.store.redis.connection_pool.connection_kwargs
        assert (kwargs["host"], kwargs["port"]) == ("cache", 6380)
        assert kwargs["socket_timeout"] == config.cache.timeout_s
    finally:
        cache.close()


# ---- a hostile PDF ---------------------------------------------------------------------------
def hostile_pdf(references: int = 10_000, repeats: int = 100) -> bytes:
    """One page whose dictionary names, `repeats` times over, an array of `references`
    references to one annotation and one back to the page itself."""
    pdf = pikepdf.new()
    pdf.add_blank_page(page_size=(200, 200))
    page = pdf.pages[0].obj
    annotation = pdf.make_indirect(pikepdf.Dictionary(
        Type=pikepdf.Name.Annot, Subtype=pikepdf.Name.Square, Rect=[0, 0, 1, 1]))
    array = pdf.make_indirect(pikepdf.Array([annotation] * references + [page]))
    page.Annots = array
    for i in range(repeats):
        page[f"/X{i}"] = array
    out = io.BytesIO()
    pdf.save(out, object_stream_mode=pikepdf.ObjectStreamMode.disable)
    return out.getvalue()


class CountingPattern:
    """keys._REF, counting every reference it finds (the digest's work)."""

    def __init__(self, pattern: re.Pattern):
        self.pattern = pattern
        self.found = 0

    def finditer(self, text, *args):
        for match in self.pattern.finditer(text, *args):
            self.found += 1
            yield match

    def sub(self, replace, text, *args):
        def counted(match):
            self.found += 1
            return replace(match)
        return self.pattern.sub(counted, text, *args)


def test_a_page_that_refers_back_to_itself_many_times_is_digested_in_linear_work(monkeypatch):
    cutter = PdfCutter(hostile_pdf())
    try:
        chunk = cutter.cut((0,)).data
    finally:
        cutter.close()
    written = len(keys._REF.findall(chunk))
    assert written > 10_000  # the cut kept the hostile structure
    counting = CountingPattern(keys._REF)
    monkeypatch.setattr(keys, "_REF", counting)
    digest = keys.pdf_chunk_digest(chunk)
    assert digest.startswith("pdfgraph:")
    assert counting.found <= written  # each object read once: no reference twice
    monkeypatch.undo()
    assert keys.pdf_chunk_digest(chunk) == digest


# ---- the fleet's engine ----------------------------------------------------------------------
def test_after_a_rollout_replaced_every_replica_the_new_engine_is_read_from():
    clock = [0.0]
    view = EngineView(window_s=10, clock=lambda: clock[0])
    for url in ("http://10.0.0.1", "http://10.0.0.2"):
        view.observe(url, "old")
    assert view.current() == "old"
    for step in range(1, 5):  # new pods at new addresses; the old ones are gone from DNS
        clock[0] = 5.0 * step
        for url in ("http://10.0.1.1", "http://10.0.1.2"):
            view.observe(url, "new")
    assert view.current() == "new"
    assert set(view._seen) == {"http://10.0.1.1", "http://10.0.1.2"}  # churn is forgotten


# ---- the engine identity ---------------------------------------------------------------------
class Engine:
    info = {"engine": "sim", "backend": "none"}


def test_the_engine_identity_changes_with_the_pixel_cap():
    one = identity.engine_identity(Engine(), WorkerConfig.from_env({}), False)
    two = identity.engine_identity(Engine(), WorkerConfig.from_env(
        {"OCR_MAX_PIXELS": "20000000"}), False)
    assert one != two


def test_the_engine_identity_changes_with_the_workers_code(tmp_path, monkeypatch):
    config = WorkerConfig.from_env({})
    before = identity.engine_identity(Engine(), config, False)
    copy = tmp_path / "services"
    shutil.copytree(Path(identity.__file__).parent.parent, copy,
                    ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(identity, "SOURCE_DIR", str(copy), raising=False)
    assert identity.engine_identity(Engine(), config, False) == before  # the same code
    edited = tmp_path / "edited"
    shutil.copytree(copy, edited)
    decode = edited / "ocr_worker" / "decode.py"
    decode.write_text(decode.read_text() + "\n# another render\n")
    monkeypatch.setattr(identity, "SOURCE_DIR", str(edited), raising=False)
    assert identity.engine_identity(Engine(), config, False) != before
