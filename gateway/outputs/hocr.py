"""The hOCR 1.2 answer (`Accept: text/vnd.hocr+html`, the media type the hOCR spec names):
what hOCR toolchains (hocr-tools, hocr-to-pdf, full-text viewers) read.

An XHTML document (save it as `.hocr` or `.html`) with `ocr-system` and `ocr-capabilities`
metadata, one `div.ocr_page` per OCR'd page (`bbox 0 0 W H; ppageno N`, N: the page's index
in the original file, 0-based as hOCR counts), its `span.ocr_line`s in reading order and
their `span.ocrx_word`s (`bbox`, `x_wconf` = the line's recognition score, 0..100), a space
between two words where the line's text has one (none between CJK characters), so the
page's text reads as the JSON's. Words come from the worker's word boxes when the request
asked for `returnWordBox`; otherwise each line is one word (words.py). A page that failed
(returnPartialResults) is an empty `div.ocr_page` (with `ppageno` and no `bbox`) whose
`div.ocrfleet_error` says its errorCode and errorMsg.

Written page by page (`hocr_chunks`). Checked with hocr-spec and parsed back in
tests/test_alto_hocr.py. Pure."""

from __future__ import annotations

from html import escape
from typing import Iterable, Iterator

from ..assemble import PageOutcome
from .alto import clean
from .words import Box, Page, TextLine, page_words

MEDIA_TYPE = "text/vnd.hocr+html"
CAPABILITIES = "ocr_page ocr_line ocrx_word"

HEAD = (
    '<?xml version="1.0" encoding="UTF-8"?>\n'
    '<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.0 Transitional//EN" '
    '"http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd">\n'
    '<html xmlns="http://www.w3.org/1999/xhtml" xml:lang="en" lang="en">\n<head>\n'
    "<title>OCR</title>\n"
    '<meta http-equiv="Content-Type" content="text/html; charset=utf-8" />\n'
    '<meta name="ocr-system" content="ocrfleet (PaddleOCR PP-OCR)" />\n'
    f'<meta name="ocr-capabilities" content="{CAPABILITIES}" />\n')
TAIL = "</body>\n</html>\n"


def _text(value: str) -> str:
    return escape(clean(value), quote=True)


def _bbox(box: Box) -> str:
    return "bbox {} {} {} {}".format(*box)


def _wconf(confidence: float | None) -> str:
    return "" if confidence is None else f"; x_wconf {round(confidence * 100)}"


def _line(line: TextLine, line_id: str) -> str:
    words = "".join(
        (" " if number > 1 and word.spaced else "")
        + f'<span class="ocrx_word" id="{line_id}_w{number}" '
        f'title="{_bbox(word.box)}{_wconf(word.confidence)}">{_text(word.text)}</span>'
        for number, word in enumerate(line.words, 1))
    return f'<span class="ocr_line" id="{line_id}" title="{_bbox(line.box)}">{words}</span>\n'


def page_html(page: Page) -> str:
    """One `div.ocr_page`: its lines, or (a failed page) none and why."""
    page_id = f"page_{page.page_index + 1}"
    if page.error_code:
        return (f'<div class="ocr_page" id="{page_id}" title="ppageno {page.page_index}">\n'
                f'<div class="ocrfleet_error">not OCR\'d: errorCode {page.error_code}: '
                f"{_text(page.error_msg)}</div>\n</div>\n")
    lines = "".join(_line(line, f"line_{page.page_index + 1}_{number}")
                    for number, line in enumerate(page.lines, 1))
    return (f'<div class="ocr_page" id="{page_id}" '
            f'title="{_bbox((0, 0, page.width, page.height))}; ppageno {page.page_index}">\n'
            f"{lines}</div>\n")


def hocr_chunks(pages: Iterable[PageOutcome], num_pages: int) -> Iterator[bytes]:
    """The whole hOCR document, a page at a time."""
    yield (HEAD + f'<meta name="ocr-number-of-pages" content="{num_pages}" />\n'
           "</head>\n<body>\n").encode()
    for page in pages:
        yield page_html(page_words(page)).encode()
    yield TAIL.encode()
