"""The page cache (docs/cache.md) on the sim and the real engine, each as workers behind one
gateway process with the cache on: a 40-page PDF of 4 distinct pages uncached, cold and warm; a
batch read and re-read; and the cost of a miss per page on the SQLite and Redis stores. Writes
cache.json; knobs in loadtest/README.md."""

import base64
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import requests

from gateway.cache import PageCache, Policy, SqliteCacheStore
from gateway.cache.key import pdf_chunk_digest
from gateway.cache.redis_store import RedisCacheStore
from loadtest import local_fleet, report
from loadtest.payloads import one_page_pdfs
from samples import documents
from scripts.fleet import free_port, redis_process

FILE = "cache.json"
# each run, in order: its label, the pages the workers must read, the pages the cache must give
# ("batch": the batch's page count)
RUNS = {"pdf40_of_4_uncached": ("40-page PDF of 4 distinct pages, `no-store`", 40, 0),
        "pdf40_of_4_cold": ("the same, cold cache", 4, 36),
        "pdf40_of_4_warm": ("the same, warm", 0, 40),
        "batch_first": ("{batch}-page PDF, first read", "batch", 0),
        "batch_rerun": ("{batch}-page PDF, re-run", 0, "batch")}


def worker_totals(urls: list[str]) -> tuple[float, float]:
    """Pages read, and the seconds spent rendering and reading them, over these workers."""
    lines = [line.split() for url in urls
             for line in requests.get(f"{url}/metrics", timeout=5).text.splitlines() if line]
    return (sum(float(v) for k, *_, v in lines if k == 'ocr_worker_pages_total{outcome="ok"}'),
            sum(float(v) for k, *_, v in lines if k.startswith("ocr_worker_stage_seconds_sum")
                and ('stage="inference"' in k or 'stage="render"' in k)))


def read(gateway: str, workers: list[str], pdf: bytes, headers=None) -> dict[str, Any]:
    """One document through /ocr: seconds, pages the workers read, pages from the cache."""
    before, started = worker_totals(workers), time.monotonic()
    response = requests.post(f"{gateway}/ocr", headers=headers, timeout=1800, json={
        "file": base64.b64encode(pdf).decode(), "visualize": False})
    response.raise_for_status()
    pages, engine_s = (after - was for after, was in zip(worker_totals(workers), before))
    return {"seconds": round(time.monotonic() - started, 3), "pagesRead": int(pages),
            "cachedPages": int(response.headers.get("X-Ocr-Cached-Pages", "0")),
            "engineSeconds": engine_s}


def fleet_runs(engine: str, workers: int, batch_pages: int) -> dict[str, Any]:
    env = local_fleet.sim_worker_env(100) if engine == "sim" else local_fleet.real_worker_env(1)
    env.update(OCR_QUEUE_SIZE="4", OCR_VISUALIZE="false")
    logs = report.log_dir("cache")
    pdfs = {"pdf40": documents.repeated_pdf(4, 40), "batch": documents.labelled_pdf(batch_pages)}
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as tmp, \
            local_fleet.workers(workers, env, logs, name=engine) as pool:
        urls = [local_fleet.url_of(w) for w in pool]
        with local_fleet.gateway(urls, logs, {
                "GATEWAY_PROCESSES": "1", "GATEWAY_CACHE_ENABLED": "true",
                "GATEWAY_CACHE_PATH": f"{tmp}/cache.sqlite3",
                "GATEWAY_JOBS_DB": f"{tmp}/jobs.sqlite3"}) as gateway:
            runs = {name: read(local_fleet.url_of(gateway), urls, pdfs[name.split("_")[0]],
                               {"Cache-Control": "no-store"} if "uncached" in name else None)
                    for name in RUNS}
        engines = report.engine_info(urls)
    engine_ms = 1000 * sum(r.pop("engineSeconds") for r in runs.values()) / sum(
        r["pagesRead"] for r in runs.values())
    return {"engine": engine, "workers": workers, "batchPages": batch_pages,
            "engines": engines, "runs": runs, "enginePageMs": round(engine_ms, 1)}


def miss_cost(store_name: str, store, chunks: list[bytes]) -> dict[str, Any]:
    """Median over the pages of a miss on this store (closed afterwards): the digest, then the
    round trips (get, claim, put)."""
    cache = PageCache(store)
    cache.engines.observe("http://bench", "bench-engine")
    document = cache.document(Policy("bench"), {}, False, False, None, "pdf")
    digests, rounds = [], []
    for data in chunks:
        began = time.perf_counter()
        assert pdf_chunk_digest(data)
        digests.append(time.perf_counter() - began)
        entry = document.lookup(data, "pdf")  # digest again + get + claim
        entry.finish({"ocrResults": [{"prunedResult": {"rec_texts": ["x" * 200]}}],
                      "dataInfo": {"type": "pdf"}}, "bench-engine", "http://bench")
        rounds.append(time.perf_counter() - began - 2 * digests[-1])
    cache.close()
    return {"store": store_name, "pages": len(chunks), **{
        key: round(statistics.median(values) * 1000, 3) for key, values in (
            ("digestMs", digests), ("storeMs", rounds),
            ("missMs", [d + r for d, r in zip(digests, rounds)]))}}


def measure() -> dict[str, Any]:
    workers = report.knob("BENCH_CACHE_WORKERS", 2)
    batch = report.knob("BENCH_CACHE_BATCH", 200, 40)
    fleets = [fleet_runs(engine, workers, batch)
              for engine in report.names("BENCH_CACHE_ENGINES", "sim,real")]
    # a miss's cost on 60 text pages, on both stores (redis-server is part of `make install`)
    chunks = one_page_pdfs(documents.labelled_pdf(60, seed=int(time.time()) % 1000), 60)
    with tempfile.TemporaryDirectory(prefix="bench-cache-miss-") as tmp:
        misses = [miss_cost("SQLite", SqliteCacheStore(f"{tmp}/miss.sqlite3", 1 << 28, 3600),
                            chunks)]
        redis = redis_process(port := free_port(), Path(tmp, "redis"), Path(tmp, "redis.log"))
        with local_fleet.running([redis], 30):
            misses.append(miss_cost("Redis on loopback", RedisCacheStore(
                f"redis://127.0.0.1:{port}/0", 1 << 28, 3600,
                prefix=f"bench-{uuid.uuid4().hex}:"), chunks))
    for miss in misses:
        miss["shareOfPage"] = {f["engine"]: round(miss["missMs"] / f["enginePageMs"], 4)
                               for f in fleets}
    return {**report.stamp([e for f in fleets for e in f["engines"]]), "fleets": fleets,
            "miss": misses}


def table(result: dict[str, Any]) -> str:
    fleets = result["fleets"]
    runs = [[label.format(batch=fleets[0]["batchPages"])]
            + [cell for f in fleets for run in [f["runs"][name]]
               for cell in (f"{run['seconds']:.2f} s", run["pagesRead"], run["cachedPages"])]
            for name, (label, *_) in RUNS.items()]
    misses = [[m["store"], *(f"{m[key]:.2f} ms" for key in ("digestMs", "storeMs", "missMs")),
               *(f"{100 * m['shareOfPage'][f['engine']]:.2f} %" for f in fleets)]
              for m in result["miss"]]
    engines = "; ".join(
        f"{f['engine']}: {f['workers']} workers, "
        + (f"{report.engine_label(f['engines'])}, " if f["engine"] != "sim" else "")
        + f"{f['enginePageMs']:g} ms of engine time per page" for f in fleets)
    return "\n".join([
        report.markdown(["run"] + [f"{f['engine']}: {column}" for f in fleets
                                   for column in ("time", "pages read", "from the cache")], runs),
        "", report.markdown(["store", "digest", "store round trips", "miss"]
                            + [f"share of a {f['engine']} page" for f in fleets], misses),
        f"\nEngines: {engines}. {report.measured(result)}."])


def wrong_answers(result: dict[str, Any]) -> int:
    """Runs whose pages read and pages from the cache are not what the cache must give."""
    return sum([fleet["runs"][name]["pagesRead"], fleet["runs"][name]["cachedPages"]]
               != [fleet["batchPages"] if want == "batch" else want for want in wants]
               for fleet in result["fleets"] for name, (_, *wants) in RUNS.items())


def rows(result: dict[str, Any]) -> list[list[Any]]:
    made = []
    for f in result["fleets"]:
        s = {name: f"{run['seconds']:.2f}" for name, run in f["runs"].items()}
        made += [[f"cache ({f['engine']}): 40-page PDF of 4 pages, uncached/cold/warm",
                  f"{s['pdf40_of_4_uncached']}/{s['pdf40_of_4_cold']}/{s['pdf40_of_4_warm']} s",
                  "4 pages read cold, 0 warm", "info"],
                 [f"cache ({f['engine']}): {f['batchPages']}-page batch, re-run",
                  f"{s['batch_first']} -> {s['batch_rerun']} s", "0 pages read", "info"]]
    return made + [[f"cache miss cost ({m['store']})", f"{m['missMs']:.2f} ms/page",
                    "(reported)", "info"] for m in result["miss"]]


if __name__ == "__main__":
    sys.exit(report.main(sys.modules[__name__]))
