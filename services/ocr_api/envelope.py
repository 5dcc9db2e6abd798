"""PaddleX-serving response envelopes: `{"logId", "result", "errorCode", "errorMsg"}` on success,
`{"logId", "errorCode", "errorMsg"}` on failure, with `errorCode` equal to the HTTP status."""

from __future__ import annotations

import re
import uuid
from typing import Any

_LOG_ID_RE = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def new_log_id() -> str:
    return str(uuid.uuid4())


def usable_log_id(candidate: Any) -> str | None:
    """The caller's logId if it is a short printable token we can safely log and forward."""
    if isinstance(candidate, str) and len(candidate) <= 128 and _LOG_ID_RE.match(candidate):
        return candidate
    return None


def success(log_id: str, result: dict[str, Any]) -> dict[str, Any]:
    return {"logId": log_id, "result": result, "errorCode": 0, "errorMsg": "Success"}


def no_result(log_id: str, status: int, message: str) -> dict[str, Any]:
    return {"logId": log_id, "errorCode": status, "errorMsg": message}


def ocr_page_result(pruned_result: dict[str, Any], ocr_image: str | None = None,
                    input_image: str | None = None,
                    doc_preprocessing_image: str | None = None) -> dict[str, Any]:
    """One entry of `result.ocrResults`, in PaddleX's field names."""
    return {
        "prunedResult": pruned_result,
        "ocrImage": ocr_image,
        "docPreprocessingImage": doc_preprocessing_image,
        "inputImage": input_image,
    }


def image_data_info(width: int, height: int) -> dict[str, Any]:
    return {"width": width, "height": height, "type": "image"}


def pages_data_info(kind: str, page_sizes: list[tuple[int, int]]) -> dict[str, Any]:
    """PaddleX's PDFInfo (kind "pdf") or TIFFInfo (kind "tiff")."""
    return {
        "numPages": len(page_sizes),
        "pages": [{"width": w, "height": h} for w, h in page_sizes],
        "type": kind,
    }
