"""The ALTO v4 answer (`Accept: application/alto+xml`): what digital archives and their
toolchains (METS/ALTO viewers, full-text indexers) read.

One `Page` per OCR'd page (`PHYSICAL_IMG_NR`: its number in the original file, 1-based;
`WIDTH`/`HEIGHT`: its size in pixels as OCR'd), `MeasurementUnit` pixel. Its `PrintSpace`
holds one `TextBlock` with the page's `TextLine`s in reading order, each with its `String`s
(`CONTENT`, box, `WC` = the line's recognition score, 0..1), an `SP` where the line's text
has a space (none between CJK characters). Words come from
the worker's word boxes when the request asked for `returnWordBox`; otherwise each line is one
`String` (words.py). A page that failed (returnPartialResults) is an empty `Page` with
`QUALITY="Missing"` and `QUALITY_DETAIL` giving its errorCode and errorMsg: schema-valid, and
the page count still matches the document.

Written page by page (`alto_chunks`), so an answer of many pages is never held whole. Valid
against the official ALTO 4.4 XSD (tests/test_alto_hocr.py). Pure."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Iterable, Iterator

from ..assemble import PageOutcome
from .words import Box, Page, TextLine, page_words

MEDIA_TYPE = "application/alto+xml"
NAMESPACE = "http://www.loc.gov/standards/alto/ns-v4#"
SCHEMA_LOCATION = f"{NAMESPACE} http://www.loc.gov/standards/alto/v4/alto-4-4.xsd"
SOFTWARE = "ocrfleet (PaddleOCR PP-OCR)"
# characters XML 1.0 cannot carry at all, even escaped
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")

HEAD = (
    '<?xml version="1.0" encoding="UTF-8"?>\n'
    f'<alto xmlns="{NAMESPACE}" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
    f'xsi:schemaLocation="{SCHEMA_LOCATION}" SCHEMAVERSION="4.4">\n'
    "<Description><MeasurementUnit>pixel</MeasurementUnit>"
    '<Processing ID="ocr"><processingCategory>contentGeneration</processingCategory>'
    f"<processingSoftware><softwareName>{SOFTWARE}</softwareName></processingSoftware>"
    "</Processing></Description>\n<Layout>\n")
TAIL = "</Layout>\n</alto>\n"


def clean(value: str) -> str:
    """`value` without the characters XML 1.0 cannot hold (escaping is ElementTree's)."""
    return _NOT_XML.sub("", value)


def _place(element: ET.Element, box: Box) -> ET.Element:
    x0, y0, x1, y1 = box
    element.attrib.update(HPOS=str(x0), VPOS=str(y0), WIDTH=str(x1 - x0), HEIGHT=str(y1 - y0))
    return element


def _union(boxes: list[Box]) -> Box:
    return (min(b[0] for b in boxes), min(b[1] for b in boxes),
            max(b[2] for b in boxes), max(b[3] for b in boxes))


def _text_line(parent: ET.Element, line: TextLine, line_id: str) -> None:
    element = _place(ET.SubElement(parent, "TextLine", ID=line_id), line.box)
    previous: Box | None = None
    for number, word in enumerate(line.words, 1):
        if previous is not None and word.spaced:
            gap = ET.SubElement(element, "SP")
            if word.box[0] > previous[2]:
                gap.attrib.update(HPOS=str(previous[2]), VPOS=str(previous[1]),
                                  WIDTH=str(word.box[0] - previous[2]))
        string = _place(ET.SubElement(element, "String", ID=f"{line_id}_w{number}",
                                      CONTENT=clean(word.text)), word.box)
        if word.confidence is not None:
            string.set("WC", f"{word.confidence:.4f}")
        previous = word.box


def page_element(page: Page) -> ET.Element:
    """One `Page`: its lines, or (a failed page) none and why."""
    page_id = f"p{page.page_index + 1}"
    element = ET.Element("Page", ID=page_id, PHYSICAL_IMG_NR=str(page.page_index + 1))
    if page.width and page.height:
        element.attrib.update(WIDTH=str(page.width), HEIGHT=str(page.height))
    if page.error_code:
        element.attrib.update(QUALITY="Missing", QUALITY_DETAIL=clean(
            f"not OCR'd: errorCode {page.error_code}: {page.error_msg}"))
        return element
    space = _place(ET.SubElement(element, "PrintSpace", ID=f"{page_id}_ps"),
                   (0, 0, page.width, page.height))
    if page.lines:
        block = _place(ET.SubElement(space, "TextBlock", ID=f"{page_id}_b1"),
                       _union([line.box for line in page.lines]))
        for number, line in enumerate(page.lines, 1):
            _text_line(block, line, f"{page_id}_l{number}")
    return element


def page_xml(page: PageOutcome) -> bytes:
    """One page's `Page` element, UTF-8, in the default (ALTO) namespace of the document."""
    return ET.tostring(page_element(page_words(page)), encoding="unicode").encode() + b"\n"


def alto_chunks(pages: Iterable[PageOutcome]) -> Iterator[bytes]:
    """The whole ALTO document, a page at a time."""
    yield HEAD.encode()
    for page in pages:
        yield page_xml(page)
    yield TAIL.encode()
