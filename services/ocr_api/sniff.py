"""Telling a PDF from an image by its first bytes (magic numbers), without decoding it."""

from __future__ import annotations

KIND_PDF = "pdf"
KIND_IMAGE = "image"

_TIFF_MAGIC = (
    b"II*\x00",  # TIFF, little-endian
    b"MM\x00*",  # TIFF, big-endian
    b"II+\x00",  # BigTIFF, little-endian
    b"MM\x00+",  # BigTIFF, big-endian
)
_IMAGE_MAGIC = (
    b"\x89PNG\r\n\x1a\n",  # PNG
    b"\xff\xd8\xff",  # JPEG
    b"BM",  # BMP
    *_TIFF_MAGIC,
)


def sniff_kind(data: bytes) -> str | None:
    """KIND_PDF, KIND_IMAGE, or None when the bytes are neither."""
    if b"%PDF-" in data[:1024]:
        return KIND_PDF
    if data.startswith(_IMAGE_MAGIC):
        return KIND_IMAGE
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return KIND_IMAGE
    return None


def is_tiff(data: bytes) -> bool:
    return data.startswith(_TIFF_MAGIC)


def describe_kind(kind: str) -> str:
    return "a PDF" if kind == KIND_PDF else "an image"
