"""The invisible text layer, built with fpdf2: one page per OCR'd page, as large in points as
the page is in pixels (so a line's pixel box is used as is), each line drawn in text render
mode 3 (invisible) with the chosen TrueType font embedded as a subset (CIDFontType2,
Identity-H, with a ToUnicode map, so extraction gives back the Unicode text). A line's font
size makes its ascent-to-descent height the box's height, and horizontal scaling (Tz) makes
its width the box's width; a tilted line is drawn at its angle, and a tall narrow box of
several characters (vertical text) top to bottom."""

from __future__ import annotations

import logging
import math

from fpdf import FPDF
from fpdf.enums import TextMode

from .layout import Line, PageText

logging.getLogger("fontTools").setLevel(logging.ERROR)  # "BDF NOT subset" for bitmap tables

FONT = "ocrlayer"
TILT_RADIANS = math.radians(1.0)  # below this a line is drawn level, on its bounding box
VERTICAL_RATIO = 1.5  # a box this much taller than wide, with 2+ characters, is vertical


def _run(line: Line) -> tuple[float, float, float, float, float]:
    """(origin x, origin y, angle clockwise in degrees, length, thickness) of the text run:
    the origin is the top-left corner of the text as it reads."""
    x0, y0, x1, y1 = line.box
    width, height = x1 - x0, y1 - y0
    if height > VERTICAL_RATIO * width and len(line.text) > 1:
        return x1, y0, 90.0, height, width
    if abs(line.angle) < TILT_RADIANS:
        return x0, y0, 0.0, width, height
    tl, tr, br, bl = line.poly
    length = (math.dist(tl, tr) + math.dist(bl, br)) / 2
    thickness = (math.dist(tl, bl) + math.dist(tr, br)) / 2
    return tl[0], tl[1], math.degrees(line.angle), length, thickness


def _draw(pdf: FPDF, line: Line, ascent: float, em_height: float) -> None:
    ox, oy, angle, length, thickness = _run(line)
    if length <= 0 or thickness <= 0:
        return
    size = thickness / em_height
    pdf.set_font_size(size)
    pdf.set_stretching(100)
    natural = pdf.get_string_width(line.text)
    if natural <= 0:
        return
    pdf.set_stretching(100 * length / natural)
    baseline = oy + ascent * size
    if angle:
        with pdf.rotation(-angle, ox, oy):
            pdf.text(ox, baseline, line.text)
    else:
        pdf.text(ox, baseline, line.text)


def text_layer_pdf(pages: list[PageText], font_path: str) -> tuple[bytes, list[int]]:
    """The layer as a PDF and, for each of its pages, the position in `pages` it is for
    (pages without lines get none)."""
    pdf = FPDF(unit="pt")
    pdf.set_compression(True)
    pdf.add_font(FONT, fname=font_path, collection_font_number=0)
    pdf.set_font(FONT, size=10)
    descriptor = pdf.current_font.desc
    ascent, descent = descriptor.ascent / 1000, descriptor.descent / 1000
    em_height = ascent - descent
    placed = []
    for position, page in enumerate(pages):
        if not page.lines or page.width <= 0 or page.height <= 0:
            continue
        pdf.add_page(format=(page.width, page.height))
        pdf.text_mode = TextMode.INVISIBLE
        for line in page.lines:
            _draw(pdf, line, ascent, em_height)
        placed.append(position)
    return (bytes(pdf.output()) if placed else b""), placed
