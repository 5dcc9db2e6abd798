"""Is this /ocr answer right? One pure function, used by the Locust users and the benchmarks'
load generator alike: a response that is not a complete, correct PaddleX envelope for the pages
that were sent is a failure, however fast it came back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from samples.documents import has_page_label

SIM_MARK = "[simulated]"


@dataclass(frozen=True)
class Expected:
    """What a correct answer to one request looks like."""

    pages: int
    kind: str  # "image" or "pdf"
    # For PDFs whose page i says "Page i of N" (documents.labelled_pdf / table_pdf): check the
    # recognised text of each page names that page, so a reordered answer fails. Skipped when
    # the engine is simulated (its text is not read from the page).
    labelled: bool = False


class WrongAnswer(Exception):
    """The response arrived but is not the right answer."""


def page_texts(body: dict[str, Any]) -> list[str]:
    return [" ".join(page.get("prunedResult", {}).get("rec_texts") or [])
            for page in body["result"]["ocrResults"]]


def is_simulated(body: dict[str, Any]) -> bool:
    texts = page_texts(body)
    return bool(texts) and all(text.startswith(SIM_MARK) for text in texts)


def check_ocr_response(status: int, body: Any, expected: Expected) -> None:
    """Raise WrongAnswer saying what is wrong, or return None when the answer is right."""
    if not isinstance(body, dict):
        raise WrongAnswer(f"HTTP {status}: the body is not a JSON object")
    code, message = body.get("errorCode"), body.get("errorMsg")
    if status != 200:
        raise WrongAnswer(f"HTTP {status}: errorCode={code} errorMsg={message!r}")
    if code != 0:
        raise WrongAnswer(f"HTTP 200 but errorCode={code} errorMsg={message!r}")
    if not body.get("logId"):
        raise WrongAnswer("no logId in the envelope")
    result = body.get("result")
    if not isinstance(result, dict):
        raise WrongAnswer("no result object in a success envelope")
    pages = result.get("ocrResults")
    if not isinstance(pages, list):
        raise WrongAnswer("result.ocrResults is not a list")
    if len(pages) != expected.pages:
        raise WrongAnswer(f"{len(pages)} ocrResults for {expected.pages} pages sent")
    for index, page in enumerate(pages):
        pruned = page.get("prunedResult") if isinstance(page, dict) else None
        if not isinstance(pruned, dict) or not isinstance(pruned.get("rec_texts"), list):
            raise WrongAnswer(f"page {index + 1}: no prunedResult.rec_texts")
    info = result.get("dataInfo")
    if not isinstance(info, dict):
        raise WrongAnswer("no result.dataInfo object")
    if info.get("type") != expected.kind:
        raise WrongAnswer(f"dataInfo.type is {info.get('type')!r}, expected {expected.kind!r}")
    if expected.kind == "pdf":
        if info.get("numPages") != expected.pages:
            raise WrongAnswer(f"dataInfo.numPages={info.get('numPages')} for {expected.pages} "
                              "pages sent")
        if len(info.get("pages") or []) != expected.pages:
            raise WrongAnswer(f"dataInfo.pages has {len(info.get('pages') or [])} entries for "
                              f"{expected.pages} pages sent")
    if expected.labelled and not is_simulated(body):
        for number, text in enumerate(page_texts(body), start=1):
            if not has_page_label(text, number, expected.pages):
                raise WrongAnswer(f"page {number} of {expected.pages} does not say "
                                  f"'Page {number} of {expected.pages}' (got {text[:60]!r}): "
                                  "pages out of order or misread")


def answer_problem(status: int, read_json: Callable[[], Any], expected: Expected) -> str | None:
    """What is wrong with an HTTP answer (`read_json` parses its body), or None if right."""
    try:
        body = read_json()
    except ValueError:
        body = None
    try:
        check_ocr_response(status, body, expected)
    except WrongAnswer as wrong:
        return str(wrong)
    return None
