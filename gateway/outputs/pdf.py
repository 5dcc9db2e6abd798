"""The searchable PDF: the input's own pages with an invisible text layer added. Pure: the
input, its kind and its OCR'd pages in, the PDF written out (files, or bytes).

A PDF input keeps every page object, content stream and resource as it was (no
re-rasterising; streams are written back undecoded and not recompressed); each OCR'd page
gets the layer as a Form XObject, drawn by a content stream added after the page's own
(which is wrapped in q/Q so whatever state it leaves cannot move the layer). An image input
first becomes a PDF with one page per image (image_pdf.py).

The worker OCR'd a page as pdfium renders it: the CropBox (clipped to the MediaBox), turned
by /Rotate, at some pixels per point. The layer is drawn in those pixels, so placing it means
scaling pixels to the visible box's points and undoing the rotation (placement_matrix).
Pages that have text of their own (PageText.own_text: the worker read them with textLayer
"auto") get no layer."""

from __future__ import annotations

import contextlib
import io
import tempfile
from typing import BinaryIO, Iterator

import pikepdf
from pikepdf import Name

from services.ocr_api.errors import excerpt, unprocessable
from services.ocr_api.sniff import KIND_PDF

from .fonts import pick_font
from .image_pdf import write_image_pdf
from .layout import PageText
from .overlay import text_layer_pdf

Box = tuple[float, float, float, float]


def _inherited(page: pikepdf.Dictionary, key: str):
    """A page attribute that may be set on the page or on an ancestor /Pages node."""
    node, depth = page, 0
    while isinstance(node, pikepdf.Dictionary) and depth < 64:
        if key in node:
            return node[key]
        node, depth = node.get("/Parent"), depth + 1
    return None


def _box(value) -> Box | None:
    try:
        x0, y0, x1, y1 = (float(v) for v in value)
    except (TypeError, ValueError):
        return None
    box = (min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1))
    return box if box[2] > box[0] and box[3] > box[1] else None


def visible_box(page: pikepdf.Dictionary) -> Box:
    """What pdfium renders: the CropBox clipped to the MediaBox (Letter when neither is
    usable)."""
    media = _box(_inherited(page, "/MediaBox")) or (0.0, 0.0, 612.0, 792.0)
    crop = _box(_inherited(page, "/CropBox"))
    if crop is None:
        return media
    clipped = (max(crop[0], media[0]), max(crop[1], media[1]),
               min(crop[2], media[2]), min(crop[3], media[3]))
    return clipped if clipped[2] > clipped[0] and clipped[3] > clipped[1] else media


def rotation(page: pikepdf.Dictionary) -> int:
    """/Rotate as pdfium reads it: quarter turns, truncated, clockwise, 0/90/180/270."""
    try:
        value = float(_inherited(page, "/Rotate") or 0)
    except (TypeError, ValueError):
        return 0
    return (int(value / 90) % 4) * 90


def placement_matrix(box: Box, rotate: int, width_px: float, height_px: float
                     ) -> tuple[float, ...]:
    """The `cm` matrix from layer space (pixels of the page as displayed, y up from its
    bottom-left corner) to the page's user space."""
    x0, y0, x1, y1 = box
    w, h = x1 - x0, y1 - y0
    shown_w, shown_h = (h, w) if rotate in (90, 270) else (w, h)
    sx, sy = shown_w / width_px, shown_h / height_px
    a, b, c, d, e, f = {
        0: (1, 0, 0, 1, x0, y0),
        90: (0, 1, -1, 0, x0 + w, y0),
        180: (-1, 0, 0, -1, x0 + w, y0 + h),
        270: (0, -1, 1, 0, x0, y0 + h),
    }[rotate]
    return (sx * a, sx * b, sy * c, sy * d, e, f)


def _own_resources(page: pikepdf.Page) -> None:
    """Give the page its own /Resources and /XObject dictionaries (shallow copies; pages
    often share one), so the layer added to one page is not listed on all of them."""
    resources = _inherited(page.obj, "/Resources")
    copy = pikepdf.Dictionary({k: v for k, v in resources.items()}) \
        if isinstance(resources, pikepdf.Dictionary) else pikepdf.Dictionary()
    xobjects = copy.get("/XObject")
    copy["/XObject"] = pikepdf.Dictionary({k: v for k, v in xobjects.items()}) \
        if isinstance(xobjects, pikepdf.Dictionary) else pikepdf.Dictionary()
    page.obj["/Resources"] = copy


def add_layer(page: pikepdf.Page, form: pikepdf.Object, width_px: float,
              height_px: float) -> None:
    """Draw the layer page `form` (a Form XObject in pixel units) over `page`, leaving the
    page's own content streams untouched."""
    matrix = placement_matrix(visible_box(page.obj), rotation(page.obj), width_px, height_px)
    _own_resources(page)
    name = page.add_resource(form, Name.XObject, prefix="OcrText")
    numbers = " ".join(f"{value:.6f}".rstrip("0").rstrip(".") for value in matrix)
    page.contents_add(b"q\n", prepend=True)
    page.contents_add(f"Q\nq {numbers} cm {name} Do Q\n".encode())


@contextlib.contextmanager
def _open(source: str | BinaryIO, kind: str, scratch: BinaryIO | None) -> Iterator[pikepdf.Pdf]:
    """The input (a path or a binary file) to rewrite, open while the block runs: a PDF read
    as it is needed; an image written as a PDF into `scratch` first (a temporary file when
    None), then read so."""
    with contextlib.ExitStack() as stack:
        if kind != KIND_PDF:
            if scratch is None:
                scratch = stack.enter_context(tempfile.TemporaryFile())
            with open(source, "rb") if isinstance(source, str) else contextlib.nullcontext(
                    source) as image:
                write_image_pdf(image, scratch)
            scratch.seek(0)
            source = scratch
        try:
            document = pikepdf.open(source)
        except pikepdf.PasswordError:
            raise unprocessable("The PDF is encrypted with a password: send an unencrypted "
                                "copy") from None
        except pikepdf.PdfError as exc:
            raise unprocessable(f"The PDF cannot be rewritten ({exc})") from None
        with document:
            yield document


def _save(document: pikepdf.Pdf, out: BinaryIO) -> None:
    """Written back as read: streams neither decoded nor (re)compressed. qpdf does not stop
    where it cannot copy a stream (its memory ran out, its bytes are missing): it warns and
    writes the stream empty. Any warning while saving is therefore an error here, never a
    PDF that lost part of the document."""
    seen = len(document.get_warnings())
    document.save(out, compress_streams=False,
                  stream_decode_level=pikepdf.StreamDecodeLevel.none)
    trouble = document.get_warnings()[seen:]
    if any("bad_alloc" in warning for warning in trouble):
        raise MemoryError(trouble[0])
    if trouble:
        raise unprocessable(f"The PDF cannot be rewritten whole ({excerpt(trouble[0], 120)}): "
                            "ask for JSON or text, or send a re-saved copy")


def write_searchable_pdf(source: str | BinaryIO, kind: str, pages: list[PageText],
                         fonts: tuple[str, ...], out: BinaryIO,
                         scratch: BinaryIO | None = None) -> None:
    """The input (`source`: a path or a binary file) with each OCR'd page's lines as an
    invisible, extractable text layer, written to `out` as it is made: a scanned document's
    images are read and written a stream at a time, never held whole (an image input's
    pages go through `scratch` as a PDF first, `_open`). A page that has text of its own
    (textLayer "auto") is left as it is, as OCRmyPDF's --skip-text does: its text is
    extractable already, and a second layer would double it."""
    pages = [page for page in pages if not page.own_text]
    text = "".join(line.text for page in pages for line in page.lines)
    with _open(source, kind, scratch) as document:
        if not text:
            return _save(document, out)
        layer_bytes, placed = text_layer_pdf(pages, pick_font(fonts, text))
        # the layer stays open until saved: copied streams are read from it then
        with pikepdf.open(io.BytesIO(layer_bytes)) as layer:
            for layer_page, position in zip(layer.pages, placed):
                page = pages[position]
                if page.page_index >= len(document.pages):
                    raise unprocessable(f"Page {page.page_index + 1} was OCR'd but the "
                                        "document has no such page")
                form = document.copy_foreign(layer_page.as_form_xobject())
                add_layer(document.pages[page.page_index], form, page.width, page.height)
            return _save(document, out)


def searchable_pdf(file_bytes: bytes, kind: str, pages: list[PageText],
                   fonts: tuple[str, ...]) -> bytes:
    """write_searchable_pdf's PDF of these bytes, as bytes."""
    out = io.BytesIO()
    write_searchable_pdf(io.BytesIO(file_bytes), kind, pages, fonts, out)
    return out.getvalue()
