"""What /ocr and a job's result answer with, chosen by the request's Accept header: the
PaddleX JSON envelope (the default), NDJSON page by page, plain text, the searchable PDF
(pdf.py), ALTO v4 XML (alto.py) and hOCR (hocr.py) for archives' toolchains, or a ZIP of
them all from one OCR pass (what a batch client that wants several of them asks for).
/layout-parsing answers in JSON, NDJSON or the document's Markdown (`LAYOUT_OFFERED`). This
package is the one writer of answers (paddlex.py: the envelope, NDJSON lines, text), from
pages in order (`Answer`). Errors are JSON envelopes whatever was asked for."""

from __future__ import annotations

import shutil
import zipfile
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Iterator, MutableMapping

from flask import Response
from werkzeug.datastructures import MIMEAccept
from werkzeug.http import parse_accept_header

from services.ocr_api import headers as protocol
from services.ocr_api.errors import ApiError

from ..assemble import PageOutcome
from ..endpoint import OCR, Endpoint
from . import alto, hocr, paddlex
from .sandbox import PdfBuilder
from .spool import UNBOUNDED, DiskBudget, MeteredSpool

JSON = "application/json"
NDJSON = "application/x-ndjson"
TEXT = "text/plain"
PDF = "application/pdf"
ZIP = "application/zip"
ALTO = alto.MEDIA_TYPE  # application/alto+xml
HOCR = hocr.MEDIA_TYPE  # text/vnd.hocr+html
MARKDOWN = "text/markdown"
OFFERED = (JSON, NDJSON, TEXT, PDF, ALTO, HOCR, ZIP)  # /ocr's
LAYOUT_OFFERED = (JSON, NDJSON, MARKDOWN)  # /layout-parsing's
# a client that names several formats at the same quality gets the most specific one
NAMED_PRIORITY = {NDJSON: 7, PDF: 6, ALTO: 5, HOCR: 4, ZIP: 3, MARKDOWN: 2, TEXT: 2, JSON: 1}
ZIP_MEMBERS = {JSON: "result.json", TEXT: "text.txt", PDF: "searchable.pdf",
               ALTO: "result.alto.xml", HOCR: "result.hocr"}
ZIP_MEMORY_BYTES = 8 * 2**20  # a ZIP being written past this goes to a temporary file
ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # members are dated as zipfile dates what it has no date for


def negotiate(header: str | None, offered: tuple[str, ...] = OFFERED) -> str:
    """The format for this Accept header: JSON without one (or for */*), 406 when it
    accepts none of `offered` (the endpoint's: OFFERED, LAYOUT_OFFERED)."""
    if not header or not header.strip():
        return JSON
    accept = parse_accept_header(header, MIMEAccept)
    named = {value.lower() for value, quality in accept if quality > 0}

    def rank(offer: str) -> tuple[float, bool, int]:
        is_named = offer in named
        return (accept.quality(offer), is_named,
                NAMED_PRIORITY[offer] if is_named else int(offer == JSON))

    best = max(offered, key=rank)
    if accept.quality(best) <= 0:
        raise ApiError(406, f"Cannot answer with {header!r}: this answers in "
                            f"{', '.join(offered)} (Accept header)")
    return best


def prepare_fields(fmt: str, fields: MutableMapping[str, Any]) -> None:
    """Text, PDF, ALTO, hOCR and ZIP answers use no visualization images: skip them unless
    asked."""
    if fmt in (TEXT, PDF, ALTO, HOCR, ZIP):
        fields.setdefault("visualize", False)


@dataclass(frozen=True)
class Answer:
    """What any answer is written from, for /ocr and for a job's result alike: the logId,
    the document's kind and bytes (for the searchable PDF), whether a pageRange was given,
    its pages in order (`pages()` gives them again each time: a ZIP reads them twice), and
    the endpoint that read them (what the JSON calls its pages)."""

    log_id: str
    kind: str  # "pdf", "tiff" or "image"
    page_range_given: bool
    pages: Callable[[], Iterator[PageOutcome]]
    file_bytes: Callable[[], bytes]
    num_pages: int
    endpoint: Endpoint = OCR


def respond(fmt: str, answer: Answer, fonts: tuple[str, ...], builder: PdfBuilder,
            disk: DiskBudget = UNBOUNDED) -> Response:
    """The whole document in `fmt` (anything but NDJSON, which its caller streams); the
    searchable PDF is built by `builder`, in a process of its own (sandbox.py), into a file.
    The PDF and a ZIP are written whole before their first byte is sent, into files whose
    disk comes out of the process's `disk` budget: any error they meet is a JSON answer, not
    a cut-off 200."""
    headers = {protocol.PAGES: str(answer.num_pages)}  # pages OCR'd, for clients' progress
    if fmt == JSON:
        return Response(paddlex.envelope_chunks(answer.log_id, answer.pages(),
                                                answer.page_range_given, answer.endpoint),
                        mimetype=JSON, headers=headers)
    if fmt == MARKDOWN:
        return Response(paddlex.markdown_chunks(answer.pages()), mimetype=MARKDOWN,
                        content_type=f"{MARKDOWN}; charset=utf-8", headers=headers)
    if fmt == TEXT:
        return Response(paddlex.text_chunks(answer.pages()), mimetype="text/plain",
                        content_type="text/plain; charset=utf-8", headers=headers)
    if fmt == ALTO:
        return Response(alto.alto_chunks(answer.pages()), mimetype=ALTO,
                        content_type=f"{ALTO}; charset=utf-8", headers=headers)
    if fmt == HOCR:
        return Response(hocr.hocr_chunks(answer.pages(), answer.num_pages), mimetype=HOCR,
                        content_type=f"{HOCR}; charset=utf-8", headers=headers)
    if fmt == ZIP:
        disk.check(ZIP_MEMORY_BYTES)  # before the PDF is built
    pdf = builder.build(answer.file_bytes(), answer.kind,
                        [paddlex.page_layout(page) for page in answer.pages()], fonts, disk)
    if fmt == PDF:
        return _streamed(pdf, PDF, {**headers, "Content-Length": str(pdf.size)})
    try:
        archive = _zip_file(answer, pdf, disk)
    finally:
        pdf.close()
    return _streamed(archive, ZIP, headers)


def _streamed(file: BinaryIO, mimetype: str, headers: dict[str, str]) -> Response:
    """A file sent a chunk at a time from where it stands, and closed with the response."""
    response = Response(_chunks(file), mimetype=mimetype, headers=headers)
    response.call_on_close(file.close)
    return response


def _zip_file(answer: Answer, pdf: BinaryIO, disk: DiskBudget) -> MeteredSpool:
    """The ZIP, each member written a chunk at a time into a spooled file (memory up to a
    few MB, then disk, at most `disk.answer_bytes`), rewound: its size never sits in the
    gateway's memory."""
    members = {
        ZIP_MEMBERS[JSON]: paddlex.envelope_chunks(answer.log_id, answer.pages(),
                                                   answer.page_range_given),
        ZIP_MEMBERS[TEXT]: paddlex.text_chunks(answer.pages()),
        ZIP_MEMBERS[ALTO]: alto.alto_chunks(answer.pages()),
        ZIP_MEMBERS[HOCR]: hocr.hocr_chunks(answer.pages(), answer.num_pages),
    }
    spooled = MeteredSpool(ZIP_MEMORY_BYTES, disk.answer_bytes, disk, "ocrfleet-zip-")
    try:
        with zipfile.ZipFile(spooled, "w") as archive:
            for name, chunks in members.items():
                info = zipfile.ZipInfo(name, ZIP_DATE)
                info.compress_type = zipfile.ZIP_DEFLATED
                with archive.open(info, "w", force_zip64=True) as out:
                    for chunk in chunks:
                        out.write(chunk)
            with archive.open(zipfile.ZipInfo(ZIP_MEMBERS[PDF], ZIP_DATE), "w",
                              force_zip64=True) as out:
                shutil.copyfileobj(pdf, out, 1 << 20)
        spooled.seek(0)
    except BaseException:
        spooled.close()
        raise
    return spooled


def _chunks(file: BinaryIO) -> Iterator[bytes]:
    while chunk := file.read(1 << 20):
        yield chunk
