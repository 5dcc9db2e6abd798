"""Worker memory on large, varied pages (issue 14): one real-engine worker answers a long run
of big page images one at a time; after each, its steady RSS (once idle) and its peak (VmHWM,
reset before the page). Goals: steady RSS grows < 10 % after page 50, the peak stays within 75 %
of the CPU overlay's memory limit; a reference run with onnxruntime's arena on and no trimming
(loadtest/README.md, "Memory", for the method and knobs). Writes memory.json."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import requests
import yaml

from loadtest import figures, local_fleet, procstats, report
from loadtest.loadgen import post_checked
from loadtest.payloads import Payload, make_payload
from samples import documents, scans
from scripts.fleet import REPO_ROOT

GROWTH_GOAL = 0.10          # steady RSS growth after the first 50 pages
GROWTH_FROM = 50
HEADROOM = 0.25             # peak <= (1 - HEADROOM) x the manifest's memory limit
CPU_OVERLAY = REPO_ROOT / "deploy" / "k8s" / "overlays" / "cpu" / "worker-cpu.yaml"
CHECKPOINTS = (1, 5, 10, 25, 50, 75, 100, 120, 150, 200)
MIB = 1024 * 1024
FILE = "memory.json"


def page_payloads() -> list[Payload]:
    """Ten generated scans (two of each kind) and two dense A4 pages, as JSON bodies."""
    return [make_payload(name, data, "image", 1) for name, data in scans.scan_set(10, seed=0)] \
        + [make_payload(f"dense-a4:{i}", documents.to_png(documents.dense_page(i)), "image", 1)
           for i in range(2)]


def memory_limit_bytes() -> int:
    """The worker container's memory limit in the CPU overlay (e.g. "4Gi")."""
    spec = yaml.safe_load(CPU_OVERLAY.read_text())
    container = spec["spec"]["template"]["spec"]["containers"][0]
    return parse_quantity(container["resources"]["limits"]["memory"])


def parse_quantity(text: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "K": 10**3, "M": 10**6, "G": 10**9}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * factor)
    return int(text)


def soak(url: str, child: int, payloads: list[Payload], pages: int) -> dict[str, Any]:
    """Send `pages` pages one after another; per page: steady and peak RSS in KiB."""
    rows = []
    failures: dict[str, int] = {}
    with requests.Session() as session:
        for number in range(1, pages + 1):
            payload = payloads[(number - 1) % len(payloads)]
            procstats.wait_idle(child)
            procstats.reset_peak_rss(child)
            ok, why = post_checked(session, f"{url}/ocr", payload, timeout=600)
            if not ok:
                failures[why or "?"] = failures.get(why or "?", 0) + 1
            procstats.wait_idle(child)
            rows.append({"page": number, "name": payload.name, "ok": ok,
                         "steady_kib": procstats.rss_kib(child),
                         "peak_kib": procstats.peak_rss_kib(child)})
            report.say(f"  memory: page {number}/{pages} {payload.name}: steady "
                       f"{rows[-1]['steady_kib'] // 1024} MiB, peak "
                       f"{rows[-1]['peak_kib'] // 1024} MiB{'' if ok else ' FAILED: ' + str(why)}")
    return {"pages": rows, "failures": sum(failures.values()), "failure_kinds": failures}


def run_worker(env: dict[str, str], payloads: list[Payload], pages: int, log_dir: Path,
               name: str) -> dict[str, Any]:
    with local_fleet.workers(1, env, log_dir, name=name) as (worker,):
        child = procstats.gunicorn_worker_pid(worker.pid)
        procstats.wait_idle(child)
        started_kib = procstats.rss_kib(child)
        result = soak(local_fleet.url_of(worker), child, payloads, pages)
        result["engines"] = report.engine_info([local_fleet.url_of(worker)])
    result["rss_kib_after_start"] = started_kib
    return result


def summarise(result: dict[str, Any], limit: int, cycle: int) -> dict[str, Any]:
    """Figures of one run; `cycle` = how many different pages it goes round."""
    rows = result["pages"]
    steady = [r["steady_kib"] for r in rows]
    peaks = [r["peak_kib"] for r in rows]
    checkpoints = [{"pages": n, "steady_mib": steady[n - 1] / 1024,
                    "peak_so_far_mib": max(peaks[:n]) / 1024}
                   for n in CHECKPOINTS if n <= len(rows)]
    by_kind: dict[str, int] = {}
    for r in rows:
        kind = r["name"].split(":")[0]
        by_kind[kind] = max(by_kind.get(kind, 0), r["peak_kib"])
    # The steady level differs by a few per cent with the kind of the last page (its
    # request's buffers), so growth compares like with like: the highest steady figure over
    # the last round of pages vs over the round that ends at page 50.
    base_at = min(GROWTH_FROM, len(rows))
    first = steady[max(0, base_at - cycle):base_at]
    growth = figures.growth(max(first), max(steady[-cycle:]))
    peak = max(peaks) * 1024
    return {
        "rss_mib_after_start": result["rss_kib_after_start"] / 1024,
        "steady_mib_at": {str(c["pages"]): round(c["steady_mib"], 1) for c in checkpoints},
        "checkpoints": checkpoints,
        "steady_growth_after": base_at,
        "steady_growth": growth,
        "steady_max_mib": max(steady) / 1024,
        "peak_mib": peak / MIB,
        "peak_mib_by_kind": {k: v / 1024 for k, v in by_kind.items()},
        "limit_mib": limit / MIB,
        "peak_share_of_limit": peak / limit,
    }


def run(pages: int, log_dir: Path, reference: bool) -> dict[str, Any]:
    payloads = page_payloads()
    limit = memory_limit_bytes()
    env = local_fleet.real_worker_env(1)
    main = run_worker(env, payloads, pages, log_dir, "memory")
    out: dict[str, Any] = {
        "engine": report.engine_label(main["engines"]),
        "pages": pages,
        "page_set": [p.name for p in payloads],
        "failures": main["failures"],
        "failure_kinds": main["failure_kinds"],
        "growth_goal": GROWTH_GOAL,
        "headroom_goal": HEADROOM,
        **summarise(main, limit, len(payloads)),
        "per_page": main["pages"],
    }
    if reference:
        # onnxruntime explicitly: its arena is what the reference is about (`auto` may pick
        # OpenVINO, where OCR_ORT_CPU_ARENA changes nothing)
        ref_env = {**env, "OCR_BACKEND": "onnxruntime", "OCR_ORT_CPU_ARENA": "true",
                   "OCR_TRIM_MIN_PIXELS": "0"}
        ref = run_worker(ref_env, payloads, len(payloads), log_dir, "memory-reference")
        out["reference"] = {"settings": "OCR_BACKEND=onnxruntime OCR_ORT_CPU_ARENA=true "
                                        "OCR_TRIM_MIN_PIXELS=0",
                            "engine": report.engine_label(ref["engines"]),
                            "failures": ref["failures"], **summarise(ref, limit, len(payloads)),
                            "per_page": ref["pages"]}
        out["failures"] += ref["failures"]
    return {**out, **report.stamp(main["engines"])}


def goals_met(result: dict[str, Any]) -> tuple[bool, bool]:
    growth_ok = result["steady_growth"] < result["growth_goal"]
    peak_ok = result["peak_share_of_limit"] <= 1 - result["headroom_goal"]
    return growth_ok, peak_ok


def rows(result: dict[str, Any]) -> list[list[Any]]:
    growth_ok, peak_ok = goals_met(result)
    steady = ", ".join(f"{n}: {mib:.0f}" for n, mib in result["steady_mib_at"].items())
    table = [
        [f"worker memory, {result['pages']} large pages: steady RSS (MiB) by page count",
         steady, "-", "info"],
        [f"worker memory: steady growth, round to page {result['steady_growth_after']} vs last "
         "round",
         f"{result['steady_growth'] * 100:+.1f} %", f"< {result['growth_goal'] * 100:.0f} %",
         figures.verdict(growth_ok and not result["failures"])],
        ["worker memory: peak RSS vs the CPU overlay's limit",
         f"{result['peak_mib']:.0f} of {result['limit_mib']:.0f} MiB "
         f"({result['peak_share_of_limit'] * 100:.0f} %)",
         f"<= {(1 - result['headroom_goal']) * 100:.0f} %", figures.verdict(peak_ok)],
    ]
    ref = result.get("reference")
    if ref:
        ref_steady = ", ".join(f"{n}: {mib:.0f}" for n, mib in ref["steady_mib_at"].items())
        table.append(["worker memory, reference (CPU arena on, no trim): steady RSS (MiB)",
                      f"{ref_steady}; peak {ref['peak_mib']:.0f}", "-", "info"])
    return table


def measure() -> dict[str, Any]:
    reference = report.knob("BENCH_MEMORY_REFERENCE", 1, 0) == 1
    return run(report.knob("BENCH_MEMORY_PAGES", 100, 60), report.log_dir("memory"), reference)


if __name__ == "__main__":
    sys.exit(report.main(sys.modules[__name__]))
