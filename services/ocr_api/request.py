"""Parsing and validating a PaddleX-serving `/ocr` request into an `OcrRequest`: the file's bytes
and kind, the pipeline parameters (validated, snake_case for PaddleOCR), `visualize`, `logId`
and our extensions `pageRange` and `textLayer`. Pure: works on dicts and bytes handed over by
the web layer."""

from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from . import logs
from .errors import ApiError, bad_request, excerpt, too_large, unprocessable
from .page_range import resolve_page_range, validate_page_range_syntax  # noqa: F401 (API)
from .sniff import KIND_IMAGE, KIND_PDF, describe_kind, sniff_kind

FILE_TYPE_PDF = 0
FILE_TYPE_IMAGE = 1

# `textLayer` (our extension): "ignore" OCRs every page, as PaddleX does; "auto" answers a PDF
# page whose own text layer covers it from that text, without OCR (docs/text-layer.md)
TEXT_LAYER_IGNORE = "ignore"
TEXT_LAYER_AUTO = "auto"
TEXT_LAYER_MODES = (TEXT_LAYER_IGNORE, TEXT_LAYER_AUTO)

MAX_DATA_URI_HEADER = 256  # "data:application/pdf;base64," and the like


def _strip_data_uri(text: str) -> str:
    """`text` without a leading `data:<media type>;base64,` (looked for in the first few
    hundred characters only)."""
    if text[:5].lower() != "data:":
        return text
    comma = text.find(",", 0, MAX_DATA_URI_HEADER)
    if comma < 0 or not text[:comma].lower().endswith(";base64"):
        return text
    return text[comma + 1:]


def _boolean(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise unprocessable(f"{name} must be true or false, got {excerpt(value)}")


# each validator carries the JSON Schema of what it accepts: the OpenAPI document
# (services/ocr_api/openapi.py) is built from these, so it cannot say other than the code
_boolean.schema = {"type": "boolean"}  # type: ignore[attr-defined]


def _number_between(low: float, high: float, *, low_open: bool = False, integer: bool = False):
    def check(name: str, value: Any):
        is_int = isinstance(value, int) and not isinstance(value, bool)
        if integer and not is_int:
            raise unprocessable(f"{name} must be an integer, got {excerpt(value)}")
        # ints are exact (a 4000-digit one is still a number, just out of range); floats
        # must be finite (JSON's NaN and Infinity parse to floats)
        if not (is_int or (isinstance(value, float) and math.isfinite(value))):
            raise unprocessable(f"{name} must be a number, got {excerpt(value)}")
        too_low = value <= low if low_open else value < low
        if too_low or value > high:
            bracket = "(" if low_open else "["
            raise unprocessable(f"{name} must be in {bracket}{low}, {high}], "
                                f"got {excerpt(value)}")
        return value
    check.schema = {"type": "integer" if integer else "number",  # type: ignore[attr-defined]
                    "exclusiveMinimum" if low_open else "minimum": low, "maximum": high}
    return check


def _one_of(*choices: str):
    def check(name: str, value: Any):
        if not isinstance(value, str) or value not in choices:
            raise unprocessable(f"{name} must be one of {', '.join(map(json.dumps, choices))}, "
                                f"got {excerpt(value)}")
        return value
    check.schema = {"type": "string", "enum": list(choices)}  # type: ignore[attr-defined]
    return check


# PaddleX's optional /ocr fields -> (PaddleOCR.predict keyword, validator)
PIPELINE_PARAMS: dict[str, tuple[str, Callable[[str, Any], Any]]] = {
    "useDocOrientationClassify": ("use_doc_orientation_classify", _boolean),
    "useDocUnwarping": ("use_doc_unwarping", _boolean),
    "useTextlineOrientation": ("use_textline_orientation", _boolean),
    "textDetLimitSideLen": ("text_det_limit_side_len", _number_between(1, 8192, integer=True)),
    "textDetLimitType": ("text_det_limit_type", _one_of("min", "max")),
    "textDetThresh": ("text_det_thresh", _number_between(0, 1, low_open=True)),
    "textDetBoxThresh": ("text_det_box_thresh", _number_between(0, 1, low_open=True)),
    "textDetUnclipRatio": ("text_det_unclip_ratio", _number_between(0, 10, low_open=True)),
    "textRecScoreThresh": ("text_rec_score_thresh", _number_between(0, 1)),
    "returnWordBox": ("return_word_box", _boolean),
}


@dataclass
class OcrRequest:
    """One validated /ocr request."""

    log_id: str
    file_bytes: bytes
    kind: str  # KIND_PDF or KIND_IMAGE
    pipeline_params: dict[str, Any] = field(default_factory=dict)  # snake_case, only set ones
    api_params: dict[str, Any] = field(default_factory=dict)  # camelCase, as the caller sent
    visualize: bool | None = None
    page_range: str | None = None
    text_layer: str = TEXT_LAYER_IGNORE

    def forward_body(self, file_bytes: bytes, kind: str, page_range: str | None = None) -> dict:
        """A PaddleX-shaped JSON body carrying these parameters for other file bytes (the
        gateway forwards each page this way)."""
        body: dict[str, Any] = {
            "file": base64.b64encode(file_bytes).decode("ascii"),
            "fileType": FILE_TYPE_PDF if kind == KIND_PDF else FILE_TYPE_IMAGE,
            **self.api_params,
        }
        if self.visualize is not None:
            body["visualize"] = self.visualize
        if page_range is not None:
            body["pageRange"] = page_range
        return body


# A PaddleX request is one object of a dozen scalar fields and one long string; every JSON value
# after the first in a container follows a comma, and every container opens with a bracket, so
# counting those bytes (at memchr speed, before parsing) bounds how many Python objects the body
# can become: 200 MB of "[],[]..." would otherwise be gigabytes of lists.
MAX_JSON_VALUES = 16384
_STRUCTURAL = (b",", b"[", b"{")


def parse_json_body(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400/422 saying what is wrong with it."""
    if not raw:
        raise bad_request("The request body is empty: send a JSON object with a base64 'file' "
                          "field, or multipart/form-data with a 'file' part")
    if sum(raw.count(mark) for mark in _STRUCTURAL) > MAX_JSON_VALUES:
        raise bad_request(f"The request body holds more than {MAX_JSON_VALUES} JSON values: "
                          "send one object with a base64 'file' field and scalar parameters")
    try:
        body = json.loads(raw)
    except RecursionError:
        raise bad_request("The request body's JSON is nested too deeply: send one object "
                          "with a base64 'file' field and scalar parameters") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"The request body is not valid JSON ({excerpt(str(exc), 120)}); "
                          "send a JSON object with a base64 'file' field") from None
    if not isinstance(body, dict):
        raise unprocessable(f"The request body must be a JSON object, got {excerpt(body)}")
    return body


# Form fields read as JSON (numbers, booleans, null); every other field stays the string the
# caller sent. A typed value is a few characters, so longer text is kept as a string (and
# then fails its field's type check) rather than parsed.
TYPED_FORM_FIELDS = frozenset({*PIPELINE_PARAMS, "fileType", "visualize",
                               "returnPartialResults"}) - {"textDetLimitType"}
MAX_TYPED_FORM_CHARS = 64


def form_fields_to_json(form: Mapping[str, str]) -> dict[str, Any]:
    """multipart/form-data values are strings; read each typed field as JSON where it parses
    ("0" -> 0, "true" -> true, "0.3" -> 0.3) so both transports share one validator."""
    fields: dict[str, Any] = {}
    for name, text in form.items():
        fields[name] = text
        if name in TYPED_FORM_FIELDS and len(text) <= MAX_TYPED_FORM_CHARS:
            try:
                fields[name] = json.loads(text)
            except ValueError:
                pass
    return fields


def decode_base64_file(text: str, max_bytes: int) -> bytes:
    text = "".join(_strip_data_uri(text).split())  # no regular expression on caller input
    if not text:
        raise unprocessable("'file' is empty: send the file's bytes base64-encoded")
    if len(text) // 4 * 3 > max_bytes + 3:
        raise too_large(f"The file is larger than the {max_bytes}-byte limit of this server")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise unprocessable("'file' is not valid base64: send the file's bytes base64-encoded "
                            "(standard alphabet, padded), or a multipart 'file' part") from None
    if len(data) > max_bytes:
        raise too_large(f"The file is {len(data)} bytes, over this server's {max_bytes}-byte limit")
    if not data:
        raise unprocessable("'file' decodes to zero bytes")
    return data


def is_url(text: str) -> bool:
    return text[:8].lower().startswith(("http://", "https://"))


def parse_ocr_request(fields: Mapping[str, Any], *, max_bytes: int,
                      file_bytes: bytes | None = None,
                      fetch_url: Callable[[str], bytes] | None = None) -> OcrRequest:
    """Validate an /ocr request given as JSON fields (file as base64 or URL) or as form fields
    plus uploaded `file_bytes`. `fetch_url` is None when URL input is disabled."""
    log_id = logs.adopt(fields.get("logId"))
    try:
        return _parse(fields, log_id, max_bytes, file_bytes, fetch_url)
    except ApiError as exc:
        exc.log_id = log_id  # type: ignore[attr-defined]
        raise


def _parse(fields, log_id, max_bytes, file_bytes, fetch_url) -> OcrRequest:
    if file_bytes is None:
        file_bytes = _file_bytes_from_field(fields, max_bytes, fetch_url)
    elif not file_bytes:
        raise unprocessable("The uploaded 'file' part is empty")
    elif len(file_bytes) > max_bytes:
        raise too_large(f"The file is {len(file_bytes)} bytes, over this server's "
                        f"{max_bytes}-byte limit")

    kind = _resolve_kind(fields.get("fileType"), file_bytes)

    pipeline_params: dict[str, Any] = {}
    api_params: dict[str, Any] = {}
    for api_name, (kwarg, validate) in PIPELINE_PARAMS.items():
        value = fields.get(api_name)
        if value is None:
            continue
        pipeline_params[kwarg] = validate(api_name, value)
        api_params[api_name] = value

    visualize = fields.get("visualize")
    if visualize is not None:
        visualize = _boolean("visualize", visualize)

    page_range = fields.get("pageRange")
    if page_range is not None:
        if isinstance(page_range, int) and not isinstance(page_range, bool):
            page_range = str(page_range)
        if not isinstance(page_range, str):
            raise unprocessable("pageRange must be a string such as \"1-3,7\" (1-based pages)")
        validate_page_range_syntax(page_range)

    text_layer = fields.get("textLayer")
    if text_layer is None:
        text_layer = TEXT_LAYER_IGNORE
    text_layer = _one_of(*TEXT_LAYER_MODES)("textLayer", text_layer)
    if text_layer != TEXT_LAYER_IGNORE:
        # in api_params: forwarded with every chunk, and part of what a page was read with;
        # the default is left out, so that "ignore" and no field are one request
        api_params["textLayer"] = text_layer

    return OcrRequest(log_id=log_id, file_bytes=file_bytes, kind=kind,
                      pipeline_params=pipeline_params, api_params=api_params,
                      visualize=visualize, page_range=page_range, text_layer=text_layer)


def _file_bytes_from_field(fields, max_bytes, fetch_url) -> bytes:
    if "file" not in fields or fields["file"] is None:
        raise unprocessable("'file' is required: the base64 of an image or PDF")
    text = fields["file"]
    if not isinstance(text, str):
        raise unprocessable(f"'file' must be a string (base64 of an image or PDF), "
                            f"got {type(text).__name__}")
    if is_url(text):
        if fetch_url is None:
            raise unprocessable("URL input is disabled on this server: send the file's bytes "
                                "base64-encoded in 'file', or upload it as multipart/form-data")
        return fetch_url(text)
    return decode_base64_file(text, max_bytes)


def _resolve_kind(file_type: Any, data: bytes) -> str:
    if file_type is not None and (isinstance(file_type, bool) or file_type not in (0, 1)):
        raise unprocessable(f"fileType must be 0 (PDF), 1 (image) or null (detect), "
                            f"got {excerpt(file_type)}")
    sniffed = sniff_kind(data)
    if sniffed is None:
        raise unprocessable("The file is neither a PDF nor a supported image (PNG, JPEG, BMP, "
                            "TIFF, WebP): check that 'file' holds the document's bytes")
    if file_type is not None:
        declared = KIND_PDF if file_type == FILE_TYPE_PDF else KIND_IMAGE
        if declared != sniffed:
            raise unprocessable(f"fileType is {file_type} ({describe_kind(declared)}) but the "
                                f"file is {describe_kind(sniffed)}: send fileType "
                                f"{FILE_TYPE_PDF if sniffed == KIND_PDF else FILE_TYPE_IMAGE} "
                                "or null")
    return sniffed
