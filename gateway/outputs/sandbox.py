"""The searchable PDF is built in a child process with a memory and a time limit, so a
hostile document can cost that child, never the gateway.

Rewriting a PDF means parsing what the caller sent, and PDF libraries trust the file's own
structure: a page tree that lists one page a million times under `/Count 1` is one page to
pdfium, and 2 GB and seconds of CPU to qpdf (pikepdf) the moment anything reads that array.
No check short of a full parse sees every such trick (object streams hide them), so the
parse runs where it can fail cheaply: a small pool of builder processes (forked from a
server that has imported pikepdf, fpdf2 and Pillow once), each with RLIMIT_DATA at
`memory_mb` and its answer awaited for at most `timeout_s`. A builder that runs out of
either is replaced, and the caller gets a 422 saying the document is too complex to rewrite
here; the other formats (JSON, text) are unaffected."""

from __future__ import annotations

import logging
import multiprocessing
import resource
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from services.ocr_api.errors import ApiError, unprocessable

from .layout import PageText

log = logging.getLogger("gateway.outputs")

PRELOAD = ["pikepdf", "fpdf", "PIL.Image", "gateway.outputs.pdf"]


@dataclass(frozen=True)
class SandboxLimits:
    memory_mb: int = 512  # heap and anonymous memory of one builder (RLIMIT_DATA)
    timeout_s: float = 60.0  # one document's build
    processes: int = 2  # builders per gateway process


def _limit_memory(memory_mb: int) -> None:
    """In a new builder: its data segment (heap, anonymous mappings) capped."""
    limit = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def _build(file_bytes: bytes, kind: str, pages: list[PageText],
           fonts: tuple[str, ...]) -> bytes:
    from .pdf import searchable_pdf

    try:
        return searchable_pdf(file_bytes, kind, pages, fonts)
    except MemoryError:
        raise _too_complex("its structure needs more memory than a builder is given") \
            from None


def _too_complex(why: str) -> ApiError:
    return unprocessable(f"The document cannot be rewritten as a searchable PDF here: {why}. "
                         "Ask for JSON or text, or send a simpler (re-saved) file")


class PdfBuilder:
    def __init__(self, limits: SandboxLimits = SandboxLimits()):
        self.limits = limits
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                context = multiprocessing.get_context("forkserver")
                context.set_forkserver_preload(PRELOAD)
                self._pool = ProcessPoolExecutor(self.limits.processes, mp_context=context,
                                                 initializer=_limit_memory,
                                                 initargs=(self.limits.memory_mb,))
            return self._pool

    def _discard(self, pool: ProcessPoolExecutor) -> None:
        """A builder died or overran: the pool goes, its processes with it."""
        with self._lock:
            if self._pool is pool:
                self._pool = None
        for process in list(getattr(pool, "_processes", {}).values()):
            process.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    def build(self, file_bytes: bytes, kind: str, pages: list[PageText],
              fonts: tuple[str, ...]) -> bytes:
        pool = self._executor()
        future = pool.submit(_build, file_bytes, kind, pages, fonts)
        try:
            return future.result(timeout=self.limits.timeout_s)
        except ApiError:
            raise
        except FutureTimeout:
            log.warning("searchable PDF build over its time limit; builder replaced")
            self._discard(pool)
            raise _too_complex(f"it takes more than {self.limits.timeout_s:g} s") from None
        except (BrokenProcessPool, MemoryError):
            log.warning("searchable PDF builder ran out of memory; replaced")
            self._discard(pool)
            raise _too_complex("its structure needs more memory than a builder is given") \
                from None

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
