"""Large, varied page images like real scans, generated (no checked-in binaries), for the
memory soak (loadtest/bench_memory.py) and the worker's memory experiments:

- `dense_scan`: an A4 page of dense 10-point text at 300 dpi (2480 x 3508 px)
- `table_scan`: an A4 form with a ruled table at 300 dpi
- `photo_of_page`: a phone photo of a printed page, ~5000 x 7000 px: the page rotated a few
  degrees on a grey desk, uneven light, blur and sensor noise, saved as JPEG (what the issue's
  "300-dpi A4 receipt scan, about 5000 x 7000 px" is in practice)
- `receipt_scan`: a long narrow receipt scanned at 300 dpi
- `cjk_scan`: a dense Chinese book page at 300 dpi
- `scanned`: a flatbed scanner's skew, blur, tint and noise over any clean page (the accuracy
  corpus's scans at 150-400 dpi, samples/accuracy_corpus.py)
- `scanned_pdf`: a long scanned PDF of dense letters, one gray JPEG a page (the gateway memory
  bench's scanned document)

Every generator is deterministic in its seed. `scan_set(n)` cycles through all kinds."""

from __future__ import annotations

import io
import random
from typing import Callable

import cv2
import numpy as np
from PIL import Image, ImageDraw

from samples import documents

A4_IN = (8.27, 11.69)


def _a4(dpi: int) -> tuple[int, int]:
    return int(A4_IN[0] * dpi), int(A4_IN[1] * dpi)


def dense_scan(seed: int = 0, dpi: int = 300) -> Image.Image:
    """A dense letter: ~70 lines of 10-point text at `dpi`, a light paper tint."""
    page = documents.dense_page(seed, dpi=dpi)
    tint = np.asarray(page, np.int16) - np.int16(random.Random(seed).randint(4, 14))
    return Image.fromarray(np.clip(tint, 0, 255).astype(np.uint8))


def table_scan(seed: int = 0, dpi: int = 300, rows: int = 40) -> Image.Image:
    """A form: a heading and a ruled table (item, quantity, price, total) filling the page."""
    rng = random.Random(seed)
    width, height = _a4(dpi)
    page = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(page)
    size = int(dpi * 0.14)
    font = documents._font(documents.find_font(documents.LATIN_FONTS), size)
    margin = int(dpi * 0.6)
    draw.text((margin, margin), f"Statement {rng.randint(1000, 9999)}", fill="black",
              font=documents._font(documents.find_font(documents.LATIN_FONTS), size * 2))
    top = margin + size * 4
    row_h = (height - top - margin) // (rows + 1)
    columns = [margin, margin + (width - 2 * margin) * 45 // 100,
               margin + (width - 2 * margin) * 62 // 100,
               margin + (width - 2 * margin) * 80 // 100, width - margin]
    for r in range(rows + 2):
        draw.line([(margin, top + r * row_h), (width - margin, top + r * row_h)], "black", 3)
    for x in columns:
        draw.line([(x, top), (x, top + (rows + 1) * row_h)], "black", 3)
    header = ["item", "quantity", "price", "total"]
    for r in range(rows + 1):
        if r == 0:
            cells = header
        else:
            quantity, price = rng.randint(1, 99), rng.randint(100, 99999) / 100
            cells = [" ".join(rng.choice(documents.WORDS) for _ in range(2)), str(quantity),
                     f"{price:.2f}", f"{quantity * price:.2f}"]
        for c, text in enumerate(cells):
            draw.text((columns[c] + size // 2, top + r * row_h + (row_h - size) // 2), text,
                      fill="black", font=font)
    return page


def receipt_scan(seed: int = 0, dpi: int = 300, items: int = 60) -> Image.Image:
    """A till receipt (80 mm wide, as long as its items) scanned at `dpi`."""
    rng = random.Random(seed)
    lines = ["SUPERMARKET  No. %d" % rng.randint(100, 999), "-" * 30]
    for _ in range(items):
        lines.append(f"{rng.choice(documents.WORDS):<18}{rng.randint(1, 9999) / 100:>9.2f}")
    lines += ["-" * 30, f"TOTAL {rng.randint(1000, 99999) / 100:>20.2f}"]
    size = int(dpi * 0.13)
    return documents.text_image(lines, size=size, width=int(3.15 * dpi),
                                margin=int(dpi * 0.15), line_gap=1.4)


def cjk_scan(seed: int = 0, dpi: int = 300) -> Image.Image:
    """A dense Chinese book page at `dpi` (falls back to Latin text without a CJK font)."""
    font = documents.find_font(documents.CJK_FONTS)
    if font is None:
        return dense_scan(seed, dpi)
    rng = random.Random(seed)
    chars = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资边流路级少图山统接知较将组见计别她手角期根论运农指几九区强放决西被干做必战先回则任取据处理"  # noqa: E501
    width, height = _a4(dpi)
    size = int(dpi * 0.15)
    per_line = (width - 2 * int(dpi * 0.8)) // size
    count = (height - 2 * int(dpi * 0.8)) // int(size * 1.6)
    lines = ["".join(rng.choice(chars) for _ in range(per_line)) for _ in range(count)]
    page = documents.text_image(lines, font_path=font, size=size, width=width,
                                margin=int(dpi * 0.8), line_gap=1.6)
    canvas = Image.new("RGB", (width, height), "white")
    canvas.paste(page.crop((0, 0, width, min(height, page.height))), (0, 0))
    return canvas


def photo_of_page(seed: int = 0, size: tuple[int, int] = (5000, 7000),
                  page: Callable[[int, int], Image.Image] | None = None) -> Image.Image:
    """A phone photo of a printed page: the page (dense text at 600 dpi unless given) rotated
    by up to 4 degrees on a grey background, lit unevenly, slightly blurred, with noise."""
    rng = random.Random(seed)
    width, height = size
    printed = (page or dense_scan)(seed, 600)
    scale = min(width / printed.width, height / printed.height) * 0.92
    printed = printed.resize((int(printed.width * scale), int(printed.height * scale)))
    desk = np.full((height, width, 3), (96, 104, 112), np.uint8)
    x0, y0 = (width - printed.width) // 2, (height - printed.height) // 2
    desk[y0:y0 + printed.height, x0:x0 + printed.width] = np.asarray(printed)
    del printed
    angle = rng.uniform(-4, 4)
    matrix = cv2.getRotationMatrix2D((width / 2, height / 2), angle, 1.0)
    photo = cv2.warpAffine(desk, matrix, (width, height), borderValue=(96, 104, 112))
    del desk
    photo = cv2.GaussianBlur(photo, (5, 5), rng.uniform(0.6, 1.4))
    light = np.linspace(rng.uniform(0.75, 0.9), 1.0, width, dtype=np.float32)[None, :, None]
    photo = (photo * light).astype(np.uint8)
    noise = np.random.default_rng(seed).integers(-12, 13, size=photo.shape[:2], dtype=np.int16)
    photo = np.clip(photo.astype(np.int16) + noise[:, :, None], 0, 255).astype(np.uint8)
    return Image.fromarray(photo)


KINDS: dict[str, Callable[[int], Image.Image]] = {
    "dense": dense_scan,
    "table": table_scan,
    "photo": photo_of_page,
    "receipt": receipt_scan,
    "cjk": cjk_scan,
}


def scan_set(count: int, seed: int = 0, kinds: tuple[str, ...] = tuple(KINDS)
             ) -> list[tuple[str, bytes]]:
    """`count` (name, encoded file) pairs cycling through `kinds`: photos as JPEG (as phones
    save them), the rest as PNG (as scanners do for text)."""
    pages = []
    for index in range(count):
        kind = kinds[index % len(kinds)]
        image = KINDS[kind](seed + index)
        data = documents.to_jpeg(image, 88) if kind == "photo" else documents.to_png(image)
        pages.append((f"{kind}:{seed + index}:{image.width}x{image.height}", data))
    return pages


def scanned(page: Image.Image, dpi: float, seed: int = 0, skew: float | None = None
            ) -> Image.Image:
    """What a flatbed scanner makes of a clean page at `dpi`, in 8-bit gray (as text is
    scanned): skewed by up to 0.3 degrees, the optics' blur (about one of its own pixels, so
    the same at every resolution), a light paper tint and sensor noise. Deterministic in
    `seed` (the skew: `skew` degrees where given); the page keeps its size."""
    rng = random.Random(seed)
    angle = rng.uniform(-0.3, 0.3) if skew is None else skew
    pixels = np.asarray(page.convert("L"))
    height, width = pixels.shape
    matrix = cv2.getRotationMatrix2D((width / 2, height / 2), angle, 1.0)
    pixels = cv2.warpAffine(pixels, matrix, (width, height), flags=cv2.INTER_LINEAR,
                            borderValue=255)
    pixels = cv2.GaussianBlur(pixels, (0, 0), 0.5).astype(np.int16) - rng.randint(6, 16)
    pixels += np.random.default_rng(seed).normal(0, 4, (height, width)).astype(np.int16)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "L")


def add_image_page(document, data: bytes, size: tuple[int, int], gray: bool, dpi: float,
                   encoding: str) -> None:
    """A page holding only one image, appended to the pikepdf `document`: its encoded
    `data` (`encoding` the PDF filter's name: "DCTDecode" for a JPEG, "FlateDecode" for raw
    8-bit pixels deflated) of `size` pixels, drawn at `dpi` (the page size a scanner
    writes)."""
    import pikepdf
    from pikepdf import Array, Dictionary, Name

    width, height = size
    image = pikepdf.Stream(document, data)
    image.update(Dictionary(Type=Name.XObject, Subtype=Name.Image, Width=width, Height=height,
                            BitsPerComponent=8,
                            ColorSpace=Name.DeviceGray if gray else Name.DeviceRGB,
                            Filter=Name("/" + encoding)))
    width_pt, height_pt = width * 72 / dpi, height * 72 / dpi
    content = pikepdf.Stream(document, f"q {width_pt:.4f} 0 0 {height_pt:.4f} 0 0 cm "
                                       "/Im0 Do Q".encode())
    document.pages.append(pikepdf.Page(Dictionary(
        Type=Name.Page, MediaBox=Array([0, 0, width_pt, height_pt]),
        Resources=Dictionary(XObject=Dictionary(Im0=image)), Contents=content)))


def scanned_pdf(pages: int, dpi: int = 200, seed: int = 0, quality: int = 50) -> bytes:
    """A long scanned PDF as an office scanner writes one: `pages` dense letters, each
    `scanned` at `dpi` and stored as an 8-bit gray JPEG (about 0.4 MB a page at 200 dpi and
    quality 50). Built a page at a time, so one page's pixels are held at once."""
    import pikepdf

    document = pikepdf.new()
    for index in range(pages):
        page = scanned(documents.dense_page(seed + index, dpi=dpi), dpi, seed + index)
        jpeg = io.BytesIO()
        page.save(jpeg, "JPEG", quality=quality)
        add_image_page(document, jpeg.getvalue(), page.size, True, dpi, "DCTDecode")
    buffer = io.BytesIO()
    document.save(buffer, static_id=True)
    return buffer.getvalue()
