"""Planning one document, the first stage of every page path (/ocr and /jobs alike): parse
the request, count its pages once (a PDF's from its page tree, a TIFF's frames cheaply and
capped), select them (`pageRange`), group them into chunks, and say how to cut and send
each chunk (`ChunkSource`). An image, or a document that fits one chunk, is sent whole.
No Flask, no network."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from services.documents.pages import select_pages
from services.documents.tiff import count_tiff_frames
from services.layout.request import parse_layout_fields
from services.ocr_api.errors import unprocessable
from services.ocr_api.request import OcrRequest, parse_ocr_request
from services.ocr_api.sniff import KIND_PDF, is_tiff

from .endpoint import LAYOUT, OCR, Endpoint
from .split import KIND_TIFF, Chunk, PdfCutter, TiffCutter, WholeFile, count_pages, group_pages


@dataclass(frozen=True)
class PlanLimits:
    max_bytes: int
    max_pages: int
    pages_per_chunk: int
    request_timeout_s: float


@dataclass
class Plan:
    """How one request is cut: its kind, its groups of pages (one chunk each), how many
    pages, whether it is split at all, its one deadline, and the worker endpoint its pages
    go to (gateway/endpoint.py)."""

    request: OcrRequest
    kind: str
    groups: list[tuple[int, ...]]
    num_pages: int
    split: bool
    partial: bool
    deadline: float
    endpoint: Endpoint = OCR

    @property
    def page_indices(self) -> list[int]:
        return [index for group in self.groups for index in group]

    def source(self) -> "ChunkSource":
        return ChunkSource(self)


class ChunkSource:
    """What the scheduler sends for one document: each group of pages cut as a standalone
    document (only when it is about to go out), and the /ocr body that carries it."""

    def __init__(self, plan: Plan):
        self._plan = plan
        data = plan.request.file_bytes
        if not plan.split:
            self._cutter = WholeFile(data)
        elif plan.kind == KIND_TIFF:
            self._cutter = TiffCutter(data)
        else:
            self._cutter = PdfCutter(data)

    def cut(self, group: tuple[int, ...]) -> Chunk:
        return self._cutter.cut(group)

    def body(self, chunk: Chunk) -> bytes:
        plan, request = self._plan, self._plan.request
        page_range = None if plan.split else request.page_range
        kind = chunk.kind if plan.split else plan.kind
        return json.dumps(request.forward_body(chunk.data, kind, page_range)).encode()

    def close(self) -> None:
        self._cutter.close()


def plan_document(fields: Mapping[str, Any], file_bytes: bytes | None, limits: PlanLimits,
                  fetch_url: Callable[[str], bytes] | None, endpoint: Endpoint = OCR) -> Plan:
    """The plan for /ocr's or /layout-parsing's fields: the same limits for both."""
    deadline = time.monotonic() + limits.request_timeout_s
    forward = parse_layout_fields(fields)[1] if endpoint == LAYOUT else {}  # 422 before the file
    request = parse_ocr_request(fields, max_bytes=limits.max_bytes, file_bytes=file_bytes,
                                fetch_url=fetch_url)
    request.api_params.update(forward)  # sent with every chunk, and in the page cache's key
    plan = _plan(request, fields, deadline, limits)
    plan.endpoint = endpoint
    return plan


def _plan(request: OcrRequest, fields: Mapping[str, Any], deadline: float,
          limits: PlanLimits) -> Plan:
    partial = fields.get("returnPartialResults", False)
    if not isinstance(partial, bool):
        raise unprocessable("returnPartialResults must be true or false")
    if is_tiff(request.file_bytes):
        return _plan_tiff(request, partial, deadline, limits)
    if request.kind != KIND_PDF:
        return Plan(request, request.kind, [(0,)], 1, False, partial, deadline)
    indices = select_pages(request.page_range, count_pages(request.file_bytes),
                           limits.max_pages, server="gateway")
    return _split_or_whole(request, KIND_PDF, indices, partial, deadline, limits)


def _plan_tiff(request: OcrRequest, partial: bool, deadline: float,
               limits: PlanLimits) -> Plan:
    """A multi-page TIFF is split by frames like a PDF by pages (frames counted cheaply and
    capped); a single-frame one is an image."""
    frames = count_tiff_frames(request.file_bytes, limits.max_pages)
    if frames <= 1:
        return Plan(request, request.kind, [(0,)], 1, False, partial, deadline)
    indices = select_pages(request.page_range, frames, limits.max_pages, what="TIFF",
                           server="gateway")
    plan = _split_or_whole(request, KIND_TIFF, indices, partial, deadline, limits)
    if not plan.split:  # sent whole: the worker selects the frames and names them
        plan.kind = request.kind
    return plan


def _split_or_whole(request: OcrRequest, kind: str, indices: list[int], partial: bool,
                    deadline: float, limits: PlanLimits) -> Plan:
    if len(indices) <= limits.pages_per_chunk:
        return Plan(request, kind, [tuple(indices)], len(indices), False, partial, deadline)
    groups = group_pages(indices, limits.pages_per_chunk)
    return Plan(request, kind, groups, len(indices), True, partial, deadline)
