"""What /ocr answers with, chosen by the request's Accept header: the PaddleX JSON envelope
(the default), NDJSON page by page (streamed by app.py), plain text (text.py), the searchable
PDF (pdf.py), or a ZIP of the JSON, text and PDF from one OCR pass (what a batch client that
wants several of them asks for). Errors are JSON envelopes whatever was asked for."""

from __future__ import annotations

import io
import json
import zipfile
from typing import Any, MutableMapping

from flask import Response
from werkzeug.datastructures import MIMEAccept
from werkzeug.http import parse_accept_header

from services.flask_common import json_response
from services.ocr_api import headers as protocol
from services.ocr_api.errors import ApiError

from . import layout, text

JSON = "application/json"
NDJSON = "application/x-ndjson"
TEXT = "text/plain"
PDF = "application/pdf"
ZIP = "application/zip"
OFFERED = (JSON, NDJSON, TEXT, PDF, ZIP)
# a client that names several formats at the same quality gets the most specific one
NAMED_PRIORITY = {NDJSON: 5, PDF: 4, ZIP: 3, TEXT: 2, JSON: 1}
ZIP_MEMBERS = {JSON: "result.json", TEXT: "text.txt", PDF: "searchable.pdf"}


def negotiate(header: str | None) -> str:
    """The format for this Accept header: JSON without one (or for */*), 406 when it
    accepts none of OFFERED."""
    if not header or not header.strip():
        return JSON
    accept = parse_accept_header(header, MIMEAccept)
    named = {value.lower() for value, quality in accept if quality > 0}

    def rank(offer: str) -> tuple[float, bool, int]:
        is_named = offer in named
        return (accept.quality(offer), is_named,
                NAMED_PRIORITY[offer] if is_named else int(offer == JSON))

    best = max(OFFERED, key=rank)
    if accept.quality(best) <= 0:
        raise ApiError(406, f"Cannot answer with {header!r}: /ocr answers "
                            f"{', '.join(OFFERED)} (Accept header)")
    return best


def prepare_fields(fmt: str, fields: MutableMapping[str, Any]) -> None:
    """Text, PDF and ZIP answers use no visualization images: skip them unless asked."""
    if fmt in (TEXT, PDF, ZIP):
        fields.setdefault("visualize", False)


def respond(fmt: str, answer: dict, plan, config) -> Response:
    """The whole document in `fmt` (anything but NDJSON) from its one OCR pass, `answer`
    (the PaddleX envelope from GatewayService.collect)."""
    # pages OCR'd, for clients' progress
    headers = {protocol.PAGES: str(len(answer["result"]["ocrResults"]))}
    if fmt == JSON:
        return json_response(answer, headers=headers)
    pages = layout.document_pages(answer["result"])
    if fmt == TEXT:
        return Response(text.document_text(pages), mimetype="text/plain",
                        content_type="text/plain; charset=utf-8", headers=headers)
    from .pdf import searchable_pdf  # pikepdf, fpdf2 and Pillow: only when a PDF is asked for

    pdf = searchable_pdf(plan.request.file_bytes, plan.kind, pages, config.pdf_fonts)
    if fmt == PDF:
        return Response(pdf, mimetype=PDF, headers=headers)
    bundle = io.BytesIO()
    with zipfile.ZipFile(bundle, "w") as archive:
        archive.writestr(ZIP_MEMBERS[JSON], json.dumps(answer, ensure_ascii=False),
                         zipfile.ZIP_DEFLATED)
        archive.writestr(ZIP_MEMBERS[TEXT], text.document_text(pages), zipfile.ZIP_DEFLATED)
        archive.writestr(ZIP_MEMBERS[PDF], pdf, zipfile.ZIP_STORED)
    return Response(bundle.getvalue(), mimetype=ZIP, headers=headers)
