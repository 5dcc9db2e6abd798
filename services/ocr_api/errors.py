"""The one error type a request can fail with, carrying the HTTP status that becomes the
envelope's `errorCode`, a message a caller can act on, and optional response headers."""

from __future__ import annotations


class ApiError(Exception):
    """A request failed in a way the caller should hear about: `status` is the HTTP status and
    the envelope's `errorCode`; `message` is the envelope's `errorMsg` (never a stack trace)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}

    def __reduce__(self):  # travels between processes whole (gateway/outputs/sandbox.py)
        return type(self), (self.status, self.message, self.headers)


def bad_request(message: str) -> ApiError:
    return ApiError(400, message)


def unprocessable(message: str) -> ApiError:
    return ApiError(422, message)


def too_large(message: str) -> ApiError:
    return ApiError(413, message)


def overloaded(message: str, retry_after_s: int) -> ApiError:
    return ApiError(503, message, {"Retry-After": str(retry_after_s)})


EXCERPT_CHARS = 40


def excerpt(value: object, limit: int = EXCERPT_CHARS) -> str:
    """A short, printable rendering of caller-supplied input for an error message: strings cut
    to `limit` characters (with how many were left out), control characters and lone
    surrogates escaped, containers named by type and size rather than rendered (a hostile
    value may be megabytes long or thousands of levels deep). Never raises."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, (int, float)):
        return _cut(_number_text(value), limit)
    if isinstance(value, (bytes, bytearray)):
        return f"{len(value)} bytes"
    if isinstance(value, str):
        text = _printable(value[:limit])
        more = len(value) - limit
        return f'"{text}"' + (f" (+{more} more characters)" if more > 0 else "")
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)} item(s)"
    if isinstance(value, dict):
        return f"an object with {len(value)} key(s)"
    return f"a {type(value).__name__}"


def _number_text(value: int | float) -> str:
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    return repr(value)


def _printable(text: str) -> str:
    escaped = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii")
                   for ch in escaped)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
