"""A replica that answers nonsense: 200s with bodies the gateway's parser never expected, and
capacity, worker and fleet-board headers that mean nothing. A real gateway on loopback fails
those pages with a JSON 502 (after trying again, as for any real failure), stays ready, and
serves the next document once the replica behaves (fleet mechanics, no OCR)."""

from __future__ import annotations

import base64
import json
from http.server import BaseHTTPRequestHandler

import pytest
import requests

from samples import documents
from scripts.fleet import free_port, gateway_process, stop_all
from tests.conftest import LoopbackServer

pytestmark = pytest.mark.slow  # starts a server: scheduled first (tests/conftest.py)

BAD_BODIES = [b'{"result": "x"}', b'{"result": {"ocrResults": 5, "dataInfo": []}}',
              b'{"result": {"ocrResults": [null], "dataInfo": {"type": 7, "pages": "no"}}}',
              b"[1, 2, 3]", b"not json at all", b'{"result": {"ocrResults": [{}], '
              b'"dataInfo": {"type": "image", "width": "wide", "height": -1}}}']
NONSENSE = {"X-Ocr-Capacity": "-5", "X-Ocr-Free": "999999999999", "X-Ocr-Worker": "\x7f" * 40,
            "X-Ocr-Board": "w:zz:1:1:1," * 500 + "c:::::", "Retry-After": "soon"}
GOOD = {"logId": "x", "errorCode": 0, "errorMsg": "Success",
        "result": {"ocrResults": [{"prunedResult": {"rec_texts": ["fine"]}}],
                   "dataInfo": {"type": "image", "width": 5, "height": 5}}}


class HostileReplica:
    def __init__(self):
        self.behave = False
        self.turn = 0
        replica = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # /readyz
                self._answer(200, b'{"status": "ready"}')

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if replica.behave:
                    self._answer(200, json.dumps(GOOD).encode())
                else:
                    replica.turn += 1
                    self._answer(200, BAD_BODIES[replica.turn % len(BAD_BODIES)])

            def _answer(self, status, body):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                for name, value in NONSENSE.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = LoopbackServer(Handler)
        self.url = self.server.url

    def close(self):
        self.server.close()


def test_nonsense_from_a_replica_fails_its_pages_not_the_gateway(tmp_path):
    replica = HostileReplica()
    port = free_port()
    gateway = gateway_process(port, {"GATEWAY_REPLICAS": replica.url, "GATEWAY_PROCESSES": "1",
                                     "GATEWAY_BACKOFF_S": "0.01", "GATEWAY_JOBS_ENABLED": "false"},
                              tmp_path / "gateway.log")
    try:
        gateway.start().wait_ready(60)
        url = f"http://127.0.0.1:{port}"
        body = {"file": base64.b64encode(documents.to_png(documents.text_image(["x"]))).decode(),
                "visualize": False}
        for _ in range(3):
            answer = requests.post(f"{url}/ocr", json=body, timeout=60)
            assert answer.status_code == 502, answer.text
            error = answer.json()
            assert error["errorCode"] == 502 and "could not be processed" in error["errorMsg"]
            assert requests.get(f"{url}/readyz", timeout=5).status_code == 200
            assert requests.get(f"{url}/healthz", timeout=5).status_code == 200
        replica.behave = True
        answer = requests.post(f"{url}/ocr", json=body, timeout=60)
        assert answer.status_code == 200
        assert answer.json()["result"]["ocrResults"][0]["prunedResult"]["rec_texts"] == ["fine"]
    finally:
        stop_all([gateway])
        replica.close()
