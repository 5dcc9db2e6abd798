"""Reading per-chunk worker answers into pages: each page's outcome (its `ocrResults` entry, or
its `layoutParsingResults` entry, and size, or its error), checked against what was sent.
Writing answers from pages is gateway/outputs/' business. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class PageOutcome:
    """One page of the document: its index in the original file and either the worker's
    `ocrResults` (or `layoutParsingResults`) entry plus rendered size, or an error.
    `cached`: answered from the page cache (gateway/cache/) instead of by a replica."""

    page_index: int
    ocr_result: dict[str, Any] | None = None
    page_info: dict[str, Any] | None = None
    error_code: int = 0
    error_msg: str = ""
    doc_type: str = "pdf"  # the worker's dataInfo.type: "pdf", "image" or "tiff"
    cached: bool = False


class MalformedReply(ValueError):
    pass


def pages_from_reply(reply: dict[str, Any], page_indices: tuple[int, ...],
                     kind: str, results: str = "ocrResults") -> list[PageOutcome]:
    """Split one worker reply for a chunk into its pages, checking it has exactly one result
    per page sent (under `results`: the endpoint's name for them). An image is sent whole, so
    its pages (frames of a multi-page TIFF) are whatever the worker found."""
    try:
        result = reply["result"]
        ocr_results = result[results]
        info = result["dataInfo"]
        doc_type = "tiff" if kind == "tiff" else info["type"]  # a TIFF split by frames
    except (KeyError, TypeError):
        raise MalformedReply(f"a replica answered without result.{results}/dataInfo") from None
    if info.get("type") == "image":
        sizes = [{"width": info.get("width"), "height": info.get("height")}]
    else:
        sizes = info.get("pages") or []
    if kind == "image":
        page_indices = tuple(info.get("pageIndices") or range(len(ocr_results)))
    if not (len(ocr_results) == len(page_indices) == len(sizes)):
        raise MalformedReply(f"a replica returned {len(ocr_results)} results for "
                             f"{len(page_indices)} page(s)")
    return [PageOutcome(index, entry, size, doc_type=doc_type)
            for index, entry, size in zip(page_indices, ocr_results, sizes)]


def failed_pages(page_indices: tuple[int, ...], code: int, message: str,
                 doc_type: str) -> list[PageOutcome]:
    return [PageOutcome(index, error_code=code, error_msg=message, doc_type=doc_type)
            for index in page_indices]
