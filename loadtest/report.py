"""The benchmarks' reports: BENCH_* knobs, provenance (stamp(): when, command, commit, machine,
its load, the engines the workers report), Markdown tables, JSON under RESULTS_DIR, plots, and
main(). A benchmark module has FILE and measure(); optionally rows(result) (`make bench`'s
summary, HEADERS), wrong_answers(result) (else "failures"), table(result) (its console and docs
table, loadtest.doc_tables) and plot(result, path) with PLOT."""

from __future__ import annotations

import copy
import functools
import json
import os
import platform
import re
import subprocess
import sys
import threading
import time
from dataclasses import field, make_dataclass
from pathlib import Path
from typing import Any, Sequence

import requests

from scripts.fleet import REPO_ROOT

HEADERS = ["benchmark", "measured", "goal", "verdict"]


def say(message: str) -> None:
    """Progress, on stderr (stdout holds the tables)."""
    print(message, file=sys.stderr, flush=True)


def quick() -> bool:
    return os.environ.get("BENCH_QUICK", "") not in ("", "0")


def knob(name: str, default: float, quick_default: float | None = None) -> int:
    """An integer knob: the environment's value, else the (BENCH_QUICK) default."""
    fallback = quick_default if quick_default is not None and quick() else default
    return int(os.environ.get(name) or fallback)


def settings(name: str, knobs: dict[str, tuple], **quick_values: Any) -> type:
    """A settings dataclass from field -> (default, its BENCH_* variable or None[, a parser;
    else the default's type]). Its from_env(): the defaults (`quick_values` with BENCH_QUICK),
    then each variable set in the environment."""
    made = make_dataclass(name, [(key, Any, field(default_factory=functools.partial(
        copy.deepcopy, default))) for key, (default, *_) in knobs.items()])

    def from_env(cls):
        values = dict(quick_values) if quick() else {}
        values.update({key: (parse[0] if parse else type(default))(os.environ[variable])
                       for key, (default, variable, *parse) in knobs.items()
                       if variable and os.environ.get(variable)})
        return cls(**values)

    made.from_env = classmethod(from_env)
    return made


def names(variable: str, default: str = "") -> list[str]:
    """A comma-separated knob's non-empty items."""
    return [w.strip() for w in (os.environ.get(variable) or default).split(",") if w.strip()]


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
    first = Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines()
    info = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in first if ":" in line)}
    bf16 = sorted(set(info.get("flags", "").split()) & {"avx512_bf16", "amx_bf16"})
    return {"cpus": os.cpu_count(), "cpu_model": info.get("model name", ""), "bf16": bool(bf16),
            "bf16_flags": bf16, "platform": platform.platform(),
            "python": platform.python_version(), "accelerator": "none (CPU only)"}


def commit() -> str:
    """The checkout's commit, with "-dirty" when tracked files differ from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True,
                              text=True).stdout.strip()

    dirty = git("status", "--porcelain", "--untracked-files=no")
    return (git("rev-parse", "--short=12", "HEAD") or "unknown") + ("-dirty" if dirty else "")


_PRIVATE = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|URL")


def command() -> str:
    """The run as typed in a checkout (`python -m` the module), the BENCH_* knobs and services'
    settings (GATEWAY_*, OCR_*; no keys, tokens, passwords or URLs) in front."""
    program = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    words = ["python", *sys.argv]
    if program and program.suffix == ".py" and REPO_ROOT in program.parents:
        module = ".".join(program.relative_to(REPO_ROOT).with_suffix("").parts)
        words = ["python", "-m", module, *sys.argv[1:]]
    return " ".join([f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith(
        ("BENCH_", "GATEWAY_", "OCR_")) and not _PRIVATE.search(k)] + words)


_load: list[float] = []  # 1-minute load averages since begin(), every 5 s (appends are atomic)


def begin() -> None:
    """A benchmark starts: the load figures in its stamp() count from here."""
    _load[:] = [os.getloadavg()[0]]


def _sample_load() -> None:
    while True:
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
    """"paddleocr PP-OCRv6_tiny_det + PP-OCRv6_tiny_rec, openvino bf16, cpu, 1 thread"; engines
    that differ are joined with " | "."""
    def one(e: dict[str, str]) -> str:
        if e.get("engine") == "sim":
            return f"sim ({float(e.get('page_ms') or 'nan'):g} ms/page)"
        threads = e.get("threads")
        return ", ".join(filter(None, (
            f"{e.get('engine', '?')} {e.get('det_model', '?')} + {e.get('rec_model', '?')}",
            " ".join(filter(None, (e.get("backend"), e.get("precision")))), e.get("device"),
            threads and f"{threads} thread{'s' if threads != '1' else ''}")))
    return " | ".join(one(e) for e in distinct(engines)) or "unknown (no worker answered)"


def distinct(items: list) -> list:
    return [item for index, item in enumerate(items) if item not in items[:index]]


def stamp(engines: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """Where and how a result was made: when, the command, the commit, the machine, its load
    meanwhile, and the engines the workers reported (where it ran workers)."""
    load = [*_load, os.getloadavg()[0]]
    made = {"measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": command(),
            "commit": commit(), "machine": machine(),
            "load": {"loadavg_1m_start": round(load[0], 2), "loadavg_1m_end": round(load[-1], 2),
                     "loadavg_1m_max": round(max(load), 2), "samples": len(load),
                     "cores": os.cpu_count()}}
    return made if engines is None else {**made, "engines": distinct(engines)}


# ---- writing, printing, running --------------------------------------------------------------
def write_json(name: str, data: dict[str, Any]) -> Path:
    path = results_dir() / name
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def markdown(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (None as "-", floats to 3 decimals, or 1 from 10 on)."""
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
        return "-" if v is None else str(v)
    return "\n".join(["| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
                     + ["| " + " | ".join(map(cell, row)) + " |" for row in rows])


def measured(result: dict[str, Any]) -> str:
    """The sentence every docs table ends with: where the result came from."""
    cpu = result["machine"]
    return (f"Measured {result['measured_at']} at commit {result.get('commit', '?')} on "
            f"{cpu['cpus']} × {cpu['cpu_model']}: `{result['command']}`")


def noise(*runs: dict[str, Any]) -> str:
    """" [other load 0.4 cores]" where other processes loaded the machine during these runs."""
    worst = max((run.get("other_load_cores", 0.0) for run in runs), default=0.0)
    return f" [other load {worst:.1f} cores]" if worst >= 0.1 else ""


def wrong_answers(bench, result: dict[str, Any]) -> int:
    count = getattr(bench, "wrong_answers", None)
    return count(result) if count else result.get("failures", 0)


def run(bench) -> tuple[dict[str, Any], list[list[Any]]]:
    """One benchmark: measure, write its JSON (and plot); the result and its summary rows."""
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


def plot_row(title: str, panels: dict[str, list]):
    """A figure of one row of panels, each title: [(xs, ys, matplotlib style, label)]; the figure
    and its axes."""
    fig, axes = pyplot().subplots(1, len(panels), figsize=(5 * len(panels), 4.8))
    fig.suptitle(title, fontsize=11)
    for axis, (name, lines) in zip(axes, panels.items()):
        for xs, ys, style, label in lines:
            axis.plot(xs, ys, style, label=label)
        axis.set_title(name, fontsize=10)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    return fig, axes
