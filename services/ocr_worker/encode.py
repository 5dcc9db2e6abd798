"""Engine output -> PaddleX-serving JSON: `prunedResult` (the pipeline's JSON minus
`input_path`/`page_index`, exactly as PaddleX serving prunes it), optional visualization
images as base64 JPEG, and `dataInfo`. A page read from its PDF text layer gets the same
shape (text_layer_result), marked in `model_settings.text_layer`."""

from __future__ import annotations

import base64
from typing import Any

import cv2
import numpy as np

from services.documents.unicode import scrub
from services.ocr_api import envelope

from .engine import PageOutput

_PRUNED_KEYS = ("input_path", "page_index")
MAX_OUTPUT_IMAGE_SIZE = (2000, 2000)  # PaddleX serving's default (width, height) bound


def prune_result(obj: Any) -> Any:
    """The result without PaddleX serving's pruned keys, and without lone surrogates in its
    strings (services/documents/unicode.py)."""
    if isinstance(obj, str):
        return scrub(obj)
    if isinstance(obj, dict):
        return {key: prune_result(value) for key, value in obj.items()
                if key not in _PRUNED_KEYS}
    if isinstance(obj, list):
        return [prune_result(item) for item in obj]
    return obj


def jpeg_base64(image: np.ndarray) -> str:
    height, width = image.shape[:2]
    max_w, max_h = MAX_OUTPUT_IMAGE_SIZE
    if width > max_w or height > max_h:
        factor = min(max_w / width, max_h / height)
        image = cv2.resize(image, (max(1, int(width * factor)), max(1, int(height * factor))))
    ok, buffer = cv2.imencode(".jpg", image)
    if not ok:
        raise RuntimeError("JPEG encoding failed")
    return base64.b64encode(buffer.tobytes()).decode("ascii")


def encode_page(output: PageOutput, input_image: np.ndarray | None, visualize: bool,
                text_layer: str | None = None) -> dict[str, Any]:
    """One page's entry; `text_layer` (what textLayer "auto" found on the page, decode.py)
    goes into model_settings. A page read from its text layer has no images to show."""
    pruned = prune_result(output.result_json())
    if text_layer is not None:
        pruned["model_settings"] = {**(pruned.get("model_settings") or {}),
                                    "text_layer": text_layer}
    if not visualize or input_image is None:
        return envelope.ocr_page_result(pruned)
    visual = output.visual_image()
    return envelope.ocr_page_result(
        pruned,
        ocr_image=jpeg_base64(visual) if visual is not None else None,
        input_image=jpeg_base64(input_image),
    )


def data_info(kind: str, page_sizes: list[tuple[int, int]]) -> dict[str, Any]:
    """PaddleX's ImageInfo, PDFInfo or TIFFInfo."""
    if kind == "image":
        width, height = page_sizes[0]
        return envelope.image_data_info(width, height)
    return envelope.pages_data_info(kind, page_sizes)


class TextLayerOutput:
    """A page read from its own text layer, as the engine's PageOutput: the pipeline's JSON
    shape with the lines' texts, score 1.0, their quadrilaterals as both detected and
    recognised polygons, and their bounding boxes; the word tokens (words and the spaces
    between them, as PaddleOCR splits them) when `returnWordBox` was asked for. No detection
    ran, so there are no `text_det_params`."""

    def __init__(self, lines: list[Any], word_boxes: bool):
        self._lines = lines
        self._word_boxes = word_boxes

    def result_json(self) -> dict[str, Any]:
        polys = [[[round(x), round(y)] for x, y in line.poly] for line in self._lines]
        result: dict[str, Any] = {
            "model_settings": {"use_doc_preprocessor": False,
                               "use_textline_orientation": False},
            "dt_polys": polys,
            "text_type": "general",
            "textline_orientation_angles": [-1] * len(polys),
            "text_rec_score_thresh": 0.0,
            "return_word_box": self._word_boxes,
            "rec_texts": [line.text for line in self._lines],
            "rec_scores": [1.0] * len(polys),
            "rec_polys": polys,
            "rec_boxes": [_bounds(poly) for poly in polys],
        }
        if self._word_boxes:
            result["text_word"] = [[text for text, _ in line.words] for line in self._lines]
            result["text_word_boxes"] = [[_int_box(box) for _, box in line.words]
                                         for line in self._lines]
        return result

    def visual_image(self) -> np.ndarray | None:
        return None


def _bounds(poly: list[list[float]]) -> list[int]:
    xs, ys = [x for x, _ in poly], [y for _, y in poly]
    return _int_box((min(xs), min(ys), max(xs), max(ys)))


def _int_box(box) -> list[int]:
    """Whole pixels, as the engine's rec_boxes: outwards."""
    x0, y0, x1, y1 = box
    return [int(np.floor(x0)), int(np.floor(y0)), int(np.ceil(x1)), int(np.ceil(y1))]
