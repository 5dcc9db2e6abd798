"""An image's pixels as the worker reads them and a viewer shows them, in one place for the
worker (services/ocr_worker/decode.py), the gateway's TIFF chunks (gateway/split.py) and the
searchable PDF's pages (gateway/outputs/image_pdf.py), so that all three see the same page.

The worker reads a one-frame image with OpenCV (as PaddleX does), and a multi-frame TIFF's
frames with Pillow. Where the two differ, Pillow's frame is made what OpenCV makes of it, or,
where OpenCV loses the page, what a viewer shows:
- 16-bit gray samples become their high byte, as OpenCV makes them (Pillow's conversion
  clipped every sample over 255 to white: a 16-bit scan read as blank pages);
- a transparent image is laid over white. OpenCV drops the alpha and keeps the colour under
  it, often black: black text on a transparent background read as a black page.
OpenCV turns a JPEG (and a phone's MPO) and a PNG upright by its EXIF orientation, a WebP
not; Pillow turns a TIFF by its own tag as it opens it."""

from __future__ import annotations

from PIL import Image, ImageOps

SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")  # "I": how some 16-bit files open
TRANSPARENT_MODES = ("RGBA", "LA", "PA")
UPRIGHTED = ("JPEG", "MPO", "PNG")  # the formats whose EXIF orientation OpenCV applies


def eight_bit(frame: Image.Image) -> Image.Image:
    """A frame of 16-bit gray samples as 8-bit gray (each sample's high byte, as OpenCV
    decodes such a file); any other frame as it is."""
    if frame.mode not in SIXTEEN_BIT_MODES:
        return frame
    # a linear map Pillow applies exactly (1/256 is a power of two) and truncates; "L" clips
    return frame.convert("I").point(lambda sample: sample * (1 / 256)).convert("L")


def transparent(frame: Image.Image) -> bool:
    return frame.mode in TRANSPARENT_MODES or "transparency" in frame.info


def as_shown(frame: Image.Image) -> Image.Image:
    """The frame's pixels as shown on a page: 16-bit gray as 8-bit (eight_bit), a transparent
    frame over white (RGB); any other frame as it is. An alpha that hides every pixel is
    no-one's intent (a 32-bit BMP or an export that left it at 0): such a frame is taken
    as its colours, as OpenCV takes it, not as a blank page."""
    frame = eight_bit(frame)
    if not transparent(frame):
        return frame
    rgba = frame.convert("RGBA")
    if rgba.getchannel("A").getextrema()[1] == 0:
        return rgba.convert("RGB")
    return Image.alpha_composite(Image.new("RGBA", rgba.size, "white"), rgba).convert("RGB")


def upright(image: Image.Image) -> Image.Image:
    """The image turned by its EXIF orientation where OpenCV would turn it (UPRIGHTED)."""
    return ImageOps.exif_transpose(image) if image.format in UPRIGHTED else image
