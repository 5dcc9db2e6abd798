"""The page cache, measured (docs/cache.md): sim workers (engine "sim", a fixed service time
per page: fleet mechanics, not OCR) behind one gateway with the cache on.

1. a 40-page PDF built from 4 distinct pages, read cold (empty cache: 4 pages read, 36 wait
   for their twin in flight) and warm (every page from the cache);
2. a 200-page PDF of distinct pages, read, then read again (a batch re-run);
3. the cost of a miss, in this process, per page: cutting aside, the page's digest (its PDF
   object graph) plus the store's round trips of a miss (get, claim, put, release), on the
   SQLite store and on Redis when a redis-server is installed, as a share of a page's
   engine time (the sim's, and OCR_BENCH_ENGINE_MS for a real engine's).

    python -m loadtest.bench_cache [--page-ms 100] [--workers 2] [--json out.json]"""

from __future__ import annotations

import argparse
import base64
import json
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import requests

from gateway.cache.key import pdf_chunk_digest
from gateway.cache.pages import PageCache, Policy
from gateway.cache.store import SqliteCacheStore
from gateway.split import PdfCutter
from loadtest import documents
from scripts.fleet import free_port, gateway_process, redis_process, stop_all, worker_process


def served(workers) -> float:
    total = 0.0
    for url in workers:
        for line in requests.get(f"{url}/metrics", timeout=5).text.splitlines():
            if line.startswith('ocr_worker_pages_total{outcome="ok"}'):
                total += float(line.split()[-1])
    return total


def read(gateway: str, pdf: bytes, headers=None) -> dict:
    before = time.monotonic()
    response = requests.post(f"{gateway}/ocr", json={"file": base64.b64encode(pdf).decode(),
                                                     "visualize": False},
                             headers=headers or {}, timeout=600)
    response.raise_for_status()
    return {"seconds": round(time.monotonic() - before, 3),
            "cachedPages": int(response.headers.get("X-Ocr-Cached-Pages", "0"))}


def fleet_runs(page_ms: int, workers_n: int, work: Path) -> dict:
    env = {"OCR_ENGINE": "sim", "OCR_SIM_PAGE_MS": str(page_ms), "OCR_QUEUE_SIZE": "4",
           "OCR_VISUALIZE": "false"}
    started = []
    try:
        ports = [free_port() for _ in range(workers_n)]
        workers = [worker_process(p, env, work / f"worker-{p}.log").start() for p in ports]
        started += workers
        for worker in workers:
            worker.wait_ready(60)
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        port = free_port()
        gateway = gateway_process(port, {"GATEWAY_REPLICAS": ",".join(urls),
                                         "GATEWAY_PROCESSES": "1",
                                         "GATEWAY_CACHE_ENABLED": "true",
                                         "GATEWAY_CACHE_PATH": str(work / "cache.sqlite3"),
                                         "GATEWAY_JOBS_DB": str(work / "jobs.sqlite3")},
                                  work / "gateway.log").start()
        started.append(gateway)
        gateway.wait_ready(30)
        url = f"http://127.0.0.1:{port}"
        results = {}
        pdf40 = documents.repeated_pdf(4, 40)
        before = served(urls)
        results["pdf40_of_4_uncached"] = {**read(url, pdf40, {"Cache-Control": "no-store"}),
                                          "pagesRead": served(urls) - before}
        for name in ("cold", "warm"):
            before = served(urls)
            results[f"pdf40_of_4_{name}"] = {**read(url, pdf40),
                                             "pagesRead": served(urls) - before}
        pdf200 = documents.labelled_pdf(200)
        for name in ("first", "rerun"):
            before = served(urls)
            results[f"batch200_{name}"] = {**read(url, pdf200),
                                           "pagesRead": served(urls) - before}
        return results
    finally:
        stop_all(started)


def miss_cost(store_name: str, cache: PageCache, chunks: list[bytes]) -> dict:
    document = cache.document(Policy("bench"), {}, False, False, None, "pdf")
    digests, rounds = [], []
    for data in chunks:
        began = time.perf_counter()
        content = pdf_chunk_digest(data)
        digested = time.perf_counter()
        entry = document.lookup(data, "pdf")  # digest again + get + claim
        entry.finish({"ocrResults": [{"prunedResult": {"rec_texts": ["x" * 200]}}],
                      "dataInfo": {"type": "pdf"}}, "bench-engine", "http://bench")
        done = time.perf_counter()
        digests.append(digested - began)
        rounds.append(done - digested - (digested - began))
        assert content
    return {"store": store_name, "pages": len(chunks),
            "digestMsMedian": round(statistics.median(digests) * 1000, 3),
            "storeMsMedian": round(statistics.median(rounds) * 1000, 3),
            "missMsMedian": round(statistics.median(
                [d + r for d, r in zip(digests, rounds)]) * 1000, 3)}


def miss_costs(work: Path) -> list[dict]:
    pdf = documents.labelled_pdf(60, seed=int(time.time()) % 1000)
    cutter = PdfCutter(pdf)
    chunks = [cutter.cut((i,)).data for i in range(60)]
    cutter.close()
    out = []
    sqlite_cache = PageCache(SqliteCacheStore(str(work / "miss.sqlite3"), 1 << 28, 3600))
    sqlite_cache.engines.observe("http://bench", "bench-engine")
    out.append(miss_cost("sqlite", sqlite_cache, chunks))
    sqlite_cache.close()
    if shutil.which("redis-server") or Path("/usr/bin/redis-server").exists():
        from gateway.cache.redis_store import RedisCacheStore
        port = free_port()
        server = redis_process(port, work / "redis", work / "redis.log").start()
        try:
            server.wait_ready(30)
            redis_cache = PageCache(RedisCacheStore(f"redis://127.0.0.1:{port}/0", 1 << 28,
                                                    3600, prefix=f"bench-{uuid.uuid4().hex}:"))
            redis_cache.engines.observe("http://bench", "bench-engine")
            out.append(miss_cost("redis (loopback)", redis_cache, chunks))
            redis_cache.close()
        finally:
            server.stop()
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--page-ms", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--engine-ms", type=float, default=None,
                        help="a real engine's time per page, for the miss's share")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as tmp:
        work = Path(tmp)
        report = {"engine": "sim", "simPageMs": args.page_ms, "workers": args.workers,
                  "fleet": fleet_runs(args.page_ms, args.workers, work),
                  "miss": miss_costs(work)}
    for row in report["miss"]:
        row["shareOfSimPage"] = round(row["missMsMedian"] / args.page_ms, 4)
        if args.engine_ms:
            row["shareOfEnginePage"] = round(row["missMsMedian"] / args.engine_ms, 4)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)
    return report


if __name__ == "__main__":
    main()
