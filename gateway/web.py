"""The gateway's web page: `/` (gateway/ui/index.html), its static assets under `/ui/`, and
`GET /fleet`, the small JSON view of the fleet the page polls. The page itself talks only to
`POST /ocr` and `POST /layout-parsing` (NDJSON streams) and `/fleet`; every asset is served from here, and a
Content-Security-Policy keeps the browser from loading anything else.

`/fleet` lists the replicas the gateway sends to and, in `workers`, the worker processes it
has heard of on the fleet board (services/ocr_api/fleet_board.py): behind a load balancer
the replicas are one row, the balancer, and the board is what tells who is behind it."""

from __future__ import annotations

from pathlib import Path

from flask import Blueprint, Flask, Response, send_from_directory

from services.flask_common import json_response
from services.ocr_api.fleet_board import Board, slots_of

UI_DIR = Path(__file__).resolve().parent / "ui"

# 'self' for everything; blob: for the page images the browser decodes from the stream (and
# the uploaded file's preview), so no data: URIs and no other origin are ever allowed.
CSP = ("default-src 'self'; img-src 'self' blob:; object-src 'none'; base-uri 'none'; "
       "frame-ancestors 'none'; form-action 'none'")


def make_blueprint(service) -> Blueprint:
    ui = Blueprint("ui", __name__, static_folder=str(UI_DIR), static_url_path="/ui")

    @ui.get("/")
    def index():
        return send_from_directory(UI_DIR, "index.html", max_age=0)

    @ui.get("/fleet")
    def fleet():
        response = json_response({**service.fleet_status(),
                                  "workers": workers_heard(service.fleet.board)})
        response.headers["Cache-Control"] = "no-store"
        return response

    @ui.after_app_request
    def _page_headers(response: Response) -> Response:
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        if response.mimetype in ("text/html", "text/javascript", "application/javascript",
                                 "text/css"):
            response.headers["Content-Security-Policy"] = CSP
        return response

    return ui


def workers_heard(board: Board) -> list[dict]:
    """The worker processes on this gateway process's fleet board (heard of in its last two
    minutes, from their answers and probes or from other gateways), by id: the id each puts
    in its answers (X-Ocr-Worker), the pages it holds to stay busy (its target; 0 while it
    drains) in whole pages, and how long ago its owner said so."""
    now = board.clock()
    return [{"id": entry.id, "target": entry.value, "slots": slots_of(entry.value),
             "draining": entry.value == 0, "heardSecondsAgo": round(now - entry.heard, 1)}
            for entry in sorted(board.workers(), key=lambda entry: entry.id)]


def register(app: Flask, service) -> None:
    app.register_blueprint(make_blueprint(service))
