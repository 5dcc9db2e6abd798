"""Presenting benchmark results: plain-text tables, JSON files under bench/results/, the machine
they were measured on, and the scaling plot (matplotlib, PNG)."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from scripts.fleet import REPO_ROOT

from loadtest import figures


def results_dir() -> Path:
    path = Path(os.environ.get("RESULTS_DIR") or REPO_ROOT / "bench" / "results")
    path.mkdir(parents=True, exist_ok=True)
    return path


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": model, "platform": platform.platform(),
            "python": platform.python_version(), "accelerator": "none (CPU only)"}


def commit() -> str:
    """The checkout's commit, with "-dirty" when files differ from it."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True,
                              text=True).stdout.strip()

    head = git("rev-parse", "--short=12", "HEAD") or "unknown"
    return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def command() -> str:
    """How this run was started, as anyone would type it in a checkout: a module of the
    project as `python -m`, the knobs set in the environment (BENCH_*) in front."""
    program = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    words = list(sys.argv[1:])
    if program and program.suffix == ".py" and REPO_ROOT in program.parents:
        module = ".".join(program.relative_to(REPO_ROOT).with_suffix("").parts)
        words = ["python", "-m", module, *words]
    else:
        words = ["python", *sys.argv]
    knobs = [f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("BENCH_")]
    return " ".join(knobs + words)


def stamp() -> dict[str, Any]:
    """Where and how a result was produced, stored next to the figures."""
    return {"measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": command(),
            "commit": commit(), "machine": machine()}


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


def plot_scaling(scaling: dict[str, Any], path: Path) -> Path:
    """Three panels against the number of replicas N, each with its ideal line and goal:
    pages/s, efficiency, and the latency of one long PDF sent alone."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    replicas = scaling["replicas"]
    page_s = scaling["service_ms"] / 1000.0
    pps, eff = scaling["pages_per_s"], scaling["efficiency"]
    base = pps[replicas.index(1)]
    latency, pages = scaling["pdf_latency_s"], scaling["pdf_pages"]

    fig, (ax_pps, ax_eff, ax_lat) = plt.subplots(1, 3, figsize=(15, 4.6))
    fig.suptitle(f"ocrfleet scaling: {scaling['engine']} engine, {scaling['service_ms']:g} ms "
                 f"per page, one gateway, N replicas on loopback", fontsize=11)

    ax_pps.plot(replicas, [n * base for n in replicas], "--", color="grey",
                label="ideal: N x pages/s(1)")
    ax_pps.plot(replicas, pps, "o-", color="tab:blue", label="measured")
    for n, value in zip(replicas, pps):
        ax_pps.annotate(f"{value:.1f}", (n, value), textcoords="offset points", xytext=(-10, 7),
                        fontsize=8, color="tab:blue")
    ax_pps.set_title("Throughput (single-page requests)", fontsize=10)
    ax_pps.set_ylabel("pages/s through the gateway")

    goal_n = [n for n in replicas if figures.efficiency_goal(n)]
    ax_eff.axhline(1.0, linestyle="--", color="grey", label="ideal: 1.0")
    ax_eff.step(goal_n, [figures.efficiency_goal(n) for n in goal_n], where="pre",
                color="tab:red", linestyle=":")
    ax_eff.plot(goal_n, [figures.efficiency_goal(n) for n in goal_n], "v", color="tab:red",
                label="goal (at least)")
    ax_eff.plot(replicas, eff, "s-", color="tab:orange", label="measured")
    for n, value in zip(replicas, eff):
        ax_eff.annotate(f"{value:.3f}", (n, value), textcoords="offset points", xytext=(-12, 7),
                        fontsize=8, color="tab:orange")
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
    ax_lat.set_yscale("log")
    ticks = [t for t in (0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 25.6)
             if min(ideal) / 2 <= t <= max(max(latency), max(goal)) * 2]
    ax_lat.yaxis.set_major_locator(FixedLocator(ticks))
    ax_lat.yaxis.set_minor_locator(NullLocator())
    ax_lat.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax_lat.set_title(f"Latency of one {pages}-page PDF sent alone (log scale)", fontsize=10)
    ax_lat.set_ylabel("seconds")

    for axis in (ax_pps, ax_eff, ax_lat):
        axis.set_xscale("log", base=2)
        axis.xaxis.set_major_locator(FixedLocator(replicas))
        axis.xaxis.set_minor_locator(NullLocator())
        axis.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_xlabel("replicas N (log scale)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8, loc="best")
    ax_pps.set_yscale("log")
    ax_pps.yaxis.set_major_locator(FixedLocator([round(n * base, 0 if n * base >= 10 else 1)
                                                 for n in replicas]))
    ax_pps.yaxis.set_minor_locator(NullLocator())
    ax_pps.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax_pps.set_ylabel("pages/s through the gateway (log scale)")
    ax_pps.set_ylim(min(pps) / 1.3, max(max(pps), replicas[-1] * base) * 1.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_fleet(fleet: dict[str, Any], path: Path) -> Path:
    """`make bench-fleet`: per shape, efficiency, the images' p95 wait and the finish spread
    against their goals; and pages/s over time while the fleet grows 16 -> 64 and shrinks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = fleet["shapes"]
    names = [f"{s['mode']}\nN={s['replicas']} G={s['gateways']}" for s in shapes]
    growth = fleet.get("growth") or []
    fig, axes = plt.subplots(1, 4 if growth else 3, figsize=(20 if growth else 15, 4.8))
    fig.suptitle(f"ocrfleet at scale: sim engine, fleet capacity {fleet['capacity_pages_per_s']:g}"
                 f" pages/s, {fleet['documents']} x {fleet['pages']}-page PDFs + an image every "
                 f"{fleet['image_every_s']:g} s per gateway", fontsize=11)
    panels = [("efficiency", "pages/s / capacity (documents running)", 0.95, "at least"),
              ("image_p95_wait_s", "image p95 beyond one page time (s)", 2.0, "at most"),
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
        axis = axes[3]
        for run in growth:
            times = [t for t, _ in run["pages_per_s_by_second"]]
            rates = [r for _, r in run["pages_per_s_by_second"]]
            axis.plot(times, rates, label=f"{run['mode']}")
        run = growth[0]
        per_replica = 1000.0 / run["page_ms"]
        axis.axvline(run["new_replicas_ready_at_s"], color="grey", linestyle="--",
                     label="16 -> 64 ready")
        axis.axvline(run["shrunk_at_s"], color="grey", linestyle=":", label="64 -> 32")
        for n in (16, 64, 32):
            axis.axhline(n * per_replica, color="tab:red", linestyle=":", linewidth=0.8)
        axis.set_title("growth mid-load: pages/s over 4 s", fontsize=10)
        axis.set_xlabel("seconds")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
