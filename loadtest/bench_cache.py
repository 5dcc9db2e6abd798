"""The page cache, measured (docs/cache.md) on the sim and the real engine, each as workers
behind one gateway process with the cache on: a 40-page PDF of 4 distinct pages uncached, cold
and warm; a batch read and re-read; and the cost of a miss per page on the SQLite and Redis
stores. Writes cache.json; knobs in loadtest/README.md."""

from __future__ import annotations

import base64
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import requests

from gateway.cache.key import pdf_chunk_digest
from gateway.cache.pages import PageCache, Policy
from gateway.cache.store import SqliteCacheStore
from loadtest import doc_tables, local_fleet, report
from loadtest.payloads import one_page_pdfs
from samples import documents
from scripts.fleet import free_port, redis_process

FILE = "cache.json"
SIM_PAGE_MS = 100


def worker_totals(urls: list[str]) -> dict[str, float]:
    """Pages read, and the seconds spent rendering and reading them, over these workers."""
    totals = {"pages": 0.0, "engine_s": 0.0}
    for url in urls:
        for line in requests.get(f"{url}/metrics", timeout=5).text.splitlines():
            if line.startswith('ocr_worker_pages_total{outcome="ok"}'):
                totals["pages"] += float(line.split()[-1])
            elif line.startswith("ocr_worker_stage_seconds_sum") and (
                    'stage="inference"' in line or 'stage="render"' in line):
                totals["engine_s"] += float(line.split()[-1])
    return totals


def read(gateway: str, workers: list[str], pdf: bytes, headers=None) -> dict[str, Any]:
    """One document through /ocr: seconds, pages the workers read, pages from the cache."""
    before = worker_totals(workers)
    started = time.monotonic()
    response = requests.post(f"{gateway}/ocr", json={"file": base64.b64encode(pdf).decode(),
                                                     "visualize": False},
                             headers=headers or {}, timeout=1800)
    response.raise_for_status()
    after = worker_totals(workers)
    return {"seconds": round(time.monotonic() - started, 3),
            "pagesRead": int(after["pages"] - before["pages"]),
            "cachedPages": int(response.headers.get("X-Ocr-Cached-Pages", "0")),
            "engineSeconds": after["engine_s"] - before["engine_s"]}


def fleet_runs(engine: str, workers_n: int, batch_pages: int, logs: Path) -> dict[str, Any]:
    env = (local_fleet.sim_worker_env(SIM_PAGE_MS, OCR_QUEUE_SIZE="4") if engine == "sim"
           else local_fleet.real_worker_env(1, OCR_QUEUE_SIZE="4"))
    env["OCR_VISUALIZE"] = "false"
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as tmp, \
            local_fleet.workers(workers_n, env, logs, name=engine) as pool:
        urls = [local_fleet.url_of(w) for w in pool]
        gateway_env = {"GATEWAY_PROCESSES": "1", "GATEWAY_CACHE_ENABLED": "true",
                       "GATEWAY_CACHE_PATH": f"{tmp}/cache.sqlite3",
                       "GATEWAY_JOBS_DB": f"{tmp}/jobs.sqlite3"}
        with local_fleet.gateway(urls, logs, gateway_env) as gateway:
            url = local_fleet.url_of(gateway)
            runs = {}
            pdf40 = documents.repeated_pdf(4, 40)
            runs["pdf40_of_4_uncached"] = read(url, urls, pdf40, {"Cache-Control": "no-store"})
            runs["pdf40_of_4_cold"] = read(url, urls, pdf40)
            runs["pdf40_of_4_warm"] = read(url, urls, pdf40)
            batch = documents.labelled_pdf(batch_pages)
            runs["batch_first"] = read(url, urls, batch)
            runs["batch_rerun"] = read(url, urls, batch)
            read_pages = sum(r["pagesRead"] for r in runs.values())
            engine_ms = 1000 * sum(r.pop("engineSeconds") for r in runs.values()) / read_pages
            return {"engine": engine, "workers": workers_n, "batchPages": batch_pages,
                    "engines": report.engine_info(urls), "runs": runs,
                    "enginePageMs": round(engine_ms, 1)}


def miss_cost(store_name: str, store, chunks: list[bytes]) -> dict[str, Any]:
    """A miss per page on this store (closed afterwards): digest, then the round trips."""
    cache = PageCache(store)
    cache.engines.observe("http://bench", "bench-engine")
    document = cache.document(Policy("bench"), {}, False, False, None, "pdf")
    digests, rounds = [], []
    for data in chunks:
        began = time.perf_counter()
        assert pdf_chunk_digest(data)
        digested = time.perf_counter()
        entry = document.lookup(data, "pdf")  # digest again + get + claim
        entry.finish({"ocrResults": [{"prunedResult": {"rec_texts": ["x" * 200]}}],
                      "dataInfo": {"type": "pdf"}}, "bench-engine", "http://bench")
        done = time.perf_counter()
        digests.append(digested - began)
        rounds.append(done - digested - (digested - began))
    cache.close()
    return {"store": store_name, "pages": len(chunks),
            "digestMs": round(statistics.median(digests) * 1000, 3),
            "storeMs": round(statistics.median(rounds) * 1000, 3),
            "missMs": round(statistics.median(
                [d + r for d, r in zip(digests, rounds)]) * 1000, 3)}


def miss_costs(work: Path) -> list[dict[str, Any]]:
    """Median over 60 text pages, on both stores (redis-server is part of `make install`)."""
    from gateway.cache.redis_store import RedisCacheStore

    chunks = one_page_pdfs(documents.labelled_pdf(60, seed=int(time.time()) % 1000), 60)
    out = [miss_cost("SQLite", SqliteCacheStore(str(work / "miss.sqlite3"), 1 << 28, 3600),
                     chunks)]
    port = free_port()
    server = redis_process(port, work / "redis", work / "redis.log").start()
    try:
        server.wait_ready(30)
        out.append(miss_cost("Redis on loopback", RedisCacheStore(
            f"redis://127.0.0.1:{port}/0", 1 << 28, 3600, prefix=f"bench-{uuid.uuid4().hex}:"),
            chunks))
    finally:
        server.stop()
    return out


def measure() -> dict[str, Any]:
    engines = report.names("BENCH_CACHE_ENGINES", "sim,real")
    workers = report.knob("BENCH_CACHE_WORKERS", 2)
    batch = report.knob("BENCH_CACHE_BATCH", 200, 40)
    logs = report.log_dir("cache")
    fleets = [fleet_runs(engine, workers, batch, logs) for engine in engines]
    with tempfile.TemporaryDirectory(prefix="bench-cache-miss-") as tmp:
        misses = miss_costs(Path(tmp))
    for row in misses:
        row["shareOfPage"] = {f["engine"]: round(row["missMs"] / f["enginePageMs"], 4)
                              for f in fleets}
    return {**report.stamp([e for f in fleets for e in f["engines"]]), "fleets": fleets,
            "miss": misses}


def table(result: dict[str, Any]) -> str:
    return doc_tables.cache_table(result)


def wrong_answers(result: dict[str, Any]) -> int:
    """Runs whose pages read disagree with what the cache must do."""
    wrong = 0
    for fleet in result["fleets"]:
        runs, batch = fleet["runs"], fleet["batchPages"]
        expected = {"pdf40_of_4_uncached": (40, 0), "pdf40_of_4_cold": (4, 36),
                    "pdf40_of_4_warm": (0, 40), "batch_first": (batch, 0),
                    "batch_rerun": (0, batch)}
        wrong += sum((runs[name]["pagesRead"], runs[name]["cachedPages"]) != want
                     for name, want in expected.items())
    return wrong


def rows(result: dict[str, Any]) -> list[list[Any]]:
    made = []
    for fleet in result["fleets"]:
        runs = fleet["runs"]
        made.append([f"cache ({fleet['engine']}): 40-page PDF of 4 pages, uncached/cold/warm",
                     "/".join(f"{runs[f'pdf40_of_4_{n}']['seconds']:.2f}"
                              for n in ("uncached", "cold", "warm")) + " s",
                     "4 pages read cold, 0 warm", "info"])
        made.append([f"cache ({fleet['engine']}): {fleet['batchPages']}-page batch, re-run",
                     f"{runs['batch_first']['seconds']:.2f} -> "
                     f"{runs['batch_rerun']['seconds']:.2f} s", "0 pages read", "info"])
    for miss in result["miss"]:
        made.append([f"cache miss cost ({miss['store']})", f"{miss['missMs']:.2f} ms/page",
                     "(reported)", "info"])
    return made


if __name__ == "__main__":
    sys.exit(report.main(sys.modules[__name__]))
