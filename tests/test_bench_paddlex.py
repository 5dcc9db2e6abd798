"""The PaddleX side by side's verdicts (loadtest/bench_paddlex.py), on made-up figures: each
figure is compared with PaddleX's strongest setup for it, and a run in which a side scales
negatively with clients, or other processes took the cores, is refused publication."""

from __future__ import annotations

import pytest

from loadtest import bench_paddlex

CHOSEN = bench_paddlex.setups(2)
SETUPS = list(CHOSEN)  # their names


def figures(one: float, four: float, pdf: float, other: float = 0.0,
            scans: float | None = None) -> dict:
    def run(pps, seconds):
        return {"pages_per_s": pps, "seconds": seconds, "failures": 0, "other_load_cores": other}
    scans = scans or four / 3
    return {"1 client": run(one, 8 / one), "4 clients": run(four, 16 / four),
            "pdf": run(16 / pdf, pdf), "pdf again": run(16 / (pdf + 1), pdf + 1),
            "scans, 4 clients": run(scans, 8 / scans)}


def summary(**overrides) -> dict:
    sides = {SETUPS[0]: figures(0.30, 0.30, 60, scans=0.15), SETUPS[1]: figures(0.28, 0.33, 70),
             SETUPS[2]: figures(0.20, 0.36, 50), "ocrfleet": figures(0.45, 0.80, 20),
             bench_paddlex.ARENA_OFF: figures(0.32, 0.42, 40)}
    sides.update(overrides)
    engines = {"ocrfleet": [], bench_paddlex.ARENA_OFF: []}
    return bench_paddlex.summarise(sides, engines, 2, 16, CHOSEN)


def test_each_figure_is_compared_with_paddlexs_strongest_setup_for_it():
    result = summary()
    assert result["strongest_paddlex"] == {"1 client": SETUPS[0], "4 clients": SETUPS[2],
                                           "scans, 4 clients": SETUPS[0], "pdf": SETUPS[2]}
    assert result["ratio"]["ocrfleet"]["scans, 4 clients"] == pytest.approx(0.80 / 3 / 0.15)
    assert result["ratio"]["ocrfleet"]["1 client"] == pytest.approx(0.45 / 0.30)
    assert result["ratio"]["ocrfleet"]["4 clients"] == pytest.approx(0.80 / 0.36)
    assert result["ratio"][bench_paddlex.ARENA_OFF]["pdf_latency"] == pytest.approx(40 / 50)
    assert result["publishable"]["ok"]
    assert "2.22x" in bench_paddlex.table(result, refuse=True)  # 0.80 / 0.36 pages/s, 4 clients


def test_a_run_from_before_the_scans_figure_still_renders():
    result = summary()
    for figures_of in (result["strongest_paddlex"], *result["ratio"].values(),
                       *result["sides"].values()):
        figures_of.pop("scans, 4 clients")
    text = bench_paddlex.table(result, refuse=True)
    assert "scans" not in text and "2.22x" in text
    assert all("scans" not in row[0] for row in bench_paddlex.rows(result))


def test_negative_scaling_or_a_busy_machine_is_not_published():
    scaled_down = summary(**{SETUPS[0]: figures(0.30, 0.25, 60)})
    assert not scaled_down["publishable"]["ok"]
    assert "scales negatively" in scaled_down["publishable"]["reasons"][0]
    with pytest.raises(ValueError, match="not publishable"):
        bench_paddlex.table(scaled_down, refuse=True)
    busy = summary(ocrfleet=figures(0.45, 0.80, 20, other=0.9))
    assert not busy["publishable"]["ok"] and "other processes" in \
        busy["publishable"]["reasons"][0]
    assert "NO:" in bench_paddlex.table(busy)  # printed, not published


def test_a_skipped_run_prints_its_reason_and_is_not_published():
    skipped = {"skipped": "could not build bench/paddlex-venv (no network)",
               "measured_at": "2026-01-01T00:00:00+0000", "commit": "abc", "command": "make",
               "machine": {"cpus": 2, "cpu_model": "CPU"}}
    assert "no network" in bench_paddlex.table(skipped)
    with pytest.raises(ValueError, match="not publishable"):
        bench_paddlex.table(skipped, refuse=True)
