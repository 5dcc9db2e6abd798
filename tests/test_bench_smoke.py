"""Smoke runs of the benchmark code paths with sim workers, a gateway and a handful of requests:
the results have the shape the README and DESIGN.md section 5 promise, every answer was right,
and the reports get written. Nothing here asserts a timing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest

from loadtest import (bench_all, bench_overload, bench_scaling, bench_soak, loadgen,
                      local_fleet, procstats, report)
from scripts.fleet import REPO_ROOT

pytestmark = pytest.mark.slow  # starts servers: scheduled first (tests/conftest.py)

SCALING_KEYS = {"engine", "service_ms", "replicas", "pages_per_s", "efficiency", "pdf_pages",
                "pdf_latency_s"}


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setenv("RESULTS_DIR", str(tmp_path / "results"))
    return tmp_path / "results"


def test_scaling_benchmark_smoke(results, tmp_path):
    settings = bench_scaling.ScalingSettings(replicas=[1, 2], page_ms=50, warmup_s=0.3,
                                             measure_s=1.5, pdf_pages=4, pdf_repeats=1)
    scaling = bench_scaling.run(settings, log_dir=tmp_path / "logs")
    assert SCALING_KEYS <= set(scaling)
    assert scaling["engine"] == "sim (50 ms/page)" and scaling["replicas"] == [1, 2]
    assert scaling["engines"][0]["engine"] == "sim" and scaling["load"]["cores"]
    assert scaling["pdf_pages"] == 4 and len(scaling["pdf_latency_s"]) == 2
    assert scaling["efficiency"][0] == pytest.approx(1.0)
    assert all(value > 0 for value in scaling["pages_per_s"] + scaling["pdf_latency_s"])
    assert all(f["failures"] == 0 and not f["pdf_failures"] for f in scaling["fleets"])
    table = bench_scaling.table(scaling)
    assert "efficiency" in table and "one 4-page PDF alone" in table
    json.dumps(scaling)  # what scaling.json gets
    plot = bench_scaling.plot(scaling, tmp_path / "scaling.png")
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_overload_benchmark_smoke(results):
    settings = bench_overload.OverloadSettings(page_ms=20, docs=3, pages=6, image_every_s=0.2,
                                               fleets=[("list", 2)], overload_factor=3,
                                               overload_queue_pages=6)
    result = bench_overload.run(settings)
    (mix,) = result["mix"]
    assert mix["documents_ok"] == 3 and mix["images_ok"] == mix["images"] >= 1
    assert mix["pages_per_s"] > 0 and mix["image_p95_s"] is not None
    over = result["overload"]
    assert over["documents"] == 6 and over["refused_429"] >= 1
    assert over["admitted"] >= 1 and over["admitted_failed"] == 0
    assert over["gateway_peak_rss_mib"] > 0
    assert bench_overload.wrong_answers(result) == 0
    assert "10x overload" in bench_overload.table(result)
    json.dumps(result)


def test_soak_measures_the_forked_worker_not_the_master(results, tmp_path):
    soak = bench_soak.run(40, 20, tmp_path / "logs", sample_every=10,
                          env=local_fleet.sim_worker_env(0))
    assert soak["answered"] == 40 and soak["failures"] == 0
    assert [s["answered"] for s in soak["samples"]] == [10, 20, 30, 40]
    assert soak["rss_kib_baseline"] > 0 and soak["rss_kib_end"] > 0
    assert soak["master_rss_kib"] != soak["rss_kib_end"]  # two processes, two figures
    assert isinstance(soak["rss_growth"], float)


def test_gunicorn_worker_pid_is_a_child_of_the_master(tmp_path):
    with local_fleet.workers(1, local_fleet.sim_worker_env(0), tmp_path) as (worker,):
        child = procstats.gunicorn_worker_pid(worker.pid)
        assert child != worker.pid and child in procstats.group_pids(worker.pid)
        assert procstats.rss_kib(child) > 0 and procstats.group_cpu([worker]) > 0


def test_a_service_set_apart_has_the_first_core_and_the_rest_have_the_others(tmp_path):
    cores = sorted(os.sched_getaffinity(0))
    with local_fleet.workers(2, local_fleet.sim_worker_env(0), tmp_path) as (alone, other):
        with procstats.apart([alone], [other]) as moved:
            assert moved == (len(cores) > 1)  # one core: nothing to set apart
            first, rest = ({cores[0]}, set(cores[1:])) if moved else (set(cores), set(cores))
            for pid in procstats.group_pids(alone.pid):
                assert os.sched_getaffinity(pid) == first
            for pid in procstats.group_pids(other.pid):
                assert os.sched_getaffinity(pid) == rest
            assert os.sched_getaffinity(0) == rest
        assert os.sched_getaffinity(0) == set(cores)  # this thread is back where it was


def test_engine_benchmark_paths_with_the_sim_engine(tmp_path):
    with local_fleet.workers(2, local_fleet.sim_worker_env(5), tmp_path) as pool:
        http = loadgen.http_rate(pool, pages_per_worker=3)
    assert http["workers"] == 2 and http["pages"] == 6 and http["failures"] == 0
    assert http["pages_per_s"] > 0
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OCR_SIM_PAGE_MS": "5"}
    out = subprocess.run([sys.executable, "-m", "loadtest.bench_engine", "--inprocess", "3",
                          "sim"], env=env, cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=60, check=True)
    inprocess = json.loads(out.stdout.strip().splitlines()[-1])
    assert inprocess["pages"] == 3 and inprocess["engine"]["engine"] == "sim"


def test_bench_all_reports_a_broken_part_and_keeps_going(results, monkeypatch, capsys):
    def part(measure, rows):
        return types.SimpleNamespace(FILE="part.json", measure=measure, rows=lambda _: rows)

    def broken():
        raise RuntimeError("no models")

    fine = part(lambda: {"failures": 0, **report.stamp()}, [["fine part", "1.0", ">= 1", "PASS"]])
    wrong = part(lambda: {"failures": 3}, [["wrong part", "2.0", ">= 1", "PASS"]])
    monkeypatch.setattr(bench_all, "PARTS", {"soak": part(broken, []), "fine": fine})
    assert bench_all.main() == 1
    out = capsys.readouterr().out
    assert "ERROR: RuntimeError: no models" in out and "fine part" in out
    summary = json.loads((results / "summary.json").read_text())
    assert "error" in summary["parts"]["soak"] and summary["parts"]["fine"]["wrong_answers"] == 0
    assert json.loads((results / "part.json").read_text())["load"]["cores"] == os.cpu_count()

    monkeypatch.setattr(bench_all, "PARTS", {"fine": fine})
    assert bench_all.main() == 0
    monkeypatch.setattr(bench_all, "PARTS", {"wrong": wrong})
    assert bench_all.main() == 1
    assert "wrong answers or errors" in capsys.readouterr().out


def test_a_result_says_how_it_was_made_and_which_engine_the_workers_ran(results, tmp_path):
    with local_fleet.workers(1, local_fleet.sim_worker_env(7), tmp_path) as (worker,):
        engines = report.engine_info([local_fleet.url_of(worker)] * 2)
    assert len(engines) == 1 and engines[0]["engine"] == "sim"
    assert report.engine_label(engines) == "sim (7 ms/page)"
    real = {"engine": "paddleocr", "backend": "openvino", "precision": "bf16", "device": "cpu",
            "det_model": "PP-OCRv6_tiny_det", "rec_model": "PP-OCRv6_tiny_rec", "threads": "1"}
    assert report.engine_label([real, real]) == \
        "paddleocr PP-OCRv6_tiny_det + PP-OCRv6_tiny_rec, openvino bf16, cpu, 1 thread"
    made = report.stamp(engines)
    assert {"measured_at", "command", "commit", "machine", "load", "engines"} <= made.keys()
    assert {"cpus", "cpu_model", "bf16"} <= made["machine"].keys()
    assert {"loadavg_1m_start", "loadavg_1m_end", "loadavg_1m_max"} <= made["load"].keys()


def test_memory_benchmark_smoke(tmp_path):
    from loadtest import bench_memory
    from loadtest.payloads import small_image_payloads

    limit = bench_memory.memory_limit_bytes()
    assert limit >= 1 << 30  # the CPU overlay's worker limit, parsed from the manifest
    payloads = small_image_payloads(2)
    result = bench_memory.run_worker(local_fleet.sim_worker_env(0), payloads, 4,
                                     tmp_path / "logs", "memory", limit)
    assert result["failures"] == 0 and len(result["per_page"]) == 4
    assert [r["name"] for r in result["per_page"]] == [p.name for p in payloads] * 2
    assert all(r["ok"] and r["peak_kib"] >= r["steady_kib"] > 0 for r in result["per_page"])
    assert set(result["steady_mib_at"]) == {"1"}
    assert result["peak_share_of_limit"] < 1
    rows = bench_memory.rows({**result, "pages": 4, "growth_goal": 0.1, "headroom_goal": 0.25})
    assert len(rows) == 3 and all(len(row) == 4 for row in rows)
    assert bench_memory.memory_limit_bytes("3Gi") == 3 << 30
    assert bench_memory.memory_limit_bytes("1500Mi") == 1500 << 20


def test_generated_scans_have_the_promised_sizes():
    from samples import scans

    assert scans.dense_scan(0).size == (2481, 3507)
    assert scans.table_scan(0).size == (2481, 3507)
    assert scans.receipt_scan(0).size[0] == 945
    small_page = lambda seed, dpi: scans.table_scan(seed, dpi=60)  # noqa: E731
    photo = scans.photo_of_page(0, size=(1000, 1400), page=small_page)
    assert photo.size == (1000, 1400)
    corner, middle = photo.getpixel((5, 5)), photo.getpixel((500, 700))
    assert sum(corner) < sum(middle)  # a paper page on a darker desk
    names = [name for name, _ in scans.scan_set(2, kinds=("table", "receipt"))]
    assert names[0].startswith("table:") and names[1].startswith("receipt:")


def test_a_scanned_pdf_holds_a_gray_jpeg_a_page_at_its_resolution():
    from samples import scans
    from samples.accuracy_corpus import embedded_image
    from services.documents import pdf

    data = scans.scanned_pdf(2, dpi=100)
    assert pdf.count_pdf_pages(data) == 2
    for page in pdf.open_pdf(data):
        [placed] = pdf.placed_images(page)
        assert placed.width_pt == pytest.approx(page.get_width(), abs=0.01)
        assert placed.width_px / placed.width_pt * 72 == pytest.approx(100, abs=0.1)
    filters, pixels = embedded_image(data)
    assert filters == ["/DCTDecode"] and pixels.ndim == 2  # gray, as text is scanned
    assert scans.scanned_pdf(2, dpi=100) == data  # deterministic


def test_gateway_memory_benchmark_smoke(results, monkeypatch):
    """`make bench-gateway-memory` with a few pages: a row for each document (born-digital at
    two sizes, scanned) in every format, visualize on and off, each answered 200 (else it
    raises); its table has a column per document, and a result from before the scanned PDF
    still renders."""
    from loadtest import bench_gateway_memory as bench

    for name, value in {"BENCH_GW_PAGES": "10", "BENCH_GW_SCANNED": "3",
                        "BENCH_GW_UPLOADS": "2", "BENCH_GW_UPLOAD_MB": "2"}.items():
        monkeypatch.setenv(name, value)
    result = bench.measure()
    cases = {(r["document"], r["pages"], r["format"], r["visualize"]) for r in result["formats"]}
    assert len(cases) == 3 * len(bench.FORMATS) * 2
    assert {(d, n) for d, n, *_ in cases} == {("born-digital", 10), ("born-digital", 1),
                                             ("scanned", 3)}
    assert all(u["answered_200"] + u["answered_429"] == 2 for u in result["uploads"])
    assert "peak +MB (3 scanned pages)" in bench.table(result)
    before = json.loads((REPO_ROOT / "docs/figures/gateway-memory-before.json").read_text())
    assert "scanned" not in bench.table(before) and "300 born-digital" in bench.table(before)


def test_batch_client_benchmark_smoke(results, tmp_path):
    from loadtest import bench_batch

    result = bench_batch.run(6, 3, 2, tmp_path / "logs", env=local_fleet.sim_worker_env(20),
                             per_worker=3)
    assert result["batch"]["done"] == 2 and result["batch"]["pages"] == 6
    assert result["failures"] == 0 and result["wrong_outputs"] == 0
    assert result["capacity_pages_per_s"] > 0 and result["ratio"] > 0
    assert "ocrfleet batch: 6 pages" in bench_batch.rows(result)[0][0]
    json.dumps(result)


def test_cache_benchmark_smoke(results, monkeypatch):
    """The cache bench's sim part: its page counts are checked (a cold read reads 4 of 40
    pages, a warm one none), and its table renders."""
    from loadtest import bench_cache
    monkeypatch.setenv("BENCH_CACHE_ENGINES", "sim")
    monkeypatch.setenv("BENCH_CACHE_BATCH", "6")
    result = bench_cache.measure()
    assert bench_cache.wrong_answers(result) == 0
    runs = result["fleets"][0]["runs"]
    assert runs["pdf40_of_4_cold"]["pagesRead"] == 4 and runs["batch_rerun"]["pagesRead"] == 0
    assert [m["store"] for m in result["miss"]] == ["SQLite", "Redis on loopback"]
    assert "the same, warm" in bench_cache.table(result)


def test_layout_benchmark_smoke(results, monkeypatch):
    """`make bench-layout`'s code path on one table of each kind and one region page, with the
    sim engine (one fixed line per page: the tables' structure is the real models', their text
    is not read) and the real layout models."""
    from loadtest import bench_layout

    monkeypatch.setenv("OCR_ENGINE", "sim")
    monkeypatch.setenv("OCR_SIM_PAGE_MS", "1")
    settings = bench_layout.Settings(tables=1, dpis=[150], pages=1, degraded=[False])
    result = bench_layout.measure(settings)
    assert result["failures"] == 0, result["failure_samples"]
    assert [t["kind"] for t in result["tables"]] == ["ruled", "unruled", "spanning"]
    assert all(0 <= t["teds"] <= t["teds_structure"] + 1e-9 <= 1 + 1e-9
               for t in result["tables"] if t["tables_found"])
    assert {s["kind"] for s in result["teds_summary"]} == {"ruled", "unruled", "spanning"}
    f1 = result["regions"]["f1"]
    assert set(f1) == {"blocks", "model", "blocks_lenient"}
    assert set(f1["blocks"]) == {"title", "text", "table"}
    speed = result["regions"]["speed"]
    assert speed["pages"] == 1 and speed["ocr_pages_per_s"] > 0 < speed["layout_pages_per_s"]
    assert {"measured_at", "command", "commit", "machine", "engines"} <= result.keys()
    assert "TEDS" in bench_layout.table(result) and len(bench_layout.rows(result)) == 5
    json.dumps(result)


def test_layout_fleet_benchmark_smoke(results, monkeypatch):
    """`make bench-layout-fleet`'s code path: a 2-page PDF through a gateway on one and two
    sim workers (the real layout models, one fixed line of text per page), both routes; the
    page count is checked (the titles only the real engine reads)."""
    from loadtest import bench_layout_fleet

    monkeypatch.setenv("BENCH_LAYOUT_FLEET_ENGINE", "sim")
    monkeypatch.setenv("BENCH_LAYOUT_FLEET_WORKERS", "1,2")
    monkeypatch.setenv("BENCH_LAYOUT_FLEET_PAGES", "2")
    result = bench_layout_fleet.measure()
    runs = {(run["route"], run["workers"]): run for run in result["runs"]}
    assert set(runs) == {(route, n) for route in ("/layout-parsing", "/ocr") for n in (1, 2)}
    assert runs[("/ocr", 2)]["right"] and runs[("/ocr", 1)]["speedup"] == 1.0
    assert all(run["problem"] is None or run["problem"].startswith("page 1 does not start")
               for run in result["runs"])  # every page came back (the sim reads no title)
    assert len(bench_layout_fleet.rows(result)) == 2 and "speed-up" in \
        bench_layout_fleet.table(result)
    json.dumps(result)
