"""An image input as a PDF to put the text layer on: one page per image (per frame of a
multi-page TIFF, as the worker reads it), drawn over the whole page, the page as large as the
image at its recorded resolution (DEFAULT_DPI when it records none). A JPEG is embedded as it
is, other pixels losslessly (Flate), a transparent image over white. An image whose EXIF
orientation the worker applied (OpenCV decodes JPEGs and PNGs upright, not WebP; Pillow turns
a TIFF by its own tag as it opens it) is drawn turned the same way, on a page of the upright
shape, so the layer's pixel boxes fit it: the image itself is embedded as stored (a portrait
phone photo stays its JPEG, not 20 MB of pixels).

The PDF is written a page at a time into a file, so a scanned TIFF of hundreds of frames is
never held whole: the PDF libraries here (fpdf2, pikepdf) keep a document's pages in memory
until it is saved, some 2-4 MB a scanned frame, and a builder has 512 MB (sandbox.py;
docs/capacity.md). An image page is a few objects (ISO 32000-1, 7.5 and 8.9): the image, the
stream that draws it and the page, then the page tree, the catalog and the cross-reference
table. pikepdf then reads this file as it reads a PDF input, a stream at a time."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, replace
from typing import BinaryIO, Iterator

from PIL import Image

from services.documents.images import UPRIGHTED, as_shown
from services.ocr_api.errors import ApiError, unprocessable

from ..split import DEFAULT_MAX_PIXELS

DEFAULT_DPI = 150.0
ORIENTATION_TAG = 0x0112
# EXIF orientation -> where a stored w x h image's point (x, y) is once upright (y down)
TURNS = {1: lambda x, y, w, h: (x, y), 2: lambda x, y, w, h: (w - x, y),
         3: lambda x, y, w, h: (w - x, h - y), 4: lambda x, y, w, h: (x, h - y),
         5: lambda x, y, w, h: (y, x), 6: lambda x, y, w, h: (h - y, x),
         7: lambda x, y, w, h: (h - y, w - x), 8: lambda x, y, w, h: (y, w - x)}
COLOURS = {"1": b"DeviceGray", "L": b"DeviceGray", "RGB": b"DeviceRGB"}
# zlib's fastest level: a third of the default's time on a scanned page for 3 % more bytes
# (docs/figures/runs/tiff-searchable-pdf.json), and a builder has 60 s (sandbox.py)
DEFLATE_LEVEL = 1

Image.MAX_IMAGE_PIXELS = None  # every frame is checked against max_pixels before decoding


@dataclass(frozen=True)
class Picture:
    """One page's image as the PDF embeds it: its encoded bytes and what decodes them."""

    data: bytes
    width: int
    height: int
    colours: bytes  # a device colour space's name
    bits: int  # per component
    encoding: bytes  # the stream's filter
    dpi: tuple[float, float]
    orientation: int = 1  # EXIF's: how it is turned upright (TURNS)

    def placement(self) -> tuple[list[float], float, float]:
        """The matrix that draws the image (PDF's unit square, its first row on top) upright
        on its page, and the page's width and height in points."""
        width, height, turned = self.width, self.height, self.orientation >= 5
        upright_width, upright_height = (height, width) if turned else (width, height)
        dpi_x, dpi_y = self.dpi[::-1] if turned else self.dpi  # along the upright axes

        def on_page(u: float, v: float) -> tuple[float, float]:
            x, y = TURNS[self.orientation](u * width, (1 - v) * height, width, height)
            return x * 72 / dpi_x, (upright_height - y) * 72 / dpi_y

        (e, f), (a, b), (c, d) = on_page(0, 0), on_page(1, 0), on_page(0, 1)
        return ([a - e, b - f, c - e, d - f, e, f], upright_width * 72 / dpi_x,
                upright_height * 72 / dpi_y)


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


def _lossless(frame: Image.Image, dpi: tuple[float, float]) -> Picture:
    """The frame's pixels as shown (services.documents.images.as_shown: 16-bit gray as the
    worker reads it, transparency over white) deflated: bilevel, gray or RGB as they are,
    anything else as RGB."""
    frame = as_shown(frame)
    if frame.mode not in COLOURS:
        frame = frame.convert("RGB")
    return Picture(zlib.compress(frame.tobytes(), DEFLATE_LEVEL), frame.width, frame.height,
                   COLOURS[frame.mode], 1 if frame.mode == "1" else 8, b"FlateDecode", dpi)


def _pictures(source: BinaryIO, image: Image.Image) -> Iterator[Picture]:
    """Each page's image, one frame decoded at a time."""
    if image.format == "TIFF":
        for index in range(getattr(image, "n_frames", 1)):
            image.seek(index)
            yield _lossless(image, _dpi(image))
        return
    orientation = image.getexif().get(ORIENTATION_TAG, 1) if image.format in UPRIGHTED else 1
    if image.format == "JPEG" and image.mode in ("L", "RGB"):
        source.seek(0)
        picture = Picture(source.read(), image.width, image.height, COLOURS[image.mode], 8,
                          b"DCTDecode", _dpi(image))
    else:
        picture = _lossless(image, _dpi(image))
    yield replace(picture, orientation=orientation if orientation in TURNS else 1)


def _number(value: float) -> bytes:
    return f"{value:.4f}".rstrip("0").rstrip(".").encode()


class _Objects:
    """PDF objects written in turn to `out`, their offsets kept for the cross-reference
    table. Objects 1 and 2 (the catalog and the page tree) are written last, when the pages
    are known."""

    def __init__(self, out: BinaryIO):
        self.out = out
        self.offsets: dict[int, int] = {}
        out.write(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")

    def put(self, number: int, dictionary: bytes, stream: bytes | None = None) -> None:
        self.offsets[number] = self.out.tell()
        self.out.write(b"%d 0 obj\n<< %s" % (number, dictionary))
        if stream is None:
            self.out.write(b" >>\nendobj\n")
            return
        self.out.write(b" /Length %d >>\nstream\n" % len(stream))
        self.out.write(stream)
        self.out.write(b"\nendstream\nendobj\n")

    def page(self, number: int, picture: Picture) -> None:
        """Objects number, +1 and +2: the image, its drawing and the page."""
        matrix, page_width, page_height = picture.placement()
        width, height = _number(page_width), _number(page_height)
        self.put(number, b"/Type /XObject /Subtype /Image /Width %d /Height %d /ColorSpace "
                         b"/%s /BitsPerComponent %d /Filter /%s" % (
                             picture.width, picture.height, picture.colours, picture.bits,
                             picture.encoding), picture.data)
        self.put(number + 1, b"", b"q %s cm /Im0 Do Q" % b" ".join(map(_number, matrix)))
        self.put(number + 2, b"/Type /Page /Parent 2 0 R /MediaBox [0 0 %s %s] /Resources "
                             b"<< /XObject << /Im0 %d 0 R >> >> /Contents %d 0 R" % (
                                 width, height, number, number + 1))

    def end(self, pages: list[int]) -> None:
        kids = b" ".join(b"%d 0 R" % page for page in pages)
        self.put(2, b"/Type /Pages /Kids [%s] /Count %d" % (kids, len(pages)))
        self.put(1, b"/Type /Catalog /Pages 2 0 R")
        size, table = max(self.offsets) + 1, self.out.tell()
        self.out.write(b"xref\n0 %d\n0000000000 65535 f \n" % size)
        self.out.write(b"".join(b"%010d 00000 n \n" % self.offsets[number]
                                for number in range(1, size)))
        self.out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n"
                       % (size, table))


def write_image_pdf(source: BinaryIO, out: BinaryIO,
                    max_pixels: int = DEFAULT_MAX_PIXELS) -> None:
    """The image in `source` (a seekable binary file) as a PDF written to `out`, a page at a
    time. 422 for an image that cannot be read or has a frame over `max_pixels`."""
    try:
        with Image.open(source) as image:
            _check_frames(image, max_pixels)
            objects, pages = _Objects(out), []
            for picture in _pictures(source, image):
                number = 3 + 3 * len(pages)
                objects.page(number, picture)
                pages.append(number + 2)
            objects.end(pages)
    except (ApiError, MemoryError):  # a builder out of memory says so (sandbox.py)
        raise
    except Exception as exc:  # PIL raises many types on odd images
        raise unprocessable(f"The image cannot be turned into a PDF page ({exc})") from None
