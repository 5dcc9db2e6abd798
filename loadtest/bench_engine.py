"""Real engine, dense A4 pages (150 DPI PNG) sent straight to the workers: scaling (2 vs 1
workers x 1 thread, goal >= 1.8x) and serving overhead (one worker over HTTP vs the same engine
in-process, goal >= 0.97), in interleaved rounds, a disturbed run measured again
(loadtest/README.md, "Real engine"). `--inprocess PAGES [ENGINE]`: the in-process side."""

import base64
import json
import os
import statistics
import subprocess
import sys
import time

import cv2
import numpy as np

from loadtest import figures, local_fleet, report
from loadtest.loadgen import http_rate
from loadtest.payloads import dense_page_payloads
from loadtest.procstats import ForeignLoad
from scripts.fleet import REPO_ROOT
from services.ocr_worker.config import WorkerConfig
from services.ocr_worker.engine import create_engine

FILE = "engine.json"
QUIET_CORES = 0.15  # other processes' load above which a run is measured again


def engine_alone(pages: int, engine_name: str = "paddleocr") -> dict:
    """The worker's engine (its configuration, 1 thread) called directly, a page at a time, on
    the HTTP side's bytes decoded as the worker decodes them; an untimed warm-up first."""
    images = [cv2.imdecode(np.frombuffer(base64.b64decode(json.loads(p.body)["file"]), np.uint8),
                           cv2.IMREAD_COLOR) for p in dense_page_payloads(2)]
    engine = create_engine(WorkerConfig.from_env({**os.environ, "OCR_ENGINE": engine_name,
                                                  "OCR_THREADS": "1"}))
    engine.load()
    engine.predict([images[0]], {})[0].result_json()  # warm-up
    started = time.perf_counter()
    for index in range(pages):
        engine.predict([images[index % len(images)]], {})[0].result_json()
    seconds = time.perf_counter() - started
    return {"pages": pages, "seconds": seconds, "pages_per_s": pages / seconds, "threads": 1,
            "engine": engine.info}


def inprocess(pages: int, engines: int = 1) -> dict:
    """`engines` engine_alone() runs at once, each in a fresh process (its thread settings apply
    before any numeric library loads), summed; two show this machine's own 2-engine ceiling."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "loadtest.bench_engine", "--inprocess", str(pages)]
    with ForeignLoad() as foreign:  # (model loading included: other load, roughly)
        processes = [subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True)
                     for _ in range(engines)]
        outputs = [process.communicate(timeout=900)[0] for process in processes]
    if any(process.returncode for process in processes):
        raise RuntimeError(f"{command} failed")
    runs = [json.loads(out.strip().splitlines()[-1]) for out in outputs]
    return {**(runs[0] if engines == 1 else {"runs": runs}),
            "pages_per_s": sum(r["pages_per_s"] for r in runs),
            "other_load_cores": round(foreign.cores, 2)}


def least_disturbed(measure, tries: int) -> dict:
    """Measure; while other processes loaded the machine (shared, 2 cores) and tries are left,
    measure again; keep the run they disturbed least (never chosen by its figure)."""
    runs = [measure()]
    while runs[-1].get("other_load_cores", 0.0) > QUIET_CORES and len(runs) < tries:
        report.say(f"  (other processes used {runs[-1]['other_load_cores']:.2f} cores: again)")
        runs.append(measure())
    return {**min(runs, key=lambda run: run.get("other_load_cores", 0.0)), "tries": len(runs)}


def measure() -> dict:
    """Interleaved rounds (in-process engine, 1 worker, 2 workers), the in-process engine once
    more, then two in-process engines at once, for reference."""
    pages, tries = report.knob("BENCH_DENSE_PAGES", 8, 4), report.knob("BENCH_QUIET_TRIES", 2, 1)
    inproc, done = [], []
    with local_fleet.workers(2, local_fleet.real_worker_env(1), report.log_dir("engine"),
                             name="real") as pool:
        engines = report.engine_info([local_fleet.url_of(w) for w in pool])
        for number in range(1, report.knob("BENCH_ENGINE_ROUNDS", 2, 1) + 1):
            inproc.append(least_disturbed(lambda: inprocess(pages), tries))
            one, two = [least_disturbed(lambda: http_rate(pool[:n], pages), tries) for n in (1, 2)]
            done.append({"one": one, "two": two, "ratio": two["pages_per_s"] / one["pages_per_s"]})
            report.say(f"  round {number}: in-process {inproc[-1]['pages_per_s']:.3f}, 1 worker "
                       f"{one['pages_per_s']:.3f}, 2 workers {two['pages_per_s']:.3f} pages/s")
        inproc.append(least_disturbed(lambda: inprocess(pages), tries))
    pair = least_disturbed(lambda: inprocess(pages, 2), tries)  # two in-process engines at once
    http = {key: {"pages_per_s": statistics.mean(r[side]["pages_per_s"] for r in done),
                  "failures": sum(r[side]["failures"] for r in done)}
            for key, side in (("http_1_worker", "one"), ("http_2_workers", "two"))}
    inproc_pps = statistics.mean(r["pages_per_s"] for r in inproc)
    return {"engine": report.engine_label(engines),
            "document": "dense A4 page, 150 DPI, PNG, visualize false",
            "threads_per_worker": 1, "pages_per_worker": pages, "rounds": done,
            "inprocess": {"pages_per_s": inproc_pps, "runs": inproc}, "inprocess_pair": pair,
            **http, "scaling_2_vs_1": statistics.mean([r["ratio"] for r in done]),
            "scaling_goal": figures.ENGINE_SCALING_GOAL,
            "machine_scaling_2_vs_1": pair["pages_per_s"] / inproc_pps,
            "serving_ratio": http["http_1_worker"]["pages_per_s"] / inproc_pps,
            "serving_goal": figures.SERVING_OVERHEAD_GOAL,
            "failures": sum(side["failures"] for side in http.values()), **report.stamp(engines)}


def rows(result: dict) -> list[list]:
    one, two, inproc = result["http_1_worker"], result["http_2_workers"], result["inprocess"]
    scaling, serving = result["scaling_2_vs_1"], result["serving_ratio"]
    runs = [r[k] for r in result["rounds"] for k in ("one", "two")]
    per_round = ", ".join(f"{r['ratio']:.2f}x" for r in result["rounds"])
    return [["real engine: 2 workers vs 1 (x1 thread), dense A4",
             f"{two['pages_per_s']:.3f} vs {one['pages_per_s']:.3f} pages/s = {scaling:.2f}x "
             f"(rounds {per_round}; 2 engines in-process {result['machine_scaling_2_vs_1']:.2f}x)"
             + report.noise(*runs),
             f">= {result['scaling_goal']}x", figures.verdict(scaling >= result["scaling_goal"])],
            ["serving overhead: HTTP / in-process, 1 thread",
             f"{one['pages_per_s']:.3f} / {inproc['pages_per_s']:.3f} pages/s = {serving:.3f}"
             + report.noise(*runs, *inproc["runs"]),
             f">= {result['serving_goal']}", figures.verdict(serving >= result["serving_goal"])]]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--inprocess"]:  # python -m loadtest.bench_engine --inprocess 8 [sim]
        print(json.dumps(engine_alone(int(sys.argv[2]), *sys.argv[3:4])))
        sys.exit(0)
    sys.exit(report.main(sys.modules[__name__]))
