"""Text without lone surrogates. A code point in U+D800-DFFF is half of a UTF-16 pair and no
character: UTF-8 cannot hold it, so one left in a string makes every UTF-8 writer raise (a
JSON, NDJSON or text answer would stop partway through its 200). Python strings get one from
a PDF's ToUnicode map (a glyph mapped to <D800>) or from JSON that escapes one ("\\ud800");
each becomes U+FFFD where text enters, and the writers replace any that is left."""

from __future__ import annotations

import json
import re
from typing import Any

REPLACEMENT = "\ufffd"
SURROGATE = re.compile("[\ud800-\udfff]")
# a JSON escape of a surrogate: all that can put one in what json.loads reads from bytes
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def scrub(text: str) -> str:
    """`text` with each surrogate code point as U+FFFD."""
    return SURROGATE.sub(REPLACEMENT, text)


def scrub_all(value: Any) -> Any:
    """Every string in a JSON value (keys too) scrubbed."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        return {scrub_all(key): scrub_all(item) for key, item in value.items()}
    if isinstance(value, list):
        return [scrub_all(item) for item in value]
    return value


def loads(data: bytes) -> Any:
    """json.loads, its strings scrubbed when the text escapes a surrogate (a linear scan;
    the value is walked only then)."""
    value = json.loads(data)
    return scrub_all(value) if SURROGATE_ESCAPE.search(data) else value


def utf8(text: str) -> bytes:
    """`text` as UTF-8, a surrogate left in it as U+FFFD (scanned for only when it fails)."""
    try:
        return text.encode()
    except UnicodeEncodeError:
        return scrub(text).encode()
