"""`make bench`: every benchmark in PARTS (loadtest/README.md), one summary table, each part's
JSON (and plot) under bench/results/ and summary.json. BENCH_QUICK=1 shortens every part,
BENCH_SKIP (part names) leaves parts out. Exit status 0 when every part ran and every answer was
right; a missed goal shows as FAIL in the table (a measurement, not an error)."""

from __future__ import annotations

import sys
import time
import traceback
from typing import Any

from loadtest import (bench_batch, bench_batching, bench_cache, bench_engine, bench_layout,
                      bench_layout_fleet, bench_memory, bench_overload, bench_paddlex,
                      bench_scaling, bench_soak, report)

PARTS: dict[str, Any] = {
    "scaling": bench_scaling, "overload": bench_overload, "engine": bench_engine,
    "soak": bench_soak, "memory": bench_memory, "batching": bench_batching,
    "batch-client": bench_batch, "cache": bench_cache, "paddlex": bench_paddlex,
    "layout": bench_layout, "layout-fleet": bench_layout_fleet}


def main() -> int:
    skip, broken = set(report.names("BENCH_SKIP")), False
    summary: dict[str, Any] = {"parts": {}, **report.stamp()}
    started = time.monotonic()
    for name, bench in PARTS.items():
        if name in skip:
            continue
        report.say(f"== {name} ==")
        part_started = time.monotonic()
        try:
            result, rows = report.run(bench)
        except Exception as exc:  # one broken part must not hide the others' figures
            traceback.print_exc()
            summary["parts"][name] = {"error": repr(exc), "rows": [
                [f"ERROR: {type(exc).__name__}: {exc}"[:90], "-", "-", "ERROR"]]}
            broken = True
            continue
        if hasattr(bench, "table"):
            print(bench.table(result), flush=True)
        failures = report.wrong_answers(bench, result)
        if failures:
            rows = [[f"{name}: wrong answers or errors", str(failures), "0", "FAIL"], *rows]
            broken = True
        summary["parts"][name] = {"file": bench.FILE, "rows": rows, "wrong_answers": failures,
                                  "engines": result.get("engines"),
                                  "seconds": round(time.monotonic() - part_started, 1)}
    summary["seconds"] = round(time.monotonic() - started, 1)
    path = report.write_json("summary.json", summary)
    print(table(summary))
    print(f"results: {path.parent}/")
    return 1 if broken else 0


def table(summary: dict[str, Any]) -> str:
    """One `make bench` run (summary.json): every part's rows, and the engines its workers
    reported."""
    rows = [[name, *row] for name, part in summary["parts"].items() if "rows" in part
            for row in part["rows"]]
    broken = [name for name, part in summary["parts"].items() if "error" in part]
    by_engine: dict[str, list[str]] = {}
    for name, part in summary["parts"].items():
        if part.get("engines"):
            by_engine.setdefault(report.engine_label(part["engines"]), []).append(name)
    engines = "; ".join(f"{label} ({', '.join(names)})" for label, names in by_engine.items())
    return "\n".join([
        report.markdown(["part", *report.HEADERS], rows),
        f"\nEngines, as the workers reported them: {engines}."
        + (f" Parts that failed to run: {', '.join(broken)}." if broken else "")
        + f" {report.measured(summary)} ({summary['seconds'] / 60:.0f} min)."])


if __name__ == "__main__":
    sys.exit(main())
