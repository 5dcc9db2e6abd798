"""Splitting a document into small standalone documents of consecutive selected pages: PDFs
with pypdfium2, multi-page TIFFs with Pillow. Pure: bytes in, bytes out. pdfium is not
thread-safe, so every call holds the process's PDFIUM_LOCK (services.documents.pdf)."""

from __future__ import annotations

import io
from dataclasses import dataclass

import pypdfium2 as pdfium
from PIL import Image

from services.documents.pdf import PDFIUM_LOCK, count_pdf_pages, open_pdf
from services.documents.images import as_shown
from services.ocr_api.errors import ApiError, excerpt, unprocessable
from services.ocr_api.sniff import KIND_IMAGE, KIND_PDF

__all__ = ["PDFIUM_LOCK", "KIND_TIFF", "Chunk", "PdfCutter", "TiffCutter", "WholeFile",
           "count_pages", "group_pages", "open_pdf"]

KIND_TIFF = "tiff"  # a plan's kind when a multi-page TIFF is split by frames


@dataclass(frozen=True)
class Chunk:
    """Pages `page_indices` (0-based, in the original document) as a standalone document of
    `kind` (a PDF, or for a TIFF's frames an image: a TIFF of those frames)."""

    page_indices: tuple[int, ...]
    data: bytes
    kind: str = KIND_PDF


count_pages = count_pdf_pages


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
                                    f"cannot be read ({excerpt(str(exc), 80)}): the file is "
                                    "damaged") from None
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


# The worker decodes a one-frame TIFF with OpenCV and a frame of a multi-frame TIFF with
# Pillow's convert("RGB") of the frame as shown (services.documents.images.as_shown: 16-bit
# gray made 8-bit, transparency over white). A chunk therefore holds each frame already
# converted the way the worker would convert it inside the whole file (so both paths see the
# same pixels), except bilevel and 8-bit grey frames (16-bit ones once made 8-bit), which both
# decoders expand identically and which stay small kept as they are (a fax page: CCITT
# group 4). Compression is lossless either way: LZW for
# grey and colour, which costs the gateway about a quarter of Deflate's CPU on a scanned
# frame for a tenth more bytes (docs/capacity.md, section 3).
_KEPT_MODES = {"1": "group4", "L": "tiff_lzw"}
_RGB_COMPRESSION = "tiff_lzw"
DEFAULT_MAX_PIXELS = 50_000_000


def _frame_for_chunk(tiff: Image.Image, index: int, max_pixels: int) -> Image.Image:
    try:
        tiff.seek(index)
        width, height = tiff.size
        if width * height > max_pixels:
            raise unprocessable(f"Page {index + 1} of the TIFF is {width} x {height} pixels, "
                                f"over the limit of {max_pixels}: downscale it or split it")
        frame = as_shown(tiff)
        frame = frame.copy() if frame.mode in _KEPT_MODES else frame.convert("RGB")
    except ApiError:
        raise
    except Exception as exc:  # PIL raises many types on corrupt data
        raise unprocessable(f"Page {index + 1} of the TIFF cannot be decoded "
                            f"({excerpt(str(exc), 80)}): the file is truncated or "
                            "corrupt") from None
    frame.info = {}  # no ICC profile, EXIF or resolution copied into the chunk
    return frame


def _save_frames(frames: list[Image.Image]) -> bytes:
    buffer = io.BytesIO()
    first, rest = frames[0], frames[1:]
    first.save(buffer, format="TIFF", save_all=bool(rest), append_images=rest,
               compression=_KEPT_MODES.get(first.mode, _RGB_COMPRESSION))
    return buffer.getvalue()


class TiffCutter:
    """Cuts groups of frames out of one multi-page TIFF, each only when asked for, as a
    standalone TIFF (kind image). A frame over `max_pixels` or that cannot be decoded is a 422
    for its own group only."""

    def __init__(self, data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS):
        self.max_pixels = max_pixels
        try:
            self._tiff = Image.open(io.BytesIO(data), formats=["TIFF"])
        except Exception as exc:  # PIL raises many types on corrupt data
            raise unprocessable(f"The TIFF cannot be decoded ({excerpt(str(exc), 80)}): the "
                                "file is truncated or corrupt") from None

    def cut(self, group: tuple[int, ...]) -> Chunk:
        frames = [_frame_for_chunk(self._tiff, index, self.max_pixels) for index in group]
        # modes must agree within one file: bilevel next to RGB becomes all RGB
        if len({frame.mode for frame in frames}) > 1:
            frames = [frame.convert("RGB") for frame in frames]
        return Chunk(tuple(group), _save_frames(frames), KIND_IMAGE)

    def close(self) -> None:
        self._tiff.close()
