"""The worker's side of flow control with the gateway (README "Flow control"): how much room
the worker has, told on every /ocr answer, and how long the caller will still wait, told on
every request.

- Every /ocr answer (200, 503, any status) carries `X-Ocr-Capacity` (admission slots,
  OCR_QUEUE_SIZE) and `X-Ocr-Free` (slots free when the answer leaves); `/readyz` says the
  same as `"capacity": {"slots", "free"}`.
- A request may carry `X-Deadline-Ms`: whole milliseconds the caller will still wait. The
  request's deadline is then the sooner of that and OCR_REQUEST_TIMEOUT_S. A value that is not
  a whole number from 0 to 999999999 gets 400 (a caller bug is better found than ignored).
- 503 means busy only (admission or memory budget full, draining, model loading), always with
  Retry-After; a failed page is 500, a passed deadline 504."""

from __future__ import annotations

from services.ocr_api.errors import bad_request

CAPACITY_HEADER = "X-Ocr-Capacity"
FREE_HEADER = "X-Ocr-Free"
DEADLINE_HEADER = "X-Deadline-Ms"
MAX_DEADLINE_MS = 999_999_999


def parse_deadline_ms(value: str | None) -> int | None:
    """Milliseconds from an X-Deadline-Ms header, None without one; 400 when malformed."""
    if value is None:
        return None
    text = value.strip()
    if not (0 < len(text) <= 9 and text.isascii() and text.isdigit()):
        raise bad_request(f"{DEADLINE_HEADER} must be a whole number of milliseconds from 0 "
                          f"to {MAX_DEADLINE_MS}")
    return int(text)


def capacity_headers(slots: int, free: int) -> dict[str, str]:
    return {CAPACITY_HEADER: str(slots), FREE_HEADER: str(max(0, free))}


def capacity_json(slots: int, free: int) -> dict[str, int]:
    return {"slots": slots, "free": max(0, free)}
