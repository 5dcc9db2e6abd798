"""The gateway's web page: `/` (gateway/ui/index.html), its static assets under `/ui/`, and
`GET /fleet`, the small JSON view of the fleet the page polls. The page itself talks only to
`POST /ocr` (NDJSON stream) and `/fleet`; every asset is served from here, and a
Content-Security-Policy keeps the browser from loading anything else."""

from __future__ import annotations

from pathlib import Path

from flask import Blueprint, Flask, Response, send_from_directory

from services.flask_common import json_response

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
        response = json_response(service.fleet_status())
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


def register(app: Flask, service) -> None:
    app.register_blueprint(make_blueprint(service))
