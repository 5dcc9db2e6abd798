"""`POST /layout-parsing` in the OpenAPI documents (worker and gateway): PaddleX's
PP-StructureV3 body as services/layout/request.py validates it, and its answer."""

from __future__ import annotations

from typing import Any

from services.ocr_api import openapi as api

from .request import _FIXED, _NULL_ONLY, IGNORED_HARMLESS

BOOL_OR_NULL = {"type": ["boolean", "null"]}
BLOCK_LABELS = ("doc_title", "paragraph_title", "text", "table", "figure_title", "image",
                "header", "footer", "reference", "formula")


def layout_fields() -> dict[str, dict[str, Any]]:
    fields = api.ocr_fields()
    fields.pop("returnWordBox", None)
    fields["textLayer"] = {"enum": ["ignore", None],
                           "description": "Layout parsing reads every page with OCR"}
    fields["visualize"] = {"enum": [False, None],
                           "description": "No visualization images are returned (true: 422)"}
    fields.update({
        "useTableRecognition": {**BOOL_OR_NULL, "description": "Tables as HTML (default true)"},
        "layoutThreshold": {"type": ["number", "object", "null"], "minimum": 0, "maximum": 1,
                            "additionalProperties": {"type": "number", "minimum": 0,
                                                     "maximum": 1},
                            "description": "Score threshold of the layout regions, or one "
                                           "per class id (0-9)"},
        "markdownIgnoreLabels": {"type": ["array", "null"], "items": {"type": "string"},
                                 "description": "Block labels left out of the Markdown"},
        "prettifyMarkdown": {**BOOL_OR_NULL, "description": "Tables and captions centred"},
        "useE2eWiredTableRecModel": {
            **BOOL_OR_NULL, "description": "Ruled tables (found by their ruling lines) by the "
                                           "structure model alone, SLANet_plus, instead of "
                                           "their line model's cells (default false)"},
        "useWiredTableCellsTransToHtml": {
            **BOOL_OR_NULL, "description": "A ruled table's HTML from its detected cells: "
                                           "what the ruled path always does (either value)"},
    })
    for name, (accepted, why) in _FIXED.items():
        if name not in fields:
            fields[name] = {"enum": [*accepted, None], "description": f"Other values: 422 ({why})"}
    for name, why in _NULL_ONLY.items():
        fields[name] = {"type": "null", "description": f"Any value: 422 ({why})"}
    for name in IGNORED_HARMLESS:
        fields[name] = {**BOOL_OR_NULL, "description": "Accepted; no effect here"}
    return fields


def block_schema() -> dict[str, Any]:
    return {"type": "object", "required": ["block_label", "block_content", "block_bbox"],
            "properties": {
                "block_label": {"enum": list(BLOCK_LABELS)}, "block_content": {"type": "string"},
                "block_bbox": {"type": "array", "items": {"type": "integer"}},
                "block_id": {"type": "integer"},
                "block_order": {"type": ["integer", "null"]}}}


def page_schema() -> dict[str, Any]:
    pruned = {"type": "object", "required": ["parsing_res_list"], "properties": {
        "width": {"type": "integer"}, "height": {"type": "integer"},
        "model_settings": {"type": "object"},
        "parsing_res_list": {"type": "array", "items": block_schema()},
        "layout_det_res": {"type": "object"}, "overall_ocr_res": {"type": "object"},
        "table_res_list": {"type": "array", "items": {"type": "object", "properties": {
            "pred_html": {"type": "string"}}}}}}
    markdown = {"type": "object", "required": ["text", "isStart", "isEnd"], "properties": {
        "text": {"type": "string"}, "isStart": {"type": "boolean"},
        "isEnd": {"type": "boolean"}, "images": {"type": ["object", "null"]}}}
    return {"type": "object", "required": ["prunedResult", "markdown"], "properties": {
        "prunedResult": pruned, "markdown": markdown,
        "outputImages": {"type": ["object", "null"]}, "inputImage": {"type": ["string", "null"]}}}


def envelope_schema() -> dict[str, Any]:
    result = {"type": "object", "required": ["layoutParsingResults", "dataInfo"],
              "properties": {"layoutParsingResults": {"type": "array", "items": page_schema()},
                             "dataInfo": api.ref("schemas", "DataInfo")}}
    return api.success_envelope(result)


def layout_body(max_bytes: int) -> dict[str, Any]:
    """JSON only: a form's booleans and numbers are not read as JSON on this endpoint."""
    return {"required": True, "content": api.json_content(
        {"type": "object", "required": ["file"], "properties": layout_fields()})}


def layout_operation(max_bytes: int, parameters: list, ok_headers: dict,
                     errors: dict[str, Any]) -> dict[str, Any]:
    return {
        "operationId": "layoutParsing", "tags": ["layout"],
        "summary": "Layout parsing: regions, reading order, tables and Markdown "
                   "(PaddleX's PP-StructureV3 /layout-parsing)",
        "parameters": parameters,
        "requestBody": layout_body(max_bytes),
        "responses": {"200": {"description": "One `layoutParsingResults` entry per page",
                              "headers": ok_headers,
                              "content": api.json_content(envelope_schema())},
                      **errors},
    }
