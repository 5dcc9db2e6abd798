"""The `ocrfleet batch` client on a folder of born-digital PDFs through a gateway in front of 2
real-engine workers, against those workers' capacity on the same pages sent straight to them
before and after (loadtest/README.md, "Batch client"); every JSON it wrote is checked. Goal:
>= 0.95 of capacity (issue 11)."""

import itertools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from loadtest import figures, local_fleet, procstats, report
from loadtest.checks import page_texts
from loadtest.loadgen import http_rate
from loadtest.payloads import make_payload, one_page_pdfs
from samples import documents
from scripts.fleet import REPO_ROOT

FILE = "batch_client.json"
GOAL = 0.95


def batch(fleet: list, source: Path, target: Path, concurrency: int) -> dict:
    """Run the client: its report, and the CPU of the gateway and the client (capacity lost)."""
    command = [sys.executable, "-m", "ocrfleet.cli", "batch", str(source), str(target),
               "--url", local_fleet.url_of(fleet[-1]), "--format", "json",
               "--concurrency", str(concurrency), "--no-progress"]
    client_before = procstats.self_cpu()
    with procstats.ForeignLoad(fleet[-1:]) as gateway_cpu, procstats.ForeignLoad(fleet) as foreign:
        out = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=1800,
                             env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    client_cpu = procstats.self_cpu() - client_before
    report.say("  " + out.stdout.strip().replace("\n", "\n  "))
    return {**json.loads((target / "ocrfleet-report.json").read_text()),
            "exit_code": out.returncode, "other_load_cores": round(foreign.cores, 2),
            "gateway_cpu_s": round(gateway_cpu.cpu_s, 2), "client_cpu_s": round(client_cpu, 2)}


def wrong_output(path: Path, pages: int, labelled: bool) -> bool:
    """A JSON output missing or wrong: its page count; with `labelled`, a page not naming itself."""
    texts = page_texts(json.loads(path.read_text())) if path.is_file() else []
    return len(texts) != pages or (labelled and not all(
        documents.has_page_label(text, i, pages) for i, text in enumerate(texts, start=1)))


def run(pages: int, doc_pages: int, concurrency: int, log_dir: Path,
        env: dict | None = None, per_worker: int | None = None) -> dict:
    """The benchmark; `env` (default: the real engine, 1 thread) lets a smoke test use sim."""
    env = env or local_fleet.real_worker_env(1)
    counts = [min(doc_pages, pages - first) for first in range(0, pages, doc_pages)]
    docs = [documents.labelled_pdf(size, lines_per_page=12, seed=number * 100)
            for number, size in enumerate(counts)]
    singles = itertools.islice((page for data, size in zip(docs, counts)  # the first 10 pages
                                for page in one_page_pdfs(data, min(size, 10))), 10)
    probe = [make_payload(f"page-{i}", page, "pdf", 1) for i, page in enumerate(singles)]
    per_worker = per_worker or (6 if report.quick() else 10)
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as tmp:
        source, target = Path(tmp) / "in", Path(tmp) / "out"
        source.mkdir()
        for number, data in enumerate(docs, start=1):
            (source / f"doc-{number:03d}.pdf").write_bytes(data)
        with local_fleet.workers(2, env, log_dir, name="batch") as pool:
            urls = [local_fleet.url_of(w) for w in pool]
            engines = report.engine_info(urls)
            with local_fleet.gateway(urls, log_dir, {"GATEWAY_PROCESSES": "1"}) as gateway:
                before = http_rate(pool, per_worker, probe)
                result = batch([*pool, gateway], source, target, concurrency)
                after = http_rate(pool, per_worker, probe)
        wrong = sum(wrong_output(target / f"doc-{number:03d}.json", size,
                                 env.get("OCR_ENGINE") != "sim")
                    for number, size in enumerate(counts, start=1))
    reference = (before["pages_per_s"] + after["pages_per_s"]) / 2
    rate = result["pages_per_s"] or 0.0
    report.say(f"  capacity {before['pages_per_s']:.3f} before, {after['pages_per_s']:.3f} after")
    return {"engine": report.engine_label(engines) + ", 2 workers",
            "documents": f"{len(docs)} born-digital Letter PDFs of {doc_pages} pages",
            "pages": pages, "concurrency": concurrency, "format": "json",
            "batch": result, "capacity_before": before, "capacity_after": after,
            "capacity_pages_per_s": reference, "batch_pages_per_s": rate,
            "ratio": rate / reference if reference else 0.0, "goal": GOAL, "wrong_outputs": wrong,
            "failures": result["failed"] + wrong + before["failures"] + after["failures"],
            **report.stamp(engines)}


def rows(result: dict) -> list[list]:
    batch_run = result["batch"]
    return [[f"ocrfleet batch: {result['pages']} pages, 2 real workers",
             f"{result['batch_pages_per_s']:.3f} vs capacity {result['capacity_pages_per_s']:.3f}"
             f" pages/s = {result['ratio']:.3f} (gateway {batch_run['gateway_cpu_s']:.0f} + "
             f"client {batch_run['client_cpu_s']:.0f} CPU-s)"
             + report.noise(result["capacity_before"], result["capacity_after"], batch_run),
             f">= {GOAL}", figures.verdict(result["ratio"] >= GOAL)]]


def measure() -> dict:
    return run(report.knob("BENCH_BATCH_PAGES", 200, 60), report.knob("BENCH_BATCH_DOC_PAGES", 10),
               report.knob("BENCH_BATCH_CONCURRENCY", 4), report.log_dir("batch-client"))


if __name__ == "__main__":
    sys.exit(report.main(sys.modules[__name__]))
