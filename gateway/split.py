"""Splitting a PDF into small PDFs of consecutive selected pages with pypdfium2. Pure: bytes in,
bytes out. pdfium is not thread-safe, so every call holds PDFIUM_LOCK."""

from __future__ import annotations

import io
import threading
from dataclasses import dataclass
from typing import Iterator

import pypdfium2 as pdfium

from services.ocr_api.errors import unprocessable

PDFIUM_LOCK = threading.Lock()


@dataclass(frozen=True)
class Chunk:
    """Pages `page_indices` (0-based, in the original document) as a standalone PDF."""

    page_indices: tuple[int, ...]
    pdf: bytes


def open_pdf(data: bytes) -> pdfium.PdfDocument:
    try:
        return pdfium.PdfDocument(data)
    except pdfium.PdfiumError as exc:
        if "password" in str(exc).lower():
            raise unprocessable("The PDF is encrypted with a password: send an unencrypted "
                                "copy") from None
        raise unprocessable(f"The file is not a readable PDF ({exc}): it is truncated or "
                            "damaged") from None


def count_pages(data: bytes) -> int:
    with PDFIUM_LOCK:
        pdf = open_pdf(data)
        try:
            return len(pdf)
        finally:
            pdf.close()


def group_pages(page_indices: list[int], pages_per_chunk: int) -> list[tuple[int, ...]]:
    """Consecutive runs of at most `pages_per_chunk` selected pages."""
    groups: list[list[int]] = []
    for index in page_indices:
        if groups and len(groups[-1]) < pages_per_chunk and groups[-1][-1] == index - 1:
            groups[-1].append(index)
        else:
            groups.append([index])
    return [tuple(group) for group in groups]


class PdfCutter:
    """Cuts groups of pages out of one PDF, in any order, each only when asked for (so the
    first pages are on their way to replicas while later ones are not cut yet, and a page
    sent again is cut again rather than kept). A damaged page fails only its own group."""

    def __init__(self, data: bytes):
        with PDFIUM_LOCK:
            self._source = open_pdf(data)

    def cut(self, group: tuple[int, ...]) -> Chunk:
        with PDFIUM_LOCK:
            if self._source is None:
                raise unprocessable("The document is closed")
            part = pdfium.PdfDocument.new()
            try:
                part.import_pages(self._source, list(group))
                buffer = io.BytesIO()
                part.save(buffer)
            except pdfium.PdfiumError as exc:
                raise unprocessable(f"Page(s) {group[0] + 1}-{group[-1] + 1} of the PDF "
                                    f"cannot be read ({exc}): the file is damaged") from None
            finally:
                part.close()
        return Chunk(tuple(group), buffer.getvalue())

    def close(self) -> None:
        with PDFIUM_LOCK:
            if self._source is not None:
                self._source.close()
                self._source = None


class WholeFile:
    """The cutter of a document that is sent whole (an image, or a PDF that fits one chunk)."""

    def __init__(self, data: bytes):
        self._data = data

    def cut(self, group: tuple[int, ...]) -> Chunk:
        return Chunk(tuple(group), self._data)

    def close(self) -> None:
        pass


def iter_chunks(data: bytes, page_indices: list[int],
                pages_per_chunk: int = 1) -> Iterator[Chunk]:
    """Chunks in page order, each made only when asked for."""
    cutter = PdfCutter(data)
    try:
        for group in group_pages(page_indices, pages_per_chunk):
            yield cutter.cut(group)
    finally:
        cutter.close()


def split_pdf(data: bytes, page_indices: list[int], pages_per_chunk: int = 1) -> list[Chunk]:
    return list(iter_chunks(data, page_indices, pages_per_chunk))
