"""Gateway memory (issue 22): the peak RSS of one gateway process group above its idle level,
for a dense PDF asked back in every format (visualize on and off, at full and a tenth of the
pages), and for concurrent large uploads the memory budget answers 429 (docs/capacity.md,
section 7). Four sim workers answer. Writes gateway-memory.json; knobs in loadtest/README.md."""

import base64
import io
import itertools
import os
import sys
from typing import Any, Callable

import pikepdf
import requests

from loadtest import local_fleet, report
from loadtest.loadgen import at_once
from loadtest.procstats import PeakRss
from samples import documents

FILE = "gateway-memory.json"
FORMATS = ("application/json", "application/x-ndjson", "text/plain", "application/pdf",
           "application/zip")


def peak_while(meter: PeakRss, send: Callable[[], Any]) -> tuple[dict[str, float], Any]:
    """The group's RSS before and at its peak while `send` ran, and the growth, in MiB."""
    idle = meter.now()
    with meter:
        outcome = send()
    return {"idle_mb": round(idle / 1024, 1), "peak_mb": round(meter.peak / 1024, 1),
            "peak_growth_mb": round((meter.peak - idle) / 1024, 1)}, outcome


def read_all(url: str, pdf: bytes, accept: str, visualize: bool) -> int:
    with requests.post(f"{url}/ocr", files={"file": ("doc.pdf", pdf)},
                       data={"visualize": str(visualize).lower()}, stream=True,
                       headers={"Accept": accept}, timeout=900) as response:
        size = sum(len(chunk) for chunk in response.iter_content(1 << 20))
        if response.status_code != 200:
            raise RuntimeError(f"{accept}: {response.status_code} {response.text[:200]}")
        return size


def formats(url: str, meter: PeakRss, page_counts: list[int]) -> list[dict[str, Any]]:
    pdfs = {pages: documents.dense_pdf(pages) for pages in page_counts}
    rows = []
    for pages, visualize, accept in itertools.product(page_counts, (False, True), FORMATS):
        rss, size = peak_while(meter, lambda: read_all(url, pdfs[pages], accept, visualize))
        rows.append({"pages": pages, "format": accept, "visualize": visualize,
                     "answer_mb": round(size / 2**20, 1), **rss})
        report.say(str(rows[-1]))
    return rows


def uploads(url: str, meter: PeakRss, count: int, megabytes: int) -> list[dict[str, Any]]:
    """`count` uploads at once of a valid PDF of `megabytes`: 50 pages, each carrying its share
    as an unused, uncompressed stream (so each page sent to a worker stays within its limit)."""
    with pikepdf.open(io.BytesIO(documents.labelled_pdf(50, lines_per_page=0))) as padded:
        for page in padded.pages:
            page.obj.Padding = pikepdf.Stream(padded, os.urandom(megabytes * 2**20 // 50))
        out = io.BytesIO()
        padded.save(out, compress_streams=False)
    pdf = out.getvalue()
    bodies = {"multipart": {"files": {"file": ("d.pdf", pdf)}},
              "json": {"json": {"file": base64.b64encode(pdf).decode()}}}
    rows = []
    for name, body in bodies.items():
        rss, statuses = peak_while(meter, lambda: at_once(
            lambda _: requests.post(f"{url}/ocr", timeout=900, **body).status_code, range(count)))
        rows.append({"body": name, "uploads": count, "upload_mb": megabytes,
                     "answered_200": statuses.count(200), "answered_429": statuses.count(429),
                     "other": sorted(s for s in statuses if s not in (200, 429)), **rss})
        report.say(str(rows[-1]))
    return rows


def measure() -> dict[str, Any]:
    pages = report.knob("BENCH_GW_PAGES", 300)
    count = report.knob("BENCH_GW_UPLOADS", 20)
    megabytes = report.knob("BENCH_GW_UPLOAD_MB", 100)
    logs = report.log_dir("gateway-memory")
    env = local_fleet.sim_worker_env(5, OCR_QUEUE_SIZE="8", OCR_MAX_PAGES="5000")
    gateway_env = {"GATEWAY_PROCESSES": "1", "GATEWAY_HTTP_THREADS": str(count + 4)}
    with local_fleet.workers(4, env, logs) as workers:
        urls = [local_fleet.url_of(w) for w in workers]
        engines = report.engine_info(urls)
        with local_fleet.gateway(urls, logs, gateway_env) as gateway:
            url, meter = local_fleet.url_of(gateway), PeakRss(gateway.process.pid)
            read_all(url, documents.dense_pdf(2), FORMATS[3], False)  # builders started
            rows = formats(url, meter, [max(1, pages // 10), pages])
            return {**report.stamp(engines), "gateway_env": gateway_env, "formats": rows,
                    "uploads": uploads(url, meter, count, megabytes)}


def table(result: dict[str, Any]) -> str:
    most = max(r["pages"] for r in result["formats"])
    fewer = {(r["format"], r["visualize"]): r["peak_growth_mb"] for r in result["formats"]
             if r["pages"] != most}
    answers = [[r["format"], "on" if r["visualize"] else "off", r["answer_mb"],
                r["peak_growth_mb"], fewer[(r["format"], r["visualize"])], r["peak_mb"]]
               for r in result["formats"] if r["pages"] == most]
    sent = [[u["body"], f"{u['uploads']} x {u['upload_mb']} MB", u["answered_200"],
             u["answered_429"], u["peak_growth_mb"], u["peak_mb"]] for u in result["uploads"]]
    return "\n".join([
        report.markdown(["format", "visualize", f"answer MB ({most} pages)",
                         f"peak +MB ({most} pages)", f"peak +MB ({most // 10} pages)",
                         "peak RSS MB"], answers), "",
        report.markdown(["uploads at once", "size", "200", "429", "peak +MB", "peak RSS MB"], sent),
        f"\n{report.measured(result)} (gateway: {result['gateway_env']})."])


if __name__ == "__main__":
    sys.exit(report.main(sys.modules[__name__]))
