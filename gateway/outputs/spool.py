"""The finished pages of one /ocr answer, held until the answer is written: in memory up to a
few MB, then in a temporary file, so that a 300-page answer with visualization images (about
3.6 MB a page) costs the gateway the same memory as a one-page answer. A page is pickled as
it arrives and read back once per pass over the answer (a ZIP reads them twice); only each
page's small part (index, size, error) stays in memory, for failures and dataInfo.

The disk it may use is bounded too: past `max_disk_bytes` the answer is refused with a 413
that says how to ask for less (visualize off, or NDJSON, which holds nothing)."""

from __future__ import annotations

import pickle
import struct
import tempfile
from dataclasses import replace
from typing import Iterator

from services.ocr_api.errors import ApiError

from ..assemble import PageOutcome

_LENGTH = struct.Struct("<Q")


class PageSpool:
    def __init__(self, memory_bytes: int, max_disk_bytes: int):
        self._file = tempfile.SpooledTemporaryFile(max_size=memory_bytes,
                                                   prefix="ocrfleet-answer-")
        self._max_bytes = max_disk_bytes
        self.light: list[PageOutcome] = []  # each page without its result

    def append(self, page: PageOutcome) -> None:
        data = pickle.dumps(page, protocol=pickle.HIGHEST_PROTOCOL)
        self._file.seek(0, 2)
        if self._file.tell() + len(data) > self._max_bytes:
            raise ApiError(413, f"The answer is larger than this gateway holds for one request "
                                f"({self._max_bytes // 2**20} MB): ask without visualize, "
                                "or for NDJSON (application/x-ndjson), which holds nothing")
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
