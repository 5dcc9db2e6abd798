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
the builds queued or running beside it, and the other formats (JSON, text), are unaffected.

The builder reads the input from a temporary file and writes the PDF into another, which the
gateway then streams (spool.DiskFile, on the answers' disk budget); only the OCR'd lines and
whether it succeeded pass through the pipe. A 300-page scanned PDF (over 100 MB of images)
is then never held again in either process's memory: the builder's grows with the document's
structure, not with its images."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import resource
import threading
from dataclasses import dataclass

from services.ocr_api.errors import ApiError, excerpt, unprocessable
from services.ocr_api.sniff import KIND_PDF

from .layout import PageText
from .spool import UNBOUNDED, DiskBudget, DiskFile

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


def _build(source_path: str, kind: str, pages: list[PageText], fonts: tuple[str, ...],
           out_path: str, scratch_path: str | None) -> None:
    from .pdf import write_searchable_pdf

    try:
        # into the files the gateway holds open: pikepdf would save a path by replacing it
        with open(out_path, "wb") as out, open(scratch_path, "w+b") if scratch_path \
                else contextlib.nullcontext() as scratch:
            write_searchable_pdf(source_path, kind, pages, fonts, out, scratch)
    except MemoryError:
        raise _too_complex("it needs more memory than a builder is given") from None


def _builder(answer, memory_mb: int, source_path: str, kind: str, pages: list[PageText],
             fonts: tuple[str, ...], out_path: str, scratch_path: str | None) -> None:
    """A builder process: one document's PDF read from source_path and written to out_path
    (an image's pages through scratch_path, as a PDF), then None (done) or the ApiError it
    ends in, sent back once."""
    _limit_memory(memory_mb)
    try:
        _build(source_path, kind, pages, fonts, out_path, scratch_path)
        result = None
    except ApiError as exc:
        result = exc
    except Exception as exc:  # the PDF library's own error on what it was given
        log.warning("searchable PDF build failed: %r", exc)
        result = _too_complex(f"the PDF library stopped on it "
                              f"({excerpt(str(exc) or type(exc).__name__, 80)})")
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
              fonts: tuple[str, ...], disk: DiskBudget = UNBOUNDED) -> DiskFile:
        """The searchable PDF, built in a process of its own once one of `processes` turns
        is free, from a copy of the input on disk into a temporary file, both on `disk`'s
        budget (the PDF is the input's own streams and a text layer: the input's size is
        taken for it before the build; an image input's pages are first written as a PDF
        into a third file, on the budget too); the PDF open for reading from its start, gone
        when closed. 422 when it needs more memory or time than a builder is given, 503 when
        `disk` is taken."""
        with self._turns, contextlib.ExitStack() as files:  # waiting: not the document's time
            source = files.enter_context(
                DiskFile(disk, len(file_bytes), "ocrfleet-pdf-input-"))
            source.write_all(file_bytes)
            scratch = None if kind == KIND_PDF else files.enter_context(
                DiskFile(disk, len(file_bytes), "ocrfleet-pdf-image-"))
            out = DiskFile(disk, len(file_bytes), "ocrfleet-pdf-")
            try:
                self._run(source.path, kind, pages, fonts, out.path,
                          scratch.path if scratch else None)
                out.written()
            except BaseException:
                out.close()
                raise
            return out

    def _run(self, source_path: str, kind: str, pages: list[PageText],
             fonts: tuple[str, ...], out_path: str, scratch_path: str | None) -> None:
        context = self._forkserver()
        receive, send = context.Pipe(duplex=False)
        process = context.Process(target=_builder, daemon=True, name="ocrfleet-pdf-builder",
                                  args=(send, self.limits.memory_mb, source_path, kind, pages,
                                        fonts, out_path, scratch_path))
        try:
            process.start()
            send.close()
            if not receive.poll(self.limits.timeout_s):
                log.warning("searchable PDF build over its time limit; its builder killed")
                raise _too_complex(f"it takes more than {self.limits.timeout_s:g} s")
            try:
                failed = receive.recv()
            except (EOFError, OSError, MemoryError):
                log.warning("searchable PDF builder died (out of memory); killed")
                raise _too_complex("it needs more memory than a builder is given") \
                    from None
        finally:
            send.close()
            _end(process)
            receive.close()
        if failed is not None:
            raise failed

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
