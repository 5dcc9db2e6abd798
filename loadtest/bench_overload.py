"""`make bench-overload`: does the fleet queue and share under load instead of failing? The
mix (long PDFs sent at once, a single image every 0.5 s) on sim workers through nginx and the
replica list, then a 10x burst against a small queue (docs/benchmarks.md, "Flow control under
overload"). Writes overload.json; knobs in loadtest/README.md."""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deploy.nginx import render as nginx
from loadtest import local_fleet, report
from loadtest.figures import verdict
from loadtest.loadgen import at_once, documents_with_images, p95, send
from loadtest.payloads import labelled_pdf_payload
from loadtest.procstats import PeakRss

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
        return report.from_env(cls, {
            "page_ms": ("BENCH_SIM_PAGE_MS", float), "docs": ("BENCH_OVERLOAD_DOCS", int),
            "pages": ("BENCH_OVERLOAD_PAGES", int),
            "fleets": ("BENCH_OVERLOAD_FLEETS", lambda text: [
                (mode, int(n)) for mode, n in (part.split(":") for part in text.split(","))])},
            docs=4, pages=20, fleets=[("nginx", 2), ("list", 2), ("list", 4)])


def run_mix(mode: str, count: int, settings: OverloadSettings, log_dir: Path) -> dict[str, Any]:
    pdf = labelled_pdf_payload(settings.pages, seed=count)
    with local_fleet.Fleet(log_dir / f"{mode}{count}", settings.page_ms, count) as sims, \
            sims.gateways(mode, 1) as (gateway,):
        engines = report.engine_info([local_fleet.url_of(w) for w in sims.workers])
        docs, image_results, wall, _ = documents_with_images(
            [local_fleet.url_of(gateway) + "/ocr"], pdf, settings.docs, settings.image_every_s)
    right = [d for d in docs if d[0] == 200 and not d[2]]
    image_pages = sum(1 for latency, ok, _ in image_results if ok and latency <= wall)
    capacity = count * 1000.0 / settings.page_ms
    pages_per_s = (len(right) * settings.pages + image_pages) / wall
    latencies = [latency for latency, ok, _ in image_results if ok]
    return {
        "mode": mode, "workers": count, "engines": engines, "documents": settings.docs,
        "pages": settings.pages, "documents_ok": len(right),
        "document_errors": [d[2] or d[0] for d in docs if d not in right][:5],
        "wall_s": round(wall, 2), "pages_per_s": round(pages_per_s, 2),
        "capacity_pages_per_s": capacity, "ratio": round(pages_per_s / capacity, 3),
        "images": len(image_results), "images_ok": sum(ok for _, ok, _ in image_results),
        "image_p95_s": round(p95(latencies), 3) if latencies else None,
        "image_median_s": round(statistics.median(latencies), 3) if latencies else None,
    }


def run_overload(settings: OverloadSettings, log_dir: Path) -> dict[str, Any]:
    """10x more pages at once than the gateway's queue holds."""
    queue_pages = settings.overload_queue_pages
    documents = max(1, settings.overload_factor * 2 * queue_pages // settings.pages)
    pdf = labelled_pdf_payload(settings.pages, seed=7)
    with local_fleet.Fleet(log_dir / "overload" / "list2", settings.page_ms, 2) as sims, \
            sims.gateways("list", 1, GATEWAY_QUEUE_PAGES=str(queue_pages)) as (gateway,), \
            PeakRss(gateway.pid, every_s=0.1) as peak_rss:
        url = local_fleet.url_of(gateway) + "/ocr"
        results = at_once(lambda _: send(url, pdf), range(documents))
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
    log_dir, mixes = report.log_dir("overload"), []
    for mode, count in settings.fleets:
        if mode == "nginx" and nginx.find_nginx() is None:
            report.say("skipping the nginx fleet: nginx is not installed")
            continue
        mixes.append(run_mix(mode, count, settings, log_dir))
        report.say(f"overload mix {mode} x{count}: {mixes[-1]}")
    engines = [e for mix in mixes for e in mix.pop("engines")]
    return {"engine": report.engine_label(engines), "service_ms": settings.page_ms,
            "mix": mixes, "overload": run_overload(settings, log_dir), **report.stamp(engines)}


def measure() -> dict[str, Any]:
    return run(OverloadSettings.from_env())


def rows(result: dict[str, Any]) -> list[list[Any]]:
    made = []
    for mix in result["mix"]:
        name, p = f"overload mix {mix['mode']} x{mix['workers']}", mix["image_p95_s"]
        made += [[f"{name}: documents, images right", f"{mix['documents_ok']}/"
                  f"{mix['documents']}, {mix['images_ok']}/{mix['images']}", "all",
                  verdict(mix["documents_ok"] == mix["documents"]
                          and mix["images_ok"] == mix["images"])],
                 [f"{name}: pages/s vs capacity", f"{mix['pages_per_s']:.2f} "
                  f"({mix['ratio']:.3f})", ">= 0.95", verdict(mix["ratio"] >= 0.95)],
                 [f"{name}: single image p95", f"{p} s", "<= 2.5 s",
                  verdict(p is not None and p <= 2.5)]]
    over = result.get("overload")
    if over:
        made += [["10x overload: refused 429 / admitted failed",
                  f"{over['refused_429']} (max {over['refused_latency_max_s']} s) / "
                  f"{over['admitted_failed']} of {over['admitted']}", "429 at once, 0 failed",
                  verdict(bool(over["refused_429"]) and not over["admitted_failed"])],
                 ["10x overload: gateway peak RSS", f"{over['gateway_peak_rss_mib']} MiB",
                  "(reported)", ""]]
    return made


def wrong_answers(result: dict[str, Any]) -> int:
    return result["overload"]["admitted_failed"] + sum(
        m["documents"] - m["documents_ok"] + m["images"] - m["images_ok"] for m in result["mix"])


def table(result: dict[str, Any]) -> str:
    return f"{report.markdown(report.HEADERS, rows(result))}\n\n{report.measured(result)}."


if __name__ == "__main__":
    sys.exit(report.main(sys.modules[__name__]))
