"""`make bench-scaling`: does the fleet scale? Sim fleets of N = 1..16 replicas behind one
gateway: pages/s of a closed loop of single-page requests (3 x N in flight), then one 32-page
PDF sent alone (docs/benchmarks.md; loadtest/README.md, "Scaling", for the columns and knobs).
Writes scaling.json (DESIGN.md section 5's shape plus details) and scaling.png."""

from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from loadtest import figures, local_fleet, report
from loadtest.loadgen import post_checked, run_closed_loop
from loadtest.payloads import Payload, labelled_pdf_payload, small_image_payloads
from loadtest.procstats import ForeignLoad, group_cpu

FILE, PLOT = "scaling.json", "scaling.png"


@dataclass
class ScalingSettings:
    replicas: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    page_ms: float = 200.0
    warmup_s: float = 3.0
    measure_s: float = 12.0
    concurrency_per_replica: int = 3
    pdf_pages: int = 32
    pdf_repeats: int = 3

    @classmethod
    def from_env(cls) -> "ScalingSettings":
        return report.from_env(cls, {
            "replicas": ("BENCH_REPLICAS", report.int_list),
            "page_ms": ("BENCH_SIM_PAGE_MS", float), "warmup_s": ("BENCH_WARMUP_S", float),
            "measure_s": ("BENCH_MEASURE_S", float),
            "concurrency_per_replica": ("BENCH_CONCURRENCY_PER_REPLICA", int),
            "pdf_pages": ("BENCH_PDF_PAGES", int), "pdf_repeats": ("BENCH_PDF_REPEATS", int)},
            warmup_s=1.5, measure_s=5.0, pdf_repeats=1)


def measure_fleet(gateway, replicas: list, settings: ScalingSettings, payloads: list[Payload],
                  pdf: Payload) -> dict[str, Any]:
    """Throughput under saturation, then one PDF's latency alone, through this gateway."""
    url = local_fleet.url_of(gateway)
    concurrency = settings.concurrency_per_replica * len(replicas)
    gateway_cpu, worker_cpu = group_cpu([gateway]), group_cpu(replicas)
    with ForeignLoad([gateway, *replicas]) as foreign:
        load = run_closed_loop(url, payloads, concurrency, duration_s=settings.measure_s,
                               warmup_s=settings.warmup_s, timeout=60)
    gateway_cpu, worker_cpu = group_cpu([gateway]) - gateway_cpu, group_cpu(replicas) - worker_cpu
    latencies = load.latencies()
    pdf_times, pdf_failures = [], []
    pdf_gateway_cpu, pdf_worker_cpu = group_cpu([gateway]), group_cpu(replicas)
    with requests.Session() as session:
        for _ in range(settings.pdf_repeats):
            time.sleep(0.3)  # let the fleet go idle: the PDF is sent alone
            started = time.perf_counter()
            ok, why = post_checked(session, f"{url}/ocr", pdf, timeout=120)
            if ok:
                pdf_times.append(time.perf_counter() - started)
            else:
                pdf_failures.append(why)
    tries = max(1, settings.pdf_repeats)
    return {
        "replicas": len(replicas), "concurrency": concurrency,
        "pages_per_s": load.pages_per_s(), "pages_in_window": len(load.in_window()),
        "failures": load.failure_count, "failure_kinds": dict(load.failures.most_common(5)),
        "latency_p50_s": statistics.median(latencies) if latencies else None,
        "latency_p95_s": latencies[int(0.95 * (len(latencies) - 1))] if latencies else None,
        "client_cpu_per_s": load.client_cpu_s / load.wall_s if load.wall_s else 0.0,
        "gateway_cpu_per_s": gateway_cpu / load.wall_s,
        "workers_cpu_per_s": worker_cpu / load.wall_s,
        "other_load_cores": round(foreign.cores, 2),
        "pdf_latency_s": statistics.median(pdf_times) if pdf_times else None,
        "pdf_latency_tries_s": pdf_times, "pdf_failures": pdf_failures,
        # CPU seconds one PDF costs (gateway: parse, split, fan out, reassemble; workers:
        # parse, render each page at OCR_PDF_DPI, encode): on fewer cores than replicas,
        # shared cores that add to the PDF's latency.
        "pdf_gateway_cpu_s": round((group_cpu([gateway]) - pdf_gateway_cpu) / tries, 4),
        "pdf_workers_cpu_s": round((group_cpu(replicas) - pdf_worker_cpu) / tries, 4),
    }


def run(settings: ScalingSettings, log_dir: Path | None = None) -> dict[str, Any]:
    log_dir = log_dir or report.log_dir("scaling")
    payloads = small_image_payloads(8, seed=100)
    pdf = labelled_pdf_payload(settings.pdf_pages, seed=7)
    page_s, pages = settings.page_ms / 1000.0, settings.pdf_pages
    fleets = []
    env = local_fleet.sim_worker_env(settings.page_ms)
    with local_fleet.workers(max(settings.replicas), env, log_dir, name="sim") as pool:
        engines = report.engine_info([local_fleet.url_of(w) for w in pool])
        for n in settings.replicas:
            with local_fleet.gateway([local_fleet.url_of(w) for w in pool[:n]],
                                     log_dir) as gateway:
                fleets.append(measure_fleet(gateway, pool[:n], settings, payloads, pdf))
            report.say(f"  N={n:>2}: {fleets[-1]['pages_per_s']:.2f} pages/s, "
                       f"PDF {fleets[-1]['pdf_latency_s'] or float('nan'):.2f} s, "
                       f"failures {fleets[-1]['failures']}")
    replicas = [f["replicas"] for f in fleets]
    pps = [f["pages_per_s"] for f in fleets]
    eff = figures.efficiency(replicas, pps) if 1 in replicas else [None] * len(replicas)
    return {
        "engine": report.engine_label(engines), "service_ms": settings.page_ms,
        "replicas": replicas, "pages_per_s": [round(v, 3) for v in pps],
        "efficiency": [round(v, 4) if v is not None else None for v in eff],
        "pdf_pages": pages,
        "pdf_latency_s": [round(f["pdf_latency_s"], 3) if f["pdf_latency_s"] else None
                          for f in fleets],
        "pdf_latency_ideal_s": [figures.ideal_pdf_latency(pages, n, page_s) for n in replicas],
        "pdf_latency_goal_s": [round(figures.pdf_latency_goal(pages, n, page_s), 3)
                               for n in replicas],
        "efficiency_goal": [figures.efficiency_goal(n) for n in replicas],
        # the CPU one PDF costs spread over this machine's cores: time the fleet cannot avoid
        # where all replicas share a few cores (ideal + this is what this machine can show)
        "pdf_cpu_bound_s": [round((f["pdf_gateway_cpu_s"] + f["pdf_workers_cpu_s"])
                                  / (os.cpu_count() or 1), 3) for f in fleets],
        "settings": {"warmup_s": settings.warmup_s, "measure_s": settings.measure_s,
                     "concurrency_per_replica": settings.concurrency_per_replica,
                     "pdf_repeats": settings.pdf_repeats, "request": "single-page PNG image",
                     "gateway_env": {}},
        "fleets": fleets,
        **report.stamp(engines),
    }


def goals_met(scaling: dict[str, Any]) -> list[tuple[bool | None, bool | None]]:
    """(efficiency goal met, PDF latency goal met) per fleet size; None where no goal."""
    return [(None if goal is None or eff is None else eff >= goal,
             None if latency is None else latency <= latency_goal)
            for eff, goal, latency, latency_goal in zip(
                scaling["efficiency"], scaling["efficiency_goal"], scaling["pdf_latency_s"],
                scaling["pdf_latency_goal_s"])]


def _num(value: float | None) -> str:
    """An efficiency, or "n/a" when the run had no N = 1 to measure it against."""
    return "n/a" if value is None else f"{value:.3f}"


def scaling_table(scaling: dict[str, Any]) -> str:
    rows = []
    for i, (n, (eff_ok, lat_ok)) in enumerate(zip(scaling["replicas"], goals_met(scaling))):
        fleet, goal = scaling["fleets"][i], scaling["efficiency_goal"][i]
        rows.append([n, f"{scaling['pages_per_s'][i]:.2f}", _num(scaling["efficiency"][i]),
                     f">= {goal:.2f} {figures.verdict(eff_ok)}" if goal else "-",
                     scaling["pdf_latency_s"][i], scaling["pdf_latency_ideal_s"][i],
                     f"<= {scaling['pdf_latency_goal_s'][i]:.2f} {figures.verdict(lat_ok)}",
                     f"{fleet['pdf_gateway_cpu_s']:.2f} + {fleet['pdf_workers_cpu_s']:.2f}",
                     round(scaling["pdf_latency_ideal_s"][i] + scaling["pdf_cpu_bound_s"][i], 3),
                     fleet["failures"] + len(fleet["pdf_failures"])])
    title = (f"Fleet scaling: {scaling['engine']} engine, {scaling['service_ms']:g} ms/page, "
             f"one gateway on loopback; throughput with single-page requests, "
             f"{scaling['settings']['concurrency_per_replica']} x N in flight")
    return title + "\n" + report.table(
        ["N", "pages/s", "efficiency", "goal", f"{scaling['pdf_pages']}p PDF s", "ideal s",
         "goal", "PDF cpu s gw+workers", "ideal+cpu/cores", "failures"], rows)


def measure() -> dict[str, Any]:
    settings = ScalingSettings.from_env()
    report.say(f"scaling benchmark: replicas {settings.replicas}, {settings.page_ms:g} ms/page, "
               f"{settings.warmup_s:g} s warm-up + {settings.measure_s:g} s per fleet")
    return run(settings)


def plot(scaling: dict[str, Any], path: Path) -> None:
    if 1 in scaling["replicas"] and None not in scaling["pdf_latency_s"]:
        report.plot_scaling(scaling, path)


def rows(scaling: dict[str, Any]) -> list[list[Any]]:
    made = []
    for (eff_ok, lat_ok), n, pps, eff, goal, latency, latency_goal in zip(
            goals_met(scaling), scaling["replicas"], scaling["pages_per_s"],
            scaling["efficiency"], scaling["efficiency_goal"], scaling["pdf_latency_s"],
            scaling["pdf_latency_goal_s"]):
        made.append([f"scaling N={n}: pages/s, efficiency", f"{pps:.2f} pages/s, {_num(eff)}",
                     f">= {goal:.2f}" if goal else "(base)", figures.verdict(eff_ok)])
        made.append([f"scaling N={n}: {scaling['pdf_pages']}-page PDF alone",
                     f"{latency:.2f} s" if latency else "failed",
                     f"<= {latency_goal:.2f} s", figures.verdict(lat_ok)])
    return made


def wrong_answers(scaling: dict[str, Any]) -> int:
    return sum(f["failures"] + len(f["pdf_failures"]) for f in scaling["fleets"])


table = scaling_table

if __name__ == "__main__":
    sys.exit(report.main(sys.modules[__name__]))
