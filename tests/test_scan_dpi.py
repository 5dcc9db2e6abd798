"""Scanned PDF pages are read at their scan's resolution (issue 26): page_dpi's rule on placed
images, then the worker's decoder on real PDFs: an image-only page comes out at its image's
pixel size, a born-digital page at OCR_PDF_DPI, and the memory reserved before rendering is
exactly what rendering takes."""

import io

import numpy as np
import pytest
from PIL import Image
from reportlab.lib.utils import ImageReader
from reportlab.pdfgen import canvas

from services.documents.pdf import PDFIUM_LOCK, PlacedImage, open_pdf, placed_images
from services.ocr_api.request import OcrRequest
from services.ocr_worker.config import WorkerConfig
from services.ocr_worker.decode import DecodeLimits, open_document, page_dpi, render_scale

LETTER = (612.0, 792.0)
LIMITS = DecodeLimits(max_pages=10, max_pixels=50_000_000, pdf_dpi=144, scan_dpi_max=400)


def scan(dpi_x: float, dpi_y: float | None = None, share: float = 1.0) -> PlacedImage:
    """An image drawn over `share` of a letter page (in each direction) at this resolution."""
    width_pt, height_pt = LETTER[0] * share, LETTER[1] * share
    return PlacedImage(round(width_pt * dpi_x / 72), round(height_pt * (dpi_y or dpi_x) / 72),
                       width_pt, height_pt)


@pytest.mark.parametrize("images, expected", [
    ([], 144),  # born-digital: text and vectors
    ([scan(300)], 300),  # a 300-dpi scan: its own pixels
    ([scan(200)], 200),
    ([scan(600)], 400),  # capped at scan_dpi_max
    ([scan(72)], 144),  # never below the configured DPI
    ([scan(204, 98)], 204),  # a fax: the denser direction keeps every pixel
    ([scan(150), scan(300)], 300),  # mixed raster content: the text layer is the dense one
    ([scan(300, share=0.6)], 144),  # a photo on a third of a text page
    ([scan(300), scan(1200, share=0.05)], 300),  # a stamp does not set a scan's resolution
    ([scan(300, share=0.1)] * 60, 300),  # a scan cut into small tiles
])
def test_page_dpi(images, expected):
    assert page_dpi(images, *LETTER, LIMITS) == pytest.approx(expected, abs=0.5)


def test_a_cap_at_or_below_the_configured_dpi_renders_every_page_at_it():
    limits = DecodeLimits(max_pages=10, max_pixels=50_000_000, pdf_dpi=144, scan_dpi_max=144)
    assert page_dpi([scan(300)], *LETTER, limits) == 144


def test_the_pixel_budget_still_bounds_a_scan():
    limits = DecodeLimits(max_pages=10, max_pixels=4_000_000, pdf_dpi=144, scan_dpi_max=400)
    scale = render_scale(*LETTER, 0, limits, page_dpi([scan(300)], *LETTER, limits))
    assert round(LETTER[0] * scale) * round(LETTER[1] * scale) <= 4_000_000
    assert scale * 72 < 300


def test_decode_limits_default_to_the_workers_cap():
    assert (DecodeLimits(max_pages=1, max_pixels=1, pdf_dpi=144).scan_dpi_max
            == WorkerConfig().pdf_scan_dpi_max == WorkerConfig.from_env({}).pdf_scan_dpi_max)


# ---- PDFs through the worker's decoder ------------------------------------------------------
def page_image(width: int, height: int) -> Image.Image:
    rng = np.random.default_rng(0)
    return Image.fromarray(rng.integers(0, 256, (height, width), dtype=np.uint8))


def image_only_pdf(image: Image.Image, dpi: float) -> bytes:
    """One page holding only this image at `dpi`, as a scanner writes it (Pillow's writer)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PDF", resolution=dpi)
    return buffer.getvalue()


def born_digital_pdf() -> bytes:
    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=LETTER)
    pdf.setFont("Helvetica", 11)
    for line in range(40):
        pdf.drawString(72, 720 - 15 * line, f"Line {line}: born-digital text, no image.")
    pdf.save()
    return buffer.getvalue()


def rendered(data: bytes, limits: DecodeLimits = LIMITS) -> tuple[list[np.ndarray], int]:
    """The worker's pages for these bytes, and the bytes it reserved before rendering."""
    document = open_document(OcrRequest(log_id="t", file_bytes=data, kind="pdf"), limits)
    try:
        return list(document.pages()), document.page_bytes
    finally:
        document.close()


@pytest.mark.parametrize("dpi", [150, 200, 300, 400])
def test_an_image_only_page_is_rendered_at_its_images_pixel_size(dpi):
    image = page_image(1700, 2200)
    [page], reserved = rendered(image_only_pdf(image, dpi))
    assert page.shape[:2] == (2200, 1700)  # not one more: that would resample every pixel
    assert reserved == page.shape[0] * page.shape[1] * 3  # reserved as rendered


def test_a_denser_scan_is_rendered_at_the_cap():
    [page], _ = rendered(image_only_pdf(page_image(1200, 1600), 600))  # 2 x 2.67 in
    assert abs(page.shape[1] - 800) <= 2 and abs(page.shape[0] - 1067) <= 2


def test_a_born_digital_page_keeps_the_configured_dpi():
    [page], reserved = rendered(born_digital_pdf())
    assert page.shape[:2] == (792 * 2, 612 * 2)  # 144 DPI
    assert reserved == page.shape[0] * page.shape[1] * 3


def test_an_image_inside_a_scaled_form_is_measured_on_the_page():
    """Matrices of enclosing Form XObjects are composed: 600 px drawn 3 in wide is 200 dpi."""
    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=(216, 216))
    pdf.beginForm("scan")
    pdf.drawImage(ImageReader(page_image(600, 600)), 0, 0, width=432, height=432)
    pdf.endForm()
    pdf.scale(0.5, 0.5)
    pdf.doForm("scan")
    pdf.save()
    with PDFIUM_LOCK:
        document = open_pdf(buffer.getvalue())
        try:
            [image] = placed_images(document[0])
        finally:
            document.close()
    assert (image.width_px, image.height_px) == (600, 600)
    assert image.width_pt == pytest.approx(216) and image.height_pt == pytest.approx(216)
    [page], _ = rendered(buffer.getvalue())
    assert page.shape[:2] == (600, 600)


def test_a_lossless_scan_comes_out_pixel_for_pixel():
    """The engine sees the scan's own pixels, as if the image had been sent."""
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (400, 300, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=(72, 96))  # 300 x 400 px at 300 dpi
    pdf.drawImage(ImageReader(Image.fromarray(pixels)), 0, 0, width=72, height=96)
    pdf.save()
    [page], _ = rendered(buffer.getvalue())
    assert np.array_equal(page[:, :, ::-1], pixels)


# ---- the accuracy corpus's scan PDFs (samples/accuracy_corpus.py, make bench-accuracy) ------
@pytest.mark.parametrize("dpi", [150, 200, 300, 400])
def test_the_accuracy_corpus_wraps_a_scan_pixel_for_pixel(dpi):
    """bench_accuracy's image-only PDFs hold the scan's pixels losslessly (Flate, not JPEG as
    Pillow's writer would), and the worker renders them back at exactly the scan's size.
    (Not always pixel for pixel: where the page's size in points times the render scale is
    a hair off whole pixels, pdfium resamples; bench_accuracy reports how far, per page.)"""
    from samples import accuracy_corpus

    scan = accuracy_corpus.synthetic_scan("receipt-8pt", dpi)
    pdf = accuracy_corpus.image_only_pdf(scan.image, dpi)
    filters, _ = accuracy_corpus.embedded_image(pdf)
    assert filters == ["/FlateDecode"] and accuracy_corpus.is_pixel_exact(pdf, scan.image)
    [page], _ = rendered(pdf)
    assert page.shape[:2] == (scan.image.height, scan.image.width)


@pytest.mark.parametrize("dpi", [150, 200, 300, 400])
def test_a_scan_that_is_exactly_its_image_is_taken_out_not_rendered(dpi):
    """Page sizes in points that are not whole pixels at the render scale make pdfium
    resample every pixel; a page that is one opaque image over all of it is decoded from the
    file instead: exactly the scan's pixels at every dpi."""
    from samples import accuracy_corpus

    scan = accuracy_corpus.synthetic_scan("receipt-8pt", dpi)
    [page], _ = rendered(accuracy_corpus.image_only_pdf(scan.image, dpi))
    expected = np.asarray(scan.image.convert("L"))
    assert np.array_equal(page[:, :, 0], expected) and np.array_equal(page[:, :, 2], expected)


def test_a_page_with_more_than_its_image_is_still_rendered():
    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=(72, 96))
    pdf.drawImage(ImageReader(page_image(300, 400)), 0, 0, width=72, height=96)
    pdf.setFillColorRGB(1, 0, 0)
    pdf.rect(10, 10, 20, 20, fill=1, stroke=0)  # drawn over the scan: a render shows it
    pdf.save()
    [page], _ = rendered(buffer.getvalue())
    assert page.shape[:2] == (400, 300)
    assert tuple(page[400 - 50, 80]) == (0, 0, 255)  # the red square (BGR), not the scan
