"""Counting a TIFF's frames without decoding it: walk the chain of image file directories
(IFDs) with struct, as the format lays it out.

Pillow's n_frames loads every frame's tags and checks each next offset against a list of those
seen, which is quadratic in the number of frames, and it decodes tag data on the way. This
walk reads 2 + 4 (or 8 + 8 for BigTIFF) bytes per frame, stops at `limit`, and ends the chain
where it loops back, as Pillow does, so both agree on what the frames are.

Layout: an 8-byte header ("II" little- or "MM" big-endian, 42, offset of the first IFD; for
BigTIFF 43, 8, 0 and an 8-byte offset), then each IFD: an entry count (2 bytes; 8 in BigTIFF),
that many 12-byte (20-byte) entries, and the offset of the next IFD (4; 8 bytes), 0 at the end.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from services.ocr_api.errors import too_large, unprocessable


@dataclass(frozen=True)
class _Layout:
    endian: str
    count_fmt: str  # struct code of an IFD's entry count
    entry_size: int
    offset_fmt: str  # struct code of an IFD offset

    @property
    def count_size(self) -> int:
        return struct.calcsize("<" + self.count_fmt)

    @property
    def offset_size(self) -> int:
        return struct.calcsize("<" + self.offset_fmt)


_CLASSIC = {"<": _Layout("<", "H", 12, "L"), ">": _Layout(">", "H", 12, "L")}
_BIG = {"<": _Layout("<", "Q", 20, "Q"), ">": _Layout(">", "Q", 20, "Q")}
_MAGIC = {b"II*\x00": _CLASSIC["<"], b"MM\x00*": _CLASSIC[">"],
          b"II+\x00": _BIG["<"], b"MM\x00+": _BIG[">"]}
TIFF_MAGIC = tuple(_MAGIC)


def _corrupt(why: str):
    return unprocessable(f"The TIFF cannot be decoded ({why}): the file is truncated or "
                         "corrupt")


def _first_ifd(data: bytes, layout: _Layout) -> int:
    if layout.offset_fmt == "L":
        if len(data) < 8:
            raise _corrupt("no header")
        return struct.unpack_from(layout.endian + "L", data, 4)[0]
    if len(data) < 16:
        raise _corrupt("no header")
    offset_size, zero, first = struct.unpack_from(layout.endian + "HHQ", data, 4)
    if offset_size != 8 or zero != 0:
        raise _corrupt("a BigTIFF header with an unsupported offset size")
    return first


def count_tiff_frames(data: bytes, limit: int) -> int:
    """How many frames (pages) the TIFF in `data` has: at least 1; 422 when the chain points
    outside the file or there is no frame; 413 when there are more than `limit`."""
    layout = _MAGIC.get(bytes(data[:4]))
    if layout is None:
        raise _corrupt("not a TIFF header")
    offset = _first_ifd(data, layout)
    seen: set[int] = set()
    while offset and offset not in seen:  # a chain that loops back ends there, as in Pillow
        if len(seen) == limit:
            raise too_large(f"The TIFF has more than {limit} pages, over this server's limit "
                            f"of {limit}: split the document")
        if offset + layout.count_size > len(data):
            raise _corrupt(f"page {len(seen) + 1} lies past the end of the file")
        entries = struct.unpack_from(layout.endian + layout.count_fmt, data, offset)[0]
        next_at = offset + layout.count_size + entries * layout.entry_size
        if next_at + layout.offset_size > len(data):
            raise _corrupt(f"page {len(seen) + 1}'s directory runs past the end of the file")
        seen.add(offset)
        offset = struct.unpack_from(layout.endian + layout.offset_fmt, data, next_at)[0]
    if not seen:
        raise _corrupt("it has no image directory")
    return len(seen)
