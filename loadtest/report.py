"""The benchmark harness's reports: where and how a result was produced (stamp()), the engine
the workers say they run (engine_info()), BENCH_* knobs, plain-text tables, JSON files under
bench/results/, the plots (matplotlib, PNG), and main(), which runs one benchmark module.

A benchmark module defines FILE (its JSON name), measure() (reads its knobs, returns the result
with stamp() in it) and rows(result) (the summary's rows: benchmark, measured, goal, verdict);
optionally wrong_answers(result), table(result) and plot(result, path) with PLOT (PNG name)."""

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

from loadtest import figures
from scripts.fleet import REPO_ROOT

HEADERS = ["benchmark", "measured", "goal", "verdict"]


def say(message: str) -> None:
    """Progress, on stderr (stdout holds the tables)."""
    print(message, file=sys.stderr, flush=True)


def quick() -> bool:
    return os.environ.get("BENCH_QUICK", "") not in ("", "0")


def knob(name: str, default: float, quick_default: float | None = None) -> int:
    """An integer BENCH_* knob: the environment's value, else the (quick) default."""
    fallback = quick_default if quick_default is not None and quick() else default
    return int(os.environ.get(name) or fallback)


def from_env(cls, knobs: dict[str, tuple[str, Callable[[str], Any]]], **quick_values):
    """A settings dataclass: its defaults (`quick_values` with BENCH_QUICK), then each knob
    set in the environment (field -> (variable, parser))."""
    values = dict(quick_values) if quick() else {}
    values.update({name: parse(os.environ[variable]) for name, (variable, parse)
                   in knobs.items() if os.environ.get(variable)})
    return cls(**values)


def names(variable: str, default: str = "") -> list[str]:
    """A comma-separated BENCH_* knob (else `default`) as its stripped, non-empty items."""
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
    model, flags = "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    bf16 = sorted(flags & {"avx512_bf16", "amx_bf16"})
    return {"cpus": os.cpu_count(), "cpu_model": model, "bf16": bool(bf16), "bf16_flags": bf16,
            "platform": platform.platform(), "python": platform.python_version(),
            "accelerator": "none (CPU only)"}


def commit() -> str:
    """The checkout's commit, with "-dirty" when files differ from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True,
                              text=True).stdout.strip()

    head = git("rev-parse", "--short=12", "HEAD") or "unknown"
    return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


_PRIVATE = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|URL")


def command() -> str:
    """How this run was started, as typed in a checkout: `python -m` the module, the BENCH_*
    knobs and the services' own settings it passed on (GATEWAY_*, OCR_*: not keys, tokens,
    passwords or URLs) in front."""
    program = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    words = ["python", *sys.argv]
    if program and program.suffix == ".py" and REPO_ROOT in program.parents:
        module = ".".join(program.relative_to(REPO_ROOT).with_suffix("").parts)
        words = ["python", "-m", module, *sys.argv[1:]]
    knobs = [f"{k}={v}" for k, v in sorted(os.environ.items())
             if k.startswith(("BENCH_", "GATEWAY_", "OCR_")) and not _PRIVATE.search(k)]
    return " ".join(knobs + words)


class _Load:
    """The machine's 1-minute load average, sampled every 5 s from begin() on."""

    def __init__(self):
        self.samples: list[float] = []
        threading.Thread(target=self._sample, daemon=True, name="loadavg").start()

    def begin(self) -> None:
        self.samples = [os.getloadavg()[0]]

    def _sample(self) -> None:
        while True:
            time.sleep(5)
            self.samples.append(os.getloadavg()[0])  # one append: atomic, no lock needed

    def summary(self) -> dict[str, Any]:
        samples, end = list(self.samples) or [os.getloadavg()[0]], os.getloadavg()[0]
        return {"loadavg_1m_start": round(samples[0], 2), "loadavg_1m_end": round(end, 2),
                "loadavg_1m_max": round(max(samples + [end]), 2), "samples": len(samples) + 1,
                "cores": os.cpu_count()}


LOAD = _Load()
begin = LOAD.begin  # a benchmark starts: the load figures in its stamp() count from here
begin()


def engine_info(urls: Sequence[str]) -> list[dict[str, str]]:
    """The engines these running workers report on /readyz (else in the labels of /metrics'
    `ocr_worker_engine_info`), each distinct one once."""
    found: list[dict[str, str]] = []
    for url in urls:
        info: dict[str, str] = {}
        try:
            info = requests.get(f"{url}/readyz", timeout=10).json().get("engine") or {}
        except (requests.RequestException, ValueError, AttributeError):
            pass
        found.append(info or _metrics_engine_info(url))
    return distinct([info for info in found if info])


def _metrics_engine_info(url: str) -> dict[str, str]:
    try:
        text = requests.get(f"{url}/metrics", timeout=10).text
    except requests.RequestException:
        return {}
    for line in text.splitlines():
        if line.startswith("ocr_worker_engine_info{"):
            labels = line[line.index("{") + 1:line.rindex("}")]
            return {k: v.strip('"') for k, v in
                    (pair.split("=", 1) for pair in labels.split('",') if "=" in pair)}
    return {}


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
    its load meanwhile, and the engines the workers reported (where it ran workers)."""
    made = {"measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": command(),
            "commit": commit(), "machine": machine(), "load": LOAD.summary()}
    if engines is not None:
        made["engines"] = distinct(engines)
    return made


# ---- writing and printing ------------------------------------------------------------------
def write_json(name: str, data: dict[str, Any]) -> Path:
    path = results_dir() / name
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[_fmt(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(cell.rjust(width) if i else cell.ljust(width)
                       for i, (cell, width) in enumerate(zip(row, widths)))
             for row in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


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
    path = write_json(bench.FILE, result)
    if hasattr(bench, "plot"):
        bench.plot(result, results_dir() / bench.PLOT)
    say(f"wrote {path}")
    return result, bench.rows(result)


def main(bench) -> int:
    """`python -m loadtest.bench_X`: run it, print its table; 1 when an answer was wrong."""
    result, rows = run(bench)
    print(bench.table(result) if hasattr(bench, "table") else table(HEADERS, rows))
    return 1 if wrong_answers(bench, result) else 0


# ---- plots ---------------------------------------------------------------------------------
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def _ticks(axis, which: str, values: list[float]) -> None:
    """Log scale (base 2 on x) with a tick at each of `values`, labelled as plain numbers."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    side = axis.xaxis if which == "x" else axis.yaxis
    (axis.set_xscale("log", base=2) if which == "x" else axis.set_yscale("log"))
    side.set_major_locator(FixedLocator(values))
    side.set_minor_locator(NullLocator())
    side.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))


def _labels(axis, xs, values, text: str, color: str, offset=(-10, 7)) -> None:
    for x, value in zip(xs, values):
        axis.annotate(text.format(value), (x, value), textcoords="offset points",
                      xytext=offset, fontsize=8, color=color)


def plot_scaling(scaling: dict[str, Any], path: Path) -> Path:
    """Three panels against the number of replicas N, each with its ideal line and goal:
    pages/s, efficiency, and the latency of one long PDF sent alone."""
    replicas = scaling["replicas"]
    page_s = scaling["service_ms"] / 1000.0
    pps, eff = scaling["pages_per_s"], scaling["efficiency"]
    base = pps[replicas.index(1)]
    latency, pages = scaling["pdf_latency_s"], scaling["pdf_pages"]
    fig, (ax_pps, ax_eff, ax_lat) = _pyplot().subplots(1, 3, figsize=(15, 4.6))
    fig.suptitle(f"ocrfleet scaling: {scaling['engine']} engine, {scaling['service_ms']:g} ms "
                 f"per page, one gateway, N replicas on loopback", fontsize=11)

    ax_pps.plot(replicas, [n * base for n in replicas], "--", color="grey",
                label="ideal: N x pages/s(1)")
    ax_pps.plot(replicas, pps, "o-", color="tab:blue", label="measured")
    _labels(ax_pps, replicas, pps, "{:.1f}", "tab:blue")
    ax_pps.set_title("Throughput (single-page requests)", fontsize=10)

    goal_n = [n for n in replicas if figures.efficiency_goal(n)]
    goals = [figures.efficiency_goal(n) for n in goal_n]
    ax_eff.axhline(1.0, linestyle="--", color="grey", label="ideal: 1.0")
    ax_eff.step(goal_n, goals, where="pre", color="tab:red", linestyle=":")
    ax_eff.plot(goal_n, goals, "v", color="tab:red", label="goal (at least)")
    ax_eff.plot(replicas, eff, "s-", color="tab:orange", label="measured")
    _labels(ax_eff, replicas, eff, "{:.3f}", "tab:orange", (-12, 7))
    ax_eff.set_ylim(min(0.8, min(eff) - 0.03), 1.05)
    ax_eff.set_title("Efficiency = pages/s(N) / (N x pages/s(1))", fontsize=10)
    ax_eff.set_ylabel("efficiency")

    ideal = [figures.ideal_pdf_latency(pages, n, page_s) for n in replicas]
    goal = [figures.pdf_latency_goal(pages, n, page_s) for n in replicas]
    ax_lat.plot(replicas, ideal, "--", color="grey", label=f"ideal: ({pages}/N) x {page_s:g} s")
    ax_lat.plot(replicas, goal, ":", color="tab:red", label="goal: <= 1.15 x ideal")
    ax_lat.plot(replicas, latency, "o-", color="tab:green", label="measured")
    for n, value in zip(replicas, latency):
        last = n == replicas[-1]
        ax_lat.annotate(f"{value:.2f} s", (n, value), textcoords="offset points",
                        xytext=(-6, 8) if last else (6, 4), ha="right" if last else "left",
                        fontsize=8, color="tab:green")
    _ticks(ax_lat, "y", [t for t in (0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 25.6)
                         if min(ideal) / 2 <= t <= max(max(latency), max(goal)) * 2])
    ax_lat.set_title(f"Latency of one {pages}-page PDF sent alone (log scale)", fontsize=10)
    ax_lat.set_ylabel("seconds")

    for axis in (ax_pps, ax_eff, ax_lat):
        _ticks(axis, "x", replicas)
        axis.set_xlabel("replicas N (log scale)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8, loc="best")
    _ticks(ax_pps, "y", [round(n * base, 0 if n * base >= 10 else 1) for n in replicas])
    ax_pps.set_ylabel("pages/s through the gateway (log scale)")
    ax_pps.set_ylim(min(pps) / 1.3, max(max(pps), replicas[-1] * base) * 1.3)
    return _save(fig, path)


def plot_fleet(fleet: dict[str, Any], path: Path) -> Path:
    """`make bench-fleet`: per shape, efficiency, the images' p95 wait and the finish spread
    against their goals; and pages/s over time while the fleet grows 16 -> 64 and shrinks."""
    shapes = fleet["shapes"]
    names = [f"{s['mode']}\nN={s['replicas']} G={s['gateways']}" for s in shapes]
    growth = fleet.get("growth") or []
    fig, axes = _pyplot().subplots(1, 4 if growth else 3, figsize=(20 if growth else 15, 4.8))
    fig.suptitle(f"ocrfleet at scale: sim engine, fleet capacity {fleet['capacity_pages_per_s']:g}"
                 f" pages/s, {fleet['documents']} x {fleet['pages']}-page PDFs + an image every "
                 f"{fleet['image_every_s']:g} s per gateway", fontsize=11)
    panels = [("efficiency", "pages/s / capacity (documents running)", 0.95, "at least"),
              ("image_p95_s", "image p95 (s)", 2.0, "at most"),
              ("finish_spread", "finish spread / makespan", 0.15, "at most")]
    for axis, (key, title, goal, sense) in zip(axes, panels):
        values = [s.get(key) or 0 for s in shapes]
        axis.bar(range(len(shapes)), values, color="tab:blue")
        axis.axhline(goal, color="tab:red", linestyle=":", label=f"goal ({sense} {goal:g})")
        for i, value in enumerate(values):
            axis.annotate(f"{value:.3g}", (i, value), ha="center", textcoords="offset points",
                          xytext=(0, 3), fontsize=8)
        axis.set_xticks(range(len(shapes)), names, fontsize=7, rotation=45, ha="right")
        axis.set_title(title, fontsize=10)
        axis.grid(alpha=0.3, axis="y")
        axis.legend(fontsize=8)
    if growth:
        axis, run = axes[3], growth[0]
        for each in growth:
            series = each["pages_per_s_by_second"]
            axis.plot([t for t, _ in series], [r for _, r in series], label=each["mode"])
        axis.axvline(run["new_replicas_ready_at_s"], color="grey", linestyle="--",
                     label="16 -> 64 ready")
        axis.axvline(run["shrunk_at_s"], color="grey", linestyle=":", label="64 -> 32")
        for n in (16, 64, 32):
            axis.axhline(n * 1000.0 / run["page_ms"], color="tab:red", linestyle=":",
                         linewidth=0.8)
        axis.set_title("growth mid-load: pages/s over 4 s", fontsize=10)
        axis.set_xlabel("seconds")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    return _save(fig, path)
