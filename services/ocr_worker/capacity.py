"""The worker's side of flow control with the gateway (docs/design.md "Flow control"): how much room
the worker has, told on every /ocr answer, and how long the caller will still wait, told on
every request.

- Every /ocr answer (200, 503, any status) carries `X-Ocr-Capacity` (admission slots,
  OCR_QUEUE_SIZE), `X-Ocr-Free` (slots free when the answer leaves) and `X-Ocr-Held` (of the
  requests admitted then, those not read first: the pages X-Ocr-Within-Target counts); `/readyz`
  says the same in its headers, and capacity and free as `"capacity": {"slots", "free"}`.
- A request may carry `X-Ocr-Priority: high`: its pages are read before the pages already
  queued (never before the one being read). The gateway marks one-page interactive
  requests so, so that an image waits for at most the page in the engine, not for the
  pages other gateways queued behind it.
- A request may carry `X-Deadline-Ms`: whole milliseconds the caller will still wait. The
  request's deadline is then the sooner of that and OCR_REQUEST_TIMEOUT_S. A value that is not
  a whole number from 0 to 999999999 gets 400 (a caller bug is better found than ignored).
- A request may carry `X-Ocr-Start-Within-Ms` (with `X-Ocr-Priority: high`; the gateway
  sends it with an image): unless the page would start within that many milliseconds
  (`InferenceBatcher.first_wait_s`), the worker refuses it at once: 503 with
  `X-Ocr-Starts-In-Ms`, its estimate. It asks before reading the body, and again as the
  page is queued (the page under way may have ended meanwhile, and a queued page started).
  The caller then tries another worker instead of waiting out a long page here.
- A request may carry `X-Ocr-Within-Target: 1` (the gateway sends it with each document page
  it places itself, from a list of replicas): when the worker already holds the pages its
  target says keep it busy (`Pace`, in whole pages), it refuses at once with the same 503
  and `X-Ocr-Starts-In-Ms` (when its page under way ends). Gateway processes that each
  place pages by what a worker last told them would otherwise queue several at the worker
  that looked emptiest to all of them. An image (`X-Ocr-Priority: high`) is not counted: one
  admitted as the page under way ends would have the next document page refused and the
  worker idle after the image.
- 503 means busy only (admission or memory budget full, draining, model loading), always with
  Retry-After; a failed page is 500, a passed deadline 504.
- Every /ocr and /readyz answer also carries `X-Ocr-Worker` (this process's id) and the
  fleet board (services/ocr_api/fleet_board.py) with this worker's entries: its target, the
  pages it should hold to stay busy (`Pace`; 0 while draining), and how many gateway
  processes it has heard of in the last minute. The worker merges the board
  each caller sends: it is the meeting point through which gateways that share it learn of
  each other and of the other workers."""

from __future__ import annotations

import secrets
import threading
import time
from typing import Callable, Mapping

from services.ocr_api.errors import bad_request
from services.ocr_api import headers
from services.ocr_api.fleet_board import Board

CAPACITY_HEADER = headers.CAPACITY
FREE_HEADER = headers.FREE
DEADLINE_HEADER = headers.DEADLINE_MS
MAX_DEADLINE_MS = 999_999_999


def parse_deadline_ms(value: str | None, name: str = DEADLINE_HEADER) -> int | None:
    """Milliseconds from an X-Deadline-Ms (or `name`) header, None without one; 400 when
    malformed."""
    if value is None:
        return None
    text = value.strip()
    if not (0 < len(text) <= 9 and text.isascii() and text.isdigit()):
        raise bad_request(f"{name} must be a whole number of milliseconds from 0 "
                          f"to {MAX_DEADLINE_MS}")
    return int(text)


def parse_priority(value: str | None) -> bool:
    """True for `X-Ocr-Priority: high` (a one-page interactive request: the worker reads it
    before the pages already queued), False without the header or for "normal"; 400 else."""
    text = "normal" if value is None else value.strip().lower()
    if text in ("high", "normal"):
        return text == "high"
    raise bad_request(f"{headers.PRIORITY} must be high or normal")


def capacity_headers(slots: int, free: int, held: int,
                     page_s: float | None = None) -> dict[str, str]:
    """A worker's room on every answer, and how long its pages take (`Pace.page_s`) once it
    has read one."""
    said = {CAPACITY_HEADER: str(slots), FREE_HEADER: str(max(0, free)),
            headers.HELD: str(max(0, held))}
    if page_s is not None:
        said[headers.PAGE_MS] = str(round(page_s * 1000))
    return said


def capacity_json(slots: int, free: int) -> dict[str, int]:
    return {"slots": slots, "free": max(0, free)}


class Pace:
    """How many pages this worker should hold to stay busy: one batch running plus a share
    of one more. The share is what the gap between pages costs: after a page, the engine
    waits for the next one while its answer travels back and the caller sends another (the
    refill gap). Where that gap is small next to a page's time, a worker holds about one
    batch (so a new page, an interactive image say, starts at once instead of waiting behind
    a queued one); where it is not (short pages), up to two. The headroom h keeps the share
    of engine time lost to gaps near `loss`: a fraction 1 - h of pages wait out a gap, so
    h = 1 - loss * (1 + page / gap), between `min_headroom` and 1.

    Fed by the batcher's thread (`observe`): each batch's engine seconds, and each wait for
    a page that began with an empty queue. Waits longer than a gap could be (no page was
    coming: nobody had work) are not gaps. Until a gap is timed, the least headroom: a
    worker that holds too little shows it in its gaps at once, one that holds too much
    would not (a page is always waiting), and a fleet that starts over-full makes new
    pages wait."""

    def __init__(self, batch: int = 1, loss: float = 0.03, min_headroom: float = 0.05,
                 weight: float = 0.1):
        self.batch = batch
        self.loss = loss
        self.min_headroom = min_headroom
        self.weight = weight
        self.page_s: float | None = None
        self.gap_s: float | None = None

    def observe(self, event: str, value) -> None:
        if event == "inference":
            seconds, _pages = value
            self.page_s = ewma(self.page_s, seconds, self.weight)
        elif event == "idle" and self.page_s is not None \
                and value <= 0.25 + self.page_s / 2:
            self.gap_s = ewma(self.gap_s, value, self.weight)

    def target(self) -> float:
        if self.page_s is None or self.gap_s is None or self.gap_s <= 0:
            headroom = self.min_headroom
        else:
            headroom = 1.0 - self.loss * (1.0 + self.page_s / self.gap_s)
        return self.batch * (1.0 + min(1.0, max(self.min_headroom, headroom)))


def ewma(old: float | None, new: float, weight: float) -> float:
    return new if old is None else old + weight * (new - old)


class Presence:
    """This worker process on the fleet board: its id, its entries (target, or 0 while
    draining; the gateway processes heard of), and the headers of each answer."""

    def __init__(self, pace: Pace, draining: Callable[[], bool],
                 clock: Callable[[], float] = time.monotonic):
        self.id = secrets.token_hex(6)
        self.board = Board(clock=clock)
        self._pace = pace
        self._draining = draining
        self._lock = threading.Lock()
        self._said: dict[str, tuple[int, float]] = {}  # kind -> (seq, value last said)

    def answer_headers(self, request_headers: Mapping[str, str]) -> dict[str, str]:
        self.board.merge(request_headers.get(headers.BOARD))
        self._say("w", 0.0 if self._draining() else round(self._pace.target() * 20) / 20)
        self._say("n", len(self.board.known_clients()))
        return {headers.WORKER: self.id,
                headers.BOARD: self.board.header([("w", self.id), ("n", self.id)])}

    def _say(self, kind: str, value: float) -> None:
        """This worker's entry of `kind` on its board, with a new seq when its value changed."""
        with self._lock:
            seq, said = self._said.get(kind, (0, None))
            if value != said:
                seq += 1
                self._said[kind] = seq, value
        self.board.say(kind, self.id, seq, value)
