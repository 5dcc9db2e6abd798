"""Does batching pages from concurrent requests help on this machine? One real-engine worker
(1 thread) with OCR_MAX_BATCH=4, OCR_BATCH_WAIT_MS=5 vs OCR_MAX_BATCH=1, 4 clients sending
small text images: pages/s and median latency of each. No goal: the figure decides the default.
Writes batching.json; knob BENCH_BATCH_REQUESTS (per setting)."""

import statistics
import sys
from typing import Any

from loadtest import figures, local_fleet, report
from loadtest.loadgen import run_closed_loop
from loadtest.payloads import small_image_payloads

FILE = "batching.json"
CLIENTS = 4
SETTINGS = {"batch 1": {"OCR_MAX_BATCH": "1", "OCR_BATCH_WAIT_MS": "0"},
            "batch 4, wait 5 ms": {"OCR_MAX_BATCH": "4", "OCR_BATCH_WAIT_MS": "5"}}


def measure() -> dict[str, Any]:
    requests_total = report.knob("BENCH_BATCH_REQUESTS", 300, 100)
    payloads, settings, engines = small_image_payloads(16, seed=500), {}, []
    for name, extra in SETTINGS.items():
        with local_fleet.workers(1, local_fleet.real_worker_env(1, **extra),
                                 report.log_dir("batching"),
                                 name=name.split(",")[0].replace(" ", "")) as (worker,):
            url = local_fleet.url_of(worker)
            engines += report.engine_info([url])
            run_closed_loop(url, payloads, CLIENTS, total_requests=2 * CLIENTS)  # warm-up
            load = run_closed_loop(url, payloads, CLIENTS, total_requests=requests_total)
        done = [c for c in load.completions if c.ok]
        settings[name] = {"env": extra, "answered": load.ok_count, "failures": load.failure_count,
                          "pages_per_s": figures.rate_from_completions([c.finished for c in done]),
                          "latency_p50_s": statistics.median(c.finished - c.started for c in done)}
    first, second = settings.values()
    return {"engine": report.engine_label(engines), "clients": CLIENTS,
            "document": "small text images", "settings": settings,
            "speedup": second["pages_per_s"] / first["pages_per_s"], **report.stamp(engines)}


def rows(result: dict[str, Any]) -> list[list[Any]]:
    one, four = result["settings"].values()
    return [[f"batching: max batch 4 (5 ms wait) vs 1, {result['clients']} clients, small images",
             f"{four['pages_per_s']:.1f} vs {one['pages_per_s']:.1f} pages/s = "
             f"{result['speedup']:.2f}x (p50 {four['latency_p50_s'] * 1000:.0f} vs "
             f"{one['latency_p50_s'] * 1000:.0f} ms)", "(informative)", "-"]]


def wrong_answers(result: dict[str, Any]) -> int:
    return sum(s["failures"] for s in result["settings"].values())


if __name__ == "__main__":
    sys.exit(report.main(sys.modules[__name__]))
