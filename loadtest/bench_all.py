"""`make bench`: every benchmark, one summary table, JSON and a PNG plot under bench/results/.

1. fleet scaling, sim engine, N = 1..16 replicas behind the gateway (loadtest/bench_scaling.py)
   -> scaling.json, scaling.png
1b. flow control under overload: 8 long PDFs + a stream of images, 10x burst, sim engine
   (loadtest/bench_overload.py) -> overload.json
2. real engine, 1 vs 2 workers x 1 thread, and HTTP vs in-process serving overhead, dense A4
   pages (loadtest/bench_engine.py) -> engine.json
3. worker RSS over a 2,000-request soak (loadtest/bench_soak.py) -> soak.json
4. worker memory on large varied pages: steady and peak RSS per page count
   (loadtest/bench_memory.py) -> memory.json
5. batching on/off (loadtest/bench_batching.py) -> batching.json
6. the ocrfleet batch client, 200 pages through 2 real workers vs their capacity
   (loadtest/bench_batch.py) -> batch_client.json
7. side by side with PaddleX's official serving (loadtest/bench_paddlex.py) -> paddlex.json;
   skipped with the reason when its venv (bench/paddlex-venv) cannot be built
The summary goes to summary.json. About 40 minutes on 2 cores (plus building the PaddleX venv
once); BENCH_QUICK=1 shortens every part, BENCH_SKIP=batching,memory,soak,engine,overload,
scaling,batch-client,paddlex leaves parts out. Each part's own knobs are in its module
docstring.

Exit status 0 when every part ran and every answer was right; goals missed show as FAIL in the
table (they are measurements, not errors)."""

from __future__ import annotations

import os
import sys
import time
import traceback
from typing import Any, Callable

from loadtest import (bench_batch, bench_batching, bench_engine, bench_memory, bench_overload,
                      bench_paddlex, bench_scaling, bench_soak, figures, report)


def quick() -> bool:
    return os.environ.get("BENCH_QUICK", "") not in ("", "0")


def scaling_rows(scaling: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for (n, eff_ok, lat_ok), pps, eff, goal, latency, latency_goal in zip(
            bench_scaling.goals_met(scaling), scaling["pages_per_s"], scaling["efficiency"],
            scaling["efficiency_goal"], scaling["pdf_latency_s"], scaling["pdf_latency_goal_s"]):
        rows.append([f"scaling N={n}: pages/s, efficiency", f"{pps:.2f} pages/s, {eff:.3f}",
                     f">= {goal:.2f}" if goal else "(base)", figures.verdict(eff_ok)])
        rows.append([f"scaling N={n}: {scaling['pdf_pages']}-page PDF alone",
                     f"{latency:.2f} s" if latency else "failed",
                     f"<= {latency_goal:.2f} s", figures.verdict(lat_ok)])
    return rows


def run_scaling() -> tuple[dict[str, Any], list[list[Any]]]:
    result = bench_scaling.run(bench_scaling.ScalingSettings.from_env())
    report.write_json("scaling.json", result)
    if 1 in result["replicas"] and None not in result["pdf_latency_s"]:
        report.plot_scaling(result, report.results_dir() / "scaling.png")
    print(bench_scaling.scaling_table(result), flush=True)
    return result, scaling_rows(result)


def run_engine() -> tuple[dict[str, Any], list[list[Any]]]:
    pages = int(os.environ.get("BENCH_DENSE_PAGES") or (4 if quick() else 8))
    tries = int(os.environ.get("BENCH_QUIET_TRIES") or (1 if quick() else 2))
    rounds = int(os.environ.get("BENCH_ENGINE_ROUNDS") or (1 if quick() else 2))
    result = bench_engine.run(pages, report.results_dir() / "logs" / "engine", tries, rounds)
    report.write_json("engine.json", result)
    return result, bench_engine.rows(result)


def run_soak() -> tuple[dict[str, Any], list[list[Any]]]:
    total = int(os.environ.get("BENCH_SOAK_REQUESTS") or (600 if quick() else 2000))
    baseline = int(os.environ.get("BENCH_SOAK_BASELINE") or 200)
    result = bench_soak.run(total, baseline, report.results_dir() / "logs" / "soak")
    report.write_json("soak.json", result)
    return result, bench_soak.rows(result)


def run_memory() -> tuple[dict[str, Any], list[list[Any]]]:
    pages = int(os.environ.get("BENCH_MEMORY_PAGES") or (60 if quick() else 100))
    reference = os.environ.get("BENCH_MEMORY_REFERENCE", "0" if quick() else "1") == "1"
    result = bench_memory.run(pages, report.results_dir() / "logs" / "memory", reference)
    report.write_json("memory.json", result)
    return result, bench_memory.rows(result)


def run_batching() -> tuple[dict[str, Any], list[list[Any]]]:
    total = int(os.environ.get("BENCH_BATCH_REQUESTS") or (100 if quick() else 300))
    result = bench_batching.run(total, report.results_dir() / "logs" / "batching")
    report.write_json("batching.json", result)
    return result, bench_batching.rows(result)


def run_overload() -> tuple[dict[str, Any], list[list[Any]]]:
    result = bench_overload.run(bench_overload.OverloadSettings.from_env())
    report.write_json("overload.json", result)
    return result, bench_overload.goals(result)


def run_batch_client() -> tuple[dict[str, Any], list[list[Any]]]:
    pages, doc_pages, concurrency = bench_batch.settings()
    result = bench_batch.run(pages, doc_pages, concurrency,
                             report.results_dir() / "logs" / "batch-client")
    report.write_json("batch_client.json", result)
    return result, bench_batch.rows(result)


def run_paddlex() -> tuple[dict[str, Any], list[list[Any]]]:
    pages = int(os.environ.get("BENCH_PADDLEX_PAGES") or (4 if quick() else 8))
    result = bench_paddlex.run_or_skip(images_1=pages, images_4=2 * pages,
                                       pdf_pages=8 if quick() else 16)
    report.write_json("paddlex.json", result)
    return result, bench_paddlex.rows(result)


PARTS: dict[str, Callable[[], tuple[dict[str, Any], list[list[Any]]]]] = {
    "scaling": run_scaling, "overload": run_overload, "engine": run_engine, "soak": run_soak,
    "memory": run_memory, "batching": run_batching, "batch-client": run_batch_client,
    "paddlex": run_paddlex}


def wrong_answers(name: str, result: dict[str, Any]) -> int:
    if name == "scaling":
        return sum(f["failures"] + len(f["pdf_failures"]) for f in result["fleets"])
    if name == "engine":
        return result["http_1_worker"]["failures"] + result["http_2_workers"]["failures"]
    if name == "overload":
        return bench_overload.wrong_answers(result)
    if name == "batching":
        return sum(s["failures"] for s in result["settings"].values())
    if name == "paddlex":
        return result.get("failures", 0)
    return result.get("failures", 0)


def main() -> int:
    skip = {part.strip() for part in os.environ.get("BENCH_SKIP", "").split(",") if part.strip()}
    rows: list[list[Any]] = []
    summary: dict[str, Any] = {"parts": {}, **report.stamp()}
    broken = False
    started = time.monotonic()
    for name, part in PARTS.items():
        if name in skip:
            continue
        print(f"== {name} ==", file=sys.stderr, flush=True)
        part_started = time.monotonic()
        try:
            result, part_rows = part()
        except Exception as exc:  # one broken part must not hide the others' figures
            traceback.print_exc()
            rows.append([name, f"ERROR: {type(exc).__name__}: {exc}"[:90], "-", "ERROR"])
            summary["parts"][name] = {"error": repr(exc)}
            broken = True
            continue
        failures = wrong_answers(name, result)
        if failures:
            rows.append([f"{name}: wrong answers or errors", str(failures), "0", "FAIL"])
            broken = True
        rows.extend(part_rows)
        summary["parts"][name] = {"rows": part_rows, "wrong_answers": failures,
                                  "seconds": round(time.monotonic() - part_started, 1)}
    summary["rows"] = rows
    summary["seconds"] = round(time.monotonic() - started, 1)
    path = report.write_json("summary.json", summary)
    print()
    print(f"ocrfleet benchmarks ({report.machine()['cpus']} CPUs, "
          f"{report.machine()['cpu_model'] or 'CPU'}, no accelerator; "
          f"{summary['seconds']:.0f} s{', BENCH_QUICK' if quick() else ''})")
    print(report.table(["benchmark", "measured", "goal", "verdict"], rows))
    print(f"results: {path.parent}/ (summary.json, scaling.json, scaling.png, engine.json, "
          "overload.json, soak.json, memory.json, batching.json, batch_client.json, "
          "paddlex.json, logs/)")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
