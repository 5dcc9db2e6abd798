"""The finished pages of one /ocr answer, held until the answer is written: in memory up to a
few MB, then in a temporary file, so that a 300-page answer with visualization images (about
3.6 MB a page) costs the gateway the same memory as a one-page answer. A page is pickled as
it arrives and read back once per pass over the answer (a ZIP reads them twice); only each
page's small part (index, size, error) stays in memory, for failures and dataInfo.

The disk it may use is bounded twice: past `max_disk_bytes` one answer is refused with a 413
that says how to ask for less (visualize off, or NDJSON, which holds nothing); and every
spooled file of the gateway process (these pages, a ZIP being written) takes its bytes on
disk from one DiskBudget, so that the answers in flight together cannot fill the pod's
temporary disk (and get it evicted with every request in it): past it, 503 and Retry-After,
and a new answer is refused before any work while the budget is taken."""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import struct
import tempfile
import threading
from dataclasses import replace
from typing import Iterator

from services.ocr_api.errors import ApiError

from ..assemble import PageOutcome

_LENGTH = struct.Struct("<Q")
RETRY_AFTER_S = 5  # a spooled answer is gone within seconds of being written


class DiskBudget:
    """The bytes all answers of one gateway process may hold on temporary disk at once
    (GATEWAY_TEMP_DISK_MB), and one answer (GATEWAY_ANSWER_DISK_MB); None: no bound."""

    def __init__(self, limit_bytes: int | None, answer_bytes: int | None = None):
        self.limit = limit_bytes
        self.answer_bytes = answer_bytes if answer_bytes is not None else limit_bytes
        self._used = 0
        self._lock = threading.Lock()

    @property
    def used(self) -> int:
        return self._used

    def check(self, room: int) -> None:
        """Before an answer's work: 503 when less than `room` (what an answer writes when it
        first goes to disk) is left."""
        if self.limit is not None and self._used + room > self.limit:
            raise self._taken()

    def take(self, size: int) -> None:
        with self._lock:
            if self.limit is not None and self._used + size > self.limit:
                raise self._taken()
            self._used += size

    def give(self, size: int) -> None:
        with self._lock:
            self._used -= size

    def _taken(self) -> ApiError:
        return ApiError(503, f"This gateway's temporary disk for answers "
                             f"({self.limit // 2**20} MB) is taken by the answers in flight: "
                             f"retry shortly, or ask for NDJSON (application/x-ndjson), which "
                             "holds nothing", {"Retry-After": str(RETRY_AFTER_S)})


UNBOUNDED = DiskBudget(None)


class MeteredSpool(tempfile.SpooledTemporaryFile):
    """A spooled temporary file (memory up to `memory_bytes`, then disk) whose size on disk
    is taken from `budget` as it grows (503 past it) and given back when it is closed; 413
    past `max_bytes`."""

    def __init__(self, memory_bytes: int, max_bytes: int | None, budget: DiskBudget,
                 prefix: str):
        super().__init__(max_size=memory_bytes, prefix=prefix)
        self._memory_bytes, self._max_bytes, self._budget = memory_bytes, max_bytes, budget
        self._taken = 0

    def write(self, data) -> int:
        end = self.tell() + len(data)
        if self._max_bytes is not None and end > self._max_bytes:
            raise ApiError(413, f"The answer is larger than this gateway holds for one "
                                f"request ({self._max_bytes // 2**20} MB): ask without "
                                "visualize, or for NDJSON (application/x-ndjson), which "
                                "holds nothing")
        if end > self._memory_bytes and end > self._taken:  # on disk: all of it
            self._budget.take(end - self._taken)
            self._taken = end
        return super().write(data)

    def close(self) -> None:
        try:
            super().close()
        finally:
            taken, self._taken = self._taken, 0
            if taken:
                self._budget.give(taken)


class DiskFile(io.FileIO):
    """A named temporary file for another process to read or write by its `path` (the
    searchable PDF's builder), open here for reading and writing. Its bytes on disk come from
    `budget`: `expected` of them taken when it is made, settled to its size by `written`
    (503 past the budget), given back when it is closed, when its name goes too."""

    def __init__(self, budget: DiskBudget, expected: int, prefix: str):
        self.path, self._budget, self._taken = "", budget, 0  # what close() reads, first
        self.size = 0
        budget.take(expected)
        self._taken = expected
        descriptor, self.path = tempfile.mkstemp(prefix=prefix)
        super().__init__(descriptor, "r+")

    def write_all(self, data: bytes) -> None:
        """`data` written here whole, for the other process to read; settled as `written`."""
        view = memoryview(data)
        while view:
            view = view[self.write(view):]
        self.written()

    def written(self) -> None:
        """Once written (here or by the other process): its `size`, taken from the budget;
        read from the start."""
        self.size = os.fstat(self.fileno()).st_size
        self._budget.take(max(0, self.size - self._taken))
        self._budget.give(max(0, self._taken - self.size))
        self._taken = self.size
        self.seek(0)

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.path:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
            taken, self._taken = self._taken, 0
            if taken:
                self._budget.give(taken)


class PageSpool:
    def __init__(self, memory_bytes: int, max_disk_bytes: int, budget: DiskBudget = UNBOUNDED):
        self._file = MeteredSpool(memory_bytes, max_disk_bytes, budget, "ocrfleet-answer-")
        self.light: list[PageOutcome] = []  # each page without its result

    def append(self, page: PageOutcome) -> None:
        data = pickle.dumps(page, protocol=pickle.HIGHEST_PROTOCOL)
        self._file.seek(0, 2)
        self._file.write(_LENGTH.pack(len(data)) + data)
        self.light.append(replace(page, ocr_result=None))

    def __len__(self) -> int:
        return len(self.light)

    def __iter__(self) -> Iterator[PageOutcome]:
        """The pages in the order they were added, read back one at a time (each pass keeps
        its own place in the file)."""
        position = 0
        for _ in range(len(self.light)):
            self._file.seek(position)
            (size,) = _LENGTH.unpack(self._file.read(_LENGTH.size))
            data = self._file.read(size)
            position += _LENGTH.size + size
            yield pickle.loads(data)

    @property
    def on_disk(self) -> bool:
        return bool(getattr(self._file, "_rolled", False))

    def close(self) -> None:
        self._file.close()
