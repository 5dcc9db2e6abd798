"""Choosing the font of the invisible text layer: the first configured font (TTF, or the first
face of a TTC) whose character map covers every character of the document, else the one that
covers most. An invisible layer needs no particular look, but a character the font lacks
would be dropped from the text; a small Latin font is listed first because loading a large
CJK font costs more. Coverage is read once per font per process."""

from __future__ import annotations

import logging
import os
import threading
from functools import lru_cache

from fontTools.ttLib import TTFont

from services.ocr_api.errors import ApiError

log = logging.getLogger("gateway.outputs")
_LOCK = threading.Lock()


@lru_cache(maxsize=16)
def _coverage(path: str) -> frozenset[int]:
    font = TTFont(path, fontNumber=0, lazy=True)
    try:
        return frozenset(font.getBestCmap() or {})
    finally:
        font.close()


def coverage(path: str) -> frozenset[int]:
    with _LOCK:
        return _coverage(path)


def pick_font(paths: tuple[str, ...], text: str) -> str:
    """The font to embed for `text`; 503 when none of the configured files exists."""
    usable = [path for path in paths if os.path.isfile(path)]
    if not usable:
        raise ApiError(503, "Searchable PDF output needs a TrueType font on the gateway: "
                            f"none of {', '.join(paths) or '(none)'} exists (set "
                            "GATEWAY_PDF_FONTS or install fonts-dejavu-core and "
                            "fonts-wqy-zenhei)")
    needed = {ord(ch) for ch in text if not ch.isspace()}
    best, best_missing = usable[0], None
    for path in usable:
        missing = len(needed - coverage(path))
        if missing == 0:
            return path
        if best_missing is None or missing < best_missing:
            best, best_missing = path, missing
    log.warning("no configured font covers all %d characters of the text layer; %d will "
                "be missing", len(needed), best_missing)
    return best
