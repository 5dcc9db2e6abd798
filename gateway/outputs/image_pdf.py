"""An image input as a PDF to put the text layer on: one page per image (per frame of a
multi-page TIFF, as the worker reads it), drawn over the whole page, the page as large as the
image at its recorded resolution (DEFAULT_DPI when it records none). A JPEG is embedded as it
is; an image whose EXIF orientation the worker applied (OpenCV decodes JPEGs upright) is
turned the same way first, so the layer's pixel boxes fit it. Built with fpdf2."""

from __future__ import annotations

import io

from fpdf import FPDF
from PIL import Image, ImageOps

from services.ocr_api.errors import ApiError, unprocessable
from services.ocr_api.sniff import is_tiff

from ..split import DEFAULT_MAX_PIXELS

DEFAULT_DPI = 150.0
ORIENTATION_TAG = 0x0112

Image.MAX_IMAGE_PIXELS = None  # every frame is checked against max_pixels before decoding


def _dpi(image: Image.Image) -> tuple[float, float]:
    dpi = image.info.get("dpi")
    try:
        x, y = float(dpi[0]), float(dpi[1])
    except (TypeError, ValueError, IndexError):
        return DEFAULT_DPI, DEFAULT_DPI
    ok = lambda value: 36.0 <= value <= 2400.0  # noqa: E731 (metadata is often junk)
    return (x if ok(x) else DEFAULT_DPI), (y if ok(y) else DEFAULT_DPI)


def _check_frames(image: Image.Image, max_pixels: int) -> None:
    """Every frame's size from its directory, before any is decoded: a few KB of TIFF can
    declare a 30000 x 30000 frame (the worker checks only the frames it reads)."""
    for index in range(getattr(image, "n_frames", 1)):
        image.seek(index)
        width, height = image.size
        if width * height > max_pixels:
            raise unprocessable(f"Page {index + 1} of the image is {width} x {height} "
                                f"pixels, over the limit of {max_pixels}: the searchable PDF "
                                "cannot include it. Ask for JSON or text instead")
    image.seek(0)


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


def image_pdf(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> bytes:
    try:
        with Image.open(io.BytesIO(data)) as image:
            _check_frames(image, max_pixels)
            pdf = FPDF(unit="pt")
            pdf.set_compression(True)
            for source, frame in _frames(data, image):
                dpi_x, dpi_y = _dpi(frame)
                width, height = frame.width * 72 / dpi_x, frame.height * 72 / dpi_y
                pdf.add_page(format=(width, height))
                pdf.image(source, x=0, y=0, w=width, h=height)
            return bytes(pdf.output())
    except (ApiError, MemoryError):  # a builder out of memory says so (sandbox.py)
        raise
    except Exception as exc:  # PIL and fpdf2 raise many types on odd images
        raise unprocessable(f"The image cannot be turned into a PDF page ({exc})") from None
