"""Engine output -> PaddleX-serving JSON: `prunedResult` (the pipeline's JSON minus
`input_path`/`page_index`, exactly as PaddleX serving prunes it), optional visualization
images as base64 JPEG, and `dataInfo`."""

from __future__ import annotations

import base64
from typing import Any

import cv2
import numpy as np

from services.ocr_api import envelope

from .engine import PageOutput

_PRUNED_KEYS = ("input_path", "page_index")
MAX_OUTPUT_IMAGE_SIZE = (2000, 2000)  # PaddleX serving's default (width, height) bound


def prune_result(obj: Any) -> Any:
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


def encode_page(output: PageOutput, input_image: np.ndarray, visualize: bool) -> dict[str, Any]:
    pruned = prune_result(output.result_json())
    if not visualize:
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
