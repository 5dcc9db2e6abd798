"""A scanned page's skew, from the OCR pipeline's own text-line polygons, and the page turned
straight for the layout and table models.

Scans come in turned by a degree or so. The OCR detector's polygons follow the lines, so OCR
reads them fine, but the layout model (PicoDet-CDLA, 800 × 608) was trained on straight pages:
at one degree it calls a small unruled table `text` (its rows no longer line up in columns
at its scale), and SLANet_plus reads fewer columns in a turned crop. PaddleX's PP-StructureV3
straightens pages with its document-unwarping model (UVDoc) first; this project loads no
such model, so the page is turned back by the angle its text lines give, the regions and
tables are found on the straight page, and their boxes are mapped back to the page as sent
(the bounding box of the turned box), so every coordinate in the answer stays the page's.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import cv2
import numpy as np

MIN_ANGLE = 0.2  # degrees: below it the page is taken as straight (born-digital pages: 0)
MAX_ANGLE = 10.0  # degrees: a line turned more is not skew (rotated text, a stamp)
MIN_ELONGATION = 3.0  # a line whose width is this many times its height gives its angle
MIN_LINES = 2  # at least this many such lines, or the page is taken as straight


def _edges(poly: np.ndarray) -> tuple[float, float, float]:
    """(angle in degrees of the top and bottom edges, mean, y down: negative when the right
    end is higher; width; height) of a 4-point polygon [tl, tr, br, bl]."""
    top, bottom = poly[1] - poly[0], poly[2] - poly[3]
    dx, dy = top[0] + bottom[0], top[1] + bottom[1]
    width = (math.hypot(*top) + math.hypot(*bottom)) / 2
    height = (math.hypot(*(poly[3] - poly[0])) + math.hypot(*(poly[2] - poly[1]))) / 2
    return math.degrees(math.atan2(dy, dx)), width, height


def estimate(ocr: dict[str, Any]) -> float:
    """The page's skew in degrees (y down: negative when lines rise to the right), the
    width-weighted median angle of its long text lines (rec_polys, else dt_polys); 0.0 when
    fewer than MIN_LINES lines tell."""
    polys = ocr.get("rec_polys") or ocr.get("dt_polys") or []
    angles, weights = [], []
    for poly in polys:
        points = np.asarray(poly, dtype=np.float64)
        if points.shape != (4, 2):
            continue
        angle, width, height = _edges(points)
        if height <= 0 or width < MIN_ELONGATION * height or abs(angle) > MAX_ANGLE:
            continue
        angles.append(angle)
        weights.append(width)
    if len(angles) < MIN_LINES:
        return 0.0
    order = np.argsort(angles)
    cumulative = np.cumsum(np.asarray(weights)[order])
    return float(np.asarray(angles)[order][np.searchsorted(cumulative, cumulative[-1] / 2)])


class Straighten:
    """The page turned by -skew about its centre onto a canvas that holds all of it (white
    where the page was not), and boxes mapped between the page and that canvas."""

    def __init__(self, page_hw: tuple[int, int], skew: float):
        height, width = page_hw
        self.page_hw = page_hw
        self.skew = skew
        matrix = cv2.getRotationMatrix2D((width / 2, height / 2), skew, 1.0)
        corners = cv2.transform(np.array([[[0, 0], [width, 0], [width, height], [0, height]]],
                                         dtype=np.float64), matrix)[0]
        low, high = corners.min(axis=0), corners.max(axis=0)
        matrix[:, 2] -= low
        self.size = (int(math.ceil(high[0] - low[0])), int(math.ceil(high[1] - low[1])))
        self.forward = matrix
        self.backward = cv2.invertAffineTransform(matrix)

    def image(self, image: np.ndarray) -> np.ndarray:
        fill = (255,) * (image.shape[2] if image.ndim == 3 else 1)
        return cv2.warpAffine(image, self.forward, self.size, flags=cv2.INTER_LINEAR,
                              borderMode=cv2.BORDER_CONSTANT, borderValue=fill)

    @staticmethod
    def _bounds(points: np.ndarray, matrix: np.ndarray) -> tuple[float, ...]:
        moved = cv2.transform(points.reshape(1, -1, 2).astype(np.float64), matrix)[0]
        return (*moved.min(axis=0), *moved.max(axis=0))

    def to_straight(self, points: Sequence[Sequence[float]]) -> tuple[float, ...]:
        """The straight page's box around the page's points (a polygon, or a box's corners)."""
        return self._bounds(np.asarray(points, dtype=np.float64), self.forward)

    def to_page(self, box: Sequence[float]) -> tuple[float, ...]:
        """The page's box (clipped to it) around a box on the straight page."""
        x0, y0, x1, y1 = box
        corners = np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], dtype=np.float64)
        a0, b0, a1, b1 = self._bounds(corners, self.backward)
        height, width = self.page_hw
        return (min(max(a0, 0.0), width), min(max(b0, 0.0), height),
                min(max(a1, 0.0), width), min(max(b1, 0.0), height))


def corners(box: Sequence[float]) -> list[list[float]]:
    x0, y0, x1, y1 = box
    return [[x0, y0], [x1, y0], [x1, y1], [x0, y1]]
