"""Plain-text rendering: each page's lines in reading order (top to bottom; lines whose
vertical centres are within half a line height form one row, read left to right), rows on
separate lines, pages separated by form feeds (as pdftotext writes them). Pure."""

from __future__ import annotations

from statistics import median

from .layout import Line, PageText

ROW_TOLERANCE = 0.5  # of a line's height: how far apart two centres may be on one row


def rows(lines: list[Line]) -> list[list[Line]]:
    """Lines grouped into rows, rows top to bottom, each row left to right."""
    grouped: list[list[Line]] = []
    for line in sorted(lines, key=lambda l: (l.box[1], l.box[0])):
        x0, y0, x1, y1 = line.box
        centre, height = (y0 + y1) / 2, y1 - y0
        if grouped:
            row = grouped[-1]
            row_centre = median((l.box[1] + l.box[3]) / 2 for l in row)
            row_height = median(l.box[3] - l.box[1] for l in row)
            if abs(centre - row_centre) <= ROW_TOLERANCE * min(height, row_height):
                row.append(line)
                continue
        grouped.append([line])
    return [sorted(row, key=lambda l: l.box[0]) for row in grouped]


def page_text(page: PageText) -> str:
    return "".join(" ".join(line.text for line in row) + "\n" for row in rows(page.lines))


def document_text(pages: list[PageText]) -> str:
    """The whole document: pages in order, separated by form feeds (\\f)."""
    return "\f".join(page_text(page) for page in pages)
