"""The floor under a gateway's routing cost (`make bench-route`): a Flask app that passes each
POST /ocr to the next worker of RELAY_WORKERS in turn, on the gateway's own connections
(gateway/connections.py), and answers with the worker's answer; nothing else. Served by
gunicorn as the gateway is (one gthread process), its CPU per page is what taking a request in
and sending it on costs in Python on this machine, before the gateway does anything of its own
(admission, the page queue, placing, the board, the answer's envelope)."""

from __future__ import annotations

import itertools
import os

from flask import Flask, Response, request

from gateway.connections import Connections


def create_app(workers: list[str]) -> Flask:
    app = Flask(__name__)
    connections = Connections(per_replica=64)
    turn = itertools.cycle(workers)

    @app.get("/readyz")
    def readyz():
        return {"ready": True}

    @app.post("/ocr")
    def ocr():
        answer = connections.request(
            "POST", next(turn), "/ocr", body=request.get_data(), connect_s=5, read_s=60,
            headers={"Content-Type": "application/json"})
        return Response(answer.data, answer.status, mimetype="application/json")

    return app


def wsgi_app() -> Flask:
    """gunicorn's entry point: `loadtest.relay_app:wsgi_app()`."""
    return create_app([url for url in os.environ["RELAY_WORKERS"].split(",") if url])
