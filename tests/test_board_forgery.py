"""Nothing outside the fleet's own gateways changes how pages are placed. A process that can
reach the workers (no gateway, no token) sends them well-formed fleet boards through the open
probe and through /ocr: huge demand for made-up gateway processes, a target of 0 for every
real worker (their ids are in every answer), sequence numbers that would beat every true
statement. The workers take none of it in, and a 48-page PDF takes about as long as without
it. Sim workers: the fleet's mechanics, not OCR."""

from __future__ import annotations

import base64
import threading
import time

import pytest
import requests

from samples import documents
from services.ocr_api.fleet_board import Board
from services.ocr_api.headers import BOARD, WORKER
from tests.test_flow_integration import start_gateway, start_nginx, start_workers

pytestmark = pytest.mark.slow  # starts servers: scheduled first (tests/conftest.py)

TOKEN = "fleet-internal-" + "x" * 24
FAKE_CLIENTS = [f"f{i:05d}" for i in range(20)]


@pytest.fixture
def processes():
    from scripts.fleet import stop_all

    started = []
    yield started
    stop_all(started)


def forged_board(worker_ids: list[str]) -> str:
    seq = 999_999_999
    items = [f"c:{c}:{seq}:{100_000 * 100}:0" for c in FAKE_CLIENTS]
    items += [f"w:{w}:{seq}:0:0" for w in worker_ids]
    return ",".join(items)[:4000]


class Forger:
    """Sends forged boards to every worker, through /readyz and /ocr, until stopped (at most
    `limit` requests)."""

    def __init__(self, urls: list[str], limit: int = 4000):
        self.urls, self.limit, self.sent = urls, limit, 0
        self.ids = [requests.get(f"{u}/readyz", timeout=5).headers[WORKER] for u in urls]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        header = {BOARD: forged_board(self.ids), "Content-Type": "application/json"}
        with requests.Session() as session:
            while not self._stop.is_set() and self.sent < self.limit:
                for url in self.urls:
                    session.get(f"{url}/readyz", headers=header, timeout=5)
                    session.post(f"{url}/ocr", data=b"{}", headers=header, timeout=5)
                    self.sent += 2

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)


def read_pdf(gateway: str, pdf: str) -> float:
    started = time.monotonic()
    answer = requests.post(f"{gateway}/ocr", json={"file": pdf, "fileType": 0}, timeout=120)
    assert answer.status_code == 200, answer.text[:300]
    assert len(answer.json()["result"]["ocrResults"]) == 48
    return time.monotonic() - started


def test_forged_boards_leave_a_long_pdf_as_fast_as_before(processes, tmp_path):
    env = {"OCR_ENGINE": "sim", "OCR_SIM_PAGE_MS": "250", "OCR_VISUALIZE": "false",
           "OCR_API_TOKEN": TOKEN}
    urls = start_workers(processes, tmp_path, 4, env)
    gateway = start_gateway(processes, tmp_path,
                            {"GATEWAY_UPSTREAM_URL": start_nginx(processes, tmp_path, urls),
                             "GATEWAY_WORKER_TOKEN": TOKEN})
    pdf = base64.b64encode(documents.labelled_pdf(48, lines_per_page=0)).decode()
    read_pdf(gateway, pdf)  # the fleet met: its boards settled
    clean = read_pdf(gateway, pdf)
    with Forger(urls) as forger:
        deadline = time.monotonic() + 10
        while forger.sent < 40 and time.monotonic() < deadline:
            time.sleep(0.01)
        forged = read_pdf(gateway, pdf)
        for url in urls:  # no forged entry on any worker's board
            board = requests.get(f"{url}/readyz", timeout=5,
                                 headers={"Authorization": f"Bearer {TOKEN}"}).headers[BOARD]
            assert not any(f":{c}:" in board for c in FAKE_CLIENTS), board
            assert "999999999" not in board, board
    assert forger.sent >= 40
    assert forged <= 1.5 * clean + 0.5, f"{forged:.1f} s with forged boards, {clean:.1f} s without"


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_board_ignores_sequence_numbers_and_values_no_owner_sends():
    clock = Clock()
    board = Board(clock=clock)
    board.merge("c:gw1:5:200:0,w:wk1:3:150:0")
    board.merge("c:gw1:99999:0:0")  # 99,994 statements ahead of a live entry: forged
    board.merge("w:wk1:2000000000:0:0")  # past any owner's count
    board.merge("c:gw2:1:100000000:0")  # a demand of a million documents
    live = board.live()
    assert [(e.id, e.value) for e in live["c"]] == [("gw1", 2.0)]
    assert [(e.id, e.value) for e in live["w"]] == [("wk1", 1.5)]
    board.merge("c:gw1:6:300:0")  # the owner's next statement is taken
    assert board.clients()[0].value == 3.0
    clock.now += 2 * board.client_ttl_s + 1  # gone quiet: the owner's count may have moved on
    board.merge("c:gw1:50000:100:0")
    assert board.clients()[0].seq == 50000
