"""Ruled tables: wired_table_rec 1.1.10's "v2" model (cycle_center_net_v2.onnx, a segmenter of
table lines: 1 = horizontal, 2 = vertical) and its decoding into cells with row and column
spans, as the wheel's TableLineRecognitionPlus and TableRecover do it (read from the wheel and
rewritten on numpy and cv2: no scikit-image, scipy or shapely); the cells are filled from the
page's OCR lines as services/layout/tables.py fills SLANet_plus's. Also the ruled/unruled
switch: long horizontal and vertical rules found by morphology on the table's crop.

Pure but for the model call (`segment`), which page.py is given."""

from __future__ import annotations

import html
import math
from typing import Callable

import cv2
import numpy as np

from . import tables

INPUT = 1024  # the long side the model sees (wired_table_rec: resize_img to (1024, 1024))
MEAN = np.array([123.675, 116.28, 103.53], dtype=np.float64).reshape(1, -1)
STD = np.array([58.395, 57.12, 57.375], dtype=np.float64).reshape(1, -1)
# TableLineRecognitionPlus.postprocess's defaults
ROW_W, COL_W = 50, 30  # a horizontal line is longer than 50 px, a vertical one than 30
H_LINES_ALPH, V_LINES_ALPH, ANGLE = 100, 15, 50
# TableRecover's defaults (WiredTableRecognition.__call__)
ROWS_THRESH, COL_THRESH, MERGE_THRESH = 10, 15, 10


# ---- the switch -------------------------------------------------------------------------------
def rulings(crop_bgr: np.ndarray) -> tuple[int, int]:
    """(long horizontal rules, long vertical rules) in a table's crop: dark strokes that
    survive a morphological opening by a long thin kernel, a horizontal one at least 40 % of
    the crop's width, a vertical one at least 25 % of its height. A slight rotation is
    tolerated (the strokes are thickened first, so each row of a tilted rule stays long)."""
    gray = crop_bgr if crop_bgr.ndim == 2 else cv2.cvtColor(crop_bgr, cv2.COLOR_BGR2GRAY)
    height, width = gray.shape[:2]
    if min(height, width) < 20:
        return 0, 0
    _, ink = cv2.threshold(gray, 0, 255, cv2.THRESH_BINARY_INV | cv2.THRESH_OTSU)
    ink = cv2.dilate(ink, np.ones((3, 3), np.uint8))
    found = []
    for kernel_shape, axis, share in (((max(15, width // 8), 1), 0, 0.4),
                                      ((1, max(15, height // 8)), 1, 0.25)):
        opened = cv2.morphologyEx(ink, cv2.MORPH_OPEN,
                                  cv2.getStructuringElement(cv2.MORPH_RECT, kernel_shape))
        count, _, stats, _ = cv2.connectedComponentsWithStats(opened, connectivity=8)
        extent = stats[1:, cv2.CC_STAT_WIDTH if axis == 0 else cv2.CC_STAT_HEIGHT]
        found.append(int((extent >= share * (width if axis == 0 else height)).sum()))
    return found[0], found[1]


def is_ruled(crop_bgr: np.ndarray) -> bool:
    """A ruled (wired) table: at least two long rules each way. A three-rule (booktabs) table,
    with horizontal rules only, is unruled."""
    horizontal, vertical = rulings(crop_bgr)
    return horizontal >= 2 and vertical >= 2


# ---- the model's input -----------------------------------------------------------------------
def preprocess(crop_bgr: np.ndarray) -> np.ndarray:
    """(1, 3, h, w) float32: the long side scaled to 1024 (area when shrinking, bicubic when
    growing), RGB, normalised (wired_table_rec's resize_img + TableLineRecognitionPlus)."""
    height, width = crop_bgr.shape[:2]
    scale = min(INPUT / max(height, width), INPUT / min(height, width))
    size = (int(width * scale + 0.5), int(height * scale + 0.5))
    interpolation = cv2.INTER_AREA if min(height, width) > INPUT else cv2.INTER_CUBIC
    image = cv2.resize(crop_bgr, size, interpolation=interpolation).astype(np.float32)
    image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
    image = ((image - MEAN) / STD).astype(np.float32)
    return image.transpose(2, 0, 1)[None]


# ---- lines -> cells (TableLineRecognitionPlus.postprocess) ------------------------------------
def _components(binary: np.ndarray):
    """8-connected components as (coords N×2 as (row, col), bbox (r0, c0, r1, c1) exclusive),
    in label order (scikit-image's measure.label + regionprops)."""
    count, labels = cv2.connectedComponents(binary.astype(np.uint8), connectivity=8)
    flat = labels.ravel()
    order = np.argsort(flat, kind="stable")
    bounds = np.searchsorted(flat[order], np.arange(1, count + 1))
    width = labels.shape[1]
    for k in range(1, count):
        index = order[bounds[k - 1]:bounds[k]]
        coords = np.stack([index // width, index % width], axis=1)
        r0, c0 = coords.min(axis=0)
        r1, c1 = coords.max(axis=0) + 1
        yield coords, (int(r0), int(c0), int(r1), int(c1))


def _order_points(pts: np.ndarray) -> np.ndarray:
    """[tl, tr, br, bl] (wired_table_rec's _order_points)."""
    x_sorted = pts[np.argsort(pts[:, 0], kind="stable"), :]
    left, right = x_sorted[:2, :], x_sorted[2:, :]
    left = left[np.argsort(left[:, 1], kind="stable"), :]
    tl, bl = left
    distance = np.linalg.norm(right - tl[None], axis=1)
    br, tr = right[np.argsort(distance, kind="stable")[::-1], :]
    return np.array([tl, tr, br, bl], dtype="float32")


def _sorted_box(coords_rc: np.ndarray) -> list[float]:
    box = cv2.boxPoints(cv2.minAreaRect(coords_rc[:, ::-1].astype(np.float32)))
    return _order_points(np.asarray(box, dtype="float32")).reshape(8).tolist()


def _center_rotate(box: list[float]) -> tuple[float, float, float, float, float]:
    x1, y1, x2, y2, x3, y3, x4, y4 = box[:8]
    cx, cy = (x1 + x2 + x3 + x4) / 4.0, (y1 + y2 + y3 + y4) / 4.0
    w = (math.hypot(x2 - x1, y2 - y1) + math.hypot(x3 - x4, y3 - y4)) / 2
    h = (math.hypot(x2 - x3, y2 - y3) + math.hypot(x1 - x4, y1 - y4)) / 2
    sin_a = (h * (x1 - cx) - w * (y1 - cy)) * 1.0 / max(h * h + w * w, 1e-9) * 2
    return float(np.arcsin(np.clip(sin_a, -1, 1))), w, h, cx, cy


def _line_of(coords_rc: np.ndarray) -> list[float]:
    """A stroke's centre line (x0, y0, x1, y1) (wired_table_rec's min_area_rect)."""
    box = _sorted_box(coords_rc)
    x1, y1, x2, y2, x3, y3, x4, y4 = box
    _, w, h, _, _ = _center_rotate(box)
    if w < h:
        return [(x1 + x2) / 2, (y1 + y2) / 2, (x3 + x4) / 2, (y3 + y4) / 2]
    return [(x1 + x4) / 2, (y1 + y4) / 2, (x2 + x3) / 2, (y2 + y3) / 2]


def table_lines(binary: np.ndarray, axis: int, min_length: int) -> list[list[float]]:
    """axis 0: horizontal lines wider than min_length; 1: vertical ones taller."""
    return [_line_of(coords) for coords, (r0, c0, r1, c1) in _components(binary > 0)
            if (r1 - r0 if axis == 1 else c1 - c0) > min_length]


def adjust_lines(lines, alph=50, angle=50):
    """Segments joining nearby ends of lines that do not overlap (wired_table_rec)."""
    new_lines = []
    for i, (x1, y1, x2, y2) in enumerate(lines):
        cx1, cy1 = (x1 + x2) / 2, (y1 + y2) / 2
        for j, (x3, y3, x4, y4) in enumerate(lines):
            if i == j:
                continue
            cx2, cy2 = (x3 + x4) / 2, (y3 + y4) / 2
            if (x3 < cx1 < x4 or y3 < cy1 < y4) or (x1 < cx2 < x2 or y1 < cy2 < y2):
                continue
            for (ax, ay), (bx, by) in (((x1, y1), (x3, y3)), ((x1, y1), (x4, y4)),
                                       ((x2, y2), (x3, y3)), ((x2, y2), (x4, y4))):
                r = math.hypot(ax - bx, ay - by)
                a = math.atan(abs((by - ay) / (bx - ax + 1e-10))) * 180 / math.pi
                if r < alph and a < angle:
                    new_lines.append((ax, ay, bx, by))
    return new_lines


def _fit_line(p):
    (x1, y1), (x2, y2) = p
    return y2 - y1, x1 - x2, x2 * y1 - x1 * y2


def line_to_line(points1, points2, alpha=10, angle=30):
    """points1 extended to where it meets points2, when an end is within alpha of it."""
    x1, y1, x2, y2 = (float(v) for v in points1)
    ox1, oy1, ox2, oy2 = (float(v) for v in points2)
    a1, b1, c1 = _fit_line(np.array([(x1, y1), (x2, y2)], dtype="float32"))
    a2, b2, c2 = _fit_line(np.array([(ox1, oy1), (ox2, oy2)], dtype="float32"))
    flag1 = a2 * np.float32(x1) + b2 * np.float32(y1) + c2
    flag2 = a2 * np.float32(x2) + b2 * np.float32(y2) + c2
    if (flag1 > 0 and flag2 > 0) or (flag1 < 0 and flag2 < 0):
        if (a1 * b2 - a2 * b1) != 0:
            x = (b1 * c2 - b2 * c1) / (a1 * b2 - a2 * b1)
            y = (a2 * c1 - a1 * c2) / (a1 * b2 - a2 * b1)
            r0, r1 = math.hypot(x - x1, y - y1), math.hypot(x - x2, y - y2)
            if min(r0, r1) < alpha:
                if r0 < r1:
                    a = math.atan(abs((y2 - y) / (x2 - x + 1e-10))) * 180 / math.pi
                    if a < angle or abs(90 - a) < angle:
                        return np.array([x, y, x2, y2], dtype="float32")
                else:
                    a = math.atan(abs((y1 - y) / (x1 - x + 1e-10))) * 180 / math.pi
                    if a < angle or abs(90 - a) < angle:
                        return np.array([x1, y1, x, y], dtype="float32")
    return points1


def final_adjust_lines(rowboxes, colboxes):
    for i in range(len(rowboxes)):
        for j in range(len(colboxes)):
            rowboxes[i] = line_to_line(rowboxes[i], colboxes[j], alpha=20, angle=30)
            colboxes[j] = line_to_line(colboxes[j], rowboxes[i], alpha=20, angle=30)
    return rowboxes, colboxes


def _draw_lines(shape, lines) -> np.ndarray:
    image = np.zeros(shape, dtype="uint8")
    for x1, y1, x2, y2 in (line[:4] for line in lines):
        cv2.line(image, (int(x1), int(y1)), (int(x2), int(y2)), 255, 2, lineType=cv2.LINE_AA)
    return image


def _region_boxes(line_image: np.ndarray) -> np.ndarray:
    """The cells: the regions the lines enclose, as minimum-area rectangles (N×8), the
    page-sized and the small (< 15 px) left out (cal_region_boxes + min_area_rect_box).
    Unlike wired_table_rec, whose crops come tight from a table detector, a region touching
    the crop's edge is left out too (when two others remain): the layout model's table box
    has a margin, and the rules, extended to it, cut it into strips that are no cells."""
    height, width = line_image.shape[:2]
    boxes, touching = [], []
    for coords, (r0, c0, r1, c1) in _components(line_image < 255):
        if (r1 - r0) * (c1 - c0) > height * width * 3 / 4:
            continue
        box = _sorted_box(coords)
        _, w, h, _, _ = _center_rotate(box)
        if w * h < 0.5 * width * height and not (w < 15 or h < 15):
            edge = r0 <= 0 or c0 <= 0 or r1 >= height or c1 >= width
            (touching if edge else boxes).append(box)
    if len(boxes) < 2:
        boxes += touching
    return np.array(boxes, dtype=np.float64).reshape(-1, 8)


def _rotate_angle(line_image: np.ndarray) -> float:
    contours, _ = cv2.findContours(line_image, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    if not contours:
        return 0.0
    angle = cv2.minAreaRect(max(contours, key=cv2.contourArea))[2]
    if angle < -45:
        angle += 90
    elif angle > 45:
        angle -= 90
    return float(angle)


def cell_polygons(mask: np.ndarray, crop_hw: tuple[int, int]
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(polygons, deskewed polygons), each N×4×2 as [tl, tr, br, bl] in crop pixels, in
    reading order, from the model's line mask (TableLineRecognitionPlus: its __call__ and
    postprocess with their defaults)."""
    height, width = crop_hw
    mask = mask.astype(np.uint8)
    hpred, vpred = mask.copy(), mask.copy()
    hpred[mask == 2] = 0
    vpred[mask == 1] = 0
    hpred = cv2.resize(hpred, (width, height))
    vpred = cv2.resize(vpred, (width, height))
    h, w = mask.shape
    hkernel = cv2.getStructuringElement(cv2.MORPH_RECT, (int(math.sqrt(w) * 1.2), 1))
    vkernel = cv2.getStructuringElement(cv2.MORPH_RECT, (1, int(math.sqrt(h) * 1.2)))
    vpred = cv2.morphologyEx(vpred, cv2.MORPH_CLOSE, vkernel, iterations=1)
    hpred = cv2.morphologyEx(hpred, cv2.MORPH_CLOSE, hkernel, iterations=1)
    colboxes = table_lines(vpred, axis=1, min_length=COL_W)
    rowboxes = table_lines(hpred, axis=0, min_length=ROW_W)
    rowboxes += adjust_lines(rowboxes, alph=H_LINES_ALPH, angle=ANGLE)
    colboxes += adjust_lines(colboxes, alph=V_LINES_ALPH, angle=ANGLE)
    rowboxes, colboxes = final_adjust_lines(rowboxes, colboxes)
    line_image = _draw_lines((height, width), rowboxes + colboxes)
    angle = _rotate_angle(line_image)
    if abs(angle) > 0.3:
        centre = (width // 2, height // 2)
        rotated = cv2.warpAffine(line_image, cv2.getRotationMatrix2D(centre, angle, 1.0),
                                 (width, height), flags=cv2.INTER_NEAREST,
                                 borderMode=cv2.BORDER_REPLICATE)
        deskewed = _region_boxes(rotated)
        back = cv2.getRotationMatrix2D(centre, -angle, 1.0)
        polygons = cv2.transform(deskewed.reshape(-1, 4, 2), back).reshape(-1, 8) \
            if len(deskewed) else deskewed
    else:
        polygons = _region_boxes(line_image)
        deskewed = polygons.copy()
    if not len(polygons):
        empty = np.zeros((0, 4, 2))
        return empty, empty
    polygons = polygons.reshape(-1, 4, 2)
    deskewed = deskewed.reshape(-1, 4, 2)
    _, order = sorted_boxes([[p[0][0], p[0][1], p[2][0], p[2][1]] for p in deskewed],
                            threshold=0.4)
    return polygons[order], deskewed[order]


def _single_axis_contained(box1, box2, threshold: float = 0.2) -> int | None:
    """wired_table_rec's is_single_axis_contained on the y axis."""
    b1, b2 = box1[3] - box1[1], box2[3] - box2[1]
    inter = min(box1[3], box2[3]) - max(box1[1], box2[1])
    ratio_1 = (b1 - inter) / b1 if b1 > 0 else 0
    ratio_2 = (b2 - inter) / b2 if b2 > 0 else 0
    if ratio_1 < threshold:
        return 1
    if ratio_2 < threshold:
        return 2
    return None


def sorted_boxes(boxes: list[list[float]], threshold: float = 0.2
                 ) -> tuple[list[list[float]], list[int]]:
    """Top to bottom, then left to right within a row (wired_table_rec's sorted_ocr_boxes)."""
    if not boxes:
        return [], []
    indices = sorted(range(len(boxes)), key=lambda i: (boxes[i][1], boxes[i][0]))
    ordered = [list(boxes[i]) for i in indices]
    for i in range(len(ordered) - 1):
        for j in range(i, -1, -1):
            if (_single_axis_contained(ordered[j], ordered[j + 1], threshold) is not None
                    and ordered[j + 1][0] < ordered[j][0]
                    and abs(ordered[j][1] - ordered[j + 1][1]) < 20):
                ordered[j], ordered[j + 1] = ordered[j + 1], ordered[j]
                indices[j], indices[j + 1] = indices[j + 1], indices[j]
            else:
                break
    return ordered, indices


# ---- cells -> rows, columns and spans (TableRecover) ------------------------------------------
def _rows(polygons: np.ndarray, thresh: float) -> dict[int, list[int]]:
    y = polygons[:, 0, 1]
    if y.size == 1:
        return {0: [0]}
    splits = np.flatnonzero(np.abs(np.diff(y)) > thresh)
    if splits.size == 0:
        return {0: list(range(len(y)))}
    splits = list(splits)
    if max(splits) != len(y) - 1:
        splits.append(len(y) - 1)
    rows, start = {}, 0
    for number, end in enumerate(splits):
        if number:
            start = splits[number - 1] + 1
        rows[number] = list(range(start, end + 1))
    return rows


def _benchmark_cols(rows, polygons, thresh):
    longest = max(rows.values(), key=len)
    starts = list(polygons[longest][:, 0, 0])
    ends = list(polygons[longest][:, 2, 0])
    min_x, max_x = starts[0], ends[-1]

    def update(col_x, value, low, high, insert_last):
        for i, v in enumerate(col_x):
            if value - thresh <= v <= value + thresh:
                break
            if value < low:
                col_x.insert(0, value)
                low = value
                break
            if value > high:
                if insert_last:
                    col_x.append(value)
                high = value
                break
            if value < v:
                col_x.insert(i, value)
                break
        return low, high

    for members in rows.values():
        for start, end in zip(polygons[members][:, 0, 0], polygons[members][:, 2, 0]):
            min_x, max_x = update(starts, start, min_x, max_x, True)
            min_x, max_x = update(starts, end, min_x, max_x, False)
    starts = np.array(starts)
    widths = (starts[1:] - starts[:-1]).tolist() + [max_x - starts[-1]]
    return starts, widths, starts.shape[0]


def _benchmark_rows(rows, polygons):
    leftmost = [members[0] for members in rows.values()]
    tops = polygons[leftmost][:, 0, 1]
    heights = (tops[1:] - tops[:-1]).tolist()
    bottom = polygons[list(rows.values())[-1]]
    heights.append(max(float(np.linalg.norm(v[1, :] - v[0, :])) for v in bottom))
    return heights, tops.shape[0]


def _span(start: int, count: int, sizes: list[float], length: float) -> int:
    """How many of sizes[start:] the length covers (TableRecover.get_merge_cells)."""
    for i in range(start, count):
        total = sum(sizes[start:i + 1])
        if i == start and total > length:
            return 1
        if abs(total - length) <= MERGE_THRESH:
            return i + 1 - start
        if total > length:
            nearer = i if abs(total - length) < abs(total - sizes[i] - length) else i - 1
            return nearer + 1 - start
    return count - start


def logical_cells(polygons: np.ndarray, rows_thresh: float = ROWS_THRESH,
                  col_thresh: float = COL_THRESH) -> np.ndarray:
    """N×4 (row_start, row_end, col_start, col_end), inclusive, for polygons in reading order
    whose points run [tl, bl, br, tr] (counter-clockwise, as TableRecover takes them)."""
    rows = _rows(polygons, rows_thresh)
    col_x, col_widths, col_count = _benchmark_cols(rows, polygons, col_thresh)
    row_heights, row_count = _benchmark_rows(rows, polygons)
    logic = {}
    for row, members in rows.items():
        taken = {}
        for cell in members:
            box = polygons[cell]
            width = float(np.linalg.norm(box[3, :] - box[0, :]))
            col_start = max(sum(taken.values()), int(np.argmin(np.abs(col_x - box[0, 0]))))
            taken[cell] = _span(col_start, col_count, col_widths, width)
            height = float(np.linalg.norm(box[1, :] - box[0, :]))
            row_span = _span(row, row_count, row_heights, height)
            logic[cell] = (row, row + row_span - 1, col_start, col_start + taken[cell] - 1)
    return np.array([logic[i] for i in range(len(polygons))], dtype=np.int64).reshape(-1, 4)


# ---- HTML -------------------------------------------------------------------------------------
def to_html(logic: np.ndarray, texts: list[str]) -> str:
    """The table's HTML from the cells' logical positions and their texts (wired_table_rec's
    plot_html_table: rows before the first cell with text and columns outside those with text
    are left out; a position no cell covers is an empty cell), spans written only when over 1,
    as PaddleX writes them."""
    if not len(logic):
        return "<html><body><table></table></body></html>"
    rows = int(logic[:, 1].max()) + 1
    cols = int(logic[:, 3].max()) + 1
    grid: list[list[int | None]] = [[None] * cols for _ in range(rows)]
    first_row = first_col = (1 << 16) - 1
    last_col = 0
    for i, (r0, r1, c0, c1) in enumerate(logic.tolist()):
        if texts[i]:
            first_row, first_col, last_col = min(r0, first_row), min(c0, first_col), \
                max(c1, last_col)
        for r in range(r0, r1 + 1):
            for c in range(c0, c1 + 1):
                grid[r][c] = i
    out = ["<html><body><table>"]
    for r in range(rows):
        if r < first_row:
            continue
        out.append("<tr>")
        for c in range(cols):
            if c < first_col or c > last_col:
                continue
            i = grid[r][c]
            if i is None:
                out.append("<td></td>")
                continue
            r0, r1, c0, c1 = logic[i].tolist()
            if (r, c) != (r0, c0):
                continue
            spans = "".join(f' {name}="{n}"' for name, n in (("rowspan", r1 - r0 + 1),
                                                              ("colspan", c1 - c0 + 1)) if n > 1)
            out.append(f"<td{spans}>{html.escape(texts[i])}</td>")
        out.append("</tr>")
    out.append("</table></body></html>")
    return "".join(out)


def recognise(crop_bgr: np.ndarray, lines: list[tuple[list[float], str]],
              segment: Callable[[np.ndarray], np.ndarray]
              ) -> tuple[str, np.ndarray] | None:
    """(HTML, cell boxes N×4 in crop pixels) of a ruled table from its crop and its OCR lines
    (boxes in crop pixels, text); None when the model finds no cells (the caller falls back to
    the structure model). `segment`: the model on preprocess()'s tensor, its line mask."""
    height, width = crop_bgr.shape[:2]
    mask = segment(preprocess(crop_bgr))
    polygons, deskewed = cell_polygons(mask, (height, width))
    if len(polygons) < 2:
        return None
    ccw = deskewed.copy()
    ccw[:, 1, :], ccw[:, 3, :] = deskewed[:, 3, :], deskewed[:, 1, :]
    logic = logical_cells(ccw)
    boxes = np.array([[p[:, 0].min(), p[:, 1].min(), p[:, 0].max(), p[:, 1].max()]
                      for p in polygons], dtype=np.float64)
    matched = tables.match_lines(boxes, lines)
    texts = [" ".join(lines[i][1].strip() for i in matched.get(cell, []) if lines[i][1].strip())
             for cell in range(len(boxes))]
    return to_html(logic, texts), boxes
