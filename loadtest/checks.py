"""Is this /ocr answer right? One pure function for the Locust users and the benchmarks alike:
an answer that is not a complete, correct PaddleX envelope for the pages sent is a failure,
however fast it came back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from samples.documents import has_page_label

SIM_MARK = "[simulated]"


@dataclass(frozen=True)
class Expected:
    """What a right answer to one request looks like. `labelled`: a PDF whose page i says
    "Page i of N", so a reordered answer fails (not checked on the sim engine's text)."""

    pages: int
    kind: str  # "image" or "pdf"
    labelled: bool = False


class WrongAnswer(Exception):
    """The response arrived but is not the right answer."""


def page_texts(body: dict[str, Any]) -> list[str]:
    return [" ".join(page.get("prunedResult", {}).get("rec_texts") or [])
            for page in body["result"]["ocrResults"]]


def check_ocr_response(status: int, body: Any, expected: Expected) -> None:
    """Raise WrongAnswer saying what is wrong, or return None when the answer is right."""
    def require(ok: Any, why: str) -> None:
        if not ok:
            raise WrongAnswer(why)

    require(isinstance(body, dict), f"HTTP {status}: the body is not a JSON object")
    code, message = body.get("errorCode"), body.get("errorMsg")
    require(status == 200, f"HTTP {status}: errorCode={code} errorMsg={message!r}")
    require(code == 0, f"HTTP 200 but errorCode={code} errorMsg={message!r}")
    require(body.get("logId"), "no logId in the envelope")
    result = body.get("result")
    require(isinstance(result, dict), "no result object in a success envelope")
    pages, n = result.get("ocrResults"), expected.pages
    require(isinstance(pages, list), "result.ocrResults is not a list")
    require(len(pages) == n, f"{len(pages)} ocrResults for {n} pages sent")
    for index, page in enumerate(pages, start=1):
        pruned = page.get("prunedResult") if isinstance(page, dict) else None
        require(isinstance(pruned, dict) and isinstance(pruned.get("rec_texts"), list),
                f"page {index}: no prunedResult.rec_texts")
    info = result.get("dataInfo")
    require(isinstance(info, dict), "no result.dataInfo object")
    require(info.get("type") == expected.kind,
            f"dataInfo.type is {info.get('type')!r}, expected {expected.kind!r}")
    if expected.kind == "pdf":
        require(info.get("numPages") == n, f"dataInfo.numPages={info.get('numPages')} for {n} "
                "pages sent")
        entries = len(info.get("pages") or [])
        require(entries == n, f"dataInfo.pages has {entries} entries for {n} pages sent")
    texts = page_texts(body)
    if expected.labelled and not all(text.startswith(SIM_MARK) for text in texts):
        for number, text in enumerate(texts, start=1):
            require(has_page_label(text, number, n), f"page {number} of {n} does not say "
                    f"'Page {number} of {n}' (got {text[:60]!r}): pages out of order or misread")


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
