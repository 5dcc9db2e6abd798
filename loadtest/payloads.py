"""Ready-to-send /ocr bodies made from samples/documents.py, each serialised once with the answer
it expects, so a load generator spends its CPU on sending. They say `"visualize": false` unless
asked otherwise: drawing the visualizations (the server's default, as in PaddleX) costs about
1 CPU-s per dense page and is not OCR."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

from loadtest.checks import Expected
from samples import documents

JSON_HEADERS = {"Content-Type": "application/json"}


@dataclass(frozen=True)
class Payload:
    name: str
    body: bytes
    expected: Expected


def make_payload(name: str, data: bytes, kind: str, pages: int, labelled: bool = False,
                 visualize: bool | None = False) -> Payload:
    """visualize None leaves the field out (the server's default applies)."""
    fields = {"file": base64.b64encode(data).decode("ascii"),
              "fileType": 0 if kind == "pdf" else 1}
    if visualize is not None:
        fields["visualize"] = visualize
    return Payload(name, json.dumps(fields).encode(), Expected(pages, kind, labelled))


def small_image_payloads(count: int = 8, seed: int = 0,
                         visualize: bool | None = False) -> list[Payload]:
    """One- or two-line text images (a few KB of PNG, ~25 ms each on the real engine)."""
    return [make_payload(f"image:small:{i}", documents.to_png(documents.text_image(
        documents.english_lines(1 + i % 2, seed + i, words_per_line=5), size=32)),
        "image", 1, visualize=visualize) for i in range(count)]


def dense_page_payloads(count: int = 2, visualize: bool | None = False) -> list[Payload]:
    """Dense A4 pages at 150 DPI (~1.3-1.9 s each on the real engine, 1 thread)."""
    return [make_payload(f"image:dense:{i}", documents.to_png(documents.dense_page(i)),
                         "image", 1, visualize=visualize) for i in range(count)]


def dense_scan_payloads(count: int = 2, visualize: bool | None = False) -> list[Payload]:
    """Dense A4 scans at 300 DPI (samples/scans.py dense_scan: 2481 x 3507 px, ~70 lines of
    10-point text on tinted paper), as PNG."""
    from samples import scans

    return [make_payload(f"image:scan:{i}", documents.to_png(scans.dense_scan(i)), "image", 1,
                         visualize=visualize) for i in range(count)]


def labelled_pdf_payload(pages: int, seed: int = 0, visualize: bool | None = False,
                         table: bool = False) -> Payload:
    """A PDF whose page i says "Page i of N" (with `table`, a ruled table on each page)."""
    make = documents.table_pdf if table else documents.labelled_pdf
    return make_payload(f"pdf:{'table:' if table else ''}{pages}p", make(pages, seed=seed),
                        "pdf", pages, labelled=True, visualize=visualize)


def one_page_pdfs(pdf: bytes, pages: int) -> list[bytes]:
    """The first `pages` pages of a PDF, each as the one-page PDF the gateway sends a worker."""
    from gateway.split import PdfCutter

    cutter = PdfCutter(pdf)
    try:
        return [cutter.cut((index,)).data for index in range(pages)]
    finally:
        cutter.close()
