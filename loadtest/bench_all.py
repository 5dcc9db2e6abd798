"""`make bench`: every benchmark, one summary table, JSON and a PNG plot under bench/results/.

1. fleet scaling, sim engine, N = 1..16 replicas behind the gateway (loadtest/bench_scaling.py)
   -> scaling.json, scaling.png
1b. flow control under overload: 8 long PDFs + a stream of images, 10x burst, sim engine
   (loadtest/bench_overload.py) -> overload.json
2. real engine, 1 vs 2 workers x 1 thread, and HTTP vs in-process serving overhead, dense A4
   pages (loadtest/bench_engine.py) -> engine.json
3. worker RSS over a 2,000-request soak (loadtest/bench_soak.py) -> soak.json
4. worker memory on large varied pages: steady and peak RSS per page count
   (loadtest/bench_memory.py) -> memory.json
5. batching on/off (loadtest/bench_batching.py) -> batching.json
6. the ocrfleet batch client, 200 pages through 2 real workers vs their capacity
   (loadtest/bench_batch.py) -> batch_client.json
6b. the page cache, sim and real engine: cold, warm, a batch re-run, a miss's cost
   (loadtest/bench_cache.py) -> cache.json
7. side by side with PaddleX's official serving (loadtest/bench_paddlex.py) -> paddlex.json;
   skipped with the reason when its venv (bench/paddlex-venv) cannot be built
The summary goes to summary.json. About 50 minutes on 2 cores (plus building the PaddleX venv
once); BENCH_QUICK=1 shortens every part, BENCH_SKIP=batching,memory,soak,engine,overload,
scaling,batch-client,cache,paddlex leaves parts out. Each part's own knobs are in its module
docstring.

Exit status 0 when every part ran and every answer was right; goals missed show as FAIL in the
table (they are measurements, not errors)."""

from __future__ import annotations

import os
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
    skip = {part.strip() for part in os.environ.get("BENCH_SKIP", "").split(",") if part.strip()}
    rows: list[list[Any]] = []
    summary: dict[str, Any] = {"parts": {}, **report.stamp()}
    broken = False
    started = time.monotonic()
    for name, bench in PARTS.items():
        if name in skip:
            continue
        print(f"== {name} ==", file=sys.stderr, flush=True)
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
