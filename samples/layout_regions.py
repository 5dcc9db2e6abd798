"""The layout regions of the accuracy corpus's born-digital pages (samples/accuracy_corpus.py),
known by construction: the same PDFs built again while reportlab's Flowable.drawOn is watched,
so every heading Paragraph (a title), body Paragraph (text) and Table (table) is recorded where
it was drawn, then tightened to its ink on the page as rendered (144 dpi, as the corpus renders
it). For `make bench-layout`'s region F1 (loadtest/bench_layout.py)."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from samples import accuracy_corpus

DPI = 144.0
CLASSES = ("title", "text", "table")


@dataclass
class RegionPage:
    name: str
    image: np.ndarray  # BGR, as accuracy_corpus.render gives it
    pdf: bytes
    regions: list[tuple[str, tuple[int, int, int, int]]]  # (class, (x0, y0, x1, y1) pixels)


@contextmanager
def _drawn():
    from reportlab.platypus import Paragraph, Table
    from reportlab.platypus.flowables import Flowable

    records = []
    original = Flowable.drawOn

    def draw_on(self, canvas, x, y, _sW=0):
        if isinstance(self, (Paragraph, Table)):
            records.append((canvas, canvas.getPageNumber(), self, self._hAlignAdjust(x, _sW), y))
        return original(self, canvas, x, y, _sW)

    Flowable.drawOn = draw_on
    try:
        yield records
    finally:
        Flowable.drawOn = original


def _class_of(flowable) -> str:
    from reportlab.platypus import Table

    if isinstance(flowable, Table):
        return "table"
    return "title" if flowable.style.name == "heading" else "text"


def _ink(image: np.ndarray, box: tuple[float, float, float, float], margin: int = 2
         ) -> tuple[int, int, int, int] | None:
    """The box tightened to the dark pixels inside it (grown by margin first)."""
    height, width = image.shape[:2]
    x0, y0 = max(0, int(box[0]) - margin), max(0, int(box[1]) - margin)
    x1, y1 = min(width, int(box[2]) + margin + 1), min(height, int(box[3]) + margin + 1)
    gray = image[y0:y1, x0:x1].mean(axis=2) if image.ndim == 3 else image[y0:y1, x0:x1]
    ys, xs = np.nonzero(gray < 160)
    if not len(xs):
        return None
    return x0 + int(xs.min()), y0 + int(ys.min()), x0 + int(xs.max()) + 1, y0 + int(ys.max()) + 1


def pages() -> list[RegionPage]:
    """Every born-digital page of the accuracy corpus with its title, text and table regions."""
    with _drawn() as records:
        pdfs = accuracy_corpus.born_digital_pdfs()
    canvases = []
    for canvas, *_ in records:
        if not any(canvas is seen for seen in canvases):
            canvases.append(canvas)
    if len(canvases) != len(pdfs):
        raise RuntimeError(f"{len(canvases)} canvases drawn for {len(pdfs)} PDFs")
    scale = DPI / 72.0
    out = []
    for (name, pdf), canvas in zip(pdfs.items(), canvases):
        images = accuracy_corpus.render(pdf, DPI)
        page_h = canvas._pagesize[1]
        for number, image in enumerate(images, start=1):
            regions = []
            for seen, page, flowable, x, y in records:
                if seen is not canvas or page != number:
                    continue
                w = getattr(flowable, "_width", None) or flowable.width
                h = getattr(flowable, "_height", None) or flowable.height
                box = (x * scale, (page_h - y - h) * scale, (x + w) * scale, (page_h - y) * scale)
                tight = _ink(image, box)
                if tight is not None:
                    regions.append((_class_of(flowable), tight))
            out.append(RegionPage(f"{name}/p{number}", image, pdf, regions))
    return out
