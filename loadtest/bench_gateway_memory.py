"""Gateway memory (issues 22 and 47): the peak RSS of one gateway process group above its idle
level, for a born-digital PDF (at full and a tenth of the pages) and a scanned PDF asked back in
every format, visualize on and off, and for concurrent large uploads the memory budget answers
429 (docs/capacity.md, section 7). Four sim workers answer; with BENCH_GW_ENGINE=paddleocr two
real workers at their default settings answer the scanned PDF alone (every format, visualize
off: its answers carry real pages' text) and the file is gateway-memory-real.json. Knobs in
loadtest/README.md."""

import base64
import functools
import io
import itertools
import os
import sys
from typing import Any

import pikepdf
import requests

from loadtest import local_fleet, report
from loadtest.loadgen import at_once
from loadtest.procstats import PeakRss
from samples import documents, scans

REAL = os.environ.get("BENCH_GW_ENGINE", "sim") == "paddleocr"
FILE = "gateway-memory-real.json" if REAL else "gateway-memory.json"
BORN_DIGITAL, SCANNED = "born-digital", "scanned"
FORMATS = ("application/json", "application/x-ndjson", "text/plain", "application/pdf",
           "application/zip")


def peaks(meter: PeakRss, cases: list) -> list[dict[str, Any]]:
    """Per (row, send) case, one after another: the row, the fields send() returns, and the
    group's RSS (MB) before send, at its peak while send ran, and the growth."""
    rows = []
    for row, send in cases:
        idle = meter.now()
        with meter:
            row.update(send())
        rows.append({**row, "idle_mb": round(idle / 1024, 1),
                     "peak_mb": round(meter.peak / 1024, 1),
                     "peak_growth_mb": round((meter.peak - idle) / 1024, 1)})
        report.say(str(rows[-1]))
    return rows


def read_all(url: str, pdf: bytes, accept: str, visualize: bool) -> dict[str, float]:
    with requests.post(f"{url}/ocr", files={"file": ("doc.pdf", pdf)},
                       data={"visualize": str(visualize).lower()}, stream=True,
                       headers={"Accept": accept}, timeout=900) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{accept}: {response.status_code} {response.text[:300]}")
        size = sum(len(chunk) for chunk in response.iter_content(1 << 20))
        return {"answer_mb": round(size / 2**20, 1)}


def send_at_once(url: str, count: int, body: dict[str, Any]) -> dict[str, Any]:
    got = at_once(lambda _: requests.post(f"{url}/ocr", timeout=900, **body).status_code,
                  range(count))
    return {"answered_200": got.count(200), "answered_429": got.count(429),
            "other": sorted(s for s in got if s not in (200, 429))}


def upload(megabytes: int) -> bytes:
    """A valid PDF of `megabytes`: 50 pages, each carrying its share as an unused, uncompressed
    stream (so each page sent to a worker stays within its limit)."""
    with pikepdf.open(io.BytesIO(documents.labelled_pdf(50, lines_per_page=0))) as padded:
        for page in padded.pages:
            page.obj.Padding = pikepdf.Stream(padded, os.urandom(megabytes * 2**20 // 50))
        out = io.BytesIO()
        padded.save(out, compress_streams=False)
    return out.getvalue()


def documents_asked(pages: int, scanned: int, real: bool) -> list[tuple[str, int, bytes]]:
    """(kind, pages, PDF) of each document the formats are asked for."""
    asked = [] if real else [(BORN_DIGITAL, n, documents.dense_pdf(n))
                             for n in (max(1, pages // 10), pages)]
    return asked + ([(SCANNED, scanned, scans.scanned_pdf(scanned))] if scanned else [])


def measure() -> dict[str, Any]:
    pages, count = report.knob("BENCH_GW_PAGES", 300), report.knob("BENCH_GW_UPLOADS", 20)
    megabytes, logs = report.knob("BENCH_GW_UPLOAD_MB", 100), report.log_dir("gateway-memory")
    scanned = report.knob("BENCH_GW_SCANNED", 300)
    workers = local_fleet.workers(2, local_fleet.real_worker_env(
        max(1, (os.cpu_count() or 2) // 2)), logs, timeout=600) if REAL \
        else local_fleet.workers(4, local_fleet.sim_worker_env(
            5, OCR_QUEUE_SIZE="8", OCR_MAX_PAGES="5000"), logs)
    gateway_env = {"GATEWAY_PROCESSES": "1", "GATEWAY_HTTP_THREADS": str(count + 4)}
    with workers as started:
        urls = [local_fleet.url_of(w) for w in started]
        with local_fleet.gateway(urls, logs, gateway_env) as gateway:
            url, meter = local_fleet.url_of(gateway), PeakRss(gateway.process.pid)
            read_all(url, documents.dense_pdf(2), FORMATS[3], False)  # builders started
            formats = peaks(meter, [
                ({"document": kind, "pages": n, "format": accept, "visualize": on},
                 functools.partial(read_all, url, pdf, accept, on))
                for (kind, n, pdf), on, accept in itertools.product(
                    documents_asked(pages, scanned, REAL), (False,) if REAL else (False, True),
                    FORMATS)])
            result = {**report.stamp(report.engine_info(urls)), "gateway_env": gateway_env,
                      "formats": formats}
            if REAL:
                return result
            pdf = upload(megabytes)
            bodies = {"multipart": {"files": {"file": ("d.pdf", pdf)}},
                      "json": {"json": {"file": base64.b64encode(pdf).decode()}}}
            return {**result, "uploads": peaks(meter, [
                ({"body": name, "uploads": count, "upload_mb": megabytes},
                 functools.partial(send_at_once, url, count, body))
                for name, body in bodies.items()])}


def table(result: dict[str, Any]) -> str:
    """A row per format and visualize; a column of peak growth per document asked (results
    before the scanned PDF have born-digital rows only), the largest answer and peak RSS."""
    rows = result["formats"]
    kinds = sorted({(r.get("document", BORN_DIGITAL), r["pages"]) for r in rows},
                   key=lambda k: (k[0] != BORN_DIGITAL, -k[1]))
    cases: dict[tuple, list[dict]] = {}
    for r in rows:
        cases.setdefault((r["format"], r["visualize"]), []).append(r)
    cell = {(r["format"], r["visualize"], r.get("document", BORN_DIGITAL), r["pages"]):
            r["peak_growth_mb"] for r in rows}
    answers = [[accept, "on" if on else "off",
                *[cell.get((accept, on, *kind), "") for kind in kinds],
                max(r["answer_mb"] for r in found), max(r["peak_mb"] for r in found)]
               for (accept, on), found in cases.items()]
    lines = [report.markdown(["format", "visualize",
                              *[f"peak +MB ({n} {kind} pages)" for kind, n in kinds],
                              "largest answer MB", "peak RSS MB"], answers)]
    if result.get("uploads"):
        sent = [[u["body"], f"{u['uploads']} x {u['upload_mb']} MB", u["answered_200"],
                 u["answered_429"], u["peak_growth_mb"], u["peak_mb"]] for u in result["uploads"]]
        lines += ["", report.markdown(["uploads at once", "size", "200", "429", "peak +MB",
                                       "peak RSS MB"], sent)]
    return "\n".join([*lines, f"\n{report.measured(result)} (gateway: {result['gateway_env']})."])


if __name__ == "__main__":
    sys.exit(report.main(sys.modules[__name__]))
