"""The `POST /layout-parsing` fields beyond /ocr's (PaddleX's PP-StructureV3 InferRequest):
validated into LayoutOptions; a field this fleet cannot honour, set to a value that would
change the result, is a 422 saying so. Pure: no numpy, no models (the gateway imports it)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from services.ocr_api.errors import excerpt, unprocessable

DEFAULT_THRESHOLD = 0.5
DEFAULT_IGNORE = ("number", "footnote", "header", "header_image", "footer", "footer_image",
                  "aside_text")  # PaddleX's default markdown_ignore_labels
LAYOUT_CLASSES = 10  # CDLA's classes: the keys a per-class layoutThreshold may use


@dataclass
class LayoutOptions:
    use_table_recognition: bool = True
    layout_threshold: float | dict[int, float] = DEFAULT_THRESHOLD
    markdown_ignore_labels: list[str] = field(default_factory=lambda: list(DEFAULT_IGNORE))
    pretty_markdown: bool = True
    # ruled tables (services/layout/ruled.py): PaddleX's useE2eWiredTableRecModel, true = the
    # structure model alone (SLANet_plus here) for them too, no cell detection
    use_e2e_wired_table_rec_model: bool = False
    # PaddleX's useWiredTableCellsTransToHtml: a ruled table's HTML built from its detected
    # cells, which is how the ruled path always builds it; false (PaddleX's default) is taken
    # and gives the same (no wired structure model is loaded to combine with the cells)
    use_wired_table_cells_trans_to_html: bool = False

    def settings(self) -> dict[str, Any]:
        """PaddleX's model_settings for what ran."""
        return {"use_doc_preprocessor": False, "use_seal_recognition": False,
                "use_table_recognition": self.use_table_recognition,
                "use_formula_recognition": False, "use_chart_recognition": False,
                "use_region_detection": False,
                "markdown_ignore_labels": list(self.markdown_ignore_labels)}


# PaddleX fields whose only honoured value is their default (or null): any other value would
# ask for a model or a step this fleet does not run. name -> (accepted values, why not)
_FIXED: dict[str, tuple[tuple[Any, ...], str]] = {
    "useSealRecognition": ((False,), "no seal recognition model is loaded"),
    "useFormulaRecognition": ((False,), "no formula recognition model is loaded"),
    "useChartRecognition": ((False,), "no chart recognition model is loaded"),
    "useRegionDetection": ((False,), "no region detection model is loaded"),
    "formatBlockContent": ((False,), "block content is given unformatted"),
    "layoutNms": ((True,), "the layout model's boxes always go through NMS"),
    "useWirelessTableCellsTransToHtml": ((False,), "no cell detection model for unruled "
                                                   "tables is loaded: they come from "
                                                   "SLANet_plus's structure"),
    "useOcrResultsWithTableCells": ((True,), "table cells are always filled from the OCR "
                                             "lines"),
    "useE2eWirelessTableRecModel": ((True,), "no cell detection model for unruled tables is "
                                             "loaded: they come from SLANet_plus's structure"),
    "visualize": ((False,), "layout parsing returns no visualization images here"),
    "textLayer": (("ignore",), "layout parsing reads every page with OCR"),
    # PaddleX's default for these two is true; this fleet's is false
    "useTableOrientationClassify": ((False,), "no table orientation model is loaded: a table "
                                              "is read as it stands on the page (a turned "
                                              "scan is straightened by up to 10 degrees)"),
    "returnMarkdownImages": ((False,), "figures are not cut out: markdown.images is empty"),
}
# fields taking no value other than null here
_NULL_ONLY = {
    "layoutUnclipRatio": "the layout boxes are not unclipped",
    "layoutMergeBboxesMode": "overlapping layout boxes are always merged the same way",
    "outputFormats": "no export formats are produced",
    **{name: "no seal recognition model is loaded" for name in (
        "sealDetLimitSideLen", "sealDetLimitType", "sealDetThresh", "sealDetBoxThresh",
        "sealDetUnclipRatio", "sealRecScoreThresh")},
}
# accepted and without effect here: formula numbers, where no formula is recognised
IGNORED_HARMLESS = ("showFormulaNumber",)
# booleans taken as they are: field -> LayoutOptions attribute
_TAKEN = {"useTableRecognition": "use_table_recognition",
          "prettifyMarkdown": "pretty_markdown",
          "useE2eWiredTableRecModel": "use_e2e_wired_table_rec_model",
          "useWiredTableCellsTransToHtml": "use_wired_table_cells_trans_to_html"}
LAYOUT_FIELDS = ("layoutThreshold", "markdownIgnoreLabels", *_TAKEN, *_FIXED, *_NULL_ONLY,
                 *IGNORED_HARMLESS)


def _refuse(name: str, value: Any, why: str) -> None:
    raise unprocessable(f"{name} {excerpt(value)} is not available on /layout-parsing here: "
                        f"{why}; leave it out or send null")


def _boolean(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise unprocessable(f"{name} must be true or false, got {excerpt(value)}")
    return value


def _threshold(value: Any) -> float | dict[int, float]:
    def one(name: str, v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or not 0 <= v <= 1:
            raise unprocessable(f"{name} must be a number in [0, 1], got {excerpt(v)}")
        return float(v)

    if isinstance(value, dict):
        found = {}
        for key, v in value.items():
            try:
                cls_id = int(key)
            except (TypeError, ValueError):
                cls_id = -1
            if not 0 <= cls_id < LAYOUT_CLASSES or str(cls_id) != str(key):
                raise unprocessable(f"layoutThreshold's keys are class ids 0-"
                                    f"{LAYOUT_CLASSES - 1}, got {excerpt(key)}")
            found[cls_id] = one(f"layoutThreshold[{key}]", v)
        return found
    return one("layoutThreshold", value)


def _labels(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and len(v) <= 64
                                              for v in value) or len(value) > 64:
        raise unprocessable(f"markdownIgnoreLabels must be a list of block labels, got "
                            f"{excerpt(value)}")
    return list(value)


def parse_layout_fields(fields: Mapping[str, Any]) -> tuple[LayoutOptions, dict[str, Any]]:
    """(LayoutOptions, the layout fields as sent, to forward) from a request's fields."""
    for name, (accepted, why) in _FIXED.items():
        value = fields.get(name)
        if value is not None and (not isinstance(value, type(accepted[0]))
                                  or value not in accepted):
            _refuse(name, value, why)
    for name, why in _NULL_ONLY.items():
        if fields.get(name) is not None:
            _refuse(name, fields[name], why)
    for name in IGNORED_HARMLESS:
        if fields.get(name) is not None:
            _boolean(name, fields[name])
    options = LayoutOptions()
    forward: dict[str, Any] = {}
    for name, attribute in _TAKEN.items():
        if fields.get(name) is not None:
            setattr(options, attribute, _boolean(name, fields[name]))
            forward[name] = getattr(options, attribute)
    if fields.get("layoutThreshold") is not None:
        options.layout_threshold = _threshold(fields["layoutThreshold"])
        forward["layoutThreshold"] = fields["layoutThreshold"]
    if fields.get("markdownIgnoreLabels") is not None:
        options.markdown_ignore_labels = _labels(fields["markdownIgnoreLabels"])
        forward["markdownIgnoreLabels"] = options.markdown_ignore_labels
    return options, forward
