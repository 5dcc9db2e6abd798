"""The default fleet under load on the real engine, as a user starts it: `make run`'s launcher
(2 workers, nginx, the gateway, every engine setting as shipped) and 4 clients that keep
sending the project's own pages for a few minutes: text images, dense page images (a worker
busy for seconds on one), labelled PDFs and ruled-table PDFs, visualisations on and off.
Every request must come back right: no failure because the workers are busy, every PDF page
in its place, every image's text read. The same run's figures are not asserted (tests check
behaviour; `make bench-paddlex` measures speed).

Run alone after the rest of the suite (the Makefile's `test`): it keeps both cores busy, and
the sim tests beside it would then measure a starved machine. OCRFLEET_REAL_LOAD_S sets the
load's length (default 150 s)."""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
import time
from collections import Counter

import pytest
import requests

from loadtest.checks import WrongAnswer, check_ocr_response, page_texts
from loadtest.loadgen import run_closed_loop
from loadtest.payloads import Payload, dense_page_payloads, labelled_pdf_payload, make_payload
from samples import documents
from scripts.fleet import REPO_ROOT, free_port, free_port_block, http_status

pytestmark = [pytest.mark.engine, pytest.mark.nginx, pytest.mark.slow, pytest.mark.alone]

CLIENTS = 4
LOAD_S = float(os.environ.get("OCRFLEET_REAL_LOAD_S", "150"))


def text_images() -> dict[str, list[str]]:
    """Payload name -> the lines drawn on it."""
    return {f"image:text:{i}": documents.english_lines(2 + i % 3, seed=40 + i, words_per_line=5)
            for i in range(6)}


def payloads() -> list[Payload]:
    images = [make_payload(name, documents.to_png(documents.text_image(lines, size=36)),
                           "image", 1, visualize=None if i % 2 else False)
              for i, (name, lines) in enumerate(text_images().items())]
    return [labelled_pdf_payload(6, seed=1, visualize=None), *images[:3],
            labelled_pdf_payload(3, seed=2, table=True), *dense_page_payloads(1),
            labelled_pdf_payload(10, seed=3), *images[3:]]


def read_right(name: str, text: str, lines: dict[str, list[str]]) -> bool:
    """An image's words came back (the engine may split or join a line)."""
    if name not in lines:
        return True
    want = " ".join(lines[name]).lower().split()
    got = text.lower().split()
    return difflib.SequenceMatcher(None, want, got).ratio() >= 0.8


@pytest.fixture
def fleet(tmp_path):
    """`make run` (scripts/run_fleet.py) on free ports, stopped with SIGTERM however the test
    ends."""
    worker, nginx_port, gateway = free_port_block(2), free_port(), free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "scripts.run_fleet", "--run-dir", str(tmp_path), "--workers", "2",
         "--worker-port", str(worker), "--nginx-port", str(nginx_port),
         "--gateway-port", str(gateway)],
        cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "WORKERS": "2"},
        stdout=open(tmp_path / "launcher.log", "w"), stderr=subprocess.STDOUT,
        start_new_session=True)
    url = f"http://127.0.0.1:{gateway}"
    try:
        deadline = time.monotonic() + 300
        while http_status(f"{url}/readyz") != 200:
            assert process.poll() is None, (tmp_path / "launcher.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the fleet was not ready in 300 s"
            time.sleep(0.5)
        yield url, tmp_path
    finally:
        process.terminate()
        try:
            process.wait(90)
        except subprocess.TimeoutExpired:
            process.kill()


def test_four_clients_on_the_default_fleet_get_every_page_right(fleet):
    url, run_dir = fleet
    lines = text_images()
    misread: list[str] = []
    result = run_closed_loop(url, payloads(), CLIENTS, duration_s=LOAD_S, timeout=600)
    assert not result.failures, f"failed requests: {dict(result.failures)}"
    assert len(result.completions) >= 2 * CLIENTS, "the load hardly ran"
    # each image's text, read once more on the loaded fleet's answers
    for payload in payloads():
        answer = requests.post(f"{url}/ocr", data=payload.body, timeout=300,
                               headers={"Content-Type": "application/json"})
        try:
            check_ocr_response(answer.status_code, answer.json(), payload.expected)
        except WrongAnswer as exc:
            misread.append(f"{payload.name}: {exc}")
            continue
        if not read_right(payload.name, " ".join(page_texts(answer.json())), lines):
            misread.append(f"{payload.name}: read {page_texts(answer.json())}")
    assert not misread, misread
    nginx_log = (run_dir / "nginx" / "error.log").read_text()
    assert "temporarily disabled" not in nginx_log, nginx_log[-3000:]
    kinds = Counter(c.pages for c in result.completions)
    assert len(kinds) >= 3, f"not every kind of request ran: {kinds}"
