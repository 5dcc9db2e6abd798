"""Worker memory under a long run: one real-engine worker (1 thread) answers 2,000 small text
images (2 in flight); the RSS of its gunicorn worker process (the forked child that holds the
model) is sampled every 100 answers. Goal: growth from answer 200 to the end < 5 %. Writes
soak.json; knobs BENCH_SOAK_REQUESTS, BENCH_SOAK_BASELINE."""

import sys
from pathlib import Path
from typing import Any

from loadtest import figures, local_fleet, procstats, report
from loadtest.loadgen import Completion, worker_rss
from loadtest.payloads import small_image_payloads

FILE = "soak.json"


def run(requests_total: int, baseline_at: int, log_dir: Path, sample_every: int = 100,
        env: dict[str, str] | None = None) -> dict[str, Any]:
    samples: dict[int, int] = {}  # answers so far -> the forked worker's RSS (KiB)

    def sample(child: int, number: int, _done: Completion) -> None:
        if number % sample_every == 0 or number == baseline_at:
            samples[number] = procstats.rss_kib(child)

    ran = worker_rss(env or local_fleet.real_worker_env(1), small_image_payloads(16, seed=300),
                     requests_total, 2, 60, log_dir, "soak", sample)
    load, ordered = ran["load"], sorted(samples.items())
    base, end = samples.get(baseline_at) or ordered[0][1], ordered[-1][1]
    return {"engine": report.engine_label(ran["engines"]), "requests": requests_total,
            "answered": load.ok_count, "failures": load.failure_count,
            "failure_kinds": dict(load.failures.most_common(3)),
            "pages_per_s": load.ok_count / load.wall_s, "rss_kib_at_start": ran["start_kib"],
            "rss_kib_baseline": base, "baseline_at": baseline_at, "rss_kib_end": end,
            "rss_growth": figures.growth(base, end), "rss_growth_goal": figures.RSS_GROWTH_GOAL,
            "master_rss_kib": ran["master_kib"],
            "samples": [{"answered": n, "rss_kib": kib} for n, kib in ordered],
            **report.stamp(ran["engines"])}


def rows(result: dict[str, Any]) -> list[list[Any]]:
    return [[f"worker RSS, {result['requests']}-request soak (small images)",
             f"{result['rss_kib_baseline'] / 1024:.0f} MiB at {result['baseline_at']} -> "
             f"{result['rss_kib_end'] / 1024:.0f} MiB at {result['requests']} = "
             f"{result['rss_growth'] * 100:+.1f} %", f"< {result['rss_growth_goal'] * 100:.0f} %",
             figures.verdict(result["rss_growth"] < result["rss_growth_goal"]
                             and not result["failures"])]]


def measure() -> dict[str, Any]:
    return run(report.knob("BENCH_SOAK_REQUESTS", 2000, 600),
               report.knob("BENCH_SOAK_BASELINE", 200), report.log_dir("soak"))


if __name__ == "__main__":
    sys.exit(report.main(sys.modules[__name__]))
