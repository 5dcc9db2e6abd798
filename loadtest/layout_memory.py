"""A worker's memory with and without /layout-parsing (issue 50, item 5: one worker pool or
two, docs/capacity.md "9. Layout parsing: one worker pool"): one in-process worker with the
real engine (the worker's defaults, 1 thread), its resident memory after load, then the same
pages through /ocr for BENCH_LAYOUT_MEMORY_ROUNDS rounds, then through /layout-parsing for as
many (the layout models load on the first one). Per request: the process's peak RSS during it
and its RSS after it. Writes docs/figures/layout-memory.json.
Run: python -m loadtest.layout_memory (not in make bench: minutes of CPU)."""

from __future__ import annotations

import base64
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from loadtest import procstats, report
from scripts import fetch_layout_models

FILE = Path(__file__).resolve().parent.parent / "docs" / "figures" / "layout-memory.json"
ROUNDS = int(os.environ.get("BENCH_LAYOUT_MEMORY_ROUNDS", "2"))


def pages() -> dict[str, dict[str, Any]]:
    """name -> request body: a 1-page generated report (PDF) and two 300-dpi A4 scans."""
    from samples import documents, layout_pages, scans

    def png(image) -> dict[str, Any]:
        return {"file": base64.b64encode(documents.to_png(image)).decode(), "fileType": 1}

    return {"report, 1-page PDF": {"file": base64.b64encode(layout_pages.report_pdf(1)).decode(),
                                   "fileType": 0},
            "dense text scan, A4 300 dpi": png(scans.dense_scan(0, 300)),
            "table scan, A4 300 dpi": png(scans.table_scan(0, 300))}


def mib(kib: int) -> float:
    return round(kib / 1024, 1)


def measure() -> dict[str, Any]:
    from services.ocr_worker.app import create_app
    from services.ocr_worker.config import WorkerConfig

    bodies = pages()
    app_config = WorkerConfig(threads=1)
    app = create_app(app_config)
    service = app.extensions["ocr_service"]
    pid = os.getpid()
    try:
        assert service.batcher.ready.wait(600), "the worker did not get ready"
        client = app.test_client()
        after_load = mib(procstats.rss_kib(pid))
        rows = []
        for route in ("/ocr", "/layout-parsing"):
            for turn in range(1, ROUNDS + 1):
                for name, body in bodies.items():
                    procstats.reset_peak_rss(pid)
                    started, cpu = time.monotonic(), time.process_time()
                    response = client.post(route, json=body)
                    assert response.status_code == 200, response.get_data()[:300]
                    rows.append({"route": route, "round": turn, "page": name,
                                 "peak_mib": mib(procstats.peak_rss_kib(pid)),
                                 "after_mib": mib(procstats.rss_kib(pid)),
                                 "cpu_s": round(time.process_time() - cpu, 2),
                                 "wall_s": round(time.monotonic() - started, 2)})
                    print(json.dumps(rows[-1]), flush=True)
        engine = dict(service.engine.info)
    finally:
        service.shutdown(5)

    def of(route: str, key: str) -> float:
        return max(r[key] for r in rows if r["route"] == route)

    summary = {"after_load_mib": after_load,
               "ocr_steady_max_mib": of("/ocr", "after_mib"),
               "ocr_peak_max_mib": of("/ocr", "peak_mib"),
               "layout_steady_max_mib": of("/layout-parsing", "after_mib"),
               "layout_peak_max_mib": of("/layout-parsing", "peak_mib"),
               "layout_model_files_mib": round(sum(
                   (Path(app_config.model_dir) / fetch_layout_models.SUBDIR / name).stat().st_size
                   for name in fetch_layout_models.FILES) / 2**20, 1)}
    return {"rounds": ROUNDS, "summary": summary, "requests": rows, **report.stamp([engine])}


def main() -> int:
    result = measure()
    FILE.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))
    print(f"wrote {FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
