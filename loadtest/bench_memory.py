"""Worker memory on large, varied pages (issue 14): one real-engine worker answers a long run
of big page images one at a time; after each, its steady RSS (once idle) and its peak (VmHWM,
reset before the page). Goals: steady RSS grows < 10 % after page 50, the peak stays within 75 %
of the CPU overlay's memory limit; a reference run with onnxruntime's arena on and no trimming
(loadtest/README.md, "Memory", for the method and knobs). Writes memory.json."""

import sys
from pathlib import Path
from typing import Any

import yaml

from loadtest import figures, local_fleet, procstats, report
from loadtest.loadgen import worker_rss
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


def memory_limit_bytes(quantity: str = "") -> int:
    """A quantity ("3Gi") in bytes; by default the CPU overlay's worker memory limit."""
    text = quantity or yaml.safe_load(CPU_OVERLAY.read_text())["spec"]["template"]["spec"][
        "containers"][0]["resources"]["limits"]["memory"]
    suffix = next((unit for unit in UNITS if text.endswith(unit)), "")
    return int(float(text[:len(text) - len(suffix)]) * UNITS.get(suffix, 1))


def run_worker(env: dict[str, str], payloads: list[Payload], pages: int, log_dir: Path,
               name: str, limit: int) -> dict[str, Any]:
    """One worker answers `pages` of `payloads`, round and round, one at a time: the figures of
    its steady RSS after each page and its peak during each (MiB)."""
    rows: list[dict[str, Any]] = []

    def page(child: int, number: int, done) -> None:
        procstats.wait_idle(child)
        rows.append({"page": number, "name": payloads[(number - 1) % len(payloads)].name,
                     "ok": done.ok, "steady_kib": procstats.rss_kib(child),
                     "peak_kib": procstats.peak_rss_kib(child)})
        procstats.reset_peak_rss(child)  # for the next page
        report.say(f"  {name}: {rows[-1]}")

    ran = worker_rss(env, payloads, pages, 1, 600, log_dir, name, page)
    steady, peaks = ([row[key] / 1024 for row in rows] for key in ("steady_kib", "peak_kib"))
    kinds = [row["name"].split(":")[0] for row in rows]
    checkpoints = [{"pages": n, "steady_mib": steady[n - 1], "peak_so_far_mib": max(peaks[:n])}
                   for n in CHECKPOINTS if n <= len(steady)]
    # The steady level differs by a few per cent with the kind of the last page (its
    # request's buffers), so growth compares like with like: the highest steady figure over
    # the last round of pages vs over the round that ends at page 50.
    base_at, cycle = min(GROWTH_FROM, len(steady)), len(payloads)
    return {"engine": report.engine_label(ran["engines"]), "engines": ran["engines"],
            "failures": ran["load"].failure_count, "failure_kinds": dict(ran["load"].failures),
            "rss_mib_after_start": ran["start_kib"] / 1024,
            "steady_mib_at": {str(c["pages"]): round(c["steady_mib"], 1) for c in checkpoints},
            "checkpoints": checkpoints, "steady_growth_after": base_at,
            "steady_growth": figures.growth(max(steady[max(0, base_at - cycle):base_at]),
                                            max(steady[-cycle:])),
            "steady_max_mib": max(steady), "peak_mib": max(peaks),
            "peak_mib_by_kind": {k: max(p for k2, p in zip(kinds, peaks) if k2 == k)
                                 for k in kinds},
            "limit_mib": limit / (1 << 20), "peak_share_of_limit": max(peaks) * (1 << 20) / limit,
            "per_page": rows}


def run(pages: int, log_dir: Path, reference: bool) -> dict[str, Any]:
    """Ten generated scans (two of each kind) and two dense A4 pages, round and round."""
    payloads = [make_payload(name, data, "image", 1) for name, data in scans.scan_set(10, seed=0)]
    payloads += [make_payload(f"dense-a4:{i}", documents.to_png(documents.dense_page(i)),
                              "image", 1) for i in range(2)]
    limit, env = memory_limit_bytes(), local_fleet.real_worker_env(1)
    out = {"pages": pages, "page_set": [p.name for p in payloads], "growth_goal": GROWTH_GOAL,
           "headroom_goal": HEADROOM, **run_worker(env, payloads, pages, log_dir, "memory", limit)}
    if reference:
        ref = run_worker({**env, **REFERENCE}, payloads, len(payloads), log_dir,
                         "memory-reference", limit)
        out["reference"] = {"settings": " ".join(f"{k}={v}" for k, v in REFERENCE.items()), **ref}
        out["failures"] += ref["failures"]
    return {**out, **report.stamp(out["engines"])}


def _steady(run: dict[str, Any]) -> str:
    return ", ".join(f"{n}: {mib:.0f}" for n, mib in run["steady_mib_at"].items())


def rows(result: dict[str, Any]) -> list[list[Any]]:
    growth, share, most = (result["steady_growth"], result["peak_share_of_limit"],
                           1 - result["headroom_goal"])
    found = [[f"worker memory, {result['pages']} large pages: steady RSS (MiB) by page count",
              _steady(result), "-", "info"],
             [f"worker memory: steady growth, round to page {result['steady_growth_after']} vs "
              "last round", f"{growth * 100:+.1f} %", f"< {result['growth_goal'] * 100:.0f} %",
              figures.verdict(growth < result["growth_goal"] and not result["failures"])],
             ["worker memory: peak RSS vs the CPU overlay's limit",
              f"{result['peak_mib']:.0f} of {result['limit_mib']:.0f} MiB ({share * 100:.0f} %)",
              f"<= {most * 100:.0f} %", figures.verdict(share <= most)]]
    if ref := result.get("reference"):
        found.append(["worker memory, reference (CPU arena on, no trim): steady RSS (MiB)",
                      f"{_steady(ref)}; peak {ref['peak_mib']:.0f}", "-", "info"])
    return found


def table(result: dict[str, Any]) -> str:
    """Steady RSS by page count and the peak, with the reference's beside them."""
    runs = [("worker now (defaults)", result)] + [
        (f"before: {ref['settings']}", ref) for ref in [result.get("reference")] if ref]
    counts = sorted({n for _, run in runs for n in run["steady_mib_at"]}, key=int)
    lines = [[label, round(run["rss_mib_after_start"]), *(round(run["steady_mib_at"][n]) if n in
              run["steady_mib_at"] else "" for n in counts), round(run["peak_mib"])]
             for label, run in runs]
    kinds = ", ".join(f"{kind} {mib:,.0f}" for kind, mib in
                      sorted(result["peak_mib_by_kind"].items(), key=lambda kv: -kv[1]))
    return "\n".join([
        report.markdown(["MiB", "after start", *(f"page {n}" for n in counts), "peak"], lines),
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
