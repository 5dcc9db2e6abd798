"""Checking searchable PDFs as a reader would, with poppler-utils: the text pdftotext gets
out, where `pdftotext -bbox` puts each word, how pdftoppm renders each page; and the raw
content streams of each page (pikepdf). Shared by the searchable-PDF tests."""

from __future__ import annotations

import html
import io
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pikepdf
import pytest
from PIL import Image, ImageChops

WORD = re.compile(r'<word xMin="([\d.]+)" yMin="([\d.]+)" xMax="([\d.]+)" yMax="([\d.]+)">'
                  r'(.*?)</word>')


def need_poppler() -> None:
    if not (shutil.which("pdftotext") and shutil.which("pdftoppm")):
        pytest.fail("poppler-utils is needed: scripts/install_system_deps.sh installs it")


def _run(args: list[str], pdf: bytes) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "in.pdf"
        path.write_bytes(pdf)
        return subprocess.run([*args, str(path), "-"], check=True, capture_output=True,
                              timeout=120).stdout


def page_texts(pdf: bytes) -> list[str]:
    """pdftotext's text of each page (it ends every page with a form feed)."""
    return _run(["pdftotext", "-enc", "UTF-8"], pdf).decode().split("\f")[:-1]


def page_words(pdf: bytes) -> list[list[tuple[float, float, float, float, str]]]:
    """Each page's words as (x0, y0, x1, y1, text), in points from the top-left corner of
    the page as shown (CropBox, rotated)."""
    out = _run(["pdftotext", "-bbox", "-cropbox", "-enc", "UTF-8"], pdf).decode()
    pages = out.split("<page ")[1:]
    return [[(float(a), float(b), float(c), float(d), html.unescape(t))
             for a, b, c, d, t in WORD.findall(page)] for page in pages]


def render(pdf: bytes, dpi: int = 40) -> list[Image.Image]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "in.pdf"
        path.write_bytes(pdf)
        subprocess.run(["pdftoppm", "-r", str(dpi), "-png", str(path), str(Path(tmp) / "p")],
                       check=True, capture_output=True, timeout=120)
        return [Image.open(p).convert("RGB") for p in sorted(Path(tmp).glob("p-*.png"))]


def differing_pixels(a: Image.Image, b: Image.Image) -> int:
    assert a.size == b.size
    difference = ImageChops.difference(a, b).convert("L")
    return sum(difference.histogram()[9:])  # pixels that differ by more than 8 levels


def cer(reference: str, hypothesis: str) -> float:
    """Character error rate: edit distance over the reference's length (whitespace left
    out: pdftotext decides spacing itself)."""
    ref, hyp = "".join(reference.split()), "".join(hypothesis.split())
    previous = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, start=1):
        current = [i]
        for j, h in enumerate(hyp, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1,
                               previous[j - 1] + (r != h)))
        previous = current
    return previous[-1] / max(1, len(ref))


def iou(a, b) -> float:
    x0, y0 = max(a[0], b[0]), max(a[1], b[1])
    x1, y1 = min(a[2], b[2]), min(a[3], b[3])
    inter = max(0.0, x1 - x0) * max(0.0, y1 - y0)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def line_ious(boxes_pt, words) -> list[float]:
    """For each expected line box (points, top-left origin): the IoU of the union of the
    words whose centre lies in it with the box (0 when none does)."""
    scores = []
    for box in boxes_pt:
        inside = [w for w in words if box[0] <= (w[0] + w[2]) / 2 <= box[2]
                  and box[1] <= (w[1] + w[3]) / 2 <= box[3]]
        if not inside:
            scores.append(0.0)
            continue
        union = (min(w[0] for w in inside), min(w[1] for w in inside),
                 max(w[2] for w in inside), max(w[3] for w in inside))
        scores.append(iou(union, box))
    return scores


def content_streams(pdf: bytes) -> list[list[bytes]]:
    """Each page's content streams, raw (as stored, still encoded)."""
    with pikepdf.open(io.BytesIO(pdf)) as document:
        pages = []
        for page in document.pages:
            contents = page.obj.get("/Contents")
            if contents is None:
                pages.append([])
            elif isinstance(contents, pikepdf.Array):
                pages.append([stream.read_raw_bytes() for stream in contents])
            else:
                pages.append([contents.read_raw_bytes()])
        return pages


def page_sizes(pdf: bytes) -> list[tuple[float, float]]:
    """Each page's size as shown (CropBox, rotated), in points."""
    with pikepdf.open(io.BytesIO(pdf)) as document:
        sizes = []
        for page in document.pages:
            box = [float(v) for v in page.cropbox]
            width, height = abs(box[2] - box[0]), abs(box[3] - box[1])
            rotate = int(page.obj.get("/Rotate", 0)) % 180
            sizes.append((height, width) if rotate else (width, height))
        return sizes
