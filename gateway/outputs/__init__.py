"""What /ocr and a job's result answer with, chosen by the request's Accept header: the
PaddleX JSON envelope (the default), NDJSON page by page, plain text, the searchable PDF
(pdf.py), or a ZIP of the JSON, text and PDF from one OCR pass (what a batch client that
wants several of them asks for). This package is the one writer of answers (paddlex.py: the
envelope, NDJSON lines, text), from pages in order (`Answer`). Errors are JSON envelopes
whatever was asked for."""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass
from typing import Any, Callable, Iterator, MutableMapping

from flask import Response
from werkzeug.datastructures import MIMEAccept
from werkzeug.http import parse_accept_header

from services.ocr_api import headers as protocol
from services.ocr_api.errors import ApiError

from ..assemble import PageOutcome
from . import paddlex
from .sandbox import PdfBuilder

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
        raise ApiError(406, f"Cannot answer with {header!r}: this answers in "
                            f"{', '.join(OFFERED)} (Accept header)")
    return best


def prepare_fields(fmt: str, fields: MutableMapping[str, Any]) -> None:
    """Text, PDF and ZIP answers use no visualization images: skip them unless asked."""
    if fmt in (TEXT, PDF, ZIP):
        fields.setdefault("visualize", False)


@dataclass(frozen=True)
class Answer:
    """What any answer is written from, for /ocr and for a job's result alike: the logId,
    the document's kind and bytes (for the searchable PDF), whether a pageRange was given,
    and its pages in order (`pages()` gives them again each time: a ZIP reads them twice)."""

    log_id: str
    kind: str  # "pdf", "tiff" or "image"
    page_range_given: bool
    pages: Callable[[], Iterator[PageOutcome]]
    file_bytes: Callable[[], bytes]
    num_pages: int


def respond(fmt: str, answer: Answer, fonts: tuple[str, ...], builder: PdfBuilder) -> Response:
    """The whole document in `fmt` (anything but NDJSON, which its caller streams); the
    searchable PDF is built by `builder`, in a process of its own (sandbox.py)."""
    headers = {protocol.PAGES: str(answer.num_pages)}  # pages OCR'd, for clients' progress
    if fmt == JSON:
        return Response(paddlex.envelope_chunks(answer.log_id, answer.pages(),
                                                answer.page_range_given),
                        mimetype=JSON, headers=headers)
    if fmt == TEXT:
        return Response(paddlex.text_chunks(answer.pages()), mimetype="text/plain",
                        content_type="text/plain; charset=utf-8", headers=headers)
    pdf = builder.build(answer.file_bytes(), answer.kind,
                        [paddlex.page_layout(page) for page in answer.pages()], fonts)
    if fmt == PDF:
        return Response(pdf, mimetype=PDF, headers=headers)
    bundle = io.BytesIO()
    with zipfile.ZipFile(bundle, "w") as archive:
        archive.writestr(ZIP_MEMBERS[JSON], b"".join(paddlex.envelope_chunks(
            answer.log_id, answer.pages(), answer.page_range_given)), zipfile.ZIP_DEFLATED)
        archive.writestr(ZIP_MEMBERS[TEXT], b"".join(paddlex.text_chunks(answer.pages())),
                         zipfile.ZIP_DEFLATED)
        archive.writestr(ZIP_MEMBERS[PDF], pdf, zipfile.ZIP_STORED)
    return Response(bundle.getvalue(), mimetype=ZIP, headers=headers)
