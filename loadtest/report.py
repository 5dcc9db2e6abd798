"""The benchmark harness's reports: BENCH_* knobs, where and how a result was produced
(stamp(): when, command, commit, machine, its load, the engines the workers report), Markdown
tables, JSON under bench/results/, matplotlib, and main(), which runs one benchmark module.

A benchmark module defines FILE (its JSON name) and measure() (the result, stamp() in it);
optionally rows(result) (its rows in `make bench`'s summary: HEADERS; a part of `make bench`
has them), wrong_answers(result) (else the result's "failures"), table(result) (Markdown: the
console's and the docs' table, loadtest.doc_tables) and plot(result, path) with PLOT."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import requests

from scripts.fleet import REPO_ROOT

HEADERS = ["benchmark", "measured", "goal", "verdict"]


def say(message: str) -> None:
    """Progress, on stderr (stdout holds the tables)."""
    print(message, file=sys.stderr, flush=True)


def quick() -> bool:
    return os.environ.get("BENCH_QUICK", "") not in ("", "0")


def knob(name: str, default: float, quick_default: float | None = None) -> int:
    """An integer BENCH_* knob: the environment's value, else the (quick) default."""
    return int(os.environ.get(name) or (quick_default if quick_default is not None and quick()
                                        else default))


def from_env(cls, knobs: dict[str, tuple[str, Callable[[str], Any]]], **quick_values):
    """A settings dataclass: its defaults (`quick_values` with BENCH_QUICK), then each knob set
    in the environment (field -> (variable, parser))."""
    values = dict(quick_values) if quick() else {}
    values.update({name: parse(os.environ[variable]) for name, (variable, parse)
                   in knobs.items() if os.environ.get(variable)})
    return cls(**values)


def names(variable: str, default: str = "") -> list[str]:
    """A comma-separated knob (else `default`) as its stripped, non-empty items."""
    return [word.strip() for word in (os.environ.get(variable) or default).split(",")
            if word.strip()]


def int_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def results_dir() -> Path:
    path = Path(os.environ.get("RESULTS_DIR") or REPO_ROOT / "bench" / "results")
    path.mkdir(parents=True, exist_ok=True)
    return path


def log_dir(name: str) -> Path:
    return results_dir() / "logs" / name


# ---- provenance ------------------------------------------------------------------------------
def machine() -> dict[str, Any]:
    """CPU model, cores, and whether the CPU computes in bf16 (avx512_bf16 / amx_bf16)."""
    info = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().split("\n\n")[0]
                .splitlines() if ":" in line)
    info = {key.strip(): value.strip() for key, value in info.items()}
    bf16 = sorted(set(info.get("flags", "").split()) & {"avx512_bf16", "amx_bf16"})
    return {"cpus": os.cpu_count(), "cpu_model": info.get("model name", ""), "bf16": bool(bf16),
            "bf16_flags": bf16, "platform": platform.platform(),
            "python": platform.python_version(), "accelerator": "none (CPU only)"}


def commit() -> str:
    """The checkout's commit, with "-dirty" when tracked files differ from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True,
                              text=True).stdout.strip()

    head = git("rev-parse", "--short=12", "HEAD") or "unknown"
    return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


_PRIVATE = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|URL")


def command() -> str:
    """How this run was started, as typed in a checkout: `python -m` the module, with the
    BENCH_* knobs and the services' settings (GATEWAY_*, OCR_*; no keys, tokens, passwords or
    URLs) in front."""
    program = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    words = ["python", *sys.argv]
    if program and program.suffix == ".py" and REPO_ROOT in program.parents:
        words = ["python", "-m", ".".join(program.relative_to(REPO_ROOT).with_suffix("").parts),
                 *sys.argv[1:]]
    knobs = [f"{k}={v}" for k, v in sorted(os.environ.items())
             if k.startswith(("BENCH_", "GATEWAY_", "OCR_")) and not _PRIVATE.search(k)]
    return " ".join(knobs + words)


_load: list[float] = []


def begin() -> None:
    """A benchmark starts: the load figures in its stamp() count from here."""
    _load[:] = [os.getloadavg()[0]]


def _sample_load() -> None:
    while True:  # one append at a time: atomic, no lock needed
        time.sleep(5)
        _load.append(os.getloadavg()[0])


begin()
threading.Thread(target=_sample_load, daemon=True, name="loadavg").start()


def engine_info(urls: Sequence[str]) -> list[dict[str, str]]:
    """The engines these running workers report on /readyz, each distinct one once."""
    found = []
    for url in urls:
        try:
            found.append(requests.get(f"{url}/readyz", timeout=10).json().get("engine") or {})
        except (requests.RequestException, ValueError, AttributeError):
            continue
    return distinct([info for info in found if info])


def engine_label(engines: list[dict[str, str]]) -> str:
    """One line for a table or a plot: "paddleocr PP-OCRv6_tiny_det + PP-OCRv6_tiny_rec,
    openvino bf16, cpu, 1 thread" (engines that differ joined with " | ")."""
    def one(info: dict[str, str]) -> str:
        if info.get("engine") == "sim":
            return f"sim ({float(info.get('page_ms') or 'nan'):g} ms/page)"
        threads = info.get("threads")
        return ", ".join(part for part in (
            f"{info.get('engine', '?')} {info.get('det_model', '?')} + "
            f"{info.get('rec_model', '?')}",
            " ".join(filter(None, (info.get("backend"), info.get("precision")))),
            info.get("device"),
            f"{threads} thread{'s' if threads != '1' else ''}" if threads else "") if part)
    return " | ".join(one(info) for info in distinct(engines)) or "unknown (no worker answered)"


def distinct(items: list) -> list:
    return [item for index, item in enumerate(items) if item not in items[:index]]


def stamp(engines: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """Where and how a result was produced: when, the exact command, the commit, the machine,
    its 1-minute load average meanwhile (sampled every 5 s), and the engines the workers
    reported (where it ran workers)."""
    samples = [*_load, os.getloadavg()[0]]
    made = {"measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": command(),
            "commit": commit(), "machine": machine(),
            "load": {"loadavg_1m_start": round(samples[0], 2),
                     "loadavg_1m_end": round(samples[-1], 2),
                     "loadavg_1m_max": round(max(samples), 2), "samples": len(samples),
                     "cores": os.cpu_count()}}
    if engines is not None:
        made["engines"] = distinct(engines)
    return made


# ---- writing, printing, running --------------------------------------------------------------
def write_json(name: str, data: dict[str, Any]) -> Path:
    path = results_dir() / name
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def markdown(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table: what the console prints and the docs hold (loadtest.doc_tables)."""
    out = ["| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
    return "\n".join(out + ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows])


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def measured(result: dict[str, Any]) -> str:
    """Where a result came from (stamp()), as the sentence every docs table ends with."""
    return (f"Measured {result['measured_at']} at commit {result.get('commit', '?')} on "
            f"{result['machine']['cpus']} × {result['machine']['cpu_model']}: "
            f"`{result['command']}`")


def noise(*runs: dict[str, Any]) -> str:
    """" [other load 0.4 cores]" where other processes loaded the machine during these runs."""
    worst = max((run.get("other_load_cores", 0.0) for run in runs), default=0.0)
    return f" [other load {worst:.1f} cores]" if worst >= 0.1 else ""


def wrong_answers(bench, result: dict[str, Any]) -> int:
    count = getattr(bench, "wrong_answers", None)
    return count(result) if count else result.get("failures", 0)


def run(bench) -> tuple[dict[str, Any], list[list[Any]]]:
    """One benchmark: measure, write its JSON (and plot), return the result and its rows."""
    begin()
    result = bench.measure()
    say(f"wrote {write_json(bench.FILE, result)}")
    if hasattr(bench, "plot"):
        bench.plot(result, results_dir() / bench.PLOT)
    return result, bench.rows(result) if hasattr(bench, "rows") else []


def main(bench) -> int:
    """`python -m loadtest.bench_X`: run it, print its table; 1 when an answer was wrong."""
    result, rows = run(bench)
    print(bench.table(result) if hasattr(bench, "table") else markdown(HEADERS, rows))
    return 1 if wrong_answers(bench, result) else 0


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path
