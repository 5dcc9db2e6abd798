"""Opening a PDF with pypdfium2, with the caller-facing 422s for damaged and encrypted files.

pdfium is not thread-safe: every pdfium call in a process, whichever module makes it, holds
the one PDFIUM_LOCK defined here."""

from __future__ import annotations

import ctypes
import math
import threading
from dataclasses import dataclass

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c

from services.ocr_api.errors import excerpt, unprocessable

PDFIUM_LOCK = threading.Lock()
# Form XObjects nested deeper than this are not searched for images (a scanner's page is its
# image, at most wrapped in a form or two)
MAX_FORM_DEPTH = 3


def open_pdf(data: bytes, *, init_forms: bool = False) -> pdfium.PdfDocument:
    """The open document (the caller closes it, under PDFIUM_LOCK); 422 when pdfium cannot
    read it. `init_forms` renders form fields' appearances, as the worker does. The caller
    holds PDFIUM_LOCK."""
    try:
        pdf = pdfium.PdfDocument(data)
    except pdfium.PdfiumError as exc:
        if "password" in str(exc).lower():
            raise unprocessable("The PDF is encrypted with a password: send an unencrypted "
                                "copy") from None
        raise unprocessable(f"The file is not a readable PDF ({excerpt(str(exc), 80)}): it "
                            "is truncated or damaged") from None
    if init_forms:
        try:
            pdf.init_forms()
        except Exception:
            pdf.close()
            raise
    return pdf


def count_pdf_pages(data: bytes) -> int:
    with PDFIUM_LOCK:
        pdf = open_pdf(data)
        try:
            return len(pdf)
        finally:
            pdf.close()


@dataclass(frozen=True)
class PlacedImage:
    """A raster image drawn on a page: its own pixels, and the lengths (points) its sides are
    drawn at on the page."""
    width_px: int
    height_px: int
    width_pt: float
    height_pt: float


def placed_images(page: pdfium.PdfPage) -> list[PlacedImage]:
    """Every image drawn on the page, at most MAX_FORM_DEPTH Form XObjects deep, from pdfium's
    object list: pixel sizes from the image dictionaries, no image is decoded. Raw calls: a
    vector page's thousands of paths are skipped without a Python object each. The caller
    holds PDFIUM_LOCK."""
    images: list[PlacedImage] = []
    _collect(page, pdfium_c.FPDFPage_CountObjects, pdfium_c.FPDFPage_GetObject,
             (1.0, 0.0, 0.0, 1.0), 0, images)
    return images


def _collect(parent, count, get, outer: tuple[float, float, float, float], depth: int,
             images: list[PlacedImage]) -> None:
    """Images among `parent`'s objects, their matrices composed with the enclosing forms'
    (`outer`, the linear part only: lengths do not depend on where a thing is drawn)."""
    for i in range(max(count(parent), 0)):
        obj = get(parent, i)
        kind = pdfium_c.FPDFPageObj_GetType(obj) if obj else None
        if kind not in (pdfium_c.FPDF_PAGEOBJ_IMAGE, pdfium_c.FPDF_PAGEOBJ_FORM):
            continue
        matrix = pdfium_c.FS_MATRIX()
        if not pdfium_c.FPDFPageObj_GetMatrix(obj, matrix):
            continue
        a, b, c, d = _compose((matrix.a, matrix.b, matrix.c, matrix.d), outer)
        if kind == pdfium_c.FPDF_PAGEOBJ_FORM:
            if depth < MAX_FORM_DEPTH:
                _collect(obj, pdfium_c.FPDFFormObj_CountObjects, pdfium_c.FPDFFormObj_GetObject,
                         (a, b, c, d), depth + 1, images)
            continue
        width, height = ctypes.c_uint(), ctypes.c_uint()
        if pdfium_c.FPDFImageObj_GetImagePixelSize(obj, width, height):
            placed = PlacedImage(width.value, height.value, math.hypot(a, b), math.hypot(c, d))
            if placed.width_px and placed.height_px and placed.width_pt and placed.height_pt:
                images.append(placed)


def _compose(inner: tuple[float, float, float, float], outer: tuple[float, float, float, float]
             ) -> tuple[float, float, float, float]:
    """The linear part of `inner` then `outer` (PDF's row-vector convention: inner x outer)."""
    a, b, c, d = inner
    oa, ob, oc, od = outer
    return a * oa + b * oc, a * ob + b * od, c * oa + d * oc, c * ob + d * od
