"""`make bench-layout-fleet` (issue 50): one 40-page PDF through the gateway's
`POST /layout-parsing` on 1, 2 and 4 real workers (one engine thread each), next to the same
PDF through `/ocr`: the seconds each took, its pages/s, and the speed-up over one worker. The
pages (samples/layout_pages.report_pdf: a numbered title, two paragraphs and a ruled table
each) must come back whole and in order: page k's Markdown starts with its own title. On a
machine with fewer cores than workers the speed-up stops at the cores: `cores` says how many
there were. Knobs: BENCH_LAYOUT_FLEET_WORKERS (1,2,4), BENCH_LAYOUT_FLEET_PAGES (40).
Writes layout-fleet.json."""

from __future__ import annotations

import base64
import os
import sys
import time
from typing import Any

import requests

from loadtest import local_fleet, report
from loadtest.procstats import ForeignLoad
from samples import layout_pages

FILE = "layout-fleet.json"
ROUTES = ("/layout-parsing", "/ocr")

Settings = report.settings("LayoutFleetSettings", {
    "workers": ([1, 2, 4], "BENCH_LAYOUT_FLEET_WORKERS", report.int_list),
    "pages": (40, "BENCH_LAYOUT_FLEET_PAGES"),
    "engine": ("paddleocr", "BENCH_LAYOUT_FLEET_ENGINE"),  # sim: the smoke test's
}, workers=[1, 2], pages=4)


def in_order(route: str, answer: dict[str, Any], pages: int) -> str | None:
    """What is wrong with the answer (None: every page there, in order)."""
    result = answer.get("result") or {}
    if route == "/ocr":
        found = result.get("ocrResults") or []
        return None if len(found) == pages else f"{len(found)} of {pages} pages"
    found = result.get("layoutParsingResults") or []
    if len(found) != pages:
        return f"{len(found)} of {pages} pages"
    for number, page in enumerate(found, 1):
        text = (page.get("markdown") or {}).get("text") or ""
        if f"{layout_pages.TITLE} {number}" not in text.split("\n", 1)[0]:
            return f"page {number} does not start with its title: {text[:60]!r}"
    return None


def _body(pdf: bytes) -> dict[str, Any]:
    """PaddleX's request: the file in base64, fileType 0 (a PDF)."""
    return {"file": base64.b64encode(pdf).decode("ascii"), "fileType": 0}


def one_fleet(count: int, pdf: bytes, settings, log_dir) -> list[dict[str, Any]]:
    """`count` real workers behind one gateway (a list): the PDF through each route once
    (after an untimed page each, so every engine has warmed up)."""
    pages = settings.pages
    env = {**local_fleet.real_worker_env(1), "OCR_ENGINE": settings.engine,
           "OCR_SIM_PAGE_MS": "1"}
    with local_fleet.workers(count, env, log_dir / f"workers-{count}", timeout=600) as workers, \
            local_fleet.gateway([local_fleet.url_of(w) for w in workers], log_dir,
                                {"GATEWAY_JOBS_ENABLED": "false"}) as gateway, \
            requests.Session() as session:
        url = local_fleet.url_of(gateway)
        warm = layout_pages.report_pdf(count)
        for route in ROUTES:
            session.post(url + route, json=_body(warm), timeout=600)
        runs = []
        for route in ROUTES:
            with ForeignLoad([gateway, *workers]) as load:
                started = time.perf_counter()
                response = session.post(url + route, json=_body(pdf), timeout=1800)
                seconds = time.perf_counter() - started
            wrong = (f"HTTP {response.status_code}: {response.text[:200]}"
                     if response.status_code != 200 else in_order(route, response.json(), pages))
            runs.append({"route": route, "workers": count, "pages": pages,
                         "seconds": round(seconds, 2), "pages_per_s": round(pages / seconds, 3),
                         "right": wrong is None, "problem": wrong,
                         "fleet_cpu_s": round(load.cpu_s, 1),
                         "other_load_cores": round(load.cores, 2)})
            report.say(f"{count} worker(s) {route}: {seconds:.1f} s"
                       + (f" WRONG: {wrong}" if wrong else ""))
    return runs


def measure() -> dict[str, Any]:
    settings, log_dir = Settings.from_env(), report.log_dir("layout-fleet")
    pdf = layout_pages.report_pdf(settings.pages)
    runs = [run for count in settings.workers
            for run in one_fleet(count, pdf, settings, log_dir)]
    for run in runs:
        alone = next(r for r in runs if r["route"] == run["route"] and r["workers"] == 1)
        run["speedup"] = round(alone["seconds"] / run["seconds"], 2)
    return {"pages": settings.pages, "cores": os.cpu_count(), "engine": settings.engine,
            "runs": runs,
            "failures": sum(not run["right"] for run in runs), **report.stamp()}


def rows(result: dict[str, Any]) -> list[list[Any]]:
    """make bench's summary: each route's speed-up on the most workers measured."""
    most = max(run["workers"] for run in result["runs"])
    return [[f"{result['pages']}-page PDF, {run['route']}, {most} vs 1 worker(s)",
             f"{run['speedup']}x ({run['seconds']} s, {result['cores']} cores)", "(reported)",
             "info" if run["right"] else "WRONG"]
            for run in result["runs"] if run["workers"] == most]


def table(result: dict[str, Any]) -> str:
    rows = [[run["route"], run["workers"], run["seconds"], run["pages_per_s"],
             run["speedup"], round(run["fleet_cpu_s"] / run["seconds"], 2),
             "yes" if run["right"] else f"no: {run['problem']}",
             run["other_load_cores"]] for run in result["runs"]]
    return "\n".join([report.markdown(
        ["route", "workers", "seconds", "pages/s", "speed-up over 1 worker",
         "cores the fleet kept busy", "every page, in order", "other load (cores)"], rows),
        f"\nOne {result['pages']}-page PDF, {result['cores']} cores. "
        f"{report.measured(result)}."])


if __name__ == "__main__":
    sys.exit(report.main(sys.modules[__name__]))
