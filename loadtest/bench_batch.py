"""The `ocrfleet batch` client on a folder of born-digital PDFs through a gateway in front of 2
real-engine workers, against those workers' capacity on the same pages sent straight to them,
before and after (loadtest/README.md, "Batch client"). Goal: >= 0.95 of capacity (issue 11).
Every JSON the client wrote is checked. Writes batch_client.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from loadtest import figures, local_fleet, procstats, report
from loadtest.checks import page_texts
from loadtest.loadgen import capacity, per_worker_rate
from loadtest.payloads import make_payload, one_page_pdfs
from samples import documents
from scripts.fleet import REPO_ROOT

FILE = "batch_client.json"
GOAL = 0.95


def make_folder(folder: Path, pages: int, doc_pages: int) -> tuple[list[bytes], list[int]]:
    """Write the documents; return each one's PDF and page count."""
    docs, counts = [], []
    for number in range((pages + doc_pages - 1) // doc_pages):
        size = min(doc_pages, pages - number * doc_pages)
        data = documents.labelled_pdf(size, lines_per_page=12, seed=number * 100)
        (folder / f"doc-{number + 1:03d}.pdf").write_bytes(data)
        docs.append(data)
        counts.append(size)
    return docs, counts


def single_pages(docs: list[bytes], counts: list[int], most: int = 10) -> list[bytes]:
    """The first pages of the folder, each as the one-page PDF the gateway sends a worker."""
    pages: list[bytes] = []
    for data, count in zip(docs, counts):
        pages += one_page_pdfs(data, count)
        if len(pages) >= most:
            break
    return pages[:most]


def worker_capacity(workers: list, pages: list[bytes], per_worker: int) -> dict[str, Any]:
    """Pages/s of the workers fed these single pages directly."""
    payloads = [make_payload(f"page-{i}", page, "pdf", 1) for i, page in enumerate(pages)]
    _, load, foreign = capacity(workers, [local_fleet.url_of(w) for w in workers], payloads,
                                per_worker)
    return {"pages_per_s": per_worker_rate(load), "pages": load.ok_count,
            "failures": load.failure_count, "other_load_cores": round(foreign.cores, 2)}


def check_outputs(folder: Path, page_counts: list[int], labelled: bool) -> int:
    """JSON outputs that are missing or wrong (page count; with the real engine, a page
    that does not name itself)."""
    wrong = 0
    for number, total in enumerate(page_counts, start=1):
        path = folder / f"doc-{number:03d}.json"
        texts = page_texts(json.loads(path.read_text())) if path.is_file() else []
        wrong += len(texts) != total or (labelled and not all(
            documents.has_page_label(text, i, total) for i, text in enumerate(texts, start=1)))
    return wrong


def batch(fleet: list, source: Path, target: Path, concurrency: int) -> dict[str, Any]:
    """Run the client; its report, plus the CPU the gateway and the client used (on this
    2-core machine they share the cores with the workers, so their CPU is capacity lost)."""
    gateway = fleet[-1]
    command = [sys.executable, "-m", "ocrfleet.cli", "batch", str(source), str(target),
               "--url", local_fleet.url_of(gateway), "--format", "json",
               "--concurrency", str(concurrency), "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    client_before = procstats.self_cpu()
    with procstats.ForeignLoad([gateway]) as gateway_cpu, procstats.ForeignLoad(fleet) as foreign:
        out = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                             timeout=1800)
    client_cpu = procstats.self_cpu() - client_before
    report.say("  " + out.stdout.strip().replace("\n", "\n  "))
    result = json.loads((target / "ocrfleet-report.json").read_text())
    return {**result, "exit_code": out.returncode, "other_load_cores": round(foreign.cores, 2),
            "gateway_cpu_s": round(gateway_cpu.cpu_s, 2), "client_cpu_s": round(client_cpu, 2)}


def run(pages: int, doc_pages: int, concurrency: int, log_dir: Path,
        env: dict[str, str] | None = None, per_worker: int | None = None) -> dict[str, Any]:
    """The benchmark; `env` (default: the real engine, 1 thread) lets a smoke test use sim
    workers."""
    per_worker = per_worker or (6 if report.quick() else 10)
    env = env or local_fleet.real_worker_env(1)
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as tmp:
        source, target = Path(tmp) / "in", Path(tmp) / "out"
        source.mkdir()
        docs, counts = make_folder(source, pages, doc_pages)
        probe = single_pages(docs, counts)
        with local_fleet.workers(2, env, log_dir, name="batch") as pool:
            urls = [local_fleet.url_of(w) for w in pool]
            engines = report.engine_info(urls)
            with local_fleet.gateway(urls, log_dir, {"GATEWAY_PROCESSES": "1"}) as gateway:
                before = worker_capacity(pool, probe, per_worker)
                report.say(f"  capacity before: {before['pages_per_s']:.3f} pages/s")
                result = batch([*pool, gateway], source, target, concurrency)
                after = worker_capacity(pool, probe, per_worker)
                report.say(f"  capacity after: {after['pages_per_s']:.3f} pages/s")
        wrong = check_outputs(target, counts, env.get("OCR_ENGINE") != "sim")
    reference = (before["pages_per_s"] + after["pages_per_s"]) / 2
    rate = result["pages_per_s"] or 0.0
    return {
        "engine": report.engine_label(engines) + ", 2 workers",
        "documents": f"{len(docs)} born-digital Letter PDFs of {doc_pages} pages",
        "pages": pages, "concurrency": concurrency, "format": "json",
        "batch": result, "capacity_before": before, "capacity_after": after,
        "capacity_pages_per_s": reference, "batch_pages_per_s": rate,
        "ratio": rate / reference if reference else 0.0, "goal": GOAL,
        "wrong_outputs": wrong,
        "failures": result["failed"] + wrong + before["failures"] + after["failures"],
        **report.stamp(engines),
    }


def rows(result: dict[str, Any]) -> list[list[Any]]:
    ratio = result["ratio"]
    return [[f"ocrfleet batch: {result['pages']} pages, 2 real workers",
             f"{result['batch_pages_per_s']:.3f} vs capacity "
             f"{result['capacity_pages_per_s']:.3f} pages/s = {ratio:.3f}"
             + f" (gateway {result['batch']['gateway_cpu_s']:.0f} + client "
             f"{result['batch']['client_cpu_s']:.0f} CPU-s)"
             + report.noise(result["capacity_before"], result["capacity_after"], result["batch"]),
             f">= {GOAL}", figures.verdict(ratio >= GOAL)]]


def measure() -> dict[str, Any]:
    return run(report.knob("BENCH_BATCH_PAGES", 200, 60), report.knob("BENCH_BATCH_DOC_PAGES", 10),
               report.knob("BENCH_BATCH_CONCURRENCY", 4), report.log_dir("batch-client"))


if __name__ == "__main__":
    sys.exit(report.main(sys.modules[__name__]))
