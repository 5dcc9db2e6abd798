"""Pages whose layout is known by construction, for `POST /layout-parsing`: a title, two
paragraphs and a ruled table (reportlab, the fonts the project installs)."""

from __future__ import annotations

from samples.accuracy_corpus import _pdf, _register_fonts

TITLE = "Quarterly Report"
PARAGRAPHS = [
    "The first paragraph describes the harvest of the northern farms. Rain came early "
    "and the wheat was taken in before the storms.",
    "The second paragraph lists the prices paid at the market. Every crate was counted "
    "twice and the totals agree with the ledger.",
]
TABLE = [["Item", "Count", "Price"],
         ["Apples", "12", "3.50"],
         ["Pears", "7", "4.25"],
         ["Plums", "30", "1.10"]]


def report_flowables(title: str = TITLE, paragraphs: list[str] = PARAGRAPHS,
                     table: list[list[str]] = TABLE):
    from reportlab.lib import colors
    from reportlab.lib.styles import ParagraphStyle
    from reportlab.platypus import Paragraph, Spacer, Table, TableStyle

    font = _register_fonts().get("latin", "Helvetica")
    body = ParagraphStyle("body", fontName=font, fontSize=12, leading=16)
    heading = ParagraphStyle("heading", parent=body, fontSize=24, leading=30)
    flow = [Paragraph(title, heading), Spacer(1, 18)]
    for paragraph in paragraphs:
        flow += [Paragraph(paragraph, body), Spacer(1, 12)]
    grid = Table(table, colWidths=[120, 90, 90], rowHeights=26)
    grid.setStyle(TableStyle([("FONT", (0, 0), (-1, -1), font, 12),
                              ("GRID", (0, 0), (-1, -1), 0.8, colors.black),
                              ("VALIGN", (0, 0), (-1, -1), "MIDDLE")]))
    return flow + [Spacer(1, 12), grid]


def report_pdf(pages: int = 1) -> bytes:
    """`pages` pages, each a titled report ("Quarterly Report 1", ...) with its table."""
    from reportlab.platypus import PageBreak

    flow = []
    for number in range(1, pages + 1):
        title = TITLE if pages == 1 else f"{TITLE} {number}"
        flow += report_flowables(title)
        if number < pages:
            flow.append(PageBreak())
    return _pdf(flow)
