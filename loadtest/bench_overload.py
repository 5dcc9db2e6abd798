"""`make bench-overload`: does the fleet queue and share under load instead of failing?
Sim workers (200 ms per page, one process each) behind the gateway, through nginx (the
gateway's one-URL mode) and with the gateway balancing the replica list itself.

1. The mix: 8 long PDFs (40 pages each) sent at once, plus a single-image request every
   0.5 s for the whole run. Goals: every document 200 with every page in order; pages/s
   >= 0.95 x the fleet's capacity (N x 5 pages/s); the single images' p95 <= 2.5 s.
   With 2 workers through nginx and through the replica list, then 4 and 8 workers.
2. 10x overload (2 workers): many more long PDFs at once than the gateway's queue holds
   (GATEWAY_QUEUE_PAGES made small so the run stays short). Goals: the excess is answered
   429 at once (its latency is reported), no admitted document fails, and the gateway's
   RSS stays bounded (peak reported).

Writes bench/results/overload.json and prints a table. Knobs (environment): BENCH_QUICK=1
(4 documents of 20 pages, no 8-worker fleet), BENCH_SIM_PAGE_MS (200), BENCH_OVERLOAD_DOCS
(8), BENCH_OVERLOAD_PAGES (40), BENCH_OVERLOAD_FLEETS ("nginx:2,list:2,list:4,list:8"),
RESULTS_DIR (bench/results)."""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from deploy.nginx import render as nginx
from loadtest import local_fleet, report
from loadtest.loadgen import images_every, p95, send
from loadtest.payloads import labelled_pdf_payload, small_image_payloads
from loadtest.procstats import PeakRss
from scripts.fleet import ManagedProcess

FILE = "overload.json"


@dataclass
class OverloadSettings:
    page_ms: float = 200.0
    docs: int = 8
    pages: int = 40
    image_every_s: float = 0.5
    fleets: list[tuple[str, int]] = field(default_factory=lambda: [
        ("nginx", 2), ("list", 2), ("list", 4), ("list", 8)])
    overload_factor: int = 10
    overload_queue_pages: int = 80  # per gateway process (2 processes)

    @classmethod
    def from_env(cls) -> "OverloadSettings":
        env = os.environ
        settings = cls(docs=4, pages=20, fleets=[("nginx", 2), ("list", 2), ("list", 4)]) \
            if report.quick() else cls()
        settings.page_ms = float(env.get("BENCH_SIM_PAGE_MS") or settings.page_ms)
        settings.docs = int(env.get("BENCH_OVERLOAD_DOCS") or settings.docs)
        settings.pages = int(env.get("BENCH_OVERLOAD_PAGES") or settings.pages)
        if env.get("BENCH_OVERLOAD_FLEETS"):
            settings.fleets = [(mode, int(n)) for mode, n in
                               (part.split(":") for part in env["BENCH_OVERLOAD_FLEETS"].split(","))]
        return settings


@contextlib.contextmanager
def fleet(mode: str, count: int, page_ms: float, log_dir: Path,
          gateway_env: dict[str, str] | None = None
          ) -> Iterator[tuple[ManagedProcess, list[dict[str, str]]]]:
    """`count` sim workers and a gateway in front, through nginx or balancing itself; the
    gateway and the engines the workers report."""
    with local_fleet.Fleet(log_dir / f"{mode}{count}", page_ms, count) as sims, \
            sims.gateways(mode, 1, **(gateway_env or {})) as (gateway,):
        yield gateway, report.engine_info([local_fleet.url_of(w) for w in sims.workers])


def gateway_url(gateway: ManagedProcess) -> str:
    return local_fleet.url_of(gateway) + "/ocr"


def run_mix(mode: str, count: int, settings: OverloadSettings, log_dir: Path) -> dict[str, Any]:
    pdf = labelled_pdf_payload(settings.pages, seed=count)
    with fleet(mode, count, settings.page_ms, log_dir) as (gateway, engines):
        url = gateway_url(gateway)
        send(url, small_image_payloads(1)[0])  # warm connections
        stop = threading.Event()
        with ThreadPoolExecutor(1) as side:
            images = side.submit(images_every, url, settings.image_every_s, stop)
            started = time.perf_counter()
            with ThreadPoolExecutor(settings.docs) as pool:
                docs = list(pool.map(lambda _: send(url, pdf), range(settings.docs)))
            wall = time.perf_counter() - started
            stop.set()
            image_results = images.result()
    image_pages = sum(1 for latency, ok in image_results if ok and latency <= wall)
    pages = sum(settings.pages for status, _, problem in docs if status == 200 and not problem)
    capacity = count * 1000.0 / settings.page_ms
    pages_per_s = (pages + image_pages) / wall
    latencies = [latency for latency, ok in image_results if ok]
    return {
        "mode": mode, "workers": count, "engines": engines, "documents": settings.docs,
        "pages": settings.pages,
        "documents_ok": sum(1 for status, _, problem in docs if status == 200 and not problem),
        "document_errors": [problem or status for status, _, problem in docs
                            if status != 200 or problem][:5],
        "wall_s": round(wall, 2), "pages_per_s": round(pages_per_s, 2),
        "capacity_pages_per_s": capacity, "ratio": round(pages_per_s / capacity, 3),
        "images": len(image_results), "images_ok": sum(ok for _, ok in image_results),
        "image_p95_s": round(p95(latencies), 3) if latencies else None,
        "image_median_s": round(statistics.median(latencies), 3) if latencies else None,
    }


def run_overload(settings: OverloadSettings, log_dir: Path) -> dict[str, Any]:
    """10x more pages at once than the gateway's queue holds."""
    queue_pages = settings.overload_queue_pages
    documents = max(1, settings.overload_factor * 2 * queue_pages // settings.pages)
    pdf = labelled_pdf_payload(settings.pages, seed=7)
    env = {"GATEWAY_QUEUE_PAGES": str(queue_pages)}
    with fleet("list", 2, settings.page_ms, log_dir / "overload", env) as (gateway, _):
        url = gateway_url(gateway)
        with PeakRss(gateway.pid, every_s=0.1) as peak_rss, \
                ThreadPoolExecutor(documents) as pool:
            results = list(pool.map(lambda _: send(url, pdf), range(documents)))
    refused = [seconds for status, seconds, _ in results if status == 429]
    admitted = [(status, problem) for status, _, problem in results if status != 429]
    return {
        "documents": documents, "pages_each": settings.pages,
        "queue_pages_per_process": queue_pages, "gateway_processes": 2,
        "refused_429": len(refused),
        "refused_latency_max_s": round(max(refused), 3) if refused else None,
        "admitted": len(admitted),
        "admitted_failed": sum(1 for status, problem in admitted if status != 200 or problem),
        "gateway_peak_rss_mib": round(peak_rss.peak / 1024, 1),
    }


def run(settings: OverloadSettings) -> dict[str, Any]:
    log_dir = report.log_dir("overload")
    mixes = []
    for mode, count in settings.fleets:
        if mode == "nginx" and nginx.find_nginx() is None:
            print("skipping the nginx fleet: nginx is not installed", file=sys.stderr)
            continue
        mixes.append(run_mix(mode, count, settings, log_dir))
        print(f"overload mix {mode} x{count}: {mixes[-1]}", file=sys.stderr, flush=True)
    engines = [e for mix in mixes for e in mix.pop("engines")]
    return {"engine": report.engine_label(engines), "service_ms": settings.page_ms,
            "mix": mixes, "overload": run_overload(settings, log_dir), **report.stamp(engines)}


def goals(result: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for mix in result["mix"]:
        name = f"overload mix {mix['mode']} x{mix['workers']}"
        all_ok = mix["documents_ok"] == mix["documents"] and mix["images_ok"] == mix["images"]
        rows.append([f"{name}: documents, images right", f"{mix['documents_ok']}/"
                     f"{mix['documents']}, {mix['images_ok']}/{mix['images']}", "all",
                     "PASS" if all_ok else "FAIL"])
        rows.append([f"{name}: pages/s vs capacity", f"{mix['pages_per_s']:.2f} "
                     f"({mix['ratio']:.3f})", ">= 0.95", "PASS" if mix["ratio"] >= 0.95 else "FAIL"])
        p = mix["image_p95_s"]
        rows.append([f"{name}: single image p95", f"{p} s", "<= 2.5 s",
                     "PASS" if p is not None and p <= 2.5 else "FAIL"])
    over = result.get("overload")
    if over:
        rows.append(["10x overload: refused 429 / admitted failed",
                     f"{over['refused_429']} (max {over['refused_latency_max_s']} s) / "
                     f"{over['admitted_failed']} of {over['admitted']}", "429 at once, 0 failed",
                     "PASS" if over["refused_429"] and not over["admitted_failed"] else "FAIL"])
        rows.append(["10x overload: gateway peak RSS", f"{over['gateway_peak_rss_mib']} MiB",
                     "(reported)", ""])
    return rows


def wrong_answers(result: dict[str, Any]) -> int:
    mixes = sum(m["documents"] - m["documents_ok"] + m["images"] - m["images_ok"]
                for m in result["mix"])
    return mixes + result["overload"]["admitted_failed"]


def measure() -> dict[str, Any]:
    return run(OverloadSettings.from_env())


rows = goals


def table(result: dict[str, Any]) -> str:
    return report.table(["figure", "value", "goal", "verdict"], goals(result))


if __name__ == "__main__":
    sys.exit(report.main(sys.modules[__name__]))
