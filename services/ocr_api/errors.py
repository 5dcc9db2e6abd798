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


def bad_request(message: str) -> ApiError:
    return ApiError(400, message)


def unprocessable(message: str) -> ApiError:
    return ApiError(422, message)


def too_large(message: str) -> ApiError:
    return ApiError(413, message)


def overloaded(message: str, retry_after_s: int) -> ApiError:
    return ApiError(503, message, {"Retry-After": str(retry_after_s)})
