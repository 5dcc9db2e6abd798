"""`make bench-scaling`: does the fleet scale? Sim fleets of N = 1..16 replicas behind one
gateway: pages/s of a closed loop of single-page requests (3 x N in flight), then one 32-page
PDF sent alone (docs/benchmarks.md; loadtest/README.md, "Scaling", for the columns and knobs).
Writes scaling.json (DESIGN.md section 5's shape plus details) and scaling.png."""

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import requests

from loadtest import figures, local_fleet, report
from loadtest.loadgen import post_checked, run_closed_loop
from loadtest.payloads import Payload, labelled_pdf_payload, small_image_payloads
from loadtest.procstats import ForeignLoad

FILE, PLOT = "scaling.json", "scaling.png"


ScalingSettings = report.settings("ScalingSettings", {
    "replicas": ([1, 2, 4, 8, 16], "BENCH_REPLICAS", report.int_list),
    "page_ms": (200.0, "BENCH_SIM_PAGE_MS"), "warmup_s": (3.0, "BENCH_WARMUP_S"),
    "measure_s": (12.0, "BENCH_MEASURE_S"),
    "concurrency_per_replica": (3, "BENCH_CONCURRENCY_PER_REPLICA"),
    "pdf_pages": (32, "BENCH_PDF_PAGES"), "pdf_repeats": (3, "BENCH_PDF_REPEATS")},
    warmup_s=1.5, measure_s=5.0, pdf_repeats=1)


def measure_fleet(gateway, replicas: list, settings, payloads: list[Payload],
                  pdf: Payload) -> dict[str, Any]:
    """Throughput under saturation, then one PDF's latency alone, through this gateway."""
    url = local_fleet.url_of(gateway)
    concurrency = settings.concurrency_per_replica * len(replicas)
    with ForeignLoad([gateway, *replicas]) as foreign, ForeignLoad([gateway]) as gateway_cpu, \
            ForeignLoad(replicas) as workers_cpu:
        load = run_closed_loop(url, payloads, concurrency, duration_s=settings.measure_s,
                               warmup_s=settings.warmup_s, timeout=60)
    latencies, tries = load.latencies(), []
    with ForeignLoad([gateway]) as pdf_gateway, ForeignLoad(replicas) as pdf_workers, \
            requests.Session() as session:
        for _ in range(settings.pdf_repeats):
            time.sleep(0.3)  # let the fleet go idle: the PDF is sent alone
            started = time.perf_counter()
            tries.append((*post_checked(session, f"{url}/ocr", pdf, timeout=120),
                          time.perf_counter() - started))
    pdf_times = [seconds for ok, _, seconds in tries if ok]
    return {
        "replicas": len(replicas), "concurrency": concurrency,
        "pages_per_s": load.pages_per_s(), "pages_in_window": len(load.in_window()),
        "failures": load.failure_count, "failure_kinds": dict(load.failures.most_common(5)),
        "latency_p50_s": statistics.median(latencies) if latencies else None,
        "latency_p95_s": latencies[int(0.95 * (len(latencies) - 1))] if latencies else None,
        "client_cpu_per_s": load.client_cpu_s / load.wall_s if load.wall_s else 0.0,
        "gateway_cpu_per_s": gateway_cpu.cpu_s / load.wall_s,
        "workers_cpu_per_s": workers_cpu.cpu_s / load.wall_s,
        "other_load_cores": round(foreign.cores, 2),
        "pdf_latency_s": statistics.median(pdf_times) if pdf_times else None,
        "pdf_latency_tries_s": pdf_times, "pdf_failures": [why for ok, why, _ in tries if not ok],
        # CPU seconds one PDF costs the gateway (parse, split, fan out, reassemble) and the
        # workers (parse, render each page, encode): on fewer cores than replicas, they add up
        "pdf_gateway_cpu_s": round(pdf_gateway.cpu_s / max(1, settings.pdf_repeats), 4),
        "pdf_workers_cpu_s": round(pdf_workers.cpu_s / max(1, settings.pdf_repeats), 4)}


def run(settings, log_dir: Path | None = None) -> dict[str, Any]:
    log_dir, fleets = log_dir or report.log_dir("scaling"), []
    payloads = small_image_payloads(8, seed=100)
    pdf = labelled_pdf_payload(settings.pdf_pages, seed=7)
    with local_fleet.workers(max(settings.replicas), local_fleet.sim_worker_env(settings.page_ms),
                             log_dir, name="sim") as pool:
        engines = report.engine_info([local_fleet.url_of(w) for w in pool])
        for n in settings.replicas:
            with local_fleet.gateway([local_fleet.url_of(w) for w in pool[:n]],
                                     log_dir) as gateway:
                fleets.append(measure_fleet(gateway, pool[:n], settings, payloads, pdf))
            report.say(f"  N={n:>2}: {fleets[-1]['pages_per_s']:.2f} pages/s, "
                       f"PDF {fleets[-1]['pdf_latency_s'] or float('nan'):.2f} s, "
                       f"failures {fleets[-1]['failures']}")
    replicas, pps = [f["replicas"] for f in fleets], [f["pages_per_s"] for f in fleets]
    eff = figures.efficiency(replicas, pps) if 1 in replicas else [None] * len(replicas)
    page_s, pages = settings.page_ms / 1000.0, settings.pdf_pages
    return {
        "engine": report.engine_label(engines), "service_ms": settings.page_ms,
        "replicas": replicas, "pages_per_s": [round(v, 3) for v in pps],
        "efficiency": [round(v, 4) if v is not None else None for v in eff], "pdf_pages": pages,
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
        "fleets": fleets, **report.stamp(engines)}


def measure() -> dict[str, Any]:
    return run(ScalingSettings.from_env())


def per_n(result: dict[str, Any]):
    """(N, pages/s, efficiency, its goal, PDF latency, ideal, goal, PDF CPU / cores) per N."""
    return zip(*(result[key] for key in (
        "replicas", "pages_per_s", "efficiency", "efficiency_goal", "pdf_latency_s",
        "pdf_latency_ideal_s", "pdf_latency_goal_s", "pdf_cpu_bound_s")))


def rows(result: dict[str, Any]) -> list[list[Any]]:
    made = []
    for n, pps, eff, goal, latency, _, latency_goal, _ in per_n(result):
        eff_ok = None if goal is None or eff is None else eff >= goal
        made += [[f"scaling N={n}: pages/s, efficiency",
                  f"{pps:.2f} pages/s, " + ("n/a" if eff is None else f"{eff:.3f}"),
                  f">= {goal:.2f}" if goal else "(base)", figures.verdict(eff_ok)],
                 [f"scaling N={n}: {result['pdf_pages']}-page PDF alone",
                  f"{latency:.2f} s" if latency else "failed", f"<= {latency_goal:.2f} s",
                  figures.verdict(None if latency is None else latency <= latency_goal)]]
    return made


def wrong_answers(result: dict[str, Any]) -> int:
    return sum(f["failures"] + len(f["pdf_failures"]) for f in result["fleets"])


def table(result: dict[str, Any]) -> str:
    rows = [[n, f"{pps:.2f}", "-" if eff is None else f"{eff:.3f}",
             f">= {goal:.2f}" if goal else "(base)", f"{latency:.2f} s", f"{ideal:.2f} s",
             f"<= {latency_goal:.2f} s", f"{ideal + cpu:.2f} s"]
            for n, pps, eff, goal, latency, ideal, latency_goal, cpu in per_n(result)]
    return "\n".join([
        report.markdown(["replicas", "pages/s", "efficiency", "goal",
                         f"one {result['pdf_pages']}-page PDF alone", "ideal", "goal",
                         "ideal + the PDF's CPU over the cores"], rows),
        f"\nEngine: {result['engine']}. {report.measured(result)}."])


def plot(result: dict[str, Any], path: Path) -> Path | None:
    """Against N (log scales): pages/s with the ideal N x pages/s(1), efficiency with its goals,
    and one PDF's latency alone with its ideal and goal. None without N = 1 or a PDF latency."""
    n, pages = result["replicas"], result["pdf_pages"]
    if 1 not in n or None in result["pdf_latency_s"]:
        return None
    base, goal_n = result["pages_per_s"][n.index(1)], [m for m in n if figures.efficiency_goal(m)]
    fig, axes = report.plot_row(f"ocrfleet scaling: {result['engine']}, one gateway, N replicas", {
        "pages/s (single-page requests)": [
            (n, [m * base for m in n], "k--", "ideal: N x pages/s(1)"),
            (n, result["pages_per_s"], "C0o-", "measured")],
        "efficiency = pages/s(N) / (N x pages/s(1))": [
            (n, [1.0] * len(n), "k--", "ideal: 1.0"),
            (goal_n, [figures.efficiency_goal(m) for m in goal_n], "rv", "goal (at least)"),
            (n, result["efficiency"], "C1s-", "measured")],
        f"seconds for one {pages}-page PDF sent alone": [
            (n, result["pdf_latency_ideal_s"], "k--",
             f"ideal: ({pages}/N) x {result['service_ms'] / 1000:g} s"),
            (n, result["pdf_latency_goal_s"], "r:", "goal: <= 1.15 x ideal"),
            (n, result["pdf_latency_s"], "C2o-", "measured")]})
    for axis in axes:
        axis.set_xscale("log", base=2)
        axis.set_xticks(n, [str(m) for m in n])
        axis.set(xlabel="replicas N", yscale="linear" if axis is axes[1] else "log")
    return report.save(fig, path)


if __name__ == "__main__":
    sys.exit(report.main(sys.modules[__name__]))
