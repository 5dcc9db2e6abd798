"""Turning a validated request's bytes into page images: images decoded with OpenCV after a
header check (size, pixel budget, integrity), PDFs opened with pypdfium2 and rendered one page
at a time: a scanned page at its scan's resolution, any other at the configured DPI; with
`textLayer: "auto"`, a page whose own text covers it is read from that text, not rendered.
Every failure is an ApiError with a message a caller can act on.

pdfium is not thread-safe, so every pdfium call holds the process's one PDFIUM_LOCK
(services.documents.pdf); opening, counting and page limits are shared with the gateway
there."""

from __future__ import annotations

import io
import math
import warnings
from dataclasses import dataclass
from typing import Iterator

import cv2
import numpy as np
import pypdfium2 as pdfium
from PIL import Image

from services.documents.pages import select_pages
from services.documents.pdf import (PDFIUM_LOCK, LayerLine, PlacedImage, TextLayer, open_pdf,
                                    page_image_pixels, placed_images, read_page_chars,
                                    text_annotations, text_layer)
from services.documents.images import as_shown, transparent, upright
from services.documents.tiff import count_tiff_frames
from services.ocr_api.errors import ApiError, excerpt, unprocessable
from services.ocr_api.request import (TEXT_LAYER_AUTO, TEXT_LAYER_IGNORE, OcrRequest,
                                      resolve_page_range)
from services.ocr_api.sniff import KIND_PDF, is_tiff
from services.ocr_worker.config import WorkerConfig

KIND_TIFF = "tiff"
# A page is a scan when images cover at least this share of it (overlaps counted twice: a
# mixed-raster scan's layers each cover the page); images under MIN_IMAGE_SHARE of the page
# (a logo, a stamp) do not set its resolution.
SCAN_COVERAGE = 0.5
MIN_IMAGE_SHARE = 0.05
# What `textLayer: "auto"` found on a page (prunedResult.model_settings.text_layer): "used",
# its lines come from the page's own text and OCR did not run; "unused", the page has text
# but it does not cover the page (only hidden text: an earlier OCR's layer; a scan; text in
# form fields or annotations; characters without Unicode), so it was OCR'd. A page without
# text has no mark. Either mark means the searchable PDF adds no second layer.
TEXT_LAYER_USED = "used"
TEXT_LAYER_UNUSED = "unused"
# over this share of a page's characters without a Unicode value, its text is not read
MAX_UNMAPPED_SHARE = 0.1

# We check pixel counts ourselves, against the configured limit; PIL's warnings about corrupt
# files become our 422s instead (a process-wide filter: catch_warnings is not thread-safe).
Image.MAX_IMAGE_PIXELS = None
warnings.filterwarnings("ignore", module=r"PIL\.")


@dataclass(frozen=True)
class DecodeLimits:
    max_pages: int
    max_pixels: int
    pdf_dpi: float
    scan_dpi_max: float = WorkerConfig.pdf_scan_dpi_max


@dataclass(frozen=True)
class TextLayerPage:
    """A PDF page read from its own text layer instead of being rendered: its size in pixels
    as it would have been rendered, and its lines in those pixels."""

    width: int
    height: int
    lines: list[LayerLine]


class Document:
    """The selected pages of one input, rendered lazily in page order. `page_bytes` is the
    size of the largest rendered page (BGR), known before any page is rendered, so that the
    worker can reserve memory for the pages it will hold at once. With `textLayer: "auto"` a
    PDF page may come as a TextLayerPage instead, and `text_layer_marks` says, by position
    among the selected pages, what each page's text layer was (TEXT_LAYER_USED/UNUSED)."""

    kind: str
    total_pages: int
    page_indices: list[int]
    page_bytes: int
    text_layer_marks: dict[int, str] = {}

    def pages(self) -> Iterator[np.ndarray | TextLayerPage]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class ImageDocument(Document):
    """One image, decoded only when its page is asked for (after memory is reserved for it);
    the document keeps the file's bytes, never the decoded page."""

    def __init__(self, data: bytes, width: int, height: int, max_pixels: int):
        self.kind = "image"
        self.total_pages = 1
        self.page_indices = [0]
        self.page_bytes = width * height * 3
        self._data = data
        self._max_pixels = max_pixels

    def pages(self) -> Iterator[np.ndarray]:
        yield decode_image(self._data, self._max_pixels)


class PdfDocument(Document):
    """Each selected page's render scale is fixed when the document is opened (its page
    loaded, its images measured), so the memory reserved for `page_bytes` is what rendering
    takes."""

    def __init__(self, pdf: pdfium.PdfDocument, page_indices: list[int], total_pages: int,
                 limits: DecodeLimits, text_layer: str = TEXT_LAYER_IGNORE):
        self.kind = KIND_PDF
        self.total_pages = total_pages
        self.page_indices = page_indices
        self.text_layer_marks = {}
        self._pdf = pdf
        self._limits = limits
        self._text_layer = text_layer
        self._scales: dict[int, float] = {}
        self.page_bytes = self._plan_pages()

    def pages(self) -> Iterator[np.ndarray | TextLayerPage]:
        for position, index in enumerate(self.page_indices):
            if self._text_layer == TEXT_LAYER_AUTO:
                page = self._read_text_layer(position, index)
                if page is not None:
                    yield page
                    continue
            yield self._render(index)

    def _read_text_layer(self, position: int, index: int) -> TextLayerPage | None:
        """The page from its own text when that covers it (no render: the size is the one it
        would be rendered at); None to render and OCR it. Marks the page either way."""
        with PDFIUM_LOCK:
            page = None
            try:
                page = self._pdf[index]
                width_pt, height_pt = page.get_size()
                scale = self._scales.get(index) or self._page_scale(page, index)
                width, height = math.ceil(width_pt * scale), math.ceil(height_pt * scale)
                chars = read_page_chars(page, width, height)
                images, annotations = placed_images(page), text_annotations(page)
            except (ApiError, pdfium.PdfiumError):
                return None  # reported when the page is rendered
            finally:
                if page is not None:
                    page.close()
        layer = text_layer(chars)  # lines and their order need no pdfium: not under its lock
        verdict = text_layer_verdict(layer, images, annotations, width_pt, height_pt)
        if verdict is not None:
            self.text_layer_marks[position] = verdict
        if verdict != TEXT_LAYER_USED:
            return None
        return TextLayerPage(width, height, layer.lines)

    def _plan_pages(self) -> int:
        """Fill in each page's scale; returns the largest rendered page's bytes."""
        largest = 0
        with PDFIUM_LOCK:
            for index in self.page_indices:
                page = None
                try:
                    page = self._pdf[index]
                    width_pt, height_pt = page.get_size()
                    self._scales[index] = scale = self._page_scale(page, index)
                except (ApiError, pdfium.PdfiumError):
                    continue  # reported when that page is rendered
                finally:
                    if page is not None:
                        page.close()
                largest = max(largest, math.ceil(width_pt * scale) * math.ceil(height_pt * scale))
        return largest * 3

    def _page_scale(self, page: pdfium.PdfPage, index: int) -> float:
        width_pt, height_pt = page.get_size()
        dpi = page_dpi(placed_images(page), width_pt, height_pt, self._limits)
        return render_scale(width_pt, height_pt, index, self._limits, dpi)

    def _render(self, index: int) -> np.ndarray:
        with PDFIUM_LOCK:
            page = None
            try:
                page = self._pdf[index]
                scale = self._scales.get(index) or self._page_scale(page, index)
                width_pt, height_pt = page.get_size()
                image = page_image_pixels(page, math.ceil(width_pt * scale),
                                          math.ceil(height_pt * scale))
                if image is None:  # anything but a scan that is exactly its image
                    bitmap = page.render(scale=scale)
                    try:
                        image = bitmap.to_numpy().copy()
                    finally:
                        bitmap.close()
            except pdfium.PdfiumError as exc:
                raise unprocessable(f"Page {index + 1} of the PDF cannot be rendered "
                                    f"({excerpt(str(exc), 80)}): "
                                    "the file is damaged") from None
            finally:
                if page is not None:
                    page.close()
        if image.ndim == 3 and image.shape[2] == 1:
            image = image[:, :, 0]
        if image.ndim == 3 and image.shape[2] == 4:
            image = cv2.cvtColor(image, cv2.COLOR_BGRA2BGR)
        elif image.ndim == 2:
            image = cv2.cvtColor(image, cv2.COLOR_GRAY2BGR)
        return image

    def close(self) -> None:
        with PDFIUM_LOCK:
            self._pdf.close()


def text_layer_verdict(layer: TextLayer, images: list[PlacedImage], annotations: int,
                       width_pt: float, height_pt: float) -> str | None:
    """Whether a page's own text covers it (TEXT_LAYER_USED), it has text that does not
    (TEXT_LAYER_UNUSED), or it has none (None). Only text a reader sees is used: a hidden
    layer is another OCR's reading of a scan (or text put there for machines alone), so the
    page is read again; a scan may hold text its layer lacks, and so may annotations (form
    field values, notes, stamps), which are not in the page's text; characters without a
    Unicode value (fonts without a ToUnicode map) would come out as garbage."""
    if layer.visible + layer.hidden + layer.unmapped == 0:
        return None
    if (not layer.lines or is_scan(images, width_pt, height_pt) or annotations
            or layer.unmapped > MAX_UNMAPPED_SHARE * (layer.visible + layer.unmapped)):
        return TEXT_LAYER_UNUSED
    return TEXT_LAYER_USED


def is_scan(images: list[PlacedImage], width_pt: float, height_pt: float) -> bool:
    """Images cover at least SCAN_COVERAGE of the page."""
    covered = sum(image.width_pt * image.height_pt for image in images)
    return bool(images) and covered >= SCAN_COVERAGE * width_pt * height_pt


def page_dpi(images: list[PlacedImage], width_pt: float, height_pt: float,
             limits: DecodeLimits) -> float:
    """The resolution to render a page at. A scan (images covering SCAN_COVERAGE of the page)
    is read at its own resolution, the densest of its images that are more than a logo, so
    OCR gets the scanner's pixels and small print keeps its strokes; never below the
    configured DPI (a low-resolution scan is enlarged as before) nor above scan_dpi_max (time
    and memory). Any other page is text and vectors: the configured DPI, chosen for text
    size."""
    page_area = width_pt * height_pt
    if not is_scan(images, width_pt, height_pt):
        return limits.pdf_dpi
    # a scan cut into small tiles has no image over the share: then all of them count
    measured = [image for image in images
                if image.width_pt * image.height_pt >= MIN_IMAGE_SHARE * page_area] or images
    own = max(72.0 * max(image.width_px / image.width_pt, image.height_px / image.height_pt)
              for image in measured)
    return max(limits.pdf_dpi, min(own, limits.scan_dpi_max))


def render_scale(width_pt: float, height_pt: float, index: int, limits: DecodeLimits,
                 dpi: float) -> float:
    """`dpi` as a pdfium scale, lowered (as PaddleX does) so that a page stays within the
    pixel budget; 422 for a page with no area. pdfium stretches the page over ceil(width x
    scale) pixels, so the scale is a hair under dpi / 72: a scan 4000 pixels wide renders
    4000 wide, not 4001 from pdfium's float32 sizes (which would resample, and blur, every
    pixel)."""
    if not (width_pt > 0 and height_pt > 0) or not math.isfinite(width_pt * height_pt):
        raise unprocessable(f"Page {index + 1} of the PDF has an invalid size "
                            f"({width_pt} x {height_pt} pt)")
    scale = dpi / 72.0 * (1 - 1e-5)
    while math.ceil(width_pt * scale) * math.ceil(height_pt * scale) > limits.max_pixels:
        scale = min(scale * 0.99, math.sqrt(limits.max_pixels / (width_pt * height_pt)))
    if scale < 0.05:
        raise unprocessable(f"Page {index + 1} of the PDF is too large to render within "
                            f"{limits.max_pixels} pixels")
    return scale


class TiffDocument(Document):
    """A multi-page TIFF (a fax, a scanner's batch): one page per frame, as PaddleX reads it."""

    def __init__(self, data: bytes, total_pages: int, page_indices: list[int],
                 limits: DecodeLimits, largest_frame_pixels: int):
        self.kind = KIND_TIFF
        self.total_pages = total_pages
        self.page_indices = page_indices
        # the memory reservation covers the largest selected frame, not the first
        self.page_bytes = min(largest_frame_pixels, limits.max_pixels) * 3
        self._data = data
        self._limits = limits

    def pages(self) -> Iterator[np.ndarray]:
        with Image.open(io.BytesIO(self._data)) as tiff:
            for index in self.page_indices:
                try:
                    tiff.seek(index)
                    width, height = tiff.size
                    _check_pixels(width, height, self._limits.max_pixels, f"Page {index + 1}")
                    page = cv2.cvtColor(np.asarray(as_shown(tiff).convert("RGB")),
                                        cv2.COLOR_RGB2BGR)
                except ApiError:
                    raise
                except Exception as exc:  # PIL raises many types on corrupt data
                    raise unprocessable(f"Page {index + 1} of the TIFF cannot be decoded "
                                        f"({excerpt(str(exc), 80)}): the file is truncated "
                                        "or corrupt") from None
                yield page
                del page  # not kept by the generator while the next frame decodes


def open_document(request: OcrRequest, limits: DecodeLimits) -> Document:
    if request.kind == KIND_PDF:
        return _open_pdf(request, limits)
    frames = (count_tiff_frames(request.file_bytes, limits.max_pages)
              if is_tiff(request.file_bytes) else 1)
    if frames > 1:
        indices = select_pages(request.page_range, frames, limits.max_pages, what="TIFF")
        return TiffDocument(request.file_bytes, frames, indices, limits,
                            _largest_frame_pixels(request.file_bytes, indices))
    resolve_page_range(request.page_range, 1)
    width, height = image_size(request.file_bytes, limits.max_pixels)
    return ImageDocument(request.file_bytes, width, height, limits.max_pixels)


def _largest_frame_pixels(data: bytes, indices: list[int]) -> int:
    """Pixels of the largest of these frames of a TIFF (their directories only: no frame is
    decoded; in ascending order Pillow walks the file once)."""
    try:
        with Image.open(io.BytesIO(data)) as tiff:
            largest = 0
            for index in sorted(indices):
                tiff.seek(index)
                largest = max(largest, tiff.size[0] * tiff.size[1])
            return largest
    except Exception as exc:  # PIL raises many types on corrupt data
        raise unprocessable(f"The TIFF cannot be decoded ({excerpt(str(exc), 80)}): the file "
                            "is truncated or corrupt") from None


def _check_pixels(width: int, height: int, max_pixels: int, what: str = "The image") -> None:
    if width <= 0 or height <= 0:
        raise unprocessable(f"{what} has no pixels")
    if width * height > max_pixels:
        raise unprocessable(f"{what} is {width} x {height} = {width * height} pixels, over "
                            f"this server's limit of {max_pixels}: downscale it or split it")


def image_size(data: bytes, max_pixels: int) -> tuple[int, int]:
    """(width, height) from the image's header, checked against the pixel budget; 422 for a
    file that is not a readable image (a full decode comes with the page)."""
    try:
        with Image.open(io.BytesIO(data)) as header:
            _check_pixels(*header.size, max_pixels)
            return header.size
    except ApiError:
        raise
    except Exception as exc:  # PIL raises many types on corrupt data
        raise unprocessable(f"The image cannot be decoded ({exc}): the file is truncated or "
                            "corrupt") from None


def decode_image(data: bytes, max_pixels: int) -> np.ndarray:
    try:
        with Image.open(io.BytesIO(data)) as header:
            _check_pixels(*header.size, max_pixels)
            header.load()  # full decode: catches truncated and corrupt files
            if transparent(header):  # OpenCV would keep the colour under the alpha
                shown = as_shown(upright(header)).convert("RGB")
                return cv2.cvtColor(np.asarray(shown), cv2.COLOR_RGB2BGR)
    except ApiError:
        raise
    except Exception as exc:  # PIL raises many types on corrupt data
        raise unprocessable(f"The image cannot be decoded ({excerpt(str(exc), 80)}): the file "
                            "is truncated or "
                            "corrupt") from None
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if image is None:
        raise unprocessable("The image cannot be decoded: the file is truncated, corrupt or in "
                            "an unsupported format")
    return image


def _open_pdf(request: OcrRequest, limits: DecodeLimits) -> PdfDocument:
    with PDFIUM_LOCK:
        pdf = open_pdf(request.file_bytes, init_forms=True)
        total = len(pdf)
    try:
        indices = select_pages(request.page_range, total, limits.max_pages)
    except Exception:
        with PDFIUM_LOCK:
            pdf.close()
        raise
    return PdfDocument(pdf, indices, total, limits, request.text_layer)
