"""`make bench-paddlex` (and part of `make bench`): ocrfleet side by side with PaddleX's official
serving (`paddlex --serve`: the same version, onnxruntime and model files, in its own venv under
bench/paddlex-venv/) in three setups, each figure against the strongest: dense pages at 1 and 4
clients and one 16-page PDF alone, interleaved. Publishable only when no side scales negatively
and the machine was quiet. Goals (issue 13): >= 1.25x PaddleX's pages/s at 4 clients, <= 0.8x
its PDF latency. Skipped, with the reason, where the venv cannot be built."""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import venv
from pathlib import Path
from typing import Any

import yaml

from loadtest import local_fleet, report
from loadtest.loadgen import run_closed_loop
from loadtest.payloads import dense_page_payloads, make_payload
from loadtest.procstats import ForeignLoad
from samples import documents
from scripts.fleet import REPO_ROOT, ManagedProcess, free_port
from services.ocr_worker.config import WorkerConfig

FILE = "paddlex.json"
VENV = REPO_ROOT / "bench" / "paddlex-venv"
SERVING_DIR = REPO_ROOT / "bench" / "paddlex-serving"
THROUGHPUT_GOAL, PDF_LATENCY_GOAL = 1.25, 0.8
SCALING_FLOOR = 0.95  # 4 clients below this share of 1 client's pages/s: negative scaling
MAX_OTHER_LOAD = 0.25  # of the cores, used by other processes during any run
# ocrfleet on PaddleX's engine settings (onnxruntime with its CPU arena on, which ocrfleet
# turns off to keep a worker's memory flat): the serving alone, side by side
SERVING_ONLY = "ocrfleet, PaddleX's engine settings"
FLEETS = {"ocrfleet": {}, SERVING_ONLY: {"OCR_BACKEND": "onnxruntime",
                                         "OCR_ORT_CPU_ARENA": "true"}}
FIGURES = ("1 client", "4 clients")


class Skipped(Exception):
    """The PaddleX side cannot run here; the reason says why."""


def requirements() -> list[str]:
    """The PaddleX serving install, pinned to what ocrfleet's own venv runs."""
    return [f"paddlex[ocr-core,serving]=={importlib.metadata.version('paddlex')}",
            f"onnxruntime=={importlib.metadata.version('onnxruntime')}"]


def ensure_venv() -> Path:
    """bench/paddlex-venv's `paddlex`, built once per requirements(); Skipped if it can't be."""
    paddlex, stamp = VENV / "bin" / "paddlex", VENV / ".ocrfleet-requirements"
    wanted = "\n".join(requirements())
    if paddlex.is_file() and stamp.is_file() and stamp.read_text() == wanted:
        return paddlex
    report.say(f"building {VENV} ({', '.join(requirements())}); a few minutes, once")
    try:
        venv.create(VENV, with_pip=True, clear=True)
        subprocess.run([str(VENV / "bin" / "python"), "-m", "pip", "install", "--quiet",
                        *requirements()], check=True, timeout=1800,
                       env={**os.environ, "PYTHONPATH": ""})  # not ocrfleet's own tree
    except (OSError, subprocess.SubprocessError) as exc:
        raise Skipped(f"could not build {VENV.relative_to(REPO_ROOT)} "
                      f"({type(exc).__name__}: {exc})"[:300]) from None
    stamp.write_text(wanted)
    return paddlex


def pipeline_config(threads: int) -> Path:
    """PaddleX's own OCR.yaml (of the pinned version) on onnxruntime with `threads` threads, the
    optional modules off, ocrfleet's local model dirs, the 10-page PDF cap lifted."""
    shipped = Path(importlib.util.find_spec("paddlex").origin).parent / "configs" / \
        "pipelines" / "OCR.yaml"
    config = yaml.safe_load(shipped.read_text())
    det_name, det_dir, rec_name, rec_dir = WorkerConfig().model_paths()
    config.update(use_doc_preprocessor=False, use_textline_orientation=False,
                  engine="onnxruntime",
                  engine_config={"intra_op_num_threads": threads, "inter_op_num_threads": 1},
                  Serving={"extra": {"max_num_input_imgs": None}})
    config.pop("SubPipelines", None)
    config["SubModules"].pop("TextLineOrientation", None)
    config["SubModules"]["TextDetection"].update(model_name=det_name, model_dir=det_dir)
    config["SubModules"]["TextRecognition"].update(model_name=rec_name, model_dir=rec_dir)
    SERVING_DIR.mkdir(parents=True, exist_ok=True)
    path = SERVING_DIR / f"OCR-{threads}-threads.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def setups(cores: int) -> dict[str, dict[str, Any]]:
    """PaddleX's default (one process, every core, serial pipeline calls), the same with
    concurrent calls, and one serial process per core behind nginx (ocrfleet's own shape)."""
    shapes = ((1, cores, True), (1, cores, False), (cores, 1, True))
    return {f"paddlex {n} x {threads} threads, {'serial' if serial else 'concurrent'} calls":
            {"instances": n, "threads": threads, "serial_pipeline_calls": serial}
            for n, threads, serial in shapes}


def start_paddlex(stack: contextlib.ExitStack, paddlex: Path, setup: dict[str, Any],
                  log_dir: Path) -> tuple[str, list[ManagedProcess]]:
    """The setup's processes, started and ready; its URL (nginx's when several)."""
    (SERVING_DIR / "cache").mkdir(parents=True, exist_ok=True)
    command = [str(paddlex), "--serve", "--pipeline", str(pipeline_config(setup["threads"])),
               "--device", "cpu", "--host", "127.0.0.1", "--port"]
    env = {"PADDLE_PDX_DISABLE_MODEL_SOURCE_CHECK": "True", "ORT_DISABLE_TELEMETRY": "1",
           "PADDLE_PDX_CACHE_HOME": str(SERVING_DIR / "cache"), "PYTHONPATH": "",
           "OMP_NUM_THREADS": str(setup["threads"]),
           "PADDLE_PDX_SERVING_SERIAL_PIPELINE_CALLS": str(setup["serial_pipeline_calls"])}
    ports = [free_port() for _ in range(setup["instances"])]
    processes = [ManagedProcess("paddlex-serving", [*command, str(port)], env=env,
                                ready_url=f"http://127.0.0.1:{port}/health",
                                log_path=log_dir / f"paddlex-{port}.log") for port in ports]
    front = ports[0]
    if len(ports) > 1:  # nginx in front, balancing over them
        front = free_port()
        processes.append(local_fleet.nginx_process(
            [f"127.0.0.1:{p}" for p in ports], log_dir / f"nginx-{ports[0]}", front, "/health"))
    stack.enter_context(local_fleet.running(processes, timeout=600))
    return f"http://127.0.0.1:{front}", processes


def measure_side(url: str, payloads, clients: int, requests: int, processes) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    with ForeignLoad(processes) as foreign:
        load = run_closed_loop(url, payloads, clients, total_requests=requests, timeout=900)
    pages = sum(c.pages for c in load.completions if c.ok)
    latencies = [c.finished - c.started for c in load.completions if c.ok]
    return {"clients": clients, "pages": pages, "seconds": load.wall_s,
            "pages_per_s": pages / load.wall_s, "failures": load.failure_count,
            "failure_kinds": dict(load.failures.most_common(3)),
            "latency_s": min(latencies, default=None),
            "other_load_cores": round(foreign.cores, 2),
            "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)]}


def measure() -> dict[str, Any]:
    """Every side, figure by figure (interleaved), or {"skipped": why}."""
    pages = report.knob("BENCH_PADDLEX_PAGES", 8, 4)
    pdf_pages = report.knob("BENCH_PADDLEX_PDF_PAGES", 16, 8)
    try:
        paddlex = ensure_venv()
    except Skipped as exc:
        report.say(f"bench-paddlex skipped: {exc}")
        return {"skipped": str(exc), **report.stamp()}
    cores = os.cpu_count() or 2
    log_dir = report.log_dir("paddlex")
    log_dir.mkdir(parents=True, exist_ok=True)
    images = dense_page_payloads(4)
    pdf = [make_payload(f"pdf:dense:{pdf_pages}p", documents.dense_pdf(pdf_pages), "pdf",
                        pdf_pages, labelled=True)]
    chosen = setups(cores)
    with contextlib.ExitStack() as stack:
        sides = {name: start_paddlex(stack, paddlex, setup, log_dir)
                 for name, setup in chosen.items()}
        engines = {}
        for name, env in FLEETS.items():
            workers = stack.enter_context(local_fleet.workers(
                2, local_fleet.real_worker_env(max(1, cores // 2), **env), log_dir, timeout=600))
            worker_urls = [local_fleet.url_of(w) for w in workers]
            gateway = stack.enter_context(local_fleet.gateway(worker_urls, log_dir))
            sides[name] = (local_fleet.url_of(gateway), [gateway, *workers])
            engines[name] = report.engine_info(worker_urls)
        for url, _ in sides.values():  # warm-up, untimed (every instance once)
            run_closed_loop(url, images[:1], cores, total_requests=2 * cores, timeout=600)
        results: dict[str, dict[str, Any]] = {name: {} for name in sides}
        for label, payloads, clients, count in (
                ("1 client", images, 1, pages), ("4 clients", images, 4, 2 * pages),
                ("pdf", pdf, 1, 1), ("pdf again", pdf, 1, 1)):
            for name, (url, processes) in sides.items():  # interleaved, figure by figure
                side = results[name][label] = measure_side(url, payloads, clients, count,
                                                           processes)
                report.say(f"  {name} {label}: {side['pages_per_s']:.3f} pages/s, "
                           f"{side['seconds']:.1f} s")
    return summarise(results, engines, cores, pdf_pages, chosen)


run_or_skip = measure  # the name tests/test_accuracy_corpus.py calls it by


def summarise(results, engines, cores, pdf_pages, chosen) -> dict[str, Any]:
    """Each figure against PaddleX's strongest setup for it; whether the run may be published."""
    pps = {side: {c: figures[c]["pages_per_s"] for c in FIGURES}
           for side, figures in results.items()}
    pdf_s = {side: min(figures["pdf"]["seconds"], figures["pdf again"]["seconds"])
             for side, figures in results.items()}
    best = {c: max(chosen, key=lambda side: pps[side][c]) for c in FIGURES}
    best["pdf"] = min(chosen, key=pdf_s.get)
    reasons = []
    for side, figures in results.items():
        if pps[side]["4 clients"] < SCALING_FLOOR * pps[side]["1 client"]:
            reasons.append(f"{side} scales negatively: {pps[side]['4 clients']:.3f} pages/s "
                           f"at 4 clients, {pps[side]['1 client']:.3f} at 1")
        worst = max(r["other_load_cores"] for r in figures.values())
        if worst > MAX_OTHER_LOAD * cores:
            reasons.append(f"other processes used {worst:.2f} of {cores} cores during a "
                           f"{side} run (at most {MAX_OTHER_LOAD:.0%} allowed)")
    return {
        "sides": results, "paddlex_setups": chosen, "strongest_paddlex": best,
        "ratio": {side: {**{c: pps[side][c] / pps[best[c]][c] for c in FIGURES},
                         "pdf_latency": pdf_s[side] / pdf_s[best["pdf"]]}
                  for side in results if side not in chosen},
        "pdf_latency_s": pdf_s, "pdf_pages": pdf_pages,
        "failures": sum(r["failures"] for side in results.values() for r in side.values()),
        "ocrfleet_engine": {side: report.engine_label(e) for side, e in engines.items()},
        "ocrfleet_setup": f"gateway + 2 workers x {max(1, cores // 2)} threads, default "
                          f"settings; '{SERVING_ONLY}': the same with OCR_BACKEND=onnxruntime "
                          "and OCR_ORT_CPU_ARENA=true, as PaddleX runs its sessions (the "
                          "serving alone)",
        "goals": {"pages_per_s_4_clients": THROUGHPUT_GOAL, "pdf_latency": PDF_LATENCY_GOAL},
        "publishable": {"ok": not reasons, "reasons": reasons,
                        "rules": f"no side's pages/s at 4 clients under {SCALING_FLOOR} x its "
                                 f"pages/s at 1 client; other processes at most "
                                 f"{MAX_OTHER_LOAD:.0%} of the cores in every run"},
        **report.stamp([e for side in engines.values() for e in side]),
    }


def rows(result: dict[str, Any]) -> list[list[Any]]:
    if "skipped" in result:
        return [["vs PaddleX serving", f"skipped: {result['skipped']}"[:90], "-", "SKIP"]]
    best, made = result["strongest_paddlex"], []
    for side, ratio in result["ratio"].items():
        ours = side == "ocrfleet"  # the goals are ocrfleet's; the other side is informative
        for figure, goal in zip(FIGURES, (None, THROUGHPUT_GOAL)):
            made.append([f"{side} vs {best[figure]}, dense A4, {figure}",
                         f"{ratio[figure]:.2f}x pages/s",
                         f">= {goal}x" if goal and ours else "(informative)",
                         "FAIL" if ours and goal and ratio[figure] < goal else "PASS"])
        made.append([f"{side} vs {best['pdf']}, one {result['pdf_pages']}-page PDF",
                     f"{ratio['pdf_latency']:.2f}x latency",
                     f"<= {PDF_LATENCY_GOAL}x" if ours else "(informative)",
                     "FAIL" if ours and ratio["pdf_latency"] > PDF_LATENCY_GOAL else "PASS"])
    verdict = result["publishable"]
    made.append(["publishable", "yes" if verdict["ok"] else "; ".join(verdict["reasons"])[:90],
                 verdict["rules"][:60], "PASS" if verdict["ok"] else "FAIL"])
    return made


def table(result: dict[str, Any], refuse: bool = False) -> str:
    """The side by side; `refuse`: a run that is not publishable raises ValueError instead."""
    skipped = result.get("skipped")
    verdict = result.get("publishable", {"ok": False, "reasons": [f"skipped: {skipped}"]})
    if refuse and not verdict["ok"]:
        raise ValueError("this PaddleX run is not publishable: " + "; ".join(verdict["reasons"]))
    if skipped:
        return f"Skipped: {skipped}. {report.measured(result)}."
    best, pdf_s = result["strongest_paddlex"], result["pdf_latency_s"]
    by_side = [[side, *(f"{figures[c]['pages_per_s']:.3f}" for c in FIGURES),
                f"{pdf_s[side]:.1f} s",
                f"{max(r['other_load_cores'] for r in figures.values()):.2f}"]
               for side, figures in result["sides"].items()]
    ratios = [[side, *(f"{ratio[key]:.2f}x" for key in (*FIGURES, "pdf_latency"))]
              for side, ratio in result["ratio"].items()]
    engines = "; ".join(f"{side}: {label}" for side, label in result["ocrfleet_engine"].items())
    publishable = "yes" if verdict["ok"] else "NO: " + "; ".join(verdict["reasons"])
    return "\n".join([
        report.markdown(["side", "pages/s, 1 client", "pages/s, 4 clients",
                         f"{result['pdf_pages']}-page PDF (best of 2)",
                         "other load (cores, worst)"], by_side), "",
        report.markdown(["ocrfleet ÷ PaddleX's strongest setup for each figure",
                         *(f"{c} ({best[c]})" for c in FIGURES), f"PDF latency ({best['pdf']})"],
                        ratios),
        f"\nPublishable: {publishable} ({verdict['rules']}). ocrfleet: "
        f"{result['ocrfleet_setup']}; engines: {engines}. {report.measured(result)}."])


if __name__ == "__main__":
    sys.exit(report.main(sys.modules[__name__]))
