"""`make bench-overload`: does the fleet queue and share under load instead of failing? The
mix (long PDFs sent at once, a single image every 0.5 s) on sim workers through nginx and the
replica list (bench_fleet.run_shapes, one gateway), then a 10x burst against a small queue
(docs/benchmarks.md, "Flow control under overload"). Writes overload.json; knobs in
loadtest/README.md."""

import sys
from typing import Any

from loadtest import bench_fleet, local_fleet, report
from loadtest.figures import verdict
from loadtest.loadgen import at_once, send
from loadtest.payloads import labelled_pdf_payload
from loadtest.procstats import PeakRss

FILE = "overload.json"
RENAMED = {"replicas": "workers", "makespan_s": "wall_s", "efficiency_makespan": "ratio"}
MIX = ["mode", "documents", "documents_ok", "document_errors", "pages_per_s", "images",
       "images_ok", "capacity_pages_per_s", "image_p95_s", "image_median_s", *RENAMED]
OverloadSettings = report.settings("OverloadSettings", {
    "page_ms": (200.0, "BENCH_SIM_PAGE_MS"), "docs": (8, "BENCH_OVERLOAD_DOCS"),
    "pages": (40, "BENCH_OVERLOAD_PAGES"), "image_every_s": (0.5, None),
    "fleets": ([("nginx", 2), ("list", 2), ("list", 4), ("list", 8)], "BENCH_OVERLOAD_FLEETS",
               bench_fleet.parse_shapes),
    "overload_factor": (10, None),
    "overload_queue_pages": (80, None)},  # per gateway process (2 processes)
    docs=4, pages=20, fleets=[("nginx", 2), ("list", 2), ("list", 4)])


def run(settings) -> dict[str, Any]:
    log_dir, page_ms = report.log_dir("overload"), settings.page_ms
    engines, shapes = bench_fleet.run_shapes(
        settings, log_dir, [(mode, n, 1) for mode, n in settings.fleets],
        lambda n: (page_ms, n * 1000.0 / page_ms))
    # the burst: 10x more pages at once than the gateway's queue holds
    queue_pages = settings.overload_queue_pages
    documents = max(1, settings.overload_factor * 2 * queue_pages // settings.pages)
    pdf = labelled_pdf_payload(settings.pages, seed=7)
    with local_fleet.Fleet(log_dir / "overload" / "list2", page_ms, 2) as sims, \
            sims.gateways("list", 1, GATEWAY_QUEUE_PAGES=str(queue_pages)) as (gateway,), \
            PeakRss(gateway.pid, every_s=0.1) as peak_rss:
        url = local_fleet.url_of(gateway) + "/ocr"
        results = at_once(lambda _: send(url, pdf), range(documents))
    refused = [seconds for status, seconds, _ in results if status == 429]
    admitted = [(status, problem) for status, _, problem in results if status != 429]
    return {"engine": report.engine_label(engines), "service_ms": page_ms,
            "mix": [{**{RENAMED.get(key, key): s[key] for key in MIX}, "pages": settings.pages}
                    for s in shapes],
            "overload": {
                "documents": documents, "pages_each": settings.pages,
                "queue_pages_per_process": queue_pages, "gateway_processes": 2,
                "refused_429": len(refused),
                "refused_latency_max_s": round(max(refused), 3) if refused else None,
                "admitted": len(admitted), "admitted_failed": sum(
                    1 for status, problem in admitted if status != 200 or problem),
                "gateway_peak_rss_mib": round(peak_rss.peak / 1024, 1)},
            **report.stamp(engines)}


def measure() -> dict[str, Any]:
    return run(OverloadSettings.from_env())


def rows(result: dict[str, Any]) -> list[list[Any]]:
    made, over = [], result["overload"]
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
    return made + [["10x overload: refused 429 / admitted failed",
                    f"{over['refused_429']} (max {over['refused_latency_max_s']} s) / "
                    f"{over['admitted_failed']} of {over['admitted']}", "429 at once, 0 failed",
                    verdict(bool(over["refused_429"]) and not over["admitted_failed"])],
                   ["10x overload: gateway peak RSS", f"{over['gateway_peak_rss_mib']} MiB",
                    "(reported)", ""]]


def wrong_answers(result: dict[str, Any]) -> int:
    return result["overload"]["admitted_failed"] + sum(
        m["documents"] - m["documents_ok"] + m["images"] - m["images_ok"] for m in result["mix"])


def table(result: dict[str, Any]) -> str:
    return f"{report.markdown(report.HEADERS, rows(result))}\n\n{report.measured(result)}."


if __name__ == "__main__":
    sys.exit(report.main(sys.modules[__name__]))
