"""Does batching pages of concurrent requests help here? One real-engine worker (1 thread),
OCR_MAX_BATCH=4 with OCR_BATCH_WAIT_MS=5 vs 1, 4 clients sending small text images: pages/s and
median latency of each. No goal: the figure decides the default. Knob BENCH_BATCH_REQUESTS."""

import sys

from loadtest import local_fleet, report
from loadtest.loadgen import http_rate, run_closed_loop
from loadtest.payloads import small_image_payloads

FILE = "batching.json"
CLIENTS = 4
SETTINGS = {"batch 1": {"OCR_MAX_BATCH": "1", "OCR_BATCH_WAIT_MS": "0"},
            "batch 4, wait 5 ms": {"OCR_MAX_BATCH": "4", "OCR_BATCH_WAIT_MS": "5"}}


def measure() -> dict:
    payloads, settings, engines = small_image_payloads(16, seed=500), {}, []
    for name, extra in SETTINGS.items():
        with local_fleet.workers(1, local_fleet.real_worker_env(1, **extra),
                                 report.log_dir("batching"),
                                 name=name.split(",")[0].replace(" ", "")) as pool:
            engines += report.engine_info([local_fleet.url_of(pool[0])])
            run_closed_loop(local_fleet.url_of(pool[0]), payloads, CLIENTS,
                            total_requests=2 * CLIENTS)  # warm-up
            settings[name] = {"env": extra, **http_rate(
                pool, report.knob("BENCH_BATCH_REQUESTS", 300, 100), payloads, CLIENTS)}
    one, four = settings.values()
    return {"engine": report.engine_label(engines), "clients": CLIENTS,
            "document": "small text images", "settings": settings,
            "speedup": four["pages_per_s"] / one["pages_per_s"],
            "failures": one["failures"] + four["failures"], **report.stamp(engines)}


def rows(result: dict) -> list[list]:
    one, four = result["settings"].values()
    return [[f"batching: max batch 4 (5 ms wait) vs 1, {result['clients']} clients, small images",
             f"{four['pages_per_s']:.1f} vs {one['pages_per_s']:.1f} pages/s = "
             f"{result['speedup']:.2f}x (p50 {four['latency_p50_s'] * 1000:.0f} vs "
             f"{one['latency_p50_s'] * 1000:.0f} ms)", "(informative)", "-"]]


if __name__ == "__main__":
    sys.exit(report.main(sys.modules[__name__]))
