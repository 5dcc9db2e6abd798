"""`pageRange` ("1-3,7,10-"): 1-based pages or ranges, as in a print dialog.

Parsed by hand in one pass over the text (str.split, strip and an ASCII-digit check, no
regular expression), so the work is linear in the spec's length, which is itself capped before
anything else happens. Page numbers are capped in digits before int() is called (int() of
thousands of digits is slow and past 4300 raises). Selected pages are worked out by merging
spans, so a spec of many overlapping open ranges costs its parts plus the document's pages,
not their product.
"""

from __future__ import annotations

from .errors import excerpt, unprocessable

MAX_SPEC_CHARS = 8192
MAX_PARTS = 2048
MAX_PAGE_DIGITS = 7  # page 9,999,999: far past any page limit a server would configure
_DIGITS = frozenset("0123456789")
_SPACE = " \t\r\n"

Span = tuple[int, "int | None"]  # (first, last or None for "to the end"), 1-based, inclusive

EXAMPLE = 'such as "1-3,7,10-"'


def parse_page_range(spec: str) -> list[Span]:
    """The spans of `spec` in the order given; 422 naming the first part that is wrong."""
    if len(spec) > MAX_SPEC_CHARS:
        raise unprocessable(f"pageRange is {len(spec)} characters long, over the limit of "
                            f"{MAX_SPEC_CHARS}: select fewer, wider ranges ({EXAMPLE})")
    if spec.count(",") >= MAX_PARTS:
        raise unprocessable(f"pageRange has more than {MAX_PARTS} comma-separated parts: "
                            f"select fewer, wider ranges ({EXAMPLE})")
    return [_parse_part(part) for part in spec.split(",")]


def _parse_part(part: str) -> Span:
    first_text, dash, last_text = part.partition("-")
    first_text, last_text = first_text.strip(_SPACE), last_text.strip(_SPACE)
    if not first_text and not dash:
        raise _malformed(part, "an empty part")
    first = _page_number(first_text, part) if first_text else 1
    if not dash:
        return first, first
    last = _page_number(last_text, part) if last_text else None
    if last is not None and last < first:
        raise unprocessable(f"pageRange part {excerpt(part)} runs backwards: write the lower "
                            "page first")
    return first, last


def _page_number(text: str, part: str) -> int:
    if not _DIGITS.issuperset(text):
        raise _malformed(part, "not a page number or range")
    if len(text) > MAX_PAGE_DIGITS:
        raise unprocessable(f"pageRange part {excerpt(part)} has a page number of "
                            f"{len(text)} digits, over the limit of {MAX_PAGE_DIGITS}")
    number = int(text)
    if number < 1:
        raise unprocessable(f"pageRange part {excerpt(part)}: pages are numbered from 1")
    return number


def _malformed(part: str, what: str):
    return unprocessable(f"pageRange part {excerpt(part)} is {what}: send 1-based pages or "
                         f"ranges {EXAMPLE}")


def validate_page_range_syntax(spec: str) -> None:
    parse_page_range(spec)


def resolve_page_range(spec: str | None, num_pages: int) -> list[int]:
    """0-based page indices selected by `spec` (all pages when None), in ascending order
    without duplicates; 422 when a page lies beyond the document."""
    if spec is None:
        return list(range(num_pages))
    spans = parse_page_range(spec)
    highest = max(first if last is None else last for first, last in spans)
    if highest > num_pages:
        raise unprocessable(f"pageRange asks for page {highest} but the document has "
                            f"{num_pages} page(s)")
    indices: list[int] = []
    covered_to = 0  # pages 1..covered_to are already in `indices`
    for first, last in sorted((first, num_pages if last is None else last)
                              for first, last in spans):
        if last > covered_to:
            indices.extend(range(max(first, covered_to + 1) - 1, last))
            covered_to = last
    return indices
