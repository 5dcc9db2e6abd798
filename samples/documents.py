"""Generated test documents (no checked-in binaries): rendered text images in English and
Chinese, dense A4 pages, born-digital multi-page PDFs whose pages say which page they are,
table PDFs and scanned (image-only) PDFs. Used by the tests and the load/benchmark scenarios."""

from __future__ import annotations

import io
import os
import random
import re
from functools import lru_cache

from PIL import Image, ImageDraw, ImageFont

LATIN_FONTS = ("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",)
CJK_FONTS = ("/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc",
             "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc")

WORDS = ("invoice total amount payment receipt order number customer account balance "
         "shipping address quantity price date reference service product delivery tax "
         "subtotal discount contract report summary project budget schedule").split()


def find_font(candidates) -> str | None:
    return next((path for path in candidates if os.path.isfile(path)), None)


@lru_cache(maxsize=16)
def _font(path: str, size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(path, size)


def text_image(lines: list[str], font_path: str | None = None, size: int = 40,
               width: int | None = None, margin: int = 30, line_gap: float = 1.6) -> Image.Image:
    """Black text on white, one line per entry."""
    font = _font(font_path or find_font(LATIN_FONTS), size)
    widths = [font.getlength(line) for line in lines]
    width = width or int(max(widths) + 2 * margin)
    height = int(len(lines) * size * line_gap + 2 * margin)
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    for index, line in enumerate(lines):
        draw.text((margin, margin + index * size * line_gap), line, fill="black", font=font)
    return image


def to_png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def to_jpeg(image: Image.Image, quality: int = 90) -> bytes:
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def english_lines(count: int, seed: int = 0, words_per_line: int = 6) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words_per_line)) + f" {rng.randint(10, 9999)}"
            for _ in range(count)]


def dense_page(seed: int = 0, dpi: int = 150) -> Image.Image:
    """An A4 page at `dpi` filled with ~45 lines of 11-point-ish text, like a dense letter."""
    width, height = int(8.27 * dpi), int(11.69 * dpi)
    size = max(12, int(dpi * 0.15))
    lines = english_lines(int((height - 2 * size * 3) / (size * 1.5)), seed, words_per_line=9)
    page = text_image(lines, size=size, width=width, margin=size * 3, line_gap=1.5)
    canvas = Image.new("RGB", (width, height), "white")
    canvas.paste(page.crop((0, 0, width, min(height, page.height))), (0, 0))
    return canvas


def page_label(number: int, total: int) -> str:
    return f"Page {number} of {total}"


_LABEL_RE = re.compile(r"Page\s*([0-9lIO|]+)\s*of\s*([0-9lIO|]+)", re.IGNORECASE)
_DIGIT_LOOKALIKES = str.maketrans({"l": "1", "I": "1", "|": "1", "O": "0"})


def read_page_label(text: str) -> tuple[int, int] | None:
    """(number, total) from OCR'd "Page i of N", forgiving the usual digit look-alikes
    (l/I/| for 1, O for 0) that a small OCR model produces."""
    match = _LABEL_RE.search(text)
    if not match:
        return None
    number, total = (int(group.translate(_DIGIT_LOOKALIKES)) for group in match.groups())
    return number, total


def has_page_label(text: str, number: int, total: int) -> bool:
    return read_page_label(text) == (number, total)


def labelled_pdf(num_pages: int, lines_per_page: int = 3, seed: int = 0) -> bytes:
    """A born-digital PDF (vector text, Letter size) whose page i says "Page i of N" in large
    type, followed by a few lines of words."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.backends.backend_pdf import PdfPages
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    with PdfPages(buffer) as pdf:
        for number in range(1, num_pages + 1):
            figure = plt.figure(figsize=(8.5, 11))
            figure.text(0.1, 0.9, page_label(number, num_pages), fontsize=28)
            for row, line in enumerate(english_lines(lines_per_page, seed + number, 4)):
                figure.text(0.1, 0.8 - row * 0.05, line, fontsize=16)
            pdf.savefig(figure)
            plt.close(figure)
    return buffer.getvalue()


def table_pdf(num_pages: int, rows: int = 12, seed: int = 0) -> bytes:
    """A born-digital PDF with one ruled table per page (item, quantity, price, total) and a
    "Page i of N" heading."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.backends.backend_pdf import PdfPages
    import matplotlib.pyplot as plt

    rng = random.Random(seed)
    buffer = io.BytesIO()
    with PdfPages(buffer) as pdf:
        for number in range(1, num_pages + 1):
            figure = plt.figure(figsize=(8.5, 11))
            figure.text(0.1, 0.93, f"Quarterly report  {page_label(number, num_pages)}",
                        fontsize=18)
            axes = figure.add_axes([0.1, 0.3, 0.8, 0.58])
            axes.axis("off")
            cells = []
            for _ in range(rows):
                quantity, price = rng.randint(1, 40), rng.randint(100, 9999) / 100
                cells.append([rng.choice(WORDS), str(quantity), f"{price:.2f}",
                              f"{quantity * price:.2f}"])
            table = axes.table(cellText=cells, colLabels=["item", "quantity", "price", "total"],
                               loc="upper center")
            table.set_fontsize(13)
            table.scale(1, 1.8)
            pdf.savefig(figure)
            plt.close(figure)
    return buffer.getvalue()


def image_pdf(images: list[Image.Image], dpi: int = 150) -> bytes:
    """A 'scanned' PDF: each page is one raster image."""
    buffer = io.BytesIO()
    first, *rest = [image.convert("RGB") for image in images]
    first.save(buffer, format="PDF", save_all=True, append_images=rest, resolution=dpi)
    return buffer.getvalue()


def multipage_tiff(images: list[Image.Image]) -> bytes:
    """A multi-page TIFF (as a fax or a batch scanner writes), one frame per image."""
    buffer = io.BytesIO()
    first, *rest = [image.convert("RGB") for image in images]
    first.save(buffer, format="TIFF", save_all=True, append_images=rest, compression="tiff_lzw")
    return buffer.getvalue()


def labelled_tiff(num_pages: int) -> bytes:
    return multipage_tiff([text_image([page_label(n, num_pages), "Fax transmission"], size=36)
                           for n in range(1, num_pages + 1)])


def dense_pdf(num_pages: int, seed: int = 0) -> bytes:
    """A born-digital A4 PDF (reportlab, Helvetica 10 pt) whose page i starts with "Page i of N"
    in large type, then ~50 lines of words: the dense pages of a real letter or report, with
    a label that proves the order of the answer."""
    from reportlab.lib.pagesizes import A4
    from reportlab.pdfgen import canvas

    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=A4, invariant=1)
    width, height = A4
    for number in range(1, num_pages + 1):
        pdf.setFont("Helvetica-Bold", 20)
        pdf.drawString(50, height - 60, page_label(number, num_pages))
        pdf.setFont("Helvetica", 10)
        for row, line in enumerate(english_lines(52, seed * 1000 + number, words_per_line=11)):
            pdf.drawString(50, height - 95 - row * 13.5, line)
        pdf.showPage()
    pdf.save()
    return buffer.getvalue()


def repeated_pdf(distinct: int, total: int) -> bytes:
    """`total` pages that repeat `distinct` labelled pages in turn (a cover sheet, a form):
    what the page cache reads once."""
    import pypdfium2 as pdfium

    source = pdfium.PdfDocument(labelled_pdf(distinct))
    target = pdfium.PdfDocument.new()
    target.import_pages(source, [i % distinct for i in range(total)])
    buffer = io.BytesIO()
    target.save(buffer)
    return buffer.getvalue()
