"""The fleet panel behind a load balancer: `GET /fleet` and the web page list the worker
processes behind the balancer, not only the balancer. The balancer here stands in for nginx:
each request it gets is answered by the next of its workers in turn, with the headers a
worker puts on every answer (its id in X-Ocr-Worker, its target on the fleet board)."""

from __future__ import annotations

import math
import secrets
import threading
from http.server import BaseHTTPRequestHandler

import pytest
from werkzeug.serving import make_server

from gateway.app import create_app
from gateway.config import GatewayConfig
from scripts.browser import chromium, chromium_missing
from scripts.fleet import free_port
from services.ocr_api import headers
from services.ocr_api.fleet_board import Board
from tests.conftest import LoopbackServer, wait_until

TARGETS = (2.0, 1.5, 0.0)  # the last one drains


class FakeWorker:
    """What one worker process says on each answer: its id and its board entry."""

    def __init__(self, target: float):
        self.id = secrets.token_hex(6)
        self.board = Board()
        self.board.say("w", self.id, 1, target)

    def answer_headers(self) -> dict[str, str]:
        return {headers.WORKER: self.id, headers.BOARD: self.board.header([("w", self.id)])}


def balancer(workers: list[FakeWorker]) -> LoopbackServer:
    turn = iter(range(1 << 30))
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            with lock:
                worker = workers[next(turn) % len(workers)]
            body = b'{"errorCode":0,"errorMsg":"Ready"}'
            self.send_response(200)
            for name, value in {**worker.answer_headers(), "Content-Type": "application/json",
                                "Content-Length": str(len(body))}.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    return LoopbackServer(Handler)


@pytest.fixture
def gateway_behind_balancer():
    workers = [FakeWorker(target) for target in TARGETS]
    server = balancer(workers)
    app = create_app(GatewayConfig(upstream_url=server.url, health_interval_s=0.2))
    try:
        yield app, workers, server
    finally:
        app.extensions["gateway_service"].shutdown()
        server.close()


def fleet_workers(client) -> dict[str, dict]:
    return {worker["id"]: worker for worker in client.get("/fleet").get_json()["workers"]}


def test_fleet_lists_the_workers_behind_the_balancer(gateway_behind_balancer):
    app, workers, server = gateway_behind_balancer
    client = app.test_client()
    listed = wait_until(lambda: len(found := fleet_workers(client)) == len(workers) and found,
                        what="every worker behind the balancer on /fleet")
    fleet = client.get("/fleet").get_json()
    assert fleet["mode"] == "load_balancer"
    assert [replica["url"] for replica in fleet["replicas"]] == [server.url]  # one: it
    for worker, target in zip(workers, TARGETS):
        assert listed[worker.id]["target"] == target
        assert listed[worker.id]["slots"] == math.ceil(target)
        assert listed[worker.id]["draining"] is (target == 0)
        assert 0 <= listed[worker.id]["heardSecondsAgo"] < 120


@pytest.mark.slow
@pytest.mark.skipif(chromium_missing() is not None,
                    reason=chromium_missing() or "chromium is here")
def test_the_fleet_panel_shows_the_workers_behind_the_balancer(gateway_behind_balancer):
    app, workers, server = gateway_behind_balancer
    http = make_server("127.0.0.1", free_port(), app, threaded=True)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    try:
        with chromium() as browser:
            page = browser.new_page()
            page.set_default_timeout(10_000)
            page.goto(f"http://127.0.0.1:{http.server_port}/")
            for worker in workers:
                page.wait_for_selector(f'#fleet-table tr.worker[data-worker="{worker.id}"]')
            assert page.locator(f'#fleet-table tr[data-url="{server.url}"]').count() == 1
            draining = page.locator(f'tr[data-worker="{workers[-1].id}"] td').nth(1)
            assert draining.inner_text() == "draining"
            busy = page.locator(f'tr[data-worker="{workers[0].id}"] td')
            assert busy.nth(0).inner_text() == f"worker {workers[0].id}"
            assert busy.nth(1).inner_text() == "yes" and busy.nth(2).inner_text() == "– / 2"
            wait_until(lambda: "3 workers behind it (1 draining)"
                       in page.inner_text("#fleet-summary"), what="the summary")
    finally:
        http.shutdown()
        thread.join(10)
