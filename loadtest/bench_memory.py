"""Worker memory on large, varied pages (issue 14): one real-engine worker answers a long run
of big page images one at a time; after each, its steady RSS (once idle) and its peak (VmHWM,
reset before the page). Goals: steady RSS grows < 10 % after page 50, the peak stays within 75 %
of the CPU overlay's memory limit; a reference run with onnxruntime's arena on and no trimming
(loadtest/README.md, "Memory", for the method and knobs). Writes memory.json."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import requests
import yaml

from loadtest import figures, local_fleet, procstats, report
from loadtest.loadgen import post_checked
from loadtest.payloads import Payload, make_payload
from samples import documents, scans
from scripts.fleet import REPO_ROOT

FILE = "memory.json"
GROWTH_GOAL = 0.10          # steady RSS growth after the first 50 pages
GROWTH_FROM = 50
HEADROOM = 0.25             # peak <= (1 - HEADROOM) x the manifest's memory limit
CPU_OVERLAY = REPO_ROOT / "deploy" / "k8s" / "overlays" / "cpu" / "worker-cpu.yaml"
CHECKPOINTS = (1, 5, 10, 25, 50, 75, 100, 120, 150, 200)
UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "K": 10**3, "M": 10**6, "G": 10**9}
# onnxruntime explicitly: its arena is what the reference is about (`auto` may pick OpenVINO,
# where OCR_ORT_CPU_ARENA changes nothing)
REFERENCE = {"OCR_BACKEND": "onnxruntime", "OCR_ORT_CPU_ARENA": "true", "OCR_TRIM_MIN_PIXELS": "0"}


def memory_limit_bytes() -> int:
    """The worker container's memory limit in the CPU overlay (e.g. "4Gi")."""
    spec = yaml.safe_load(CPU_OVERLAY.read_text())
    return parse_quantity(spec["spec"]["template"]["spec"]["containers"][0]["resources"]
                          ["limits"]["memory"])


def parse_quantity(text: str) -> int:
    suffix = next((unit for unit in UNITS if text.endswith(unit)), "")
    return int(float(text[:len(text) - len(suffix)]) * UNITS.get(suffix, 1))


def run_worker(env: dict[str, str], payloads: list[Payload], pages: int, log_dir: Path,
               name: str) -> dict[str, Any]:
    """One worker answers `pages` pages one after another; per page: steady and peak RSS, KiB."""
    rows, failures = [], Counter()
    with (local_fleet.workers(1, env, log_dir, name=name) as (worker,),
          requests.Session() as session):
        url, child = local_fleet.url_of(worker), procstats.gunicorn_worker_pid(worker.pid)
        procstats.wait_idle(child)
        started_kib = procstats.rss_kib(child)
        for number in range(1, pages + 1):
            payload = payloads[(number - 1) % len(payloads)]
            procstats.reset_peak_rss(child)
            ok, why = post_checked(session, f"{url}/ocr", payload, timeout=600)
            if not ok:
                failures[why or "?"] += 1
            procstats.wait_idle(child)
            rows.append({"page": number, "name": payload.name, "ok": ok,
                         "steady_kib": procstats.rss_kib(child),
                         "peak_kib": procstats.peak_rss_kib(child)})
            report.say(f"  memory: page {number}/{pages} {payload.name}: steady "
                       f"{rows[-1]['steady_kib'] // 1024} MiB, peak "
                       f"{rows[-1]['peak_kib'] // 1024} MiB{'' if ok else ' FAILED: ' + str(why)}")
        engines = report.engine_info([url])
    return {"pages": rows, "failures": failures.total(), "failure_kinds": dict(failures),
            "engines": engines, "rss_kib_after_start": started_kib}


def summarise(result: dict[str, Any], limit: int, cycle: int) -> dict[str, Any]:
    """Figures of one run; `cycle` = how many different pages it goes round."""
    steady = [row["steady_kib"] / 1024 for row in result["pages"]]
    peaks = [row["peak_kib"] / 1024 for row in result["pages"]]
    by_kind: dict[str, float] = {}
    for row, peak in zip(result["pages"], peaks):
        kind = row["name"].split(":")[0]
        by_kind[kind] = max(by_kind.get(kind, 0), peak)
    checkpoints = [{"pages": n, "steady_mib": steady[n - 1], "peak_so_far_mib": max(peaks[:n])}
                   for n in CHECKPOINTS if n <= len(steady)]
    # The steady level differs by a few per cent with the kind of the last page (its
    # request's buffers), so growth compares like with like: the highest steady figure over
    # the last round of pages vs over the round that ends at page 50.
    base_at = min(GROWTH_FROM, len(steady))
    return {"engine": report.engine_label(result["engines"]), "failures": result["failures"],
            "rss_mib_after_start": result["rss_kib_after_start"] / 1024,
            "steady_mib_at": {str(c["pages"]): round(c["steady_mib"], 1) for c in checkpoints},
            "checkpoints": checkpoints, "steady_growth_after": base_at,
            "steady_growth": figures.growth(max(steady[max(0, base_at - cycle):base_at]),
                                            max(steady[-cycle:])),
            "steady_max_mib": max(steady), "peak_mib": max(peaks), "peak_mib_by_kind": by_kind,
            "limit_mib": limit / (1 << 20), "peak_share_of_limit": max(peaks) * (1 << 20) / limit,
            "per_page": result["pages"]}


def run(pages: int, log_dir: Path, reference: bool) -> dict[str, Any]:
    """Ten generated scans (two of each kind) and two dense A4 pages, round and round."""
    payloads = [make_payload(name, data, "image", 1) for name, data in scans.scan_set(10, seed=0)]
    payloads += [make_payload(f"dense-a4:{i}", documents.to_png(documents.dense_page(i)),
                              "image", 1) for i in range(2)]
    limit, env = memory_limit_bytes(), local_fleet.real_worker_env(1)
    main = run_worker(env, payloads, pages, log_dir, "memory")
    out = {"pages": pages, "page_set": [p.name for p in payloads],
           "failure_kinds": main["failure_kinds"], "growth_goal": GROWTH_GOAL,
           "headroom_goal": HEADROOM, **summarise(main, limit, len(payloads))}
    if reference:
        ref = run_worker({**env, **REFERENCE}, payloads, len(payloads), log_dir,
                         "memory-reference")
        out["reference"] = {"settings": " ".join(f"{k}={v}" for k, v in REFERENCE.items()),
                            **summarise(ref, limit, len(payloads))}
        out["failures"] += ref["failures"]
    return {**out, **report.stamp(main["engines"])}


def rows(result: dict[str, Any]) -> list[list[Any]]:
    growth_ok = result["steady_growth"] < result["growth_goal"] and not result["failures"]
    steady = ", ".join(f"{n}: {mib:.0f}" for n, mib in result["steady_mib_at"].items())
    found = [
        [f"worker memory, {result['pages']} large pages: steady RSS (MiB) by page count",
         steady, "-", "info"],
        [f"worker memory: steady growth, round to page {result['steady_growth_after']} vs "
         "last round", f"{result['steady_growth'] * 100:+.1f} %",
         f"< {result['growth_goal'] * 100:.0f} %", figures.verdict(growth_ok)],
        ["worker memory: peak RSS vs the CPU overlay's limit",
         f"{result['peak_mib']:.0f} of {result['limit_mib']:.0f} MiB "
         f"({result['peak_share_of_limit'] * 100:.0f} %)",
         f"<= {(1 - result['headroom_goal']) * 100:.0f} %",
         figures.verdict(result["peak_share_of_limit"] <= 1 - result["headroom_goal"])]]
    ref = result.get("reference")
    if ref:
        ref_steady = ", ".join(f"{n}: {mib:.0f}" for n, mib in ref["steady_mib_at"].items())
        found.append(["worker memory, reference (CPU arena on, no trim): steady RSS (MiB)",
                      f"{ref_steady}; peak {ref['peak_mib']:.0f}", "-", "info"])
    return found


def table(result: dict[str, Any]) -> str:
    """Steady RSS by page count and the peak, with the reference's beside them."""
    runs = [("worker now (defaults)", result)]
    if result.get("reference"):
        runs.append((f"before: {result['reference']['settings']}", result["reference"]))
    counts = sorted({int(n) for _, run in runs for n in run["steady_mib_at"]})
    lines = [[label, round(run["rss_mib_after_start"])]
             + [round(run["steady_mib_at"][str(n)]) if str(n) in run["steady_mib_at"] else ""
                for n in counts] + [round(run["peak_mib"])] for label, run in runs]
    kinds = ", ".join(f"{kind} {mib:,.0f}" for kind, mib in
                      sorted(result["peak_mib_by_kind"].items(), key=lambda kv: -kv[1]))
    return "\n".join([
        report.markdown(["MiB", "after start"] + [f"page {n}" for n in counts] + ["peak"], lines),
        f"\nGrowth from the round ending at page {result['steady_growth_after']} to the last "
        f"round: {result['steady_growth'] * 100:+.1f} % (goal < "
        f"{result['growth_goal'] * 100:.0f} %). The peak is "
        f"{result['peak_share_of_limit'] * 100:.0f} % of the CPU overlay's "
        f"{result['limit_mib'] / 1024:g} GiB limit (goal <= "
        f"{(1 - result['headroom_goal']) * 100:.0f} %). Peaks by kind: {kinds}. Engine: "
        f"{result['engine']}. {report.measured(result)}."])


def measure() -> dict[str, Any]:
    return run(report.knob("BENCH_MEMORY_PAGES", 100, 60), report.log_dir("memory"),
               report.knob("BENCH_MEMORY_REFERENCE", 1, 0) == 1)


if __name__ == "__main__":
    sys.exit(report.main(sys.modules[__name__]))
