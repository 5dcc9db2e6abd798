"""The protocol's HTTP headers, named once for the gateway, the workers and the clients."""

from __future__ import annotations

from typing import Mapping

LOG_ID = "X-Log-Id"  # one id per document, from the caller or minted, on every hop and log
API_KEY = "X-API-Key"  # a caller's key (also accepted as Authorization: Bearer)
DEADLINE_MS = "X-Deadline-Ms"  # gateway -> worker: milliseconds the caller will still wait
PRIORITY = "X-Ocr-Priority"  # gateway -> worker: "high" = read before the pages queued there
START_WITHIN_MS = "X-Ocr-Start-Within-Ms"  # gateway -> worker: start it this soon, or refuse
STARTS_IN_MS = "X-Ocr-Starts-In-Ms"  # worker -> gateway, on that 503: when it would have started
WITHIN_TARGET = "X-Ocr-Within-Target"  # gateway -> worker: "1" = refuse it (that 503) when
# the worker already holds the pages its target says keep it busy
CAPACITY = "X-Ocr-Capacity"  # worker -> gateway: admission slots (OCR_QUEUE_SIZE)
FREE = "X-Ocr-Free"  # worker -> gateway: slots free as the answer leaves
HELD = "X-Ocr-Held"  # worker -> gateway: admitted requests not read first (no image): what
# X-Ocr-Within-Target counts
PAGE_MS = "X-Ocr-Page-Ms"  # worker -> gateway: how long its engine takes over a batch of pages
# (a moving mean of the last ones; absent before the first): whether pages are long
WORKER = "X-Ocr-Worker"  # worker -> gateway: the id of the worker process that answered
BOARD = "X-Ocr-Board"  # both ways: the fleet board (services/ocr_api/fleet_board.py)
PAGES = "X-Ocr-Pages"  # gateway -> client: pages in a PDF/ZIP/text answer
NUM_PAGES = "X-Num-Pages"  # gateway -> client: pages of a streamed document, before page 1
SIGNATURE = "X-OCRFleet-Signature"  # gateway -> callback receiver: t=<unix s>,v1=<HMAC>
JOB_ID = "X-OCRFleet-Job-Id"  # gateway -> callback receiver
ENGINE = "X-Ocr-Engine"  # worker -> gateway: its engine identity (a digest; the page cache key)
CACHED_PAGES = "X-Ocr-Cached-Pages"  # gateway -> client: pages answered from the page cache


def int_header(headers: Mapping[str, str], name: str) -> int | None:
    """A whole-number header (capacity, free slots, Retry-After), None when absent or not one."""
    value = headers.get(name)
    return int(value) if value and value.isascii() and value.isdigit() and len(value) < 10 \
        else None
