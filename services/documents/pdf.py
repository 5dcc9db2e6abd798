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


PLAIN_COLORSPACES = (pdfium_c.FPDF_COLORSPACE_DEVICEGRAY, pdfium_c.FPDF_COLORSPACE_DEVICERGB,
                     pdfium_c.FPDF_COLORSPACE_CALGRAY, pdfium_c.FPDF_COLORSPACE_CALRGB,
                     pdfium_c.FPDF_COLORSPACE_ICCBASED)


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


def page_image_pixels(page: pdfium.PdfPage, width_px: int, height_px: int):
    """The pixels of a page that is exactly one opaque image of `width_px` x `height_px`
    drawn upright over all of it (a scan as a scanner writes it), decoded from the file, not
    rendered: a render stretches the image over the page's size in points times the scale,
    which for most sizes is a hair off whole pixels and resamples every pixel. A numpy array
    (gray, BGR or BGRA as pdfium gives it), or None when the page is anything else (rotated,
    cropped off the image, more than one object, a mask or transparency, an uncommon colour
    space): then it is rendered. The caller holds PDFIUM_LOCK."""
    if page.get_rotation() % 360 or pdfium_c.FPDFPage_CountObjects(page) != 1:
        return None
    obj = pdfium_c.FPDFPage_GetObject(page, 0)
    if (not obj or pdfium_c.FPDFPageObj_GetType(obj) != pdfium_c.FPDF_PAGEOBJ_IMAGE
            or pdfium_c.FPDFPageObj_HasTransparency(obj)):
        return None
    width, height = ctypes.c_uint(), ctypes.c_uint()
    if (not pdfium_c.FPDFImageObj_GetImagePixelSize(obj, width, height)
            or (width.value, height.value) != (width_px, height_px)):
        return None
    matrix = pdfium_c.FS_MATRIX()
    if not pdfium_c.FPDFPageObj_GetMatrix(obj, matrix):
        return None
    left, bottom, right, top = page.get_cropbox()
    placed = (matrix.a, matrix.b, matrix.c, matrix.d, matrix.e, matrix.f)
    wanted = (right - left, 0.0, 0.0, top - bottom, left, bottom)
    if any(abs(got - want) > 0.01 for got, want in zip(placed, wanted)):
        return None
    metadata = pdfium_c.FPDF_IMAGEOBJ_METADATA()
    if (not pdfium_c.FPDFImageObj_GetImageMetadata(obj, page, metadata)
            or metadata.colorspace not in PLAIN_COLORSPACES):
        return None
    raw = pdfium_c.FPDFImageObj_GetBitmap(obj)
    if not raw:
        return None
    bitmap = pdfium.PdfBitmap.from_raw(raw)  # pdfium's buffer, freed with the wrapper
    pixels = bitmap.to_numpy().copy()
    del bitmap
    return pixels if pixels.shape[:2] == (height_px, width_px) else None


def _compose(inner: tuple[float, float, float, float], outer: tuple[float, float, float, float]
             ) -> tuple[float, float, float, float]:
    """The linear part of `inner` then `outer` (PDF's row-vector convention: inner x outer)."""
    a, b, c, d = inner
    oa, ob, oc, od = outer
    return a * oa + b * oc, a * ob + b * od, c * oa + d * oc, c * ob + d * od


# ---- the text layer --------------------------------------------------------------------------
# Characters drawn in these text render modes are not seen: 3 is invisible (an OCR layer over a
# scan, hidden text), 7 only adds to the clipping path.
HIDDEN_RENDER_MODES = frozenset({pdfium_c.FPDF_TEXTRENDERMODE_INVISIBLE,
                                 pdfium_c.FPDF_TEXTRENDERMODE_CLIP})
# Annotations whose appearance draws text that is not in the page's text (form field values,
# typewriter notes, stamps)
TEXT_ANNOTATIONS = frozenset({pdfium_c.FPDF_ANNOT_WIDGET, pdfium_c.FPDF_ANNOT_FREETEXT,
                              pdfium_c.FPDF_ANNOT_STAMP})
# A gap wider than this many line heights ends a line (table cells, columns), as text
# detection splits them
LINE_GAP = 1.0
# A line's box is its glyphs' ink padded by this share of its font size (em) on every side, as
# text detection draws it (measured against PP-OCR's boxes on the same pages: tests/
# test_text_layer.py)
LINE_PAD = 0.25
# A page whose text layer is larger than this is OCR'd instead (its mark is "unused"): pdfium's
# characters (generated spaces and line breaks included), then lines. A dense born-digital
# page (small print, a large table) is a few thousand lines; a page of tens of thousands of
# one-glyph lines is no text a reader sees, and reading it costs the worker's one pdfium lock.
MAX_LAYER_CHARS = 50_000
MAX_LAYER_LINES = 5_000
# PaddleOCR's reading order, replayed exactly (an insertion sort) for runs of rows closer than
# its row threshold of at most this many lines; a longer run is cut into rows instead
EXACT_RUN = 64
LIGATURES = str.maketrans({"\ufb00": "ff", "\ufb01": "fi", "\ufb02": "fl", "\ufb03": "ffi",
                           "\ufb04": "ffl", "\ufb05": "st", "\ufb06": "st"})
Point = tuple[float, float]
Rect = tuple[float, float, float, float]  # x0, y0, x1, y1


@dataclass(frozen=True)
class LayerLine:
    """One line of a page's own text: its text, its quadrilateral in pixels of the page as
    rendered (top-left, top-right, bottom-right, bottom-left as the text reads, y downwards),
    and its words and the spaces between them, each with its pixel box."""

    text: str
    poly: tuple[Point, Point, Point, Point]
    words: tuple[tuple[str, Rect], ...]


@dataclass(frozen=True)
class TextLayer:
    """What a page's own text layer holds: its visible lines, and counts of its characters
    (not spaces): seen, hidden (render mode 3 or 7), without a usable Unicode value. `dense`:
    the layer is over MAX_LAYER_CHARS (then `visible` is pdfium's count of characters) or
    MAX_LAYER_LINES, so its lines were not read (none): the page is OCR'd."""

    lines: list[LayerLine]
    visible: int
    hidden: int
    unmapped: int
    dense: bool = False


@dataclass(frozen=True)
class PageChars:
    """A page's characters as pdfium gives them (read_page_chars), before they are made into
    lines (text_layer), which needs no pdfium and so no lock."""

    chars: list[_Char | None]
    hidden: int
    unmapped: int
    to_px: tuple[float, float, float, float, float, float]
    dense: int = 0  # over MAX_LAYER_CHARS: how many pdfium counted (none is read)


@dataclass
class _Char:
    text: str
    quarter: int  # quarter turns of the text direction, counterclockwise in user space
    rect: Rect  # the font's box (ascent to descent), in the reading frame: text runs +x, y up
    ink: Rect  # the glyph's own box, in the same frame
    em: float  # the font size, in user space units


def text_annotations(page: pdfium.PdfPage) -> int:
    """How many of the page's annotations draw text of their own (TEXT_ANNOTATIONS). The
    caller holds PDFIUM_LOCK."""
    found = 0
    for i in range(max(pdfium_c.FPDFPage_GetAnnotCount(page.raw), 0)):
        annot = pdfium_c.FPDFPage_GetAnnot(page.raw, i)
        if annot:
            found += pdfium_c.FPDFAnnot_GetSubtype(annot) in TEXT_ANNOTATIONS
            pdfium_c.FPDFPage_CloseAnnot(annot)
    return found


def read_text_layer(page: pdfium.PdfPage, width_px: int, height_px: int) -> TextLayer:
    """The page's own text grouped into lines (read_page_chars, then text_layer). The caller
    holds PDFIUM_LOCK."""
    return text_layer(read_page_chars(page, width_px, height_px))


def read_page_chars(page: pdfium.PdfPage, width_px: int, height_px: int) -> PageChars:
    """The page's own text (pdfium's characters), in pixels of the page rendered `width_px` x
    `height_px` (crop box, /Rotate and all, as page.render draws it), in content order.
    Hidden characters and those without Unicode (lone surrogates included) are counted, not
    read; characters outside the visible page are left out. Over MAX_LAYER_CHARS none is
    read (`dense`). The caller holds PDFIUM_LOCK."""
    to_px = _device_matrix(page, width_px, height_px)
    textpage = page.get_textpage()
    try:
        count = pdfium_c.FPDFText_CountChars(textpage.raw)
        if count > MAX_LAYER_CHARS:
            return PageChars([], 0, 0, to_px, dense=count)
        chars, hidden, unmapped = _chars(textpage.raw, to_px, width_px, height_px)
    finally:
        textpage.close()
    return PageChars(chars, hidden, unmapped, to_px)


def text_layer(page: PageChars) -> TextLayer:
    """A page's characters as lines. A line ends at pdfium's line breaks, at a change of
    direction, where the next character is not beside the last one (their font boxes,
    ascent to descent, overlap less than half) or is LINE_GAP line heights away. A line's box
    is its glyphs' ink padded by LINE_PAD em; lines come in PaddleOCR's order. A dense page
    (over MAX_LAYER_CHARS characters or MAX_LAYER_LINES lines) has no lines: it is OCR'd.
    Linear in the characters, but for the ordering (n log n); no pdfium call."""
    if page.dense:
        return TextLayer([], page.dense, 0, 0, dense=True)
    chars = page.chars
    visible = sum(1 for char in chars if char is not None and not char.text.isspace())
    runs = [run for run in _group(chars) if run]
    if len(runs) > MAX_LAYER_LINES:
        return TextLayer([], visible, page.hidden, page.unmapped, dense=True)
    lines = [line for run in runs if (line := _line(run, page.to_px)) is not None]
    return TextLayer(reading_order(lines), visible, page.hidden, page.unmapped)


def reading_order(lines: list[LayerLine], same_row_px: float = 10.0) -> list[LayerLine]:
    """Lines in the order PaddleOCR gives detected boxes (its sorted_boxes): sorted by the
    top-left corner, top to bottom, then each moved left past the ones before it whose corner
    is less than `same_row_px` apart vertically and further right (an insertion sort, which
    is quadratic). In O(n log n) here, with the same result: a line never moves past a gap of
    `same_row_px` between consecutive corners, so the runs between such gaps are ordered each
    on its own; a run whose corners all lie within `same_row_px` is one row, read left to
    right; a run of rows each closer than that to the next is replayed as PaddleOCR sorts it
    up to EXACT_RUN lines, and cut into rows (rows_of) beyond."""
    ordered = sorted(lines, key=lambda line: (line.poly[0][1], line.poly[0][0]))
    result: list[LayerLine] = []
    for run in _runs(ordered, same_row_px):
        if run[-1].poly[0][1] - run[0].poly[0][1] < same_row_px:
            result.extend(sorted(run, key=lambda line: line.poly[0][0]))
        elif len(run) <= EXACT_RUN:
            result.extend(_insertion_order(run, same_row_px))
        else:
            for row in rows_of(run, same_row_px):
                result.extend(sorted(row, key=lambda line: line.poly[0][0]))
    return result


def _runs(ordered: list[LayerLine], same_row_px: float) -> list[list[LayerLine]]:
    """Lines sorted top to bottom, cut where a corner is `same_row_px` or more below the
    previous one."""
    runs: list[list[LayerLine]] = []
    for line in ordered:
        if runs and line.poly[0][1] - runs[-1][-1].poly[0][1] < same_row_px:
            runs[-1].append(line)
        else:
            runs.append([line])
    return runs


def rows_of(run: list[LayerLine], same_row_px: float) -> list[list[LayerLine]]:
    """A run sorted top to bottom as rows: a row ends where a corner is `same_row_px` or more
    below the row's first."""
    rows: list[list[LayerLine]] = []
    for line in run:
        if rows and line.poly[0][1] - rows[-1][0].poly[0][1] < same_row_px:
            rows[-1].append(line)
        else:
            rows.append([line])
    return rows


def _insertion_order(run: list[LayerLine], same_row_px: float) -> list[LayerLine]:
    """PaddleOCR's sorted_boxes on a run sorted top to bottom (at most EXACT_RUN lines)."""
    ordered = list(run)
    for i in range(len(ordered) - 1):
        for j in range(i, -1, -1):
            (ax, ay), (bx, by) = ordered[j].poly[0], ordered[j + 1].poly[0]
            if abs(by - ay) < same_row_px and bx < ax:
                ordered[j], ordered[j + 1] = ordered[j + 1], ordered[j]
            else:
                break
    return ordered


def _device_matrix(page: pdfium.PdfPage, width_px: int, height_px: int
                   ) -> tuple[float, float, float, float, float, float]:
    """(a, b, c, d, e, f): user space (x, y) -> pixels (a x + c y + e, b x + d y + f), from
    pdfium's own page-to-device mapping (whole pixels, so measured over 10^4 points)."""
    def device(x: float, y: float) -> tuple[int, int]:
        dx, dy = ctypes.c_int(), ctypes.c_int()
        pdfium_c.FPDF_PageToDevice(page.raw, 0, 0, width_px, height_px, 0, x, y, dx, dy)
        return dx.value, dy.value

    span = 10000.0
    ox, oy = device(0.0, 0.0)
    xx, xy = device(span, 0.0)
    yx, yy = device(0.0, span)
    return ((xx - ox) / span, (xy - oy) / span, (yx - ox) / span, (yy - oy) / span,
            float(ox), float(oy))


def _apply(m, x: float, y: float) -> Point:
    return m[0] * x + m[2] * y + m[4], m[1] * x + m[3] * y + m[5]


def _turn(quarter: int, x: float, y: float) -> Point:
    """(x, y) turned by -quarter quarter turns: into the reading frame."""
    return ((x, y), (y, -x), (-x, -y), (-y, x))[quarter]


def _unturn(quarter: int, x: float, y: float) -> Point:
    return ((x, y), (-y, x), (-x, -y), (y, -x))[quarter]


def _chars(raw, to_px, width_px: int, height_px: int
           ) -> tuple[list[_Char | None], int, int]:
    """The page's characters in content order (None for a line break), with the counts of
    hidden and unmapped ones. Raw calls: a dense page is thousands of characters."""
    chars: list[_Char | None] = []
    hidden = unmapped = 0
    modes: dict[int, int] = {}
    box = pdfium_c.FS_RECTF()
    left, right, bottom, top = (ctypes.c_double() for _ in range(4))
    matrix = pdfium_c.FS_MATRIX()
    for i in range(max(pdfium_c.FPDFText_CountChars(raw), 0)):
        code = pdfium_c.FPDFText_GetUnicode(raw, i)
        if code in (0x0A, 0x0D):
            chars.append(None)
            continue
        text = chr(code) if 0 < code < 0x110000 and not 0xD800 <= code <= 0xDFFF else "\ufffd"
        if text.isspace():
            chars.append(_Char(" ", 0, (0.0, 0.0, 0.0, 0.0), (0.0, 0.0, 0.0, 0.0), 0.0))
            continue
        if pdfium_c.FPDFText_IsGenerated(raw, i) == 1:
            continue
        obj = pdfium_c.FPDFText_GetTextObject(raw, i)
        key = ctypes.cast(obj, ctypes.c_void_p).value or 0
        if key not in modes:
            modes[key] = pdfium_c.FPDFTextObj_GetTextRenderMode(obj) if obj else 0
        if modes[key] in HIDDEN_RENDER_MODES:
            hidden += 1
            continue
        if (text == "\ufffd" or code < 0x20 or 0xE000 <= code <= 0xF8FF
                or pdfium_c.FPDFText_HasUnicodeMapError(raw, i) == 1):
            unmapped += 1
            continue
        if not pdfium_c.FPDFText_GetLooseCharBox(raw, i, box):
            continue
        x0, x1 = sorted((box.left, box.right))
        y0, y1 = sorted((box.bottom, box.top))
        cx, cy = _apply(to_px, (x0 + x1) / 2, (y0 + y1) / 2)
        if not (0 <= cx <= width_px and 0 <= cy <= height_px):
            continue  # outside the visible box: not on the page as seen
        angle = pdfium_c.FPDFText_GetCharAngle(raw, i)
        quarter = round(angle / (math.pi / 2)) % 4 if angle >= 0 else 0
        if not pdfium_c.FPDFText_GetCharBox(raw, i, left, right, bottom, top):
            left.value, right.value, bottom.value, top.value = x0, x1, y0, y1
        em = pdfium_c.FPDFText_GetFontSize(raw, i)
        if pdfium_c.FPDFText_GetMatrix(raw, i, matrix):
            em *= math.hypot(matrix.c, matrix.d)
        if not (em > 0 and math.isfinite(em)):
            em = (x1 - x0, y1 - y0)[quarter % 2 == 0] / 1.2
        chars.append(_Char(text.translate(LIGATURES), quarter, _frame(quarter, x0, y0, x1, y1),
                           _frame(quarter, left.value, bottom.value, right.value, top.value),
                           em))
    return chars, hidden, unmapped


def _frame(quarter: int, x0: float, y0: float, x1: float, y1: float) -> Rect:
    """A user-space rectangle in the reading frame."""
    (ax, ay), (bx, by) = _turn(quarter, x0, y0), _turn(quarter, x1, y1)
    return min(ax, bx), min(ay, by), max(ax, bx), max(ay, by)


def _group(chars: list[_Char | None]) -> list[list[_Char]]:
    """Runs of characters that make one line each (spaces kept inside a run)."""
    runs: list[list[_Char]] = []
    run: list[_Char] = []
    last: _Char | None = None
    for char in chars:
        if char is None:
            last = None
            runs.append(run)
            run = []
            continue
        if char.text == " ":
            if run:
                run.append(char)
            continue
        if last is not None and not _beside(last, char):
            runs.append(run)
            run = []
        run.append(char)
        last = char
    runs.append(run)
    return runs


def _beside(last: _Char, char: _Char) -> bool:
    """Whether `char` continues the line whose last character is `last`."""
    if char.quarter != last.quarter:
        return False
    lx0, ly0, lx1, ly1 = last.rect
    x0, y0, x1, y1 = char.rect
    height = max(ly1 - ly0, y1 - y0, 1e-6)
    overlap = min(ly1, y1) - max(ly0, y0)
    if overlap < 0.5 * min(ly1 - ly0, y1 - y0):
        return False
    return -height <= x0 - lx1 <= LINE_GAP * height


def _line(run: list[_Char], to_px) -> LayerLine | None:
    """One run as a line: its text (spaces collapsed), its quadrilateral and its words."""
    words: list[list[_Char]] = [[]]
    for char in run:
        if char.text == " ":
            if words[-1]:
                words.append([])
        else:
            words[-1].append(char)
    words = [word for word in words if word]
    if not words:
        return None
    quarter = words[0][0].quarter
    x0 = min(c.ink[0] for word in words for c in word)
    y0 = min(c.ink[1] for word in words for c in word)
    x1 = max(c.ink[2] for word in words for c in word)
    y1 = max(c.ink[3] for word in words for c in word)
    pad = LINE_PAD * max(c.em for word in words for c in word)
    x0, y0, x1, y1 = x0 - pad, y0 - pad, x1 + pad, y1 + pad

    def pixel(x: float, y: float) -> Point:
        px, py = _apply(to_px, *_unturn(quarter, x, y))
        return round(px, 1), round(py, 1)

    # top-left, top-right, bottom-right, bottom-left as the text reads (y up in the frame)
    poly = (pixel(x0, y1), pixel(x1, y1), pixel(x1, y0), pixel(x0, y0))
    tokens: list[tuple[str, Rect]] = []
    end = x0
    for number, word in enumerate(words):
        wx0 = max(x0, min(c.ink[0] for c in word) - pad)
        wx1 = min(x1, max(c.ink[2] for c in word) + pad)
        if number:  # the space between two words, as PaddleOCR's word boxes have it
            tokens.append((" ", _pixel_rect(pixel, end, max(end, wx0), y0, y1)))
        tokens.append(("".join(c.text for c in word), _pixel_rect(pixel, wx0, wx1, y0, y1)))
        end = wx1
    return LayerLine(" ".join("".join(c.text for c in word) for word in words), poly,
                     tuple(tokens))


def _pixel_rect(pixel, x0: float, x1: float, y0: float, y1: float) -> Rect:
    """The pixel bounding box of the frame rectangle [x0, x1] x [y0, y1]."""
    points = [pixel(x, y) for x in (x0, x1) for y in (y0, y1)]
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    return min(xs), min(ys), max(xs), max(ys)
