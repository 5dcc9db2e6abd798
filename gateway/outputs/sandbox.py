"""The searchable PDF is built in a child process with a memory and a time limit, so a
hostile document can cost that child, never the gateway, nor anyone else's build.

Rewriting a PDF means parsing what the caller sent, and PDF libraries trust the file's own
structure: a page tree that lists one page a million times under `/Count 1` is one page to
pdfium, and 2 GB and seconds of CPU to qpdf (pikepdf) the moment anything reads that array.
No check short of a full parse sees every such trick (object streams hide them), so the
parse runs where it can fail cheaply: each build in a process of its own (forked from a
server that has imported pikepdf, fpdf2 and Pillow once, so a fork costs milliseconds), with
RLIMIT_DATA at `memory_mb`, at most `processes` at once per gateway process. A build waits
for its turn first; its `timeout_s` starts when its process does, so time spent behind
another document is not counted against it. A build that runs out of memory or time is
killed, alone, and its caller gets a 422 saying the document is too complex to rewrite here;
the builds queued or running beside it, and the other formats (JSON, text), are unaffected."""

from __future__ import annotations

import logging
import multiprocessing
import resource
import threading
from dataclasses import dataclass

from services.ocr_api.errors import ApiError, excerpt, unprocessable

from .layout import PageText

log = logging.getLogger("gateway.outputs")

PRELOAD = ["pikepdf", "fpdf", "PIL.Image", "gateway.outputs.pdf"]


@dataclass(frozen=True)
class SandboxLimits:
    memory_mb: int = 512  # heap and anonymous memory of one builder (RLIMIT_DATA)
    timeout_s: float = 60.0  # one document's build, from when its process starts
    processes: int = 2  # builds at once per gateway process


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


def _builder(answer, memory_mb: int, file_bytes: bytes, kind: str, pages: list[PageText],
             fonts: tuple[str, ...]) -> None:
    """A builder process: one document's PDF, or the ApiError it ends in, sent back once."""
    _limit_memory(memory_mb)
    try:
        result = (True, _build(file_bytes, kind, pages, fonts))
    except ApiError as exc:
        result = (False, exc)
    except Exception as exc:  # the PDF library's own error on what it was given
        log.warning("searchable PDF build failed: %r", exc)
        result = (False, _too_complex(f"the PDF library stopped on it "
                                      f"({excerpt(str(exc) or type(exc).__name__, 80)})"))
    answer.send(result)
    answer.close()


def _too_complex(why: str) -> ApiError:
    return unprocessable(f"The document cannot be rewritten as a searchable PDF here: {why}. "
                         "Ask for JSON or text, or send a simpler (re-saved) file")


class PdfBuilder:
    def __init__(self, limits: SandboxLimits = SandboxLimits()):
        self.limits = limits
        self._turns = threading.BoundedSemaphore(limits.processes)
        self._lock = threading.Lock()
        self._context = None

    def _forkserver(self):
        with self._lock:
            if self._context is None:
                context = multiprocessing.get_context("forkserver")
                context.set_forkserver_preload(PRELOAD)
                self._context = context
            return self._context

    def build(self, file_bytes: bytes, kind: str, pages: list[PageText],
              fonts: tuple[str, ...]) -> bytes:
        """The searchable PDF, built in a process of its own once one of `processes` turns
        is free; 422 when it needs more memory or time than a builder is given."""
        with self._turns:  # waiting here is not the document's time
            return self._run(file_bytes, kind, pages, fonts)

    def _run(self, file_bytes: bytes, kind: str, pages: list[PageText],
             fonts: tuple[str, ...]) -> bytes:
        context = self._forkserver()
        receive, send = context.Pipe(duplex=False)
        process = context.Process(target=_builder, daemon=True, name="ocrfleet-pdf-builder",
                                  args=(send, self.limits.memory_mb, file_bytes, kind, pages,
                                        fonts))
        try:
            process.start()
            send.close()
            if not receive.poll(self.limits.timeout_s):
                log.warning("searchable PDF build over its time limit; its builder killed")
                raise _too_complex(f"it takes more than {self.limits.timeout_s:g} s")
            try:
                built, value = receive.recv()
            except (EOFError, OSError, MemoryError):
                log.warning("searchable PDF builder died (out of memory); killed")
                raise _too_complex("its structure needs more memory than a builder is "
                                   "given") from None
        finally:
            send.close()
            _end(process)
            receive.close()
        if not built:
            raise value
        return value

    def close(self) -> None:
        """Nothing is held between builds: each build's process ends with it."""


def _end(process) -> None:
    """A builder's process killed if it still runs, and reaped."""
    if process.pid is None:
        return
    if process.is_alive():
        process.kill()
    process.join()
    process.close()
