"""The worker endpoints a document can be sent to, and what each names its pages in an
answer: /ocr's `ocrResults` (an NDJSON line's `ocrResult`), /layout-parsing's
`layoutParsingResults` (PaddleX's PP-StructureV3). A document carries its Endpoint from the
route through its plan and the scheduler to the replica and back into its answer, so the
one page path serves both. Pure."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Endpoint:
    path: str  # the worker's route, and the gateway's
    results: str  # the answer's list of page entries
    result: str  # one page's entry in an NDJSON line


OCR = Endpoint("/ocr", "ocrResults", "ocrResult")
LAYOUT = Endpoint("/layout-parsing", "layoutParsingResults", "layoutParsingResult")
ENDPOINTS = {endpoint.path: endpoint for endpoint in (OCR, LAYOUT)}


def by_path(path: str) -> Endpoint:
    """The Endpoint a job recorded (its `path`); KeyError for a path no gateway serves."""
    return ENDPOINTS[path]
