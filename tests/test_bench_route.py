"""make bench-route's pieces that need no fleet: the relay that measures the floor under a
gateway's routing cost, and the table (with the floor, and a result from before it)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from loadtest import bench_route
from loadtest.relay_app import create_app

FIGURES = Path(__file__).resolve().parents[1] / "docs" / "figures"


def test_the_relay_sends_each_request_to_the_next_worker_and_answers_with_its_answer():
    servers = []

    class Worker(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            answer = b'{"worker": %d, "got": %d}' % (self.server.index, len(body))
            self.send_response(200 if self.server.index == 0 else 503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    try:
        for index in range(2):
            server = ThreadingHTTPServer(("127.0.0.1", 0), Worker)
            server.index = index
            servers.append(server)
            threading.Thread(target=server.serve_forever, daemon=True).start()
        client = create_app([f"http://127.0.0.1:{s.server_port}" for s in servers]).test_client()
        answers = [client.post("/ocr", data=b"x" * n) for n in (3, 5, 7)]
        assert client.get("/readyz").status_code == 200
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
    assert [(a.status_code, a.json) for a in answers] == [
        (200, {"worker": 0, "got": 3}), (503, {"worker": 1, "got": 5}),
        (200, {"worker": 0, "got": 7})]


def test_the_table_says_the_floor_and_renders_a_result_from_before_it():
    result = json.loads((FIGURES / "runs" / "route-189bbc7.json").read_text())  # no floor
    before = bench_route.table(result)
    assert "The floor:" not in before and "| list | 16 | 236.9 | 4.220 |" in before
    floor = {"workers": 16, "pages": 5000, "failures": 0, "pages_per_s": 500.0, "cpu_s": 10.0,
             "pages_per_core_s": 500.0, "core_to_itself": True}
    assert "500.0 pages per CPU-second (2.0 ms a page)" in bench_route.table(
        {**result, "http_floor": floor})
    assert "| 128 | 0.139 | 0.122 | - |" in before  # no share figure then
    flow = [{"workers": 128, "image_ms": 0.1, "document_page_ms": 0.09, "share_taken_ms": 0.23}]
    assert "| 128 | 0.100 | 0.090 | 0.230 |" in bench_route.table(
        {**result, "flow_objects_cpu_ms_per_page": flow})
