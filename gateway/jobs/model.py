"""What a job is, in the one flat shape both stores keep (a Redis hash, an SQLite row): the
request as submitted (`JobSpec`, written once), its progress, its lease and its callback.
Also the page records stored per finished page, and a pageRange spelling of the pages still
to do. Pure: no store, no Flask."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..assemble import PageOutcome
from ..endpoint import OCR, Endpoint, by_path

QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED = "queued", "running", "succeeded", "failed", \
    "cancelled"
ACTIVE_STATES = (QUEUED, RUNNING)
FINAL_STATES = (SUCCEEDED, FAILED, CANCELLED)

# callback_state: "" (no callbackUrl), then pending -> delivered | failed
CB_PENDING, CB_DELIVERED, CB_FAILED = "pending", "delivered", "failed"

# The scalar fields of a job (the columns of the SQLite table, the fields of the Redis hash).
INT_FIELDS = ("pages_done", "pages_failed", "pages_cached", "stored_bytes", "error_code",
              "callback_attempts")
FLOAT_FIELDS = ("created", "started", "finished", "expires_at", "lease_until")
STR_FIELDS = ("id", "client", "state", "spec", "error_msg", "callback_state", "lease_owner",
              "lease_token")


@dataclass(frozen=True)
class JobSpec:
    """The request as submitted; never changes. `fields` are the /ocr (or /layout-parsing)
    fields without `file`, `callbackUrl` and `endpoint` (the document's bytes are stored
    beside the job). `endpoint` is the path of the route its pages go to (gateway/endpoint.py):
    kept in the spec's JSON, so a job submitted to one gateway runs as the same endpoint on
    any other, through either store; a record written before jobs had one is an /ocr job."""

    kind: str  # "pdf", "tiff" (a multi-page TIFF, by frames) or "image" (sent whole)
    log_id: str
    fields: dict[str, Any]
    page_indices: tuple[int, ...]  # selected pages or frames, 0-based; (0,) for an image
    page_range_given: bool
    partial: bool
    callback_url: str | None = None
    base_url: str = ""  # where the job was submitted, for URLs in the callback
    cache_control: str | None = None  # the request's Cache-Control (the page cache)
    endpoint: str = OCR.path  # "/ocr" or "/layout-parsing"

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "JobSpec":
        data = json.loads(text)
        data["page_indices"] = tuple(data["page_indices"])
        return cls(**data)

    @property
    def route(self) -> Endpoint:
        """The Endpoint the job's pages go to, and its result names them by."""
        return by_path(self.endpoint)


@dataclass
class Job:
    id: str
    client: str
    spec: JobSpec
    state: str = QUEUED
    created: float = field(default_factory=time.time)
    started: float = 0.0
    finished: float = 0.0
    expires_at: float = 0.0  # 0 while active: the result TTL starts when the job ends
    pages_done: int = 0
    pages_failed: int = 0
    pages_cached: int = 0  # stored pages answered from the page cache
    stored_bytes: int = 0
    error_code: int = 0
    error_msg: str = ""
    callback_state: str = ""
    callback_attempts: int = 0
    lease_owner: str = ""
    lease_token: str = ""
    lease_until: float = 0.0

    @property
    def num_pages(self) -> int:
        """Pages selected; an image sent whole has as many as the worker found."""
        if self.spec.kind == "image" and self.state in (SUCCEEDED, FAILED):
            return max(1, self.pages_done)
        return len(self.spec.page_indices)

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    def to_row(self) -> dict[str, str | int | float]:
        row = {name: getattr(self, name) for name in INT_FIELDS + FLOAT_FIELDS + STR_FIELDS
               if name != "spec"}
        row["spec"] = self.spec.to_json()
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "Job":
        values: dict[str, Any] = {}
        for name in INT_FIELDS:
            values[name] = int(row.get(name) or 0)
        for name in FLOAT_FIELDS:
            values[name] = float(row.get(name) or 0.0)
        for name in STR_FIELDS:
            value = row.get(name)
            values[name] = value.decode() if isinstance(value, bytes) else (value or "")
        values["spec"] = JobSpec.from_json(values["spec"])
        return cls(**values)


@dataclass(frozen=True)
class StoredPage:
    """One finished page as stored: a PageOutcome that survives a restart."""

    index: int
    data: str  # the PageOutcome as JSON

    @classmethod
    def of(cls, page: PageOutcome) -> "StoredPage":
        record = {"i": page.page_index, "r": page.ocr_result, "p": page.page_info,
                  "c": page.error_code, "m": page.error_msg, "t": page.doc_type}
        if page.cached:
            record["k"] = 1  # answered from the page cache (absent: read by a replica)
        return cls(page.page_index, json.dumps(record, ensure_ascii=False,
                                               separators=(",", ":")))

    @property
    def failed(self) -> bool:
        return json.loads(self.data)["c"] != 0

    @property
    def cached(self) -> bool:
        """Answered from the page cache (and not a failure)."""
        record = json.loads(self.data)
        return bool(record.get("k")) and record["c"] == 0

    def outcome(self) -> PageOutcome:
        record = json.loads(self.data)
        return PageOutcome(record["i"], record["r"], record["p"], record["c"], record["m"],
                           record["t"], bool(record.get("k")))

    def failure(self) -> str:
        """The small record kept for a failed page (listed by GET /jobs/{id})."""
        record = json.loads(self.data)
        return json.dumps({"pageIndex": record["i"], "errorCode": record["c"],
                           "errorMsg": record["m"]})

    @property
    def size(self) -> int:
        return len(self.data.encode())


def page_range_text(indices: list[int] | tuple[int, ...]) -> str:
    """0-based indices as a 1-based pageRange: [0, 1, 2, 6, 9, 10] -> "1-3,7,10-11"."""
    parts: list[str] = []
    ordered = sorted(set(indices))
    start = previous = None
    for index in ordered + [None]:
        if start is not None and (index is None or index != previous + 1):
            parts.append(str(start + 1) if start == previous else f"{start + 1}-{previous + 1}")
            start = None
        if index is not None and start is None:
            start = index
        previous = index
    return ",".join(parts)


def iso(timestamp: float) -> str | None:
    """A Unix time as ISO 8601 UTC with milliseconds, or None for 0 (not yet)."""
    if not timestamp:
        return None
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(timestamp))
    return f"{seconds}.{int(timestamp * 1000) % 1000:03d}Z"
