"""What one attempt to send a chunk to a replica came to: the one classification that the
scheduler (retry or not), the replica set (eject or not, grow or shrink its limit) and the
metrics all read, and the answer it books (Attempt). Busy is not down: a worker's 503 or 429
is backpressure, never a failure."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class Outcome(enum.Enum):
    OK = "ok"              # 200: the pages came back
    REJECTED = "rejected"  # a 4xx other than 429: the document's own problem, not retried
    BUSY = "busy"          # 503 / 429: the replica is full or draining; send again later
    LATER = "later"        # 503 + X-Ocr-Starts-In-Ms: it would start the page later than
    #                        asked (X-Ocr-Start-Within-Ms), or it holds its target's pages
    #                        (X-Ocr-Within-Target); another replica, at once
    FAILED = "failed"      # 500 and other 5xx from a live replica: retried within the budget
    DOWN = "down"          # connection error, timeout, 502/504 from a proxy: retried, ejects

    @property
    def is_failure(self) -> bool:
        """Counts against the page's attempts and the fleet-wide retry budget."""
        return self in (Outcome.FAILED, Outcome.DOWN)


def classify(status: int | None, later: bool = False) -> Outcome:
    """The outcome of an HTTP answer (`None`: no answer at all: refused, reset, timed out;
    `later`: the answer says when the worker would have started the page)."""
    if status is None or status in (502, 504):
        return Outcome.DOWN
    if status == 200:
        return Outcome.OK
    if status in (429, 503):
        return Outcome.LATER if later and status == 503 else Outcome.BUSY
    if status >= 500:
        return Outcome.FAILED
    return Outcome.REJECTED


@dataclass
class Attempt:
    """One attempt's answer: the outcome, the HTTP status (None: no answer), the parsed body,
    and what the worker said: its room, when to come back, its id and its fleet board."""

    outcome: Outcome
    status: int | None
    payload: dict[str, Any]
    message: str
    capacity: int | None = None
    free: int | None = None
    held: int | None = None
    retry_after_s: float | None = None
    worker: str | None = None
    board: str | None = None
    timed_out: bool = False  # no answer within the time allowed (a 504 to the caller)
    engine: str | None = None  # the engine identity the replica says it runs (page cache)
    seconds: float = 0.0  # from sending to the whole answer
    starts_in_s: float | None = None  # LATER: when the worker would have started it
    page_s: float | None = None  # how long the worker's pages take (X-Ocr-Page-Ms)
