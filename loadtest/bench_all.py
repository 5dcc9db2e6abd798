"""`make bench`: every benchmark in PARTS (loadtest/README.md lists them), one summary table,
the JSON files and plots under bench/results/ and summary.json. BENCH_QUICK=1 shortens every
part, BENCH_SKIP (comma-separated part names) leaves parts out. Exit status 0 when every part
ran and every answer was right; missed goals show as FAIL in the table (measurements, not
errors)."""

from __future__ import annotations

import sys
import time
import traceback
from typing import Any

from loadtest import (bench_batch, bench_batching, bench_cache, bench_engine, bench_memory,
                      bench_overload, bench_paddlex, bench_scaling, bench_soak, report)

PARTS: dict[str, Any] = {
    "scaling": bench_scaling, "overload": bench_overload, "engine": bench_engine,
    "soak": bench_soak, "memory": bench_memory, "batching": bench_batching,
    "batch-client": bench_batch, "cache": bench_cache, "paddlex": bench_paddlex}


def main() -> int:
    skip = set(report.names("BENCH_SKIP"))
    rows: list[list[Any]] = []
    summary: dict[str, Any] = {"parts": {}, **report.stamp()}
    broken = False
    started = time.monotonic()
    for name, bench in PARTS.items():
        if name in skip:
            continue
        report.say(f"== {name} ==")
        part_started = time.monotonic()
        try:
            result, part_rows = report.run(bench)
        except Exception as exc:  # one broken part must not hide the others' figures
            traceback.print_exc()
            rows.append([name, f"ERROR: {type(exc).__name__}: {exc}"[:90], "-", "ERROR"])
            summary["parts"][name] = {"error": repr(exc)}
            broken = True
            continue
        if hasattr(bench, "table"):
            print(bench.table(result), flush=True)
        failures = report.wrong_answers(bench, result)
        if failures:
            rows.append([f"{name}: wrong answers or errors", str(failures), "0", "FAIL"])
            broken = True
        rows.extend(part_rows)
        summary["parts"][name] = {"file": bench.FILE, "rows": part_rows,
                                  "wrong_answers": failures, "engines": result.get("engines"),
                                  "seconds": round(time.monotonic() - part_started, 1)}
    summary["rows"] = rows
    summary["seconds"] = round(time.monotonic() - started, 1)
    path = report.write_json("summary.json", summary)
    machine = summary["machine"]
    print()
    print(f"ocrfleet benchmarks ({machine['cpus']} CPUs, {machine['cpu_model'] or 'CPU'}, "
          f"bf16 {'yes' if machine['bf16'] else 'no'}, no accelerator; "
          f"{summary['seconds']:.0f} s{', BENCH_QUICK' if report.quick() else ''})")
    print(report.table(report.HEADERS, rows))
    print(f"results: {path.parent}/ (summary.json, "
          + ", ".join(bench.FILE for bench in PARTS.values()) + ", scaling.png, logs/)")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
