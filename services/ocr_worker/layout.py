"""The worker's `/layout-parsing` stage: a request's layout fields (services/layout/request.py)
and, for every page the OCR pipeline has read, its regions, tables and Markdown
(services/layout/page.py) on the layout models (loaded on first use, shared by the request
threads: onnxruntime sessions are thread-safe)."""

from __future__ import annotations

import logging
from typing import Any, Mapping

import numpy as np

from services.layout.models import LayoutModels
from services.layout.request import LayoutOptions, parse_layout_fields
from services.ocr_api.errors import ApiError
from services.ocr_api.request import OcrRequest

from .config import WorkerConfig
from .encode import prune_result

log = logging.getLogger("ocr_worker")


class LayoutStage:
    def __init__(self, config: WorkerConfig):
        self.models = LayoutModels(config.model_dir, config.threads)

    def parse(self, fields: Mapping[str, Any]) -> LayoutOptions:
        options, forward = parse_layout_fields(fields)
        reason = self.models.missing()
        if reason:
            raise ApiError(500, reason)
        options.forward = forward  # type: ignore[attr-defined]
        return options

    @staticmethod
    def adopt(ocr_request: OcrRequest, options: LayoutOptions) -> None:
        """The layout options go with the request; their fields with what it forwards."""
        ocr_request.layout_options = options  # type: ignore[attr-defined]
        ocr_request.api_params.update(getattr(options, "forward", {}))
        ocr_request.visualize = False

    @staticmethod
    def of(ocr_request: OcrRequest) -> LayoutOptions | None:
        return getattr(ocr_request, "layout_options", None)

    def page(self, image: np.ndarray | None, output, options: LayoutOptions,
             number: int) -> dict[str, Any]:
        """One entry of `layoutParsingResults`."""
        from services.layout.page import parse_page  # numpy/cv2 work, after the models

        if image is None:
            raise ApiError(500, f"layout parsing got no image for page {number}")
        ocr = prune_result(output.result_json())
        try:
            self.models.load()
            pruned, text = parse_page(image, ocr, options, self.models.detect,
                                      self.models.table_structure, self.models.table_vocab,
                                      self.models.ruled_lines)
        except ApiError:
            raise
        except Exception as exc:
            log.exception("layout parsing failed on page %d", number)
            raise ApiError(500, f"layout parsing failed on page {number}: "
                                f"{type(exc).__name__}") from None
        return {"prunedResult": pruned,
                "markdown": {"text": text, "isStart": True, "isEnd": True, "images": {}},
                "outputImages": None, "inputImage": None}
