"""Documents whose text is the attack (issue 49, items 6 and 7), without a server: a page of
tens of thousands of one-glyph lines costs the worker linear work, outside the pdfium lock
but for reading the characters, and is OCR'd; the reading order is PaddleOCR's on ordinary
pages and n log n on any; a ToUnicode map that yields a lone surrogate costs nothing but
that character, and none reaches or breaks a writer (JSON, NDJSON, text, ALTO, hOCR), from
the text layer, a worker's result or a reply the gateway reads."""

import json
import random
import threading
import time

import numpy as np
import pytest

from gateway.assemble import PageOutcome
from gateway.dispatch import _json_or_empty
from gateway.outputs import alto, hocr, paddlex
from services.documents import pdf as documents_pdf
from services.documents.pdf import (MAX_LAYER_LINES, PDFIUM_LOCK, LayerLine, open_pdf,
                                    read_text_layer, reading_order)
from services.ocr_api.request import parse_ocr_request
from services.ocr_worker import decode as worker_decode
from services.ocr_worker.decode import DecodeLimits, TextLayerPage, open_document
from services.ocr_worker.encode import prune_result
from tests.conftest import b64
from tests.hostile_pdfs import glyph_lines_pdf, surrogate_pdf

LIMITS = DecodeLimits(max_pages=20, max_pixels=50_000_000, pdf_dpi=144, scan_dpi_max=400)
SURROGATE = "\ud800"


def decode(pdf: bytes):
    request = parse_ocr_request({"file": b64(pdf), "textLayer": "auto"}, max_bytes=10**8)
    document = open_document(request, LIMITS)
    try:
        return list(document.pages()), dict(document.text_layer_marks)
    finally:
        document.close()


# ---- the reading order --------------------------------------------------------------------
def sorted_boxes(lines, same_row_px=10.0):
    """PaddleOCR's sorted_boxes, as reading_order was written before: the reference."""
    ordered = sorted(lines, key=lambda line: (line.poly[0][1], line.poly[0][0]))
    for i in range(len(ordered) - 1):
        for j in range(i, -1, -1):
            (ax, ay), (bx, by) = ordered[j].poly[0], ordered[j + 1].poly[0]
            if abs(by - ay) < same_row_px and bx < ax:
                ordered[j], ordered[j + 1] = ordered[j + 1], ordered[j]
            else:
                break
    return ordered


class Corner(tuple):
    """A line's quadrilateral that counts how often its corners are read: the work of an
    ordering."""

    reads = 0

    def __getitem__(self, index):
        Corner.reads += 1
        return super().__getitem__(index)


def line_at(x: float, y: float, text: str = "", counted: bool = False) -> LayerLine:
    corners = ((x, y), (x + 30, y), (x + 30, y + 20), (x, y + 20))
    return LayerLine(text, Corner(corners) if counted else corners, ())


def ordinary_page(rng: random.Random) -> list[LayerLine]:
    """Rows of lines (columns, table cells) whose corners wobble by a few pixels, rows a line
    height apart or more, with now and then a superscript or a note a few pixels off its row
    (a run of rows closer than PaddleOCR's threshold)."""
    lines, y = [], rng.uniform(0, 50)
    for row in range(rng.randint(1, 60)):
        for cell in range(rng.randint(1, 8)):
            wobble = rng.uniform(-4, 4) if rng.random() < 0.3 else 0.0
            lines.append(line_at(rng.uniform(0, 2000), round(y + wobble, 1), f"{row}.{cell}"))
            if rng.random() < 0.05:
                lines.append(line_at(rng.uniform(0, 2000), round(y + rng.uniform(6, 9), 1)))
        y += rng.uniform(12, 60) if rng.random() < 0.9 else rng.uniform(3, 9.9)
    rng.shuffle(lines)
    return lines


@pytest.mark.parametrize("seed", range(200))
def test_the_reading_order_is_paddleocrs_on_ordinary_pages(seed):
    lines = ordinary_page(random.Random(seed))
    assert reading_order(lines) == sorted_boxes(lines)


def test_the_reading_order_is_paddleocrs_on_the_born_digital_samples():
    from samples import documents

    for pdf in (documents.labelled_pdf(3), documents.table_pdf(2, seed=7),
                documents.dense_pdf(2)):
        with PDFIUM_LOCK:
            document = open_pdf(pdf)
            try:
                layers = [read_text_layer(document[i], 1224, 1584) for i in range(len(document))]
            finally:
                document.close()
        for layer in layers:
            assert layer.lines and layer.lines == sorted_boxes(layer.lines)


@pytest.mark.parametrize("layout", ["one row right to left", "two rows interleaved",
                                    "a band of rows 0.1 px apart"])
def test_the_reading_order_reads_each_corner_a_bounded_number_of_times(layout):
    """The layouts that make PaddleOCR's insertion sort quadratic (every line moves past all
    before it): counted in corner reads, n log n allows a few dozen a line."""
    count = 3000
    if layout == "one row right to left":
        lines = [line_at(10_000 - i, 50 + i * 0.001, counted=True) for i in range(count)]
    elif layout == "two rows interleaved":
        lines = [line_at(i // 2, 50 + (i % 2) * 3, counted=True) for i in range(count)]
    else:
        lines = [line_at(10_000 - i, 50 + (i // 20) * 0.1, counted=True) for i in range(count)]
    Corner.reads = 0
    ordered = reading_order(lines)
    assert sorted(map(id, ordered)) == sorted(map(id, lines))
    assert Corner.reads < 200 * count, Corner.reads  # the insertion sort: millions


# ---- the text layer's cost ----------------------------------------------------------------
@pytest.mark.parametrize("glyphs", [MAX_LAYER_LINES + 1000, 40_000])
def test_a_page_of_one_glyph_lines_is_ocrd_after_linear_work(glyphs):
    """Over MAX_LAYER_LINES lines (6,000), or over MAX_LAYER_CHARS characters (40,000
    glyphs: about 100 KB of PDF), the page is rendered and OCR'd ("unused") instead of
    being read from its text. Before, 40,000 held the pdfium lock for minutes."""
    pdf = glyph_lines_pdf(glyphs)
    done: dict = {}
    reader = threading.Thread(target=lambda: done.update(result=decode(pdf)), daemon=True)
    reader.start()
    reader.join(60)  # linear: well under a second; quadratic: minutes
    assert "result" in done, "the text layer was still being read after 60 s"
    pages, marks = done["result"]
    assert marks == {0: "unused"} and isinstance(pages[0], np.ndarray)


def test_lines_are_made_and_ordered_with_the_pdfium_lock_free(monkeypatch):
    """Only reading pdfium's characters holds the process-wide lock; grouping them into
    lines and ordering those does not."""
    held = []

    def text_layer(chars):
        held.append(PDFIUM_LOCK.locked())
        return documents_pdf.text_layer(chars)

    monkeypatch.setattr(worker_decode, "text_layer", text_layer)
    from samples import documents

    pages, marks = decode(documents.labelled_pdf(2))
    assert marks == {0: "used", 1: "used"} and all(isinstance(p, TextLayerPage) for p in pages)
    assert held == [False, False]


# ---- lone surrogates ----------------------------------------------------------------------
def test_a_glyph_mapped_to_a_lone_surrogate_is_unmapped_not_read():
    with PDFIUM_LOCK:
        document = open_pdf(surrogate_pdf())
        try:
            layer = read_text_layer(document[0], 800, 200)
        finally:
            document.close()
    assert [line.text for line in layer.lines] == ["Paid in full on the 3rd of May: thank you"]
    assert layer.unmapped == 1
    pages, marks = decode(surrogate_pdf())
    assert marks == {0: "used"}
    assert all(SURROGATE not in text for line in pages[0].lines
               for text in [line.text, *(word for word, _ in line.words)])


def page_with(text: str) -> PageOutcome:
    corners = [[10, 10], [300, 10], [300, 40], [10, 40]]
    return PageOutcome(0, {"prunedResult": {"rec_texts": [text], "rec_scores": [0.9],
                                            "rec_polys": [corners],
                                            "rec_boxes": [[10, 10, 300, 40]]}},
                       {"width": 400, "height": 100})


def test_every_writer_answers_whole_around_a_lone_surrogate():
    """A page result that still holds one (from an older worker, a cache entry written
    before): each writer completes, with U+FFFD in its place."""
    page = page_with(f"total {SURROGATE} due")
    written = {
        "json": b"".join(paddlex.envelope_chunks("log", [page], False)),
        "ndjson": paddlex.line(paddlex.stream_page_line("log", page)),
        "text": b"".join(paddlex.text_chunks([page])),
        "alto": b"".join(alto.alto_chunks([page])),
        "hocr": b"".join(hocr.hocr_chunks([page], 1)),
    }
    for name, data in written.items():
        text = data.decode("utf-8")  # valid UTF-8 throughout
        assert "total" in text and "due" in text, name
    assert json.loads(written["json"])["result"]["ocrResults"][0]["prunedResult"][
        "rec_texts"] == ["total \ufffd due"]
    assert json.loads(written["ndjson"])["ocrResult"]["prunedResult"]["rec_texts"] == \
        ["total \ufffd due"]
    assert written["text"] == "total \ufffd due\n".encode()


def test_a_reply_that_escapes_a_lone_surrogate_is_read_without_it():
    reply = json.dumps({"result": {"ocrResults": [{"prunedResult": {
        "rec_texts": ["a\ud800b", "\ud83d\ude00 kept"]}}]}, "errorMsg": "x\udfff"}).encode()
    assert b"\\ud800" in reply
    parsed = _json_or_empty(reply)
    assert parsed["result"]["ocrResults"][0]["prunedResult"]["rec_texts"] == \
        ["a\ufffdb", "\U0001F600 kept"]
    assert parsed["errorMsg"] == "x\ufffd"


def test_a_workers_result_carries_no_lone_surrogate():
    pruned = prune_result({"rec_texts": ["a\ud800"], "input_path": "x",
                           "model_settings": {"k": ["\udc00"]}})
    assert pruned == {"rec_texts": ["a\ufffd"], "model_settings": {"k": ["\ufffd"]}}
