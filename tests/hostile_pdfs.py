"""Hostile PDFs whose text layer is the attack, written with pikepdf: tens of thousands of
one-glyph lines in one band of rows (PaddleOCR's insertion sort is quadratic in them), and
a ToUnicode map that turns a glyph into a lone surrogate."""

from __future__ import annotations

import io

import pikepdf

# a ToUnicode map: "b" is U+D800 (half of a UTF-16 pair, no character), "c" is itself
SURROGATE_CMAP = b"""/CIDInit /ProcSet findresource begin 12 dict begin begincmap
/CIDSystemInfo << /Registry (Adobe) /Ordering (UCS) /Supplement 0 >> def
/CMapName /Adobe-Identity-UCS def /CMapType 2 def
1 begincodespacerange <00> <FF> endcodespacerange
2 beginbfchar <62> <D800> <63> <0063> endbfchar
endcmap CMapName currentdict /CMap defineresource pop end end"""
SURROGATE_TEXT = b"Paid in full on the 3rd of May: thank you b"


def text_pdf(content: bytes, size: tuple[float, float], to_unicode: bytes | None = None) -> bytes:
    """One page of `size` points drawing `content` with Helvetica as /F1."""
    pdf = pikepdf.new()
    font = pikepdf.Dictionary(Type=pikepdf.Name.Font, Subtype=pikepdf.Name.Type1,
                              BaseFont=pikepdf.Name.Helvetica)
    if to_unicode is not None:
        font.ToUnicode = pdf.make_stream(to_unicode)
    pdf.add_blank_page(page_size=size)
    pdf.pages[0].Resources = pikepdf.Dictionary(
        Font=pikepdf.Dictionary(F1=pdf.make_indirect(font)))
    pdf.pages[0].Contents = pdf.make_stream(content)
    out = io.BytesIO()
    pdf.save(out, compress_streams=True)
    return out.getvalue()


def glyph_lines_pdf(count: int, per_row: int = 5600) -> bytes:
    """`count` glyphs of a 0.25 pt font, each a line of its own (every other one 0.4 pt
    lower, so no two in a row overlap), rows of `per_row` 0.8 pt apart: all in one band that
    PaddleOCR's order sorts as one run."""
    shows = []
    for i in range(count):
        row, column = divmod(i, per_row)
        x = 10 + (column // 2) * 0.2
        y = 700 - row * 0.8 - (column % 2) * 0.4
        shows.append(b"1 0 0 1 %.1f %.1f Tm(a)Tj" % (x, y))
    return text_pdf(b"BT /F1 0.25 Tf " + b" ".join(shows) + b" ET", (600, 800))


def surrogate_pdf() -> bytes:
    """A line of text whose last glyph's ToUnicode value is U+D800."""
    return text_pdf(b"BT /F1 14 Tf 20 50 Td (" + SURROGATE_TEXT + b") Tj ET", (400, 100),
                    SURROGATE_CMAP)
