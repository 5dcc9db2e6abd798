"""Putting per-chunk worker answers back together in page order: the PaddleX envelope for the
whole document (one `ocrResults` entry per page, `dataInfo` for the document), optional
per-page errors for partial results, and the NDJSON lines of a streamed answer. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.ocr_api import envelope


@dataclass
class PageOutcome:
    """One page of the document: its index in the original file and either the worker's
    `ocrResults` entry plus rendered size, or an error."""

    page_index: int
    ocr_result: dict[str, Any] | None = None
    page_info: dict[str, Any] | None = None
    error_code: int = 0
    error_msg: str = ""
    doc_type: str = "pdf"  # the worker's dataInfo.type: "pdf", "image" or "tiff"


class MalformedReply(ValueError):
    pass


def pages_from_reply(reply: dict[str, Any], page_indices: tuple[int, ...],
                     kind: str) -> list[PageOutcome]:
    """Split one worker reply for a chunk into its pages, checking it has exactly one result
    per page sent. An image is sent whole, so its pages (frames of a multi-page TIFF) are
    whatever the worker found."""
    try:
        result = reply["result"]
        ocr_results = result["ocrResults"]
        info = result["dataInfo"]
        doc_type = "tiff" if kind == "tiff" else info["type"]  # a TIFF split by frames
    except (KeyError, TypeError):
        raise MalformedReply("a replica answered without result.ocrResults/dataInfo") from None
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


def data_info(pages: list[PageOutcome], page_range_given: bool) -> dict[str, Any]:
    """PaddleX's ImageInfo, PDFInfo or TIFFInfo for the whole document."""
    doc_type = pages[0].doc_type if pages else "pdf"
    if doc_type == "image":
        size = pages[0].page_info or {}
        return envelope.image_data_info(size.get("width"), size.get("height"))
    info = {"numPages": len(pages), "pages": [p.page_info for p in pages], "type": doc_type}
    if page_range_given:
        info["pageIndices"] = [p.page_index for p in pages]
    return info


def failed_page_entry(page: PageOutcome) -> dict[str, Any]:
    entry = envelope.ocr_page_result(None)
    entry["error"] = {"errorCode": page.error_code, "errorMsg": page.error_msg}
    return entry


def document_result(pages: list[PageOutcome], page_range_given: bool) -> dict:
    """`result` for the whole document; failed pages (partial mode) carry an `error`."""
    result: dict[str, Any] = {
        "ocrResults": [p.ocr_result if not p.error_code else failed_page_entry(p)
                       for p in pages],
        "dataInfo": data_info(pages, page_range_given),
    }
    failed = [p for p in pages if p.error_code]
    if failed:
        result["failedPages"] = [{"pageIndex": p.page_index, "errorCode": p.error_code,
                                  "errorMsg": p.error_msg} for p in failed]
    return result


def describe_failures(pages: list[PageOutcome]) -> tuple[int, str]:
    """One status and message naming every failed page (1-based, as people count pages)."""
    failed = [p for p in pages if p.error_code]
    numbers = ", ".join(str(p.page_index + 1) for p in failed[:20])
    more = f" and {len(failed) - 20} more" if len(failed) > 20 else ""
    status = failed[0].error_code
    return status, (f"Page(s) {numbers}{more} could not be processed: {failed[0].error_msg}. "
                    "Send returnPartialResults: true to get the other pages anyway")


def stream_page_line(log_id: str, page: PageOutcome) -> dict[str, Any]:
    if page.error_code:
        return {"logId": log_id, "pageIndex": page.page_index, "errorCode": page.error_code,
                "errorMsg": page.error_msg}
    return {"logId": log_id, "pageIndex": page.page_index, "ocrResult": page.ocr_result,
            "pageInfo": page.page_info}


def stream_summary_line(log_id: str, pages: list[PageOutcome],
                        page_range_given: bool) -> dict[str, Any]:
    failed = [p for p in pages if p.error_code]
    if failed:
        code, message = describe_failures(pages)
        line = envelope.no_result(log_id, code, message)
    else:
        line = envelope.success(log_id, {"dataInfo": data_info(pages, page_range_given)})
    line["done"] = True
    line["numPages"] = len(pages)
    return line
