"""The PaddleX answer, written from pages in order: the whole document's envelope (one
`ocrResults` entry per page, or `layoutParsingResults` entry for /layout-parsing: the
document's Endpoint names them; `dataInfo` for the document, failed pages named in partial
mode), the same envelope written out page by page, NDJSON lines, plain text, Markdown, and
the error that names failed pages. /ocr, /layout-parsing and job results all answer through
here. Pure."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Iterable, Iterator

from services.documents.unicode import utf8
from services.ocr_api import envelope

from services.layout import markdown

from ..assemble import PageOutcome
from ..endpoint import LAYOUT, OCR, Endpoint
from . import layout, text


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

def failed_page_entry(page: PageOutcome, endpoint: Endpoint = OCR) -> dict[str, Any]:
    """A failed page's entry (partial mode): no result, and its `error`. A layout page keeps
    PaddleX's required fields (an empty result and Markdown)."""
    if endpoint == LAYOUT:
        entry = {"prunedResult": {}, "markdown": {"text": "", "isStart": True, "isEnd": True,
                                                  "images": {}},
                 "outputImages": None, "inputImage": None}
    else:
        entry = envelope.ocr_page_result(None)
    entry["error"] = {"errorCode": page.error_code, "errorMsg": page.error_msg}
    return entry

def document_result(pages: list[PageOutcome], page_range_given: bool,
                    endpoint: Endpoint = OCR) -> dict:
    """`result` for the whole document; failed pages (partial mode) carry an `error`."""
    result: dict[str, Any] = {
        endpoint.results: [p.ocr_result if not p.error_code else failed_page_entry(p, endpoint)
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

def stream_page_line(log_id: str, page: PageOutcome,
                     endpoint: Endpoint = OCR) -> dict[str, Any]:
    """A page's NDJSON line; `cached` (always there, false while the cache is off) says it
    was answered from the page cache; its entry is the endpoint's (`ocrResult`,
    `layoutParsingResult`)."""
    if page.error_code:
        return {"logId": log_id, "pageIndex": page.page_index, "errorCode": page.error_code,
                "errorMsg": page.error_msg, "cached": False}
    return {"logId": log_id, "pageIndex": page.page_index, endpoint.result: page.ocr_result,
            "pageInfo": page.page_info, "cached": page.cached}


def cached_pages(pages: Iterable[PageOutcome]) -> int:
    """How many of these pages were answered from the page cache."""
    return sum(1 for page in pages if page.cached and not page.error_code)

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
    line["cachedPages"] = cached_pages(pages)
    return line


def _dumps(value: Any) -> bytes:
    return utf8(json.dumps(value, ensure_ascii=False))


def line(obj: dict[str, Any]) -> bytes:
    """One NDJSON line."""
    return _dumps(obj) + b"\n"


def envelope_chunks(log_id: str, pages: Iterable[PageOutcome],
                    page_range_given: bool, endpoint: Endpoint = OCR) -> Iterator[bytes]:
    """envelope.success(logId, document_result(...)) written out page by page: only each
    page's size is kept for dataInfo at the end, so a long answer is never held whole."""
    light: list[PageOutcome] = []
    yield (b'{"logId":' + _dumps(log_id) + b',"result":{' + _dumps(endpoint.results)
           + b":[")
    for number, page in enumerate(pages):
        entry = page.ocr_result if not page.error_code else failed_page_entry(page, endpoint)
        yield (b"," if number else b"") + _dumps(entry)
        light.append(replace(page, ocr_result=None))
    tail = document_result(light, page_range_given, endpoint)
    yield b'],"dataInfo":' + _dumps(tail["dataInfo"])
    if "failedPages" in tail:
        yield b',"failedPages":' + _dumps(tail["failedPages"])
    yield b'},"errorCode":0,"errorMsg":"Success"}'


def ndjson_pages(log_id: str, pages: Iterable[PageOutcome], seen: list[PageOutcome],
                 endpoint: Endpoint = OCR, **extra: Any) -> Iterator[bytes]:
    """A line per page; each page (without its result) is appended to `seen`, for the
    summary line the caller writes."""
    for page in pages:
        yield line({**stream_page_line(log_id, page, endpoint), **extra})
        seen.append(replace(page, ocr_result=None))


def page_text(page: PageOutcome) -> str:
    """One page's lines in reading order (outputs/text.py)."""
    return text.page_text(page_layout(page))


def text_chunks(pages: Iterable[PageOutcome]) -> Iterator[bytes]:
    """The document's text, a page at a time, pages separated by form feeds."""
    for number, page in enumerate(pages):
        yield (b"\f" if number else b"") + utf8(page_text(page))


def page_markdown(page: PageOutcome) -> str:
    """One /layout-parsing page's Markdown; a failed page (partial mode) says so in a
    comment, so the pages after it keep their place."""
    if page.error_code:
        return f"<!-- page {page.page_index + 1}: {page.error_msg.replace('--', '- -')} -->"
    return str(((page.ocr_result or {}).get("markdown") or {}).get("text") or "")


def markdown_chunks(pages: Iterable[PageOutcome]) -> Iterator[bytes]:
    """The document's Markdown (services/layout/markdown.py: pages in order, a page break
    between them), written once every page is in (their Markdown is a small part of each)."""
    yield utf8(markdown.document_markdown([page_markdown(page) for page in pages]))


def page_layout(page: PageOutcome) -> layout.PageText:
    """One page's size and lines, as the searchable PDF places them."""
    size = page.page_info or {}
    pruned = (page.ocr_result or {}).get("prunedResult") if not page.error_code else None
    return layout.PageText(page.page_index, float(size.get("width") or 0),
                           float(size.get("height") or 0), layout.page_lines(pruned),
                           page.error_msg or None, layout.has_own_text(pruned))
