"""Real-engine benchmarks (the workers' default engine), dense A4 pages at 150 DPI sent as PNG
straight to the workers: engine scaling (1 vs 2 workers x 1 thread, goal >= 1.8x on 2 cores)
and serving overhead (one worker's HTTP rate vs the engine in-process, inprocess_engine.py; goal
>= 0.97), in interleaved rounds, a disturbed run measured again (loadtest/README.md, "Real
engine", for the method and knobs). Writes engine.json."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

from loadtest import figures, local_fleet, report
from loadtest.loadgen import capacity, per_worker_rate
from loadtest.payloads import dense_page_payloads
from loadtest.procstats import ForeignLoad
from scripts.fleet import REPO_ROOT

FILE = "engine.json"


def http_rate(workers: list, pages_per_worker: int) -> dict[str, Any]:
    """Pages/s of these worker processes, each sent dense pages directly."""
    urls = [local_fleet.url_of(w) for w in workers]
    warm, load, foreign = capacity(workers, urls, dense_page_payloads(2), pages_per_worker)
    return {"workers": len(urls), "pages": load.ok_count, "pages_per_s": per_worker_rate(load),
            "failures": load.failure_count + warm.failure_count,
            "failure_kinds": dict(load.failures.most_common(3)),
            "other_load_cores": round(foreign.cores, 2)}


def inprocess(pages: int, engines: int = 1) -> dict[str, Any]:
    """`engines` in-process engines at once (inprocess_engine.py, each in a fresh process, 1
    thread), summed; two at once are what this machine gives two engines with no serving."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    command = [sys.executable, "-m", "loadtest.inprocess_engine", "--pages", str(pages)]
    with ForeignLoad() as foreign:
        processes = [subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True)
                     for _ in range(engines)]
        outputs = [process.communicate(timeout=900)[0] for process in processes]
    if any(process.returncode for process in processes):
        raise RuntimeError(f"{command} failed")
    # (model loading is inside the window: the figure shows other processes' load, roughly)
    runs = [json.loads(out.strip().splitlines()[-1]) for out in outputs]
    return {**(runs[0] if engines == 1 else {"runs": runs}),
            "pages_per_s": sum(r["pages_per_s"] for r in runs),
            "other_load_cores": round(foreign.cores, 2)}


QUIET_CORES = 0.15  # other processes' load above which a run is measured again


def least_disturbed(measure: Callable[[], dict[str, Any]], tries: int) -> dict[str, Any]:
    """Measure; while other processes loaded the machine (shared, 2 cores) and tries are left,
    measure again; keep the run they disturbed least. The choice looks only at the other load,
    never at the figure, so it cannot favour a goal."""
    runs = [measure()]
    while runs[-1].get("other_load_cores", 0.0) > QUIET_CORES and len(runs) < tries:
        report.say(f"  (other processes used {runs[-1]['other_load_cores']:.2f} cores: "
                   "measuring again)")
        runs.append(measure())
    best = min(runs, key=lambda run: run.get("other_load_cores", 0.0))
    return {**best, "tries": len(runs)}


def _say(label: str, result: dict[str, Any]) -> None:
    report.say(f"  {label}: {result['pages_per_s']:.3f} pages/s")


def run(pages_per_worker: int, log_dir: Path, tries: int = 2, rounds: int = 2
        ) -> dict[str, Any]:
    """Both figures, from interleaved rounds (in-process engine, 1 worker, 2 workers; then the
    in-process engine once more); finally two in-process engines at once, for reference."""
    inproc, rows = [], []
    with local_fleet.workers(2, local_fleet.real_worker_env(1), log_dir, name="real") as pool:
        engines = report.engine_info([local_fleet.url_of(w) for w in pool])
        for number in range(1, rounds + 1):
            inproc.append(least_disturbed(lambda: inprocess(pages_per_worker), tries))
            _say(f"round {number}: in-process engine", inproc[-1])
            one = least_disturbed(lambda: http_rate(pool[:1], pages_per_worker), tries)
            _say(f"round {number}: 1 worker over HTTP", one)
            two = least_disturbed(lambda: http_rate(pool, pages_per_worker), tries)
            _say(f"round {number}: 2 workers over HTTP", two)
            rows.append({"one": one, "two": two, "ratio": two["pages_per_s"] /
                         one["pages_per_s"]})
        inproc.append(least_disturbed(lambda: inprocess(pages_per_worker), tries))
        _say("in-process engine", inproc[-1])
    pair = least_disturbed(lambda: inprocess(pages_per_worker, engines=2), tries)
    _say("two in-process engines at once", pair)
    one_pps = statistics.mean([r["one"]["pages_per_s"] for r in rows])
    two_pps = statistics.mean([r["two"]["pages_per_s"] for r in rows])
    inproc_pps = statistics.mean([r["pages_per_s"] for r in inproc])
    return {
        "engine": report.engine_label(engines),
        "document": "dense A4 page, 150 DPI, PNG, visualize false",
        "threads_per_worker": 1,
        "pages_per_worker": pages_per_worker,
        "rounds": rows,
        "inprocess": {"pages_per_s": inproc_pps, "runs": inproc},
        "inprocess_pair": pair,
        "http_1_worker": {"pages_per_s": one_pps,
                          "failures": sum(r["one"]["failures"] for r in rows)},
        "http_2_workers": {"pages_per_s": two_pps,
                           "failures": sum(r["two"]["failures"] for r in rows)},
        "scaling_2_vs_1": statistics.mean([r["ratio"] for r in rows]),
        "scaling_goal": figures.ENGINE_SCALING_GOAL,
        "machine_scaling_2_vs_1": pair["pages_per_s"] / inproc_pps,
        "serving_ratio": one_pps / inproc_pps,
        "serving_goal": figures.SERVING_OVERHEAD_GOAL,
        **report.stamp(engines),
    }


def rows(result: dict[str, Any]) -> list[list[Any]]:
    scaling, serving = result["scaling_2_vs_1"], result["serving_ratio"]
    one, two, inproc = result["http_1_worker"], result["http_2_workers"], result["inprocess"]
    runs = [r[k] for r in result["rounds"] for k in ("one", "two")]
    per_round = ", ".join(f"{r['ratio']:.2f}x" for r in result["rounds"])
    return [
        ["real engine: 2 workers vs 1 (x1 thread), dense A4",
         f"{two['pages_per_s']:.3f} vs {one['pages_per_s']:.3f} pages/s = {scaling:.2f}x "
         f"(rounds {per_round}; 2 engines in-process {result['machine_scaling_2_vs_1']:.2f}x)"
         + report.noise(*runs),
         f">= {result['scaling_goal']}x", figures.verdict(scaling >= result["scaling_goal"])],
        ["serving overhead: HTTP / in-process, 1 thread",
         f"{one['pages_per_s']:.3f} / {inproc['pages_per_s']:.3f} pages/s = {serving:.3f}"
         + report.noise(*runs, *inproc["runs"]),
         f">= {result['serving_goal']}", figures.verdict(serving >= result["serving_goal"])],
    ]


def measure() -> dict[str, Any]:
    return run(report.knob("BENCH_DENSE_PAGES", 8, 4), report.log_dir("engine"),
               report.knob("BENCH_QUIET_TRIES", 2, 1), report.knob("BENCH_ENGINE_ROUNDS", 2, 1))


def wrong_answers(result: dict[str, Any]) -> int:
    return result["http_1_worker"]["failures"] + result["http_2_workers"]["failures"]


if __name__ == "__main__":
    sys.exit(report.main(sys.modules[__name__]))
