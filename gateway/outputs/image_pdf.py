"""An image input as a PDF to put the text layer on: one page per image (per frame of a
multi-page TIFF, as the worker reads it), drawn over the whole page, the page as large as the
image at its recorded resolution (DEFAULT_DPI when it records none). A JPEG is embedded as it
is; an image whose EXIF orientation the worker applied (OpenCV decodes JPEGs upright) is
turned the same way first, so the layer's pixel boxes fit it. Built with fpdf2."""

from __future__ import annotations

import io

from fpdf import FPDF
from PIL import Image, ImageOps

from services.ocr_api.errors import unprocessable
from services.ocr_api.sniff import is_tiff

DEFAULT_DPI = 150.0
ORIENTATION_TAG = 0x0112

Image.MAX_IMAGE_PIXELS = None  # the worker has checked the pixel count already


def _dpi(image: Image.Image) -> tuple[float, float]:
    dpi = image.info.get("dpi")
    try:
        x, y = float(dpi[0]), float(dpi[1])
    except (TypeError, ValueError, IndexError):
        return DEFAULT_DPI, DEFAULT_DPI
    ok = lambda value: 36.0 <= value <= 2400.0  # noqa: E731 (metadata is often junk)
    return (x if ok(x) else DEFAULT_DPI), (y if ok(y) else DEFAULT_DPI)


def _frames(data: bytes, image: Image.Image):
    """(what fpdf2 should embed, PIL frame) for each page."""
    if is_tiff(data):
        for index in range(getattr(image, "n_frames", 1)):
            image.seek(index)
            frame = image.copy()
            yield (frame if frame.mode in ("1", "L", "RGB", "CMYK") else
                   frame.convert("RGB")), frame
        return
    orientation = image.getexif().get(ORIENTATION_TAG, 1)
    if orientation not in (None, 1):
        upright = ImageOps.exif_transpose(image)
        yield upright, upright
    elif image.format == "JPEG":
        yield io.BytesIO(data), image
    else:
        yield (image if image.mode in ("1", "L", "RGB", "RGBA", "LA", "P") else
               image.convert("RGB")), image


def image_pdf(data: bytes) -> bytes:
    try:
        with Image.open(io.BytesIO(data)) as image:
            pdf = FPDF(unit="pt")
            pdf.set_compression(True)
            for source, frame in _frames(data, image):
                dpi_x, dpi_y = _dpi(frame)
                width, height = frame.width * 72 / dpi_x, frame.height * 72 / dpi_y
                pdf.add_page(format=(width, height))
                pdf.image(source, x=0, y=0, w=width, h=height)
            return bytes(pdf.output())
    except Exception as exc:  # PIL and fpdf2 raise many types on odd images
        raise unprocessable(f"The image cannot be turned into a PDF page ({exc})") from None
