"""Blocks in reading order -> Markdown, as PaddleX's PP-StructureV3 writes it: titles as
headings, tables as their HTML, headers, footers and page numbers left out by default."""

from __future__ import annotations

import re

from .request import DEFAULT_IGNORE
CENTERED = '<div style="text-align: center;">{}</div>'
PAGE_BREAK = "\n\n---\n\n"  # between pages, in a whole document's Markdown


def simplify_table(table_html: str) -> str:
    """The table without its <html><body> wrapper (PaddleX's simplify_table_func)."""
    return re.sub(r"</?(html|body)>", "", table_html)


def block_markdown(label: str, content: str, pretty: bool = True) -> str | None:
    """One block's Markdown, or None where it has none (no content, or an image)."""
    content = content.strip()
    if not content:
        return None
    if label == "doc_title":
        return "# " + " ".join(content.split())
    if label == "paragraph_title":
        return "## " + " ".join(content.split())
    if label == "table":
        table = simplify_table(content)
        return CENTERED.format(table) if pretty else table
    if label == "formula":
        return f"$${content}$$"
    if label in ("figure_title", "table_title", "chart_title") and pretty:
        return CENTERED.format(content)
    return content


def page_markdown(blocks: list[tuple[str, str]], ignore: tuple[str, ...] | list[str]
                  = DEFAULT_IGNORE, pretty: bool = True) -> str:
    """(label, content) pairs in reading order -> the page's Markdown."""
    parts = [block_markdown(label, content, pretty) for label, content in blocks
             if label not in ignore]
    return "\n\n".join(part for part in parts if part)


def document_markdown(pages: list[str]) -> str:
    """Every page's Markdown, in order, with a page break between pages."""
    return PAGE_BREAK.join(page.strip() for page in pages) + "\n"
