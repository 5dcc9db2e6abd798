"""`make bench-paddlex` (and part of `make bench`): ocrfleet side by side with PaddleX's official
serving (`paddlex --serve`) on this machine, same client, same pages, same model files.

- PaddleX: `paddlex[ocr-core,serving]` at the version ocrfleet uses, with the same
  onnxruntime, installed into its own venv under bench/paddlex-venv/ (git-ignored; built once,
  from PyPI). Its pipeline config (bench/paddlex-serving/OCR.yaml) is PaddleX's own OCR.yaml
  with the engine set to onnxruntime (`engine:`/`engine_config:`, all cores as intra-op
  threads), the optional modules off, the model dirs pointing at ocrfleet's models/ (local
  files: nothing is downloaded) and the 10-page PDF cap lifted (Serving.extra).
- ocrfleet: its default settings on this machine: 2 workers x (cores / 2) engine threads
  behind the gateway, `OCR_BACKEND=auto`.
- The client: loadtest/loadgen.py, dense A4 pages at 150 DPI as PNG with `"visualize":
  false`, at 1 and 4 concurrent clients; and one 16-page born-digital dense PDF sent alone
  (each side's best of two). Every answer is checked (page count, order labels).

Runs are interleaved (PaddleX, then ocrfleet, for each figure) and each records the cores
other processes used meanwhile and the load average, since this machine is shared.
Goals (issue 13): >= 1.25x PaddleX's pages/s at 4 clients, <= 0.8x its 16-page PDF latency.

Knobs: BENCH_PADDLEX_PAGES (pages per client-count run, default 8 at 1 client, 16 at 4),
BENCH_PADDLEX_PDF_PAGES (16), BENCH_PADDLEX_ONNXRUNTIME=1 (also ocrfleet with
OCR_BACKEND=onnxruntime: what the serving alone gives, without the faster backend). If the venv cannot be built (no network, no wheel), the part is
skipped with the reason."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import subprocess
import sys
import venv
from pathlib import Path
from typing import Any

from loadtest import documents, local_fleet, report
from loadtest.loadgen import run_closed_loop
from loadtest.payloads import dense_page_payloads, make_payload
from loadtest.procstats import ForeignLoad
from scripts.fleet import REPO_ROOT, ManagedProcess, free_port

FILE = "paddlex.json"

VENV = REPO_ROOT / "bench" / "paddlex-venv"
SERVING_DIR = REPO_ROOT / "bench" / "paddlex-serving"
THROUGHPUT_GOAL = 1.25
PDF_LATENCY_GOAL = 0.8


class Skipped(Exception):
    """The PaddleX side cannot run here; the reason says why."""


def requirements() -> list[str]:
    """The PaddleX serving install, pinned to what ocrfleet's own venv runs."""
    return [f"paddlex[ocr-core,serving]=={importlib.metadata.version('paddlex')}",
            f"onnxruntime=={importlib.metadata.version('onnxruntime')}"]


def ensure_venv() -> Path:
    paddlex = VENV / "bin" / "paddlex"
    stamp = VENV / ".ocrfleet-requirements"
    wanted = "\n".join(requirements())
    if paddlex.is_file() and stamp.is_file() and stamp.read_text() == wanted:
        return paddlex
    print(f"building {VENV} ({', '.join(requirements())}); a few minutes, once",
          file=sys.stderr, flush=True)
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
    """PaddleX's own OCR.yaml with the engine, model dirs and limits set as described above."""
    import importlib.util

    import yaml

    from services.ocr_worker.config import WorkerConfig

    # the same paddlex version as in the serving venv (requirements() pins it)
    shipped = Path(importlib.util.find_spec("paddlex").origin).parent / "configs" / \
        "pipelines" / "OCR.yaml"
    config = yaml.safe_load(shipped.read_text())
    det_name, det_dir, rec_name, rec_dir = WorkerConfig().model_paths()
    config.update(use_doc_preprocessor=False, use_textline_orientation=False,
                  engine="onnxruntime",
                  engine_config={"intra_op_num_threads": threads, "inter_op_num_threads": 1})
    config.pop("SubPipelines", None)
    modules = config["SubModules"]
    modules.pop("TextLineOrientation", None)
    modules["TextDetection"].update(model_name=det_name, model_dir=det_dir)
    modules["TextRecognition"].update(model_name=rec_name, model_dir=rec_dir)
    config["Serving"] = {"extra": {"max_num_input_imgs": None}}
    SERVING_DIR.mkdir(parents=True, exist_ok=True)
    path = SERVING_DIR / "OCR.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def paddlex_process(paddlex: Path, config: Path, port: int, threads: int,
                    log_path: Path) -> ManagedProcess:
    cache = SERVING_DIR / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    return ManagedProcess(
        "paddlex-serving",
        [str(paddlex), "--serve", "--pipeline", str(config), "--device", "cpu",
         "--host", "127.0.0.1", "--port", str(port)],
        env={"PADDLE_PDX_DISABLE_MODEL_SOURCE_CHECK": "True", "PADDLE_PDX_CACHE_HOME":
             str(cache), "OMP_NUM_THREADS": str(threads), "ORT_DISABLE_TELEMETRY": "1",
             "PYTHONPATH": ""},
        ready_url=f"http://127.0.0.1:{port}/health", log_path=log_path)


def measure_side(url: str, payloads, clients: int, requests: int, processes
                 ) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    with ForeignLoad(processes) as foreign:
        result = run_closed_loop(url, payloads, clients, total_requests=requests, timeout=900)
    pages = sum(c.pages for c in result.completions if c.ok)
    latencies = [c.finished - c.started for c in result.completions if c.ok]
    return {"clients": clients, "pages": pages, "seconds": result.wall_s,
            "pages_per_s": pages / result.wall_s, "failures": result.failure_count,
            "failure_kinds": dict(result.failures.most_common(3)),
            "latency_s": min(latencies) if latencies else None,
            "other_load_cores": round(foreign.cores, 2),
            "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)]}


def run(images_1: int = 8, images_4: int = 16, pdf_pages: int = 16) -> dict[str, Any]:
    paddlex = ensure_venv()
    cores = os.cpu_count() or 2
    log_dir = report.results_dir() / "logs" / "paddlex"
    log_dir.mkdir(parents=True, exist_ok=True)
    images = dense_page_payloads(4)
    pdf = [make_payload(f"pdf:dense:{pdf_pages}p", documents.dense_pdf(pdf_pages), "pdf",
                        pdf_pages, labelled=True)]
    port = free_port()
    server = paddlex_process(paddlex, pipeline_config(cores), port, cores,
                             log_dir / f"paddlex-{port}.log")
    threads = max(1, cores // 2)
    fleets = {"ocrfleet": {}}
    if os.environ.get("BENCH_PADDLEX_ONNXRUNTIME", "0") not in ("", "0"):
        fleets["ocrfleet onnxruntime"] = {"OCR_BACKEND": "onnxruntime"}
    results: dict[str, dict[str, Any]] = {"paddlex": {}, **{name: {} for name in fleets}}
    with contextlib.ExitStack() as stack:
        stack.enter_context(local_fleet.running([server], timeout=600))
        sides = {"paddlex": (f"http://127.0.0.1:{port}", [server])}
        engines = {}
        for name, env in fleets.items():
            workers = stack.enter_context(local_fleet.workers(
                2, local_fleet.real_worker_env(threads, **env), log_dir, timeout=600))
            gateway = stack.enter_context(local_fleet.gateway(
                [local_fleet.url_of(w) for w in workers], log_dir))
            sides[name] = (local_fleet.url_of(gateway), [gateway, *workers])
            engines[name] = report.engine_info([local_fleet.url_of(w) for w in workers])
        for name, (url, _) in sides.items():  # warm-up, untimed
            run_closed_loop(url, images[:1], 1, total_requests=2, timeout=600)
        for label, payloads, clients, count in (("1 client", images, 1, images_1),
                                                ("4 clients", images, 4, images_4),
                                                ("pdf", pdf, 1, 1), ("pdf again", pdf, 1, 1)):
            for name, (url, processes) in sides.items():
                results[name][label] = measure_side(url, payloads, clients, count, processes)
                print(f"  {name} {label}: {results[name][label]['pages_per_s']:.3f} pages/s, "
                      f"{results[name][label]['seconds']:.1f} s", file=sys.stderr, flush=True)
    return summarise(results, engines, cores, pdf_pages)


def summarise(results, engines, cores, pdf_pages) -> dict[str, Any]:
    def pdf_latency(side: str) -> float:
        return min(results[side][k]["seconds"] for k in ("pdf", "pdf again"))

    def ratio(side: str) -> dict[str, float]:
        return {clients: results[side][clients]["pages_per_s"] /
                results["paddlex"][clients]["pages_per_s"]
                for clients in ("1 client", "4 clients")}

    others = [side for side in results if side not in ("paddlex", "ocrfleet")]
    return {
        **results,
        "ratio_pages_per_s": ratio("ocrfleet"),
        "pdf_latency_s": {s: pdf_latency(s) for s in results},
        "pdf_latency_ratio": pdf_latency("ocrfleet") / pdf_latency("paddlex"),
        "also": {side: {"ratio_pages_per_s": ratio(side), "pdf_latency_ratio":
                        pdf_latency(side) / pdf_latency("paddlex")} for side in others},
        "pdf_pages": pdf_pages,
        "failures": sum(r["failures"] for side in results.values() for r in side.values()),
        "ocrfleet_engine": {side: report.engine_label(e) for side, e in engines.items()},
        "setup": {"paddlex": f"paddlex --serve, 1 process, onnxruntime, {cores} intra-op "
                             "threads", "ocrfleet": f"gateway + 2 workers x {max(1, cores // 2)}"
                                                    " threads, default settings"},
        "goals": {"pages_per_s_4_clients": THROUGHPUT_GOAL, "pdf_latency": PDF_LATENCY_GOAL},
        **report.stamp([e for side in engines.values() for e in side]),
    }


def rows(result: dict[str, Any]) -> list[list[Any]]:
    if "skipped" in result:
        return [["vs PaddleX serving", f"skipped: {result['skipped']}"[:90], "-", "SKIP"]]
    p, o = result["paddlex"], result["ocrfleet"]
    ratio, pdf = result["ratio_pages_per_s"], result["pdf_latency_s"]

    made = []
    for clients, goal in (("1 client", None), ("4 clients", THROUGHPUT_GOAL)):
        made.append([f"vs PaddleX serving, dense A4, {clients}",
                     f"{o[clients]['pages_per_s']:.3f} vs {p[clients]['pages_per_s']:.3f} "
                     f"pages/s = {ratio[clients]:.2f}x" + report.noise(o[clients], p[clients]),
                     f">= {goal}x" if goal else "(informative)",
                     "PASS" if goal is None or ratio[clients] >= goal else "FAIL"])
    made.append([f"vs PaddleX serving, one {result['pdf_pages']}-page PDF",
                 f"{pdf['ocrfleet']:.2f} vs {pdf['paddlex']:.2f} s = "
                 f"{result['pdf_latency_ratio']:.2f}x" + report.noise(o["pdf"], p["pdf"]),
                 f"<= {PDF_LATENCY_GOAL}x",
                 "PASS" if result["pdf_latency_ratio"] <= PDF_LATENCY_GOAL else "FAIL"])
    for side, also in result.get("also", {}).items():
        made.append([f"  ({side}: 1 / 4 clients, PDF)",
                     f"{also['ratio_pages_per_s']['1 client']:.2f}x / "
                     f"{also['ratio_pages_per_s']['4 clients']:.2f}x, "
                     f"{also['pdf_latency_ratio']:.2f}x", "(informative)", "-"])
    return made


def run_or_skip(**kwargs) -> dict[str, Any]:
    try:
        return run(**kwargs)
    except Skipped as exc:
        print(f"bench-paddlex skipped: {exc}", file=sys.stderr, flush=True)
        return {"skipped": str(exc), **report.stamp()}


def measure() -> dict[str, Any]:
    pages = report.knob("BENCH_PADDLEX_PAGES", 8, 4)
    return run_or_skip(images_1=pages, images_4=2 * pages,
                       pdf_pages=report.knob("BENCH_PADDLEX_PDF_PAGES", 16, 8))


if __name__ == "__main__":
    sys.exit(report.main(sys.modules[__name__]))
