"""The process's heap, for both services: its resident memory, and handing what was freed back
to the OS. glibc keeps freed memory in its heaps (one per thread, up to 8 per core), so a
process that handled one large request keeps its peak resident until malloc_trim(0) returns
it; it costs milliseconds, so the services call it only after large work (the worker after a
large page, services/ocr_worker/memory.py; the gateway after a large request, gateway/app.py)."""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import lru_cache
from pathlib import Path


def rss_bytes(pid: int | str = "self") -> int:
    """Resident memory (VmRSS) of a process, 0 where /proc cannot tell."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@lru_cache(maxsize=1)
def _libc_malloc_trim():
    """glibc's malloc_trim, or None (musl, macOS, or a preloaded allocator that lacks it)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def malloc_trim() -> bool:
    """Give the heap's free memory back to the OS; False where there is no malloc_trim."""
    trim = _libc_malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
