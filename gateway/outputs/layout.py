"""The recognised lines of each page, read out of a document's `result` (`ocrResults` and
`dataInfo`, as the gateway's JSON answer carries them): what the text and PDF renderings are
made from. Coordinates stay in pixels of the page as the worker saw it (a PDF page rendered,
rotated and cropped as a viewer shows it; an image as decoded). Pure."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

Point = tuple[float, float]


@dataclass(frozen=True)
class Line:
    """One recognised line: its text and its quadrilateral (top-left, top-right,
    bottom-right, bottom-left, in pixels, y downwards)."""

    text: str
    poly: tuple[Point, Point, Point, Point]

    @property
    def box(self) -> tuple[float, float, float, float]:
        xs = [x for x, _ in self.poly]
        ys = [y for _, y in self.poly]
        return min(xs), min(ys), max(xs), max(ys)

    @property
    def angle(self) -> float:
        """The slope of the top edge, radians, clockwise as seen (y points down)."""
        (x0, y0), (x1, y1) = self.poly[0], self.poly[1]
        return math.atan2(y1 - y0, x1 - x0)


@dataclass
class PageText:
    """One OCR'd page: where it is in the original file, its size in pixels as OCR'd, its
    lines (empty for a page that failed, which then has `error`), and whether the page has
    text of its own (textLayer "auto" said so: the searchable PDF adds no second layer)."""

    page_index: int
    width: float
    height: float
    lines: list[Line] = field(default_factory=list)
    error: str | None = None
    own_text: bool = False


def _poly(raw: Any) -> tuple[Point, Point, Point, Point] | None:
    try:
        points = [(float(x), float(y)) for x, y in raw]
    except (TypeError, ValueError):
        return None
    if len(points) == 4:
        return points[0], points[1], points[2], points[3]
    if len(points) < 3:
        return None
    xs, ys = [x for x, _ in points], [y for _, y in points]  # a polygon: its bounding box
    return (min(xs), min(ys)), (max(xs), min(ys)), (max(xs), max(ys)), (min(xs), max(ys))


def _box_poly(raw: Any) -> tuple[Point, Point, Point, Point] | None:
    try:
        x0, y0, x1, y1 = (float(v) for v in raw)
    except (TypeError, ValueError):
        return None
    return (x0, y0), (x1, y0), (x1, y1), (x0, y1)


def has_own_text(pruned: dict[str, Any] | None) -> bool:
    """Whether the worker found a text layer on the page (`model_settings.text_layer`, set
    only with textLayer "auto": "used" when the lines are that text, "unused" when the page
    was OCR'd all the same)."""
    settings = pruned.get("model_settings") if isinstance(pruned, dict) else None
    return isinstance(settings, dict) and settings.get("text_layer") in ("used", "unused")


def page_lines(pruned: dict[str, Any] | None) -> list[Line]:
    """The lines of one `prunedResult`: `rec_texts` with `rec_polys` (or `rec_boxes`);
    blank texts and lines without a usable shape are left out."""
    if not isinstance(pruned, dict):
        return []
    texts = pruned.get("rec_texts") or []
    polys = pruned.get("rec_polys") or []
    boxes = pruned.get("rec_boxes") or []
    lines = []
    for index, text in enumerate(texts):
        if not isinstance(text, str) or not text.strip():
            continue
        poly = _poly(polys[index]) if index < len(polys) else None
        if poly is None and index < len(boxes):
            poly = _box_poly(boxes[index])
        if poly is not None:
            lines.append(Line(text.strip(), poly))
    return lines
