"""`make bench-paddlex` (and part of `make bench`): ocrfleet side by side with PaddleX's official
serving (`paddlex --serve`, the same version, onnxruntime and model files, in its own venv
under bench/paddlex-venv/) in three setups, each figure against the strongest; the same client
and dense pages at 1 and 4 clients, and one 16-page PDF alone, interleaved. A run is
publishable only when no side scales negatively and the machine was quiet (docs/benchmarks.md;
loadtest/README.md for the knobs). Goals (issue 13): >= 1.25x PaddleX's pages/s at 4 clients,
<= 0.8x its PDF latency. Skipped, with the reason, where the venv cannot be built."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest import doc_tables, local_fleet, report
from loadtest.loadgen import run_closed_loop
from loadtest.payloads import dense_page_payloads, make_payload
from loadtest.procstats import ForeignLoad
from samples import documents
from scripts.fleet import REPO_ROOT, ManagedProcess, free_port

FILE = "paddlex.json"

VENV = REPO_ROOT / "bench" / "paddlex-venv"
SERVING_DIR = REPO_ROOT / "bench" / "paddlex-serving"
THROUGHPUT_GOAL = 1.25
PDF_LATENCY_GOAL = 0.8
SCALING_FLOOR = 0.95  # 4 clients below this share of 1 client's pages/s: negative scaling
MAX_OTHER_LOAD = 0.25  # of the cores, used by other processes during any run
# ocrfleet with PaddleX's engine settings (onnxruntime, its CPU arena on: PaddleX's default,
# which ocrfleet turns off to keep a worker's memory flat): the serving alone, side by side
SERVING_ONLY = "ocrfleet, PaddleX's engine settings"


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
    """PaddleX's own OCR.yaml on onnxruntime with `threads` threads, the optional modules off,
    ocrfleet's model dirs (local files: nothing is downloaded), the 10-page PDF cap lifted."""
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
    path = SERVING_DIR / f"OCR-{threads}-threads.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@dataclass(frozen=True)
class PaddlexSetup:
    """One way to run PaddleX's serving here: instances (processes, behind nginx when more
    than one), onnxruntime threads each, and whether its pipeline calls are serialised
    (PADDLE_PDX_SERVING_SERIAL_PIPELINE_CALLS, True by default: one call at a time per
    process, whatever the clients)."""

    instances: int
    threads: int
    serial: bool

    @property
    def name(self) -> str:
        calls = "serial calls" if self.serial else "concurrent calls"
        return f"paddlex {self.instances} x {self.threads} threads, {calls}"


def setups(cores: int) -> list[PaddlexSetup]:
    """Its default (one process, every core, serial calls), the same with concurrent calls,
    and one serial process per core behind nginx (ocrfleet's own shape)."""
    return [PaddlexSetup(1, cores, True), PaddlexSetup(1, cores, False),
            PaddlexSetup(cores, 1, True)]


def paddlex_process(paddlex: Path, setup: PaddlexSetup, port: int,
                    log_path: Path) -> ManagedProcess:
    cache = SERVING_DIR / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    return ManagedProcess(
        "paddlex-serving",
        [str(paddlex), "--serve", "--pipeline", str(pipeline_config(setup.threads)),
         "--device", "cpu", "--host", "127.0.0.1", "--port", str(port)],
        env={"PADDLE_PDX_DISABLE_MODEL_SOURCE_CHECK": "True", "PADDLE_PDX_CACHE_HOME":
             str(cache), "OMP_NUM_THREADS": str(setup.threads), "ORT_DISABLE_TELEMETRY": "1",
             "PADDLE_PDX_SERVING_SERIAL_PIPELINE_CALLS": str(setup.serial), "PYTHONPATH": ""},
        ready_url=f"http://127.0.0.1:{port}/health", log_path=log_path)


def start_paddlex(stack: contextlib.ExitStack, paddlex: Path, setup: PaddlexSetup,
                  log_dir: Path) -> tuple[str, list[ManagedProcess]]:
    """The setup's processes, started and ready; its URL (nginx's when several)."""
    ports = [free_port() for _ in range(setup.instances)]
    servers = [paddlex_process(paddlex, setup, port, log_dir / f"paddlex-{port}.log")
               for port in ports]
    stack.enter_context(local_fleet.running(servers, timeout=600))
    if setup.instances == 1:
        return f"http://127.0.0.1:{ports[0]}", servers
    port = free_port()
    balancer = local_fleet.nginx_process([f"127.0.0.1:{p}" for p in ports],
                                         log_dir / f"nginx-{ports[0]}", port, "/health")
    stack.enter_context(local_fleet.running([balancer], timeout=60))
    return f"http://127.0.0.1:{port}", [*servers, balancer]


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
    log_dir = report.log_dir("paddlex")
    log_dir.mkdir(parents=True, exist_ok=True)
    images = dense_page_payloads(4)
    pdf = [make_payload(f"pdf:dense:{pdf_pages}p", documents.dense_pdf(pdf_pages), "pdf",
                        pdf_pages, labelled=True)]
    threads = max(1, cores // 2)
    fleets = {"ocrfleet": {}, SERVING_ONLY: {"OCR_BACKEND": "onnxruntime",
                                             "OCR_ORT_CPU_ARENA": "true"}}
    chosen = setups(cores)
    results: dict[str, dict[str, Any]] = {}
    with contextlib.ExitStack() as stack:
        sides, engines = {}, {}
        for setup in chosen:
            sides[setup.name] = start_paddlex(stack, paddlex, setup, log_dir)
        for name, env in fleets.items():
            workers = stack.enter_context(local_fleet.workers(
                2, local_fleet.real_worker_env(threads, **env), log_dir, timeout=600))
            gateway = stack.enter_context(local_fleet.gateway(
                [local_fleet.url_of(w) for w in workers], log_dir))
            sides[name] = (local_fleet.url_of(gateway), [gateway, *workers])
            engines[name] = report.engine_info([local_fleet.url_of(w) for w in workers])
        for name, (url, _) in sides.items():  # warm-up, untimed (every instance once)
            run_closed_loop(url, images[:1], cores, total_requests=2 * cores, timeout=600)
        results = {name: {} for name in sides}
        for label, payloads, clients, count in (("1 client", images, 1, images_1),
                                                ("4 clients", images, 4, images_4),
                                                ("pdf", pdf, 1, 1), ("pdf again", pdf, 1, 1)):
            for name, (url, processes) in sides.items():  # interleaved, figure by figure
                results[name][label] = measure_side(url, payloads, clients, count, processes)
                report.say(f"  {name} {label}: {results[name][label]['pages_per_s']:.3f} "
                           f"pages/s, {results[name][label]['seconds']:.1f} s")
    return summarise(results, engines, cores, pdf_pages, chosen)


def summarise(results, engines, cores, pdf_pages, chosen) -> dict[str, Any]:
    """Each figure against PaddleX's strongest setup for that figure, and whether the run may
    be published (`publishable`)."""
    paddlex_sides = [setup.name for setup in chosen]

    def pps(side: str, clients: str) -> float:
        return results[side][clients]["pages_per_s"]

    def pdf_latency(side: str) -> float:
        return min(results[side][k]["seconds"] for k in ("pdf", "pdf again"))

    best = {clients: max(paddlex_sides, key=lambda s: pps(s, clients))
            for clients in ("1 client", "4 clients")}
    best["pdf"] = min(paddlex_sides, key=pdf_latency)

    def against_best(side: str) -> dict[str, float]:
        return {**{clients: pps(side, clients) / pps(best[clients], clients)
                   for clients in ("1 client", "4 clients")},
                "pdf_latency": pdf_latency(side) / pdf_latency(best["pdf"])}

    reasons = []
    for side in results:
        if pps(side, "4 clients") < SCALING_FLOOR * pps(side, "1 client"):
            reasons.append(f"{side} scales negatively: {pps(side, '4 clients'):.3f} pages/s "
                           f"at 4 clients, {pps(side, '1 client'):.3f} at 1")
        worst = max(r["other_load_cores"] for r in results[side].values())
        if worst > MAX_OTHER_LOAD * cores:
            reasons.append(f"other processes used {worst:.2f} of {cores} cores during a "
                           f"{side} run (at most {MAX_OTHER_LOAD:.0%} allowed)")
    return {
        "sides": results,
        "paddlex_setups": {setup.name: {"instances": setup.instances, "threads": setup.threads,
                                        "serial_pipeline_calls": setup.serial}
                           for setup in chosen},
        "strongest_paddlex": best,
        "ratio": {side: against_best(side) for side in results if side not in paddlex_sides},
        "pdf_latency_s": {side: pdf_latency(side) for side in results},
        "pdf_pages": pdf_pages,
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


def table(result: dict[str, Any]) -> str:
    return doc_tables.paddlex_table(result, refuse=False)


def rows(result: dict[str, Any]) -> list[list[Any]]:
    if "skipped" in result:
        return [["vs PaddleX serving", f"skipped: {result['skipped']}"[:90], "-", "SKIP"]]
    ratio, best = result["ratio"], result["strongest_paddlex"]
    made = []
    for side in ratio:
        for clients, goal in (("1 client", None), ("4 clients", THROUGHPUT_GOAL)):
            ok = goal is None or ratio[side][clients] >= goal
            made.append([f"{side} vs {best[clients]}, dense A4, {clients}",
                         f"{ratio[side][clients]:.2f}x pages/s",
                         f">= {goal}x" if goal and side == "ocrfleet" else "(informative)",
                         "PASS" if ok or side != "ocrfleet" else "FAIL"])
        ok = ratio[side]["pdf_latency"] <= PDF_LATENCY_GOAL
        made.append([f"{side} vs {best['pdf']}, one {result['pdf_pages']}-page PDF",
                     f"{ratio[side]['pdf_latency']:.2f}x latency",
                     f"<= {PDF_LATENCY_GOAL}x" if side == "ocrfleet" else "(informative)",
                     "PASS" if ok or side != "ocrfleet" else "FAIL"])
    verdict = result["publishable"]
    made.append(["publishable", "yes" if verdict["ok"] else "; ".join(verdict["reasons"])[:90],
                 verdict["rules"][:60], "PASS" if verdict["ok"] else "FAIL"])
    return made


def run_or_skip(**kwargs) -> dict[str, Any]:
    try:
        return run(**kwargs)
    except Skipped as exc:
        report.say(f"bench-paddlex skipped: {exc}")
        return {"skipped": str(exc), **report.stamp()}


def measure() -> dict[str, Any]:
    pages = report.knob("BENCH_PADDLEX_PAGES", 8, 4)
    return run_or_skip(images_1=pages, images_4=2 * pages,
                       pdf_pages=report.knob("BENCH_PADDLEX_PDF_PAGES", 16, 8))


if __name__ == "__main__":
    sys.exit(report.main(sys.modules[__name__]))
