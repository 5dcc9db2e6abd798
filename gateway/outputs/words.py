"""Each OCR'd page as lines of words with whole-pixel boxes and confidences: what the ALTO
(alto.py) and hOCR (hocr.py) answers are written from, so both say the same thing.

Words are the worker's word boxes (`text_word` / `text_word_boxes` in `prunedResult`, there
when the request asked for `returnWordBox`); without them, or where they do not spell their
line's text, the whole line is one word, so the text is always the JSON's. PaddleOCR scores
lines, not words: every word carries its line's `rec_scores` entry. Boxes are axis-aligned,
in pixels of the page as OCR'd, y downwards, clipped to the page: a rotated line's is the
bounding box of its polygon, and each of its words as high as the polygon is where the word
lies (`_fit`). Lines come in the plain text's reading order (text.py). Pure."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..assemble import PageOutcome
from . import text

Box = tuple[int, int, int, int]  # x0, y0, x1, y1


@dataclass(frozen=True)
class Word:
    text: str
    box: Box
    confidence: float | None  # 0..1
    spaced: bool = True  # a space before it in its line's text (none between CJK characters)


@dataclass(frozen=True)
class TextLine:
    text: str
    box: Box
    confidence: float | None
    words: tuple[Word, ...]


@dataclass(frozen=True)
class Page:
    """One page of the answer: its index in the original file, its size in pixels (0 when
    unknown), its lines; a page that failed (partial mode) has no lines and its error."""

    page_index: int
    width: int
    height: int
    lines: tuple[TextLine, ...]
    error_code: int = 0
    error_msg: str = ""


def _bounds(raw: Any) -> tuple[float, float, float, float] | None:
    """The bounding box of a polygon ([[x, y], ...]) or of a box ([x0, y0, x1, y1])."""
    try:
        if raw and all(isinstance(point, (list, tuple)) for point in raw):
            xs = [float(x) for x, _ in raw]
            ys = [float(y) for _, y in raw]
            values = (min(xs), min(ys), max(xs), max(ys))
        else:
            values = tuple(float(v) for v in raw)
    except (TypeError, ValueError):
        return None
    if len(values) != 4 or not all(math.isfinite(v) for v in values):
        return None
    x0, y0, x1, y1 = values
    return (x0, y0, x1, y1) if x1 >= x0 and y1 >= y0 else None


def _pixels(bounds: tuple[float, float, float, float], width: int, height: int) -> Box:
    """Whole pixels that cover `bounds`, clipped to the page when its size is known."""
    x0, y0 = math.floor(bounds[0]), math.floor(bounds[1])
    x1, y1 = math.ceil(bounds[2]), math.ceil(bounds[3])
    if width > 0 and height > 0:
        x0, x1 = min(max(x0, 0), width), min(max(x1, 0), width)
        y0, y1 = min(max(y0, 0), height), min(max(y1, 0), height)
    return x0, y0, max(x0, x1), max(y0, y1)


def _score(raw: Any) -> float | None:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return None
    return min(max(value, 0.0), 1.0) if math.isfinite(value) else None


def _item(values: Any, index: int) -> Any:
    return values[index] if isinstance(values, list) and index < len(values) else None


def _points(raw: Any) -> list[tuple[float, float]]:
    try:
        return [(float(x), float(y)) for x, y in raw]
    except (TypeError, ValueError):
        return []


def _clip(points: list[tuple[float, float]], axis: int, value: float, above: bool
          ) -> list[tuple[float, float]]:
    """The part of a polygon on one side of the line `coordinate[axis] == value`."""
    kept = []
    for number, point in enumerate(points):
        previous = points[number - 1]
        inside = point[axis] >= value if above else point[axis] <= value
        was_inside = previous[axis] >= value if above else previous[axis] <= value
        if inside != was_inside:
            t = (value - previous[axis]) / (point[axis] - previous[axis])
            kept.append((previous[0] + t * (point[0] - previous[0]),
                         previous[1] + t * (point[1] - previous[1])))
        if inside:
            kept.append(point)
    return kept


def _fit(bounds: tuple[float, float, float, float], poly: list[tuple[float, float]]
         ) -> tuple[float, float, float, float]:
    """A word's box across its line's whole polygon. PaddleX cuts a line into words along
    its length but takes their height from two corners of the polygon, a sliver where the
    line is rotated: the slice of the polygon between the word's ends gives the height."""
    if len(poly) < 3:
        return bounds
    xs, ys = [x for x, _ in poly], [y for _, y in poly]
    along = 1 if max(ys) - min(ys) > 1.5 * (max(xs) - min(xs)) else 0  # vertical text: y
    part = _clip(_clip(poly, along, bounds[along], True), along, bounds[along + 2], False)
    if not part:
        return bounds
    across = [point[1 - along] for point in part]
    if along == 0:
        return bounds[0], min(across), bounds[2], max(across)
    return min(across), bounds[1], max(across), bounds[3]


def _spacing(line_text: str, words: list[str]) -> list[bool]:
    """Whether each word follows a gap in its line's text (a space; none between CJK
    characters); True where the word is not found there."""
    spaced, cursor = [], 0
    for number, word in enumerate(words):
        found = line_text.find(word, cursor)
        spaced.append(found < 0 or number == 0 or found > cursor)
        cursor = found + len(word) if found >= 0 else cursor
    return spaced


def _words(pruned: dict[str, Any], index: int, line: TextLine, size: tuple[int, int]
           ) -> tuple[Word, ...]:
    """The line's words from its word boxes, or the line as one word."""
    texts = _item(pruned.get("text_word"), index)
    boxes = _item(pruned.get("text_word_boxes"), index)
    poly = _points(_item(pruned.get("rec_polys"), index))
    found = []
    if isinstance(texts, list) and isinstance(boxes, list) and len(texts) == len(boxes):
        for word, raw in zip(texts, boxes):
            bounds = _bounds(raw)
            if isinstance(word, str) and word.strip() and bounds is not None:
                found.append((word.strip(), _pixels(_fit(bounds, poly), *size)))
    if "".join(word for word, _ in found) != "".join(line.text.split()):
        return (Word(line.text, line.box, line.confidence),)  # words that lose or add text
    spaced = _spacing(line.text, [word for word, _ in found])
    return tuple(Word(word, box, line.confidence, space)
                 for (word, box), space in zip(found, spaced))


def _line(pruned: dict[str, Any], index: int, size: tuple[int, int]) -> TextLine | None:
    """Line `index` of a `prunedResult` (None for a blank one or one without a shape)."""
    line_text = _item(pruned.get("rec_texts"), index)
    if not isinstance(line_text, str) or not line_text.strip():
        return None
    bounds = _bounds(_item(pruned.get("rec_polys"), index)) or _bounds(
        _item(pruned.get("rec_boxes"), index))
    if bounds is None:
        return None
    line = TextLine(line_text.strip(), _pixels(bounds, *size),
                    _score(_item(pruned.get("rec_scores"), index)), ())
    return TextLine(line.text, line.box, line.confidence, _words(pruned, index, line, size))


def _size(page: PageOutcome) -> tuple[int, int]:
    info = page.page_info or {}
    try:
        return max(0, round(float(info.get("width") or 0))), max(0, round(
            float(info.get("height") or 0)))
    except (TypeError, ValueError):
        return 0, 0


def page_words(page: PageOutcome) -> Page:
    """One page of the answer, its lines in reading order."""
    width, height = _size(page)
    pruned = (page.ocr_result or {}).get("prunedResult") if not page.error_code else None
    if not isinstance(pruned, dict):
        return Page(page.page_index, width, height, (), page.error_code, page.error_msg)
    count = len(pruned.get("rec_texts") or [])
    found = [line for index in range(count)
             if (line := _line(pruned, index, (width, height))) is not None]
    ordered = tuple(line for row in text.rows(found) for line in row)  # type: ignore[arg-type]
    return Page(page.page_index, width, height, ordered)
