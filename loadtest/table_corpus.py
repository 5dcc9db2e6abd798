"""A table corpus whose structure is known by construction, for `make bench-layout` (TEDS) and
tests/test_layout.py: ruled, unruled and spanning tables of English words and numbers, each
written as HTML (the truth) and drawn with PIL from that HTML's grid (DejaVu Sans, the font
the project installs) at 150 and 300 dpi on an A4 page, under a one-line caption and over a
short paragraph of prose, clean and degraded like a scan (slight rotation, blur, noise, JPEG).
Deterministic: every choice comes from a seeded random.Random."""

from __future__ import annotations

import html
import io
import random
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from samples.documents import WORDS

FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
BOLD = "/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf"
KINDS = ("ruled", "unruled", "spanning")
DPIS = (150, 300)
FONT_PT, CAPTION_PT, MARGIN_PT = 10.0, 12.0, 36.0
PAD_X_PT, ROW_PT = 6.0, 20.0  # cell padding left/right; row height
UNRULED_GAP_PT = 18.0  # extra space between an unruled table's columns


@dataclass
class Cell:
    text: str
    rowspan: int = 1
    colspan: int = 1
    header: bool = False


@dataclass
class TableSpec:
    """One table: its rows of cells as HTML lists them (a spanned position has no cell)."""
    name: str
    kind: str  # ruled | unruled | spanning
    caption: str
    rows: list[list[Cell]]
    booktabs: bool = False  # unruled with three horizontal rules (top, under the header, bottom)
    seed: int = 0
    columns: int = field(init=False)

    def __post_init__(self):
        self.columns = max(c0 + cell.colspan for _, c0, cell in self.placed())

    def placed(self) -> list[tuple[int, int, Cell]]:
        """(row, column, cell) of every cell, the columns found as HTML lays them out."""
        taken: set[tuple[int, int]] = set()
        out = []
        for r, row in enumerate(self.rows):
            c = 0
            for cell in row:
                while (r, c) in taken:
                    c += 1
                out.append((r, c, cell))
                for dr in range(cell.rowspan):
                    for dc in range(cell.colspan):
                        taken.add((r + dr, c + dc))
                c += cell.colspan
        return out

    def html(self) -> str:
        """The truth, in the shape PaddleX's pred_html has: <html><body><table>, td only."""
        rows = []
        for row in self.rows:
            cells = []
            for cell in row:
                spans = "".join(f' {name}="{n}"' for name, n in (("rowspan", cell.rowspan),
                                                                  ("colspan", cell.colspan))
                                if n > 1)
                cells.append(f"<td{spans}>{html.escape(cell.text)}</td>")
            rows.append("<tr>" + "".join(cells) + "</tr>")
        return "<html><body><table>" + "".join(rows) + "</table></body></html>"


def _word(rng: random.Random) -> str:
    return rng.choice(WORDS)


def _value(rng: random.Random, column: int) -> str:
    kind = column % 3
    if kind == 0:
        return str(rng.randint(1, 999))
    if kind == 1:
        return f"{rng.randint(1, 9999)}.{rng.randint(0, 99):02d}"
    return f"{rng.randint(1, 99)}%"


def make_table(kind: str, index: int, seed: int = 2026) -> TableSpec:
    """The index-th table of a kind: 3-5 columns, 4-8 body rows, a header row; spanning
    tables have a two-row header (a group heading over two columns) and a first column whose
    cells span two rows."""
    s = seed * 1000 + KINDS.index(kind) * 100 + index
    rng = random.Random(s)
    columns = rng.randint(3, 5)
    body_rows = rng.randint(4, 8)
    caption = f"Table {index + 1}. {_word(rng).capitalize()} {_word(rng)} by {_word(rng)}"
    label = [_word(rng).capitalize() for _ in range(columns)]
    rows: list[list[Cell]] = []
    if kind == "spanning":
        group = rng.randint(1, columns - 2)  # the group heading spans columns group, group + 1
        top = [Cell(label[0], rowspan=2, header=True)]
        for c in range(1, columns):
            if c == group:
                top.append(Cell(f"{_word(rng).capitalize()} {_word(rng)}", colspan=2,
                                header=True))
            elif c != group + 1:
                top.append(Cell(label[c], rowspan=2, header=True))
        rows += [top, [Cell(label[group], header=True), Cell(label[group + 1], header=True)]]
        if body_rows % 2:
            body_rows += 1
        for r in range(body_rows):
            row = [Cell(f"{_word(rng).capitalize()} {rng.randint(1, 99)}", rowspan=2)] \
                if r % 2 == 0 else []
            row += [Cell(_value(rng, c)) for c in range(1, columns)]
            rows.append(row)
    else:
        rows.append([Cell(text, header=True) for text in label])
        for _ in range(body_rows):
            rows.append([Cell(f"{_word(rng).capitalize()} {_word(rng)}")]
                        + [Cell(_value(rng, c)) for c in range(1, columns)])
    return TableSpec(f"{kind}-{index + 1}", kind, caption, rows,
                     booktabs=kind == "unruled" and index % 2 == 0, seed=s)


def corpus(per_kind: int, seed: int = 2026) -> list[TableSpec]:
    return [make_table(kind, i, seed) for kind in KINDS for i in range(per_kind)]


# ---- drawing ------------------------------------------------------------------------------------
A4_IN = (8.27, 11.69)


def render(spec: TableSpec, dpi: float, page_size: str = "a4") -> Image.Image:
    """The table under its caption and over a paragraph of prose, drawn at dpi (RGB) on an A4
    page (page_size "a4") or on a page just large enough for the caption and the table
    ("tight"). info["table_box"]: the table's box; info["words"]: each cell's text box."""
    px = dpi / 72.0
    font = ImageFont.truetype(FONT, round(FONT_PT * px))
    bold = ImageFont.truetype(BOLD, round(FONT_PT * px))
    caption_font = ImageFont.truetype(BOLD, round(CAPTION_PT * px))
    pad = PAD_X_PT * px + (UNRULED_GAP_PT * px / 2 if spec.kind == "unruled" else 0)
    row_h = ROW_PT * px
    placed = spec.placed()

    def text_width(cell: Cell) -> float:
        return (bold if cell.header else font).getlength(cell.text) + 2 * pad

    widths = [0.0] * spec.columns
    for _, c, cell in placed:
        if cell.colspan == 1:
            widths[c] = max(widths[c], text_width(cell))
    for _, c, cell in placed:  # a spanning cell wider than its columns widens the last one
        if cell.colspan > 1:
            short = text_width(cell) - sum(widths[c:c + cell.colspan])
            if short > 0:
                widths[c + cell.colspan - 1] += short
    margin = MARGIN_PT * px
    caption_h = CAPTION_PT * px * 2.2
    table_w, table_h = sum(widths), row_h * len(spec.rows)
    size = (int(table_w + 2 * margin), int(table_h + caption_h + 2 * margin))
    if page_size == "a4":
        size = (max(size[0], int(A4_IN[0] * dpi)), max(size[1], int(A4_IN[1] * dpi)))
    page = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(page)
    draw.text((margin, margin), spec.caption, font=caption_font, fill="black")
    x0, y0 = margin, margin + caption_h
    xs = [x0 + sum(widths[:c]) for c in range(spec.columns + 1)]
    line = max(1, round(0.6 * px))
    header_rows = max(r + cell.rowspan for r, _, cell in placed if cell.header) \
        if any(cell.header for _, _, cell in placed) else 0
    words = []  # (box, text) of every cell's text, in page pixels
    for r, c, cell in placed:
        left, right = xs[c], xs[c + cell.colspan]
        top, bottom = y0 + r * row_h, y0 + (r + cell.rowspan) * row_h
        face = bold if cell.header else font
        ascent, descent = face.getmetrics()
        ty = (top + bottom) / 2 - (ascent + descent) / 2
        numeric = cell.text.replace(".", "").replace("%", "").isdigit()
        tx = right - pad - face.getlength(cell.text) if numeric else left + pad
        draw.text((tx, ty), cell.text, font=face, fill="black")
        words.append((list(draw.textbbox((tx, ty), cell.text, font=face)), cell.text))
        if spec.kind != "unruled":
            draw.rectangle([left, top, right, bottom], outline="black", width=line)
    if spec.kind == "unruled" and spec.booktabs:
        for y, w in ((y0, 2 * line), (y0 + header_rows * row_h, line), (y0 + table_h, 2 * line)):
            draw.line([(x0, y), (x0 + table_w, y)], fill="black", width=w)
    if page_size == "a4":  # a paragraph under the table, wrapped to the page's text width
        from samples.accuracy_corpus import english_sentences

        y, leading = y0 + table_h + 2 * FONT_PT * px, FONT_PT * px * 1.4
        line = ""
        for word in " ".join(english_sentences(3, spec.seed)).split():
            if font.getlength(f"{line} {word}".strip()) > size[0] - 2 * margin:
                draw.text((margin, y), line, font=font, fill="black")
                line, y = word, y + leading
            else:
                line = f"{line} {word}".strip()
        draw.text((margin, y), line, font=font, fill="black")
    page.info["words"] = words
    page.info["table_box"] = (int(x0), int(y0), int(x0 + table_w) + 1, int(y0 + table_h) + 1)
    return page


def degrade(image: Image.Image, dpi: float, seed: int) -> Image.Image:
    """Like a scan: rotated by 0.4-1.2 degrees either way, blurred, grey noise, JPEG at 45-65."""
    rng = random.Random(seed)
    angle = rng.uniform(0.4, 1.2) * rng.choice((-1, 1))
    out = image.rotate(angle, resample=Image.BICUBIC, expand=True, fillcolor="white")
    out = out.filter(ImageFilter.GaussianBlur(radius=0.5 * dpi / 150))
    noise = np.random.default_rng(seed).normal(0, 10, (out.height, out.width, 1))
    pixels = np.clip(np.asarray(out, dtype=np.float32) + noise, 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=rng.randint(45, 65))
    return Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")


@dataclass
class TableImage:
    spec: TableSpec
    dpi: int
    degraded: bool
    image: Image.Image

    @property
    def name(self) -> str:
        return f"{self.spec.name}@{self.dpi}dpi{'-degraded' if self.degraded else ''}"


def images(per_kind: int, dpis=DPIS, degraded=(False, True), seed: int = 2026
           ) -> list[TableImage]:
    out = []
    for spec in corpus(per_kind, seed):
        for dpi in dpis:
            clean = render(spec, dpi)
            for worn in degraded:
                out.append(TableImage(spec, dpi, worn, degrade(clean, dpi, spec.seed + dpi)
                                      if worn else clean))
    return out
