"""Opening a PDF with pypdfium2, with the caller-facing 422s for damaged and encrypted files.

pdfium is not thread-safe: every pdfium call in a process, whichever module makes it, holds
the one PDFIUM_LOCK defined here."""

from __future__ import annotations

import threading

import pypdfium2 as pdfium

from services.ocr_api.errors import excerpt, unprocessable

PDFIUM_LOCK = threading.Lock()


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
