"""`make bench-paddlex`: ocrfleet beside `paddlex --serve` (same version, onnxruntime and model
files; bench/paddlex-venv/) in three setups, each figure against the strongest; published only
when no side scales negatively and the machine was quiet; skipped, with why, without the venv.
Goals (issue 47): >= 1.5x the pages/s of PaddleX's strongest setup at 4 clients, <= 0.6x its
PDF latency. 300-dpi scans at 4 clients are a figure of their own (informative): each side
runs its own detector cap (ocrfleet's OCR_DET_MAX_SIDE, PaddleX's 4000)."""

import contextlib
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import venv
from pathlib import Path

import yaml

from loadtest import figures, local_fleet, report
from loadtest.loadgen import run_closed_loop
from loadtest.payloads import dense_page_payloads, dense_scan_payloads, make_payload
from loadtest.procstats import ForeignLoad
from samples import documents
from scripts.fleet import REPO_ROOT, ManagedProcess, free_port
from services.ocr_worker.config import WorkerConfig

FILE = "paddlex.json"
VENV, SERVING_DIR = REPO_ROOT / "bench/paddlex-venv", REPO_ROOT / "bench/paddlex-serving"
THROUGHPUT_GOAL, PDF_LATENCY_GOAL = 1.5, 0.6
SCALING_FLOOR = 0.95  # 4 clients below this share of 1 client's pages/s: negative scaling
MAX_OTHER_LOAD = 0.25  # of the cores, used by other processes during any run
# ocrfleet with onnxruntime's CPU arena off, which keeps a worker's memory lowest: what the
# arena (on by default, shrunk after large inputs) buys, in the same run
ARENA_OFF = "ocrfleet, CPU arena off"
FLEETS = {"ocrfleet": {}, ARENA_OFF: {"OCR_ORT_CPU_ARENA": "false"}}
FIGURES = ("1 client", "4 clients", "scans, 4 clients")
# (ratio, its strongest-setup key, what, unit, ocrfleet's goal: pages/s at least, latency at most)
COMPARED = (("1 client", "1 client", "dense A4, 1 client", "pages/s", None),
            ("4 clients", "4 clients", "dense A4, 4 clients", "pages/s", THROUGHPUT_GOAL),
            ("pdf_latency", "pdf", "one {pdf_pages}-page PDF", "latency", PDF_LATENCY_GOAL),
            ("scans, 4 clients", "scans, 4 clients", "300-dpi A4 scans, 4 clients", "pages/s",
             None))


def requirements() -> list[str]:
    """The PaddleX serving install, pinned to what ocrfleet's own venv runs."""
    return [f"paddlex[ocr-core,serving]=={importlib.metadata.version('paddlex')}",
            f"onnxruntime=={importlib.metadata.version('onnxruntime')}"]


def ensure_venv() -> Path:
    """bench/paddlex-venv's `paddlex`, built once per requirements() (else an OSError or a
    SubprocessError)."""
    paddlex, stamp, wanted = VENV / "bin/paddlex", VENV / ".ocrfleet-requirements", requirements()
    if paddlex.is_file() and stamp.is_file() and stamp.read_text() == "\n".join(wanted):
        return paddlex
    report.say(f"building {VENV} ({', '.join(wanted)}); a few minutes, once")
    venv.create(VENV, with_pip=True, clear=True)
    subprocess.run([str(VENV / "bin" / "python"), "-m", "pip", "install", "--quiet", *wanted],
                   check=True, timeout=1800, env={**os.environ, "PYTHONPATH": ""})
    stamp.write_text("\n".join(wanted))
    return paddlex


def pipeline_config(threads: int) -> Path:
    """PaddleX's own OCR.yaml (of the pinned version) on onnxruntime with `threads` threads, the
    optional modules off, ocrfleet's local model dirs, the 10-page PDF cap lifted."""
    shipped = Path(importlib.util.find_spec("paddlex").origin).parent / "configs" / \
        "pipelines" / "OCR.yaml"
    config = yaml.safe_load(shipped.read_text())
    config.pop("SubPipelines", None)
    config["SubModules"].pop("TextLineOrientation", None)
    det_name, det_dir, rec_name, rec_dir = WorkerConfig().model_paths()
    config["SubModules"]["TextDetection"].update(model_name=det_name, model_dir=det_dir)
    config["SubModules"]["TextRecognition"].update(model_name=rec_name, model_dir=rec_dir)
    config.update(use_doc_preprocessor=False, use_textline_orientation=False, engine="onnxruntime",
                  engine_config={"intra_op_num_threads": threads, "inter_op_num_threads": 1},
                  Serving={"extra": {"max_num_input_imgs": None}})
    path = SERVING_DIR / f"OCR-{threads}-threads.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def setups(cores: int) -> dict[str, dict]:
    """PaddleX's default (one process, every core, serial pipeline calls), the same with
    concurrent calls, and one serial process per core behind nginx (ocrfleet's own shape)."""
    return {f"paddlex {n} x {threads} threads, {'serial' if serial else 'concurrent'} calls":
            {"instances": n, "threads": threads, "serial_pipeline_calls": serial}
            for n, threads, serial in ((1, cores, True), (1, cores, False), (cores, 1, True))}


def start_paddlex(stack, paddlex: Path, setup: dict, log_dir: Path) -> tuple[str, list]:
    """The setup's processes, started (until `stack` closes) and ready; its URL and processes."""
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
    if len(ports) > 1:  # nginx in front, balancing over them
        ports.insert(0, free_port())
        processes.append(local_fleet.nginx_process(
            [f"127.0.0.1:{p}" for p in ports[1:]], log_dir / f"nginx-{ports[1]}", ports[0],
            "/health"))
    stack.enter_context(local_fleet.running(processes, timeout=600))
    return f"http://127.0.0.1:{ports[0]}", processes


def measure_side(url: str, payloads: list, clients: int, requests: int, processes) -> dict:
    """One figure of one side: pages over the whole run's time, other processes' load."""
    with ForeignLoad(processes) as foreign:
        load = run_closed_loop(url, payloads, clients, total_requests=requests, timeout=900)
    done = [c for c in load.completions if c.ok]
    return {"clients": clients, "pages": sum(c.pages for c in done), "seconds": load.wall_s,
            "pages_per_s": sum(c.pages for c in done) / load.wall_s,
            "failures": load.failure_count, "failure_kinds": dict(load.failures.most_common(3)),
            "latency_s": min((c.finished - c.started for c in done), default=None),
            "other_load_cores": round(foreign.cores, 2)}


def measure() -> dict:
    """Every side, figure by figure (interleaved), or {"skipped": why}."""
    pages = report.knob("BENCH_PADDLEX_PAGES", 8, 4)
    pdf_pages = report.knob("BENCH_PADDLEX_PDF_PAGES", 16, 8)
    scan_pages = report.knob("BENCH_PADDLEX_SCANS", 8, 4)
    try:
        paddlex = ensure_venv()
    except (OSError, subprocess.SubprocessError) as exc:
        why = f"could not build {VENV.relative_to(REPO_ROOT)} ({type(exc).__name__}: {exc})"
        report.say(f"bench-paddlex skipped: {why[:300]}")
        return {"skipped": why[:300], **report.stamp()}
    cores, log_dir, images = os.cpu_count() or 2, report.log_dir("paddlex"), dense_page_payloads(4)
    scans = dense_scan_payloads(2)
    for folder in (log_dir, SERVING_DIR / "cache"):
        folder.mkdir(parents=True, exist_ok=True)
    pdf = [make_payload(f"pdf:dense:{pdf_pages}p", documents.dense_pdf(pdf_pages), "pdf",
                        pdf_pages, labelled=True)]
    chosen, engines = setups(cores), {}
    with contextlib.ExitStack() as stack:
        sides = {name: start_paddlex(stack, paddlex, setup, log_dir)
                 for name, setup in chosen.items()}
        for name, env in FLEETS.items():
            workers = stack.enter_context(local_fleet.workers(
                2, local_fleet.real_worker_env(max(1, cores // 2), **env), log_dir, timeout=600))
            urls = [local_fleet.url_of(w) for w in workers]
            gateway = stack.enter_context(local_fleet.gateway(urls, log_dir))
            sides[name] = (local_fleet.url_of(gateway), [gateway, *workers])
            engines[name] = report.engine_info(urls)
        for url, _ in sides.values():  # warm-up, untimed (every instance once)
            run_closed_loop(url, [images[0], scans[0]], cores, total_requests=2 * cores,
                            timeout=600)
        results: dict[str, dict] = {name: {} for name in sides}
        for label, payloads, clients, count in (
                ("1 client", images, 1, pages), ("4 clients", images, 4, 2 * pages),
                ("pdf", pdf, 1, 1), ("pdf again", pdf, 1, 1),
                ("scans, 4 clients", scans, 4, scan_pages)):
            for name, (url, processes) in sides.items():  # interleaved, figure by figure
                side = results[name][label] = measure_side(url, payloads, clients, count,
                                                           processes)
                report.say(f"  {name} {label}: {side['pages_per_s']:.3f} pages/s")
    return summarise(results, engines, cores, pdf_pages, chosen)


def summarise(results: dict, engines: dict, cores: int, pdf_pages: int, chosen: dict) -> dict:
    """Each figure against PaddleX's strongest setup for it; whether the run may be published."""
    got = {side: {**{c: runs[c]["pages_per_s"] for c in FIGURES},
                  "pdf": min(runs["pdf"]["seconds"], runs["pdf again"]["seconds"]),
                  "other": max(r["other_load_cores"] for r in runs.values())}
           for side, runs in results.items()}
    best = {**{c: max(chosen, key=lambda setup: got[setup][c]) for c in FIGURES},
            "pdf": min(chosen, key=lambda setup: got[setup]["pdf"])}
    reasons = [f"{side} scales negatively: {f['4 clients']:.3f} pages/s at 4 clients, "
               f"{f['1 client']:.3f} at 1" for side, f in got.items()
               if f["4 clients"] < SCALING_FLOOR * f["1 client"]]
    reasons += [f"other processes used {f['other']:.2f} of {cores} cores during a {side} run "
                f"(at most {MAX_OTHER_LOAD:.0%} allowed)" for side, f in got.items()
                if f["other"] > MAX_OTHER_LOAD * cores]
    return {
        "sides": results, "paddlex_setups": chosen, "strongest_paddlex": best,
        "ratio": {side: {**{c: got[side][c] / got[best[c]][c] for c in FIGURES},
                         "pdf_latency": got[side]["pdf"] / got[best["pdf"]]["pdf"]}
                  for side in results if side not in chosen},
        "pdf_latency_s": {side: f["pdf"] for side, f in got.items()}, "pdf_pages": pdf_pages,
        "failures": sum(r["failures"] for runs in results.values() for r in runs.values()),
        "ocrfleet_engine": {side: report.engine_label(e) for side, e in engines.items()},
        "ocrfleet_setup": f"gateway + 2 workers x {max(1, cores // 2)} threads, default "
                          f"settings; '{ARENA_OFF}': the same with OCR_ORT_CPU_ARENA=false",
        "goals": {"pages_per_s_4_clients": THROUGHPUT_GOAL, "pdf_latency": PDF_LATENCY_GOAL},
        "publishable": {"ok": not reasons, "reasons": reasons,
                        "rules": f"no side's pages/s at 4 clients under {SCALING_FLOOR} x its "
                                 f"pages/s at 1 client; other processes at most "
                                 f"{MAX_OTHER_LOAD:.0%} of the cores in every run"},
        **report.stamp([e for side in engines.values() for e in side]),
    }


def rows(result: dict) -> list[list]:
    if "skipped" in result:
        return [["vs PaddleX serving", f"skipped: {result['skipped']}"[:90], "-", "SKIP"]]
    made, verdict = [], result["publishable"]
    for side, ratio in result["ratio"].items():
        for key, best, what, unit, goal in (c for c in COMPARED if c[0] in ratio):
            goal, at_most = goal if side == "ocrfleet" else None, unit == "latency"
            ok = not goal or (ratio[key] <= goal if at_most else ratio[key] >= goal)
            made.append([f"{side} vs {result['strongest_paddlex'][best]}, {what.format(**result)}",
                         f"{ratio[key]:.2f}x {unit}",
                         f"{'<=' if at_most else '>='} {goal}x" if goal else "(informative)",
                         figures.verdict(ok)])
    return made + [["publishable", "yes" if verdict["ok"] else "; ".join(verdict["reasons"])[:90],
                    verdict["rules"][:60], figures.verdict(verdict["ok"])]]


def measured_figures(result: dict) -> list[str]:
    """The pages/s figures this result has (one from before the scans has two)."""
    return [c for c in FIGURES if c in result["strongest_paddlex"]]


def table(result: dict, refuse: bool = False) -> str:
    """The side by side; `refuse`: a run that is not publishable raises ValueError instead."""
    verdict = result.get("publishable",
                         {"ok": False, "reasons": [f"skipped: {result.get('skipped')}"]})
    if refuse and not verdict["ok"]:
        raise ValueError("this PaddleX run is not publishable: " + "; ".join(verdict["reasons"]))
    if "skipped" in result:
        return f"Skipped: {result['skipped']}. {report.measured(result)}."
    measured = measured_figures(result)
    by_side = [[side, *(f"{runs[c]['pages_per_s']:.3f}" for c in measured),
                f"{result['pdf_latency_s'][side]:.1f} s",
                f"{max(r['other_load_cores'] for r in runs.values()):.2f}"]
               for side, runs in result["sides"].items()]
    engines = "; ".join(f"{side}: {label}" for side, label in result["ocrfleet_engine"].items())
    best = result["strongest_paddlex"]
    return "\n".join([
        report.markdown(["side", *(f"pages/s, {c}" for c in measured),
                         f"{result['pdf_pages']}-page PDF (best of 2)",
                         "other load (cores, worst)"], by_side), "",
        report.markdown(["ocrfleet ÷ PaddleX's strongest setup for each figure",
                         *(f"{c} ({best[c]})" for c in measured), f"PDF latency ({best['pdf']})"],
                        [[side, *(f"{ratio[key]:.2f}x" for key in (*measured, "pdf_latency"))]
                         for side, ratio in result["ratio"].items()]),
        f"\nPublishable: {'yes' if verdict['ok'] else 'NO: ' + '; '.join(verdict['reasons'])} "
        f"({verdict['rules']}). ocrfleet: {result['ocrfleet_setup']}; engines: {engines}. "
        f"{report.measured(result)}."])


if __name__ == "__main__":
    sys.exit(report.main(sys.modules[__name__]))
