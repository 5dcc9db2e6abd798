"""Which pages of a document a request gets, and the page limit, applied alike by gateway and
worker."""

from __future__ import annotations

from services.ocr_api.errors import too_large, unprocessable
from services.ocr_api.page_range import resolve_page_range


def select_pages(page_range: str | None, total: int, max_pages: int, *, what: str = "PDF",
                 server: str = "server") -> list[int]:
    """0-based indices of the pages `page_range` selects out of `total`; 422 for a document
    without pages or a range past its end, 413 for more than `max_pages` selected."""
    if total == 0:
        raise unprocessable(f"The {what} has no pages")
    indices = resolve_page_range(page_range, total)
    if len(indices) > max_pages:
        raise too_large(f"The request selects {len(indices)} {what} pages, over this "
                        f"{server}'s limit of {max_pages}: send fewer pages (pageRange) or "
                        "split the document")
    return indices
