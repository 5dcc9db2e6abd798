"""The load-test and benchmark code itself: the answer checker the Locust users and the load
generator rely on, the scaling arithmetic, the load generator and Locust's headless run against
small local servers (a fake /ocr that answers wrongly, and one sim worker). Behaviour only: no
assertion here is about how fast anything ran."""

from __future__ import annotations

import base64
import csv
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from loadtest import figures
from loadtest.checks import Expected, WrongAnswer, check_ocr_response
from loadtest.loadgen import run_closed_loop
from loadtest.payloads import labelled_pdf_payload, make_payload, small_image_payloads
from scripts.fleet import REPO_ROOT, free_port, worker_process


def page(text: str) -> dict:
    return {"prunedResult": {"rec_texts": [text], "rec_scores": [0.99]}, "ocrImage": None}


def pdf_answer(texts: list[str]) -> dict:
    return {"logId": "abc", "errorCode": 0, "errorMsg": "Success",
            "result": {"ocrResults": [page(t) for t in texts],
                       "dataInfo": {"type": "pdf", "numPages": len(texts),
                                    "pages": [{"width": 10, "height": 10}] * len(texts)}}}


def image_answer(text: str = "hello") -> dict:
    return {"logId": "abc", "errorCode": 0, "errorMsg": "Success",
            "result": {"ocrResults": [page(text)],
                       "dataInfo": {"type": "image", "width": 10, "height": 10}}}


LABELLED = [f"Page {i} of 3 invoice total" for i in (1, 2, 3)]


# ---- the answer checker ---------------------------------------------------------------------
def test_checker_accepts_right_answers():
    check_ocr_response(200, image_answer(), Expected(1, "image"))
    check_ocr_response(200, pdf_answer(LABELLED), Expected(3, "pdf", labelled=True))


@pytest.mark.parametrize("status, body, expected, why", [
    (200, pdf_answer(LABELLED[:2]), Expected(3, "pdf"), "2 ocrResults for 3 pages"),
    (503, {"logId": "x", "errorCode": 503, "errorMsg": "queue full"}, Expected(1, "image"),
     "HTTP 503"),
    (200, {"logId": "x", "errorCode": 500, "errorMsg": "boom"}, Expected(1, "image"),
     "errorCode=500"),
    (200, None, Expected(1, "image"), "not a JSON object"),
    (200, image_answer(), Expected(1, "pdf"), "dataInfo.type"),
    (200, {**pdf_answer(LABELLED), "logId": ""}, Expected(3, "pdf"), "logId"),
])
def test_checker_rejects_wrong_answers(status, body, expected, why):
    with pytest.raises(WrongAnswer, match=why):
        check_ocr_response(status, body, expected)


def test_checker_rejects_a_wrong_num_pages():
    body = pdf_answer(LABELLED)
    body["result"]["dataInfo"]["numPages"] = 4
    with pytest.raises(WrongAnswer, match="numPages=4"):
        check_ocr_response(200, body, Expected(3, "pdf"))


def test_checker_rejects_pages_out_of_order_when_text_is_real():
    swapped = [LABELLED[1], LABELLED[0], LABELLED[2]]
    with pytest.raises(WrongAnswer, match="page 1 of 3"):
        check_ocr_response(200, pdf_answer(swapped), Expected(3, "pdf", labelled=True))
    # The same order is fine when nobody asked for the text check...
    check_ocr_response(200, pdf_answer(swapped), Expected(3, "pdf"))
    # ...and the sim engine's text says nothing about the page, so it is not checked.
    simulated = [f"[simulated] page 10x10 {i}" for i in range(3)]
    check_ocr_response(200, pdf_answer(simulated), Expected(3, "pdf", labelled=True))


def test_payloads_carry_their_expected_answer():
    pdf = labelled_pdf_payload(3)
    body = json.loads(pdf.body)
    assert body["fileType"] == 0 and base64.b64decode(body["file"]).startswith(b"%PDF")
    assert pdf.expected == Expected(3, "pdf", labelled=True)
    image = small_image_payloads(2)[1]
    assert json.loads(image.body)["fileType"] == 1 and image.expected == Expected(1, "image")
    assert body["visualize"] is False  # benchmarks measure OCR, not drawing
    assert "visualize" not in json.loads(make_payload("x", b"x", "image", 1, visualize=None).body)


# ---- scaling arithmetic ---------------------------------------------------------------------
def test_efficiency_is_relative_to_n_times_one_replica():
    assert figures.efficiency([1, 2, 4], [5.0, 9.5, 20.0]) == pytest.approx([1.0, 0.95, 1.0])
    with pytest.raises(ValueError):
        figures.efficiency([2, 4], [10.0, 20.0])


def test_ideal_pdf_latency_and_goal():
    assert figures.ideal_pdf_latency(32, 1, 0.2) == pytest.approx(6.4)
    assert figures.ideal_pdf_latency(32, 16, 0.2) == pytest.approx(0.4)
    assert figures.pdf_latency_goal(32, 8, 0.2) == pytest.approx(1.15 * 0.8)


def test_efficiency_goals():
    assert figures.efficiency_goal(1) is None
    assert figures.efficiency_goal(8) == 0.95
    assert figures.efficiency_goal(16) == 0.90


def test_rate_from_completions_of_one_server():
    times = [10 + 0.2 * i for i in range(1, 51)]  # a 5 pages/s server
    assert figures.rate_from_completions(times) == pytest.approx(5.0)


@pytest.mark.parametrize("phase", [0.0, 0.05, 0.13, 0.199])
def test_windowed_rate_counts_servers_in_step_exactly(phase):
    # 8 servers of 0.2 s finishing together: a plain window or first-to-last count is off by
    # up to 8 completions; the trapezoidal window is exact whatever the phase.
    times = [phase + 0.2 * k for k in range(200) for _ in range(8)]
    assert figures.windowed_rate(times, None, 5.0, 17.0, 1.0) == pytest.approx(40.0)
    weights = [2] * len(times)
    assert figures.windowed_rate(times, weights, 5.0, 17.0, 1.0) == pytest.approx(80.0)


@pytest.mark.parametrize("phase", [0.0, 0.6, 1.3, 2.1, 2.9, 3.7])
def test_the_fleet_benchmark_reads_pages_in_waves_at_their_rate_whatever_the_phase(phase):
    # 128 pages every 4 s (32 pages/s), sampled every 0.25 s, over a window that ends just
    # after a wave (the first document's end): the count between the samples nearest its
    # edges is a wave off at some phases (0.8 of the rate); the trapezoid is not
    from loadtest.bench_fleet import PageCounter

    counter = PageCounter((0.1 + t / 4, 128 * ((0.1 + t / 4 + phase) // 4)) for t in range(240))
    end = 28.05 - phase  # just after the wave at 28 - phase
    assert counter.rate(end - 20, end, 4.0) == pytest.approx(32.0, rel=0.01)
    assert counter.rate(end - 8, end, 4.0) is None  # two page times: no steady window
    late = PageCounter(list(counter)[20:])  # its first count 5 s in: the window starts a
    assert late.rate(end - 24, end, 4.0) == pytest.approx(32.0, rel=0.01)  # page time later


def test_the_fleet_benchmark_reads_the_engines_busy_share_between_each_workers_reads():
    # worker a reads pages all along and is read every 8 s; worker b idles for 10 s, then
    # reads pages, and is read every second: from 4 s to 20 s they spent 16 + 10 of 32 s
    from loadtest.bench_fleet import EngineClock

    clock = EngineClock(["http://a", "http://b"])
    assert clock.busy(4.0, 20.0, 0.0) is None  # nothing read yet
    a, b = clock.samples.values()
    a += [(t, float(t)) for t in range(0, 25, 8)]
    b += [(t, max(0.0, t - 10.0)) for t in range(25)]
    assert clock.busy(4.0, 20.0, 0.0) == pytest.approx(26 / 32)
    # over [4 + d, 18 + d] for d in 0, 0.1, ..., 1.9: a 14 s, b 8 + d s (8.95 on average)
    assert clock.busy(4.0, 20.0, 2.0) == pytest.approx((14 + 8.95) / 28)
    assert clock.busy(-5.0, 30.0, 0.0) == pytest.approx((24 + 14) / 70)  # the edges' reads
    assert clock.busy(20.0, 21.0, 1.0) is None


@pytest.mark.parametrize("phase", [0.0, 0.6, 1.3, 2.1, 2.9, 3.7])
def test_the_engines_busy_share_is_read_whole_whatever_the_phase_of_the_page_ends(phase):
    # a worker always busy with 4 s pages: its count steps by 4 s as each ends; read every
    # 0.5 s, the window's edges fall anywhere in a page, yet over a page time of phases the
    # share read is whole
    from loadtest.bench_fleet import EngineClock

    clock = EngineClock(["http://a"])
    clock.samples["http://a/metrics"] += [
        (t / 2, 4.0 * ((t / 2 + phase) // 4)) for t in range(80)]
    assert clock.busy(8.05, 31.3, 4.0) == pytest.approx(1.0, abs=0.01)


def test_growth():
    assert figures.growth(100.0, 103.0) == pytest.approx(0.03)


def test_a_disturbed_engine_run_is_measured_again_and_the_quietest_kept():
    from loadtest.bench_engine import least_disturbed

    runs = iter([{"pages_per_s": 0.9, "other_load_cores": 0.6},
                 {"pages_per_s": 0.7, "other_load_cores": 0.05},
                 {"pages_per_s": 1.0, "other_load_cores": 0.0}])
    kept = least_disturbed(lambda: next(runs), tries=3)
    assert kept["pages_per_s"] == 0.7 and kept["tries"] == 2  # quiet enough: no third run
    noisy = iter([{"pages_per_s": 0.5, "other_load_cores": 0.9},
                  {"pages_per_s": 0.6, "other_load_cores": 0.4}])
    assert least_disturbed(lambda: next(noisy), tries=2)["pages_per_s"] == 0.6


# ---- the load generator and Locust against local servers ------------------------------------
class FakeOcr(BaseHTTPRequestHandler):
    """An /ocr that answers with a fixed body (set per server)."""

    def do_GET(self):
        self._send(200, {"errorCode": 0, "errorMsg": "Ready", "logId": "r"})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send(200, self.server.answer)

    def _send(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_ocr():
    servers = []

    def start(answer: dict) -> str:
        server = ThreadingHTTPServer(("127.0.0.1", 0), FakeOcr)
        server.answer = answer
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_load_generator_counts_wrong_answers_as_failures(fake_ocr):
    right, wrong = fake_ocr(image_answer()), fake_ocr(pdf_answer(["a", "b"]))
    image = [make_payload("img", b"not really a png", "image", 1)]
    seen = []
    good = run_closed_loop(right, image, 3, total_requests=20,
                           on_complete=lambda n, c: seen.append(n))
    assert good.ok_count == 20 and good.failure_count == 0
    assert sorted(seen) == list(range(1, 21))
    bad = run_closed_loop(wrong, image, 2, total_requests=6)
    assert bad.ok_count == 0 and bad.failure_count == 6
    assert "dataInfo" in next(iter(bad.failures)) or "ocrResults" in next(iter(bad.failures))


def make_loadtest(**env: str) -> subprocess.CompletedProcess:
    """`make loadtest` (its install step taken as done) with these settings."""
    return subprocess.run(["make", "-s", "-o", "install", "loadtest"], cwd=REPO_ROOT,
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=90)


def _run_locust(host: str, results, duration: str = "4s") -> tuple[int, dict[str, dict]]:
    code = make_loadtest(HOST=host, USERS="4", SPAWN_RATE="4", DURATION=duration,
                         RESULTS_DIR=str(results), LOCUST_LONG_PAGES="6",
                         LOCUST_MIXED_PAGES="6").returncode
    with open(results / "locust_stats.csv", newline="") as handle:
        stats = {row["Name"]: row for row in csv.DictReader(handle)}
    return code, stats


@pytest.mark.slow
def test_locust_marks_wrong_answers_as_failures(fake_ocr, tmp_path):
    host = fake_ocr(pdf_answer(["only one page"]))  # wrong for every request Locust sends
    code, stats = _run_locust(host, tmp_path)
    assert code != 0
    total = stats["Aggregated"]
    assert int(total["Request Count"]) > 0
    assert int(total["Failure Count"]) == int(total["Request Count"])
    assert (tmp_path / "locust.html").is_file()
    assert (tmp_path / "locust_failures.csv").read_text().count("/ocr") >= 1


@pytest.mark.slow
def test_locust_against_a_sim_worker_passes(tmp_path):
    port = free_port()
    worker = worker_process(port, {"OCR_ENGINE": "sim", "OCR_SIM_PAGE_MS": "5",
                                   "OCR_PROCESSES": "1"}, tmp_path / "worker.log")
    worker.start().wait_ready(60)
    try:
        code, stats = _run_locust(f"http://127.0.0.1:{port}", tmp_path / "results")
    finally:
        worker.stop()
    total = stats["Aggregated"]
    assert code == 0, (tmp_path / "results" / "locust_failures.csv").read_text()
    assert int(total["Request Count"]) > 0 and int(total["Failure Count"]) == 0


def test_make_loadtest_refuses_a_host_that_is_not_ready(tmp_path):
    done = make_loadtest(RESULTS_DIR=str(tmp_path), HOST=f"http://127.0.0.1:{free_port()}")
    assert done.returncode != 0 and "start a fleet first" in done.stderr


def test_a_result_names_the_service_settings_it_ran_with_but_no_secret(monkeypatch):
    from loadtest import report
    monkeypatch.setenv("BENCH_QUICK", "1")
    monkeypatch.setenv("GATEWAY_PROCESSES", "1")
    monkeypatch.setenv("OCR_SIM_PAGE_MS", "5")
    monkeypatch.setenv("GATEWAY_API_KEYS", "s3cret")
    monkeypatch.setenv("GATEWAY_REDIS_URL", "redis://:pw@127.0.0.1:6379/0")
    words = report.command().split()
    assert {"BENCH_QUICK=1", "GATEWAY_PROCESSES=1", "OCR_SIM_PAGE_MS=5"} <= set(words)
    assert "s3cret" not in report.command() and "pw@" not in report.command()
