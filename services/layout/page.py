"""One page's layout-parsing result (PaddleX's `prunedResult` plus its Markdown) from the
page image, the OCR pipeline's JSON for it and the layout and table models. Pure but for
the two model calls it is given."""

from __future__ import annotations

import re
from statistics import median
from typing import Any, Callable

import numpy as np

from . import deskew, markdown, regions as layout_regions, ruled, tables
from .request import LayoutOptions
from .order import (Block, Line, assign_lines, group_loose_lines, is_grid, reading_order,
                    sort_lines, split_paragraphs, union)

# regions read as a block of text lines (a table's lines go to its cells instead)
TEXT_LIKE = {"text", "paragraph_title", "doc_title", "figure_title", "header", "footer",
             "reference", "formula", "number", "footnote"}


def ocr_lines(ocr: dict[str, Any], straight: deskew.Straighten | None = None) -> list[Line]:
    """The OCR pipeline's rec_boxes and rec_texts as Lines; with `straight`, each line's box
    on the straightened page (around its polygon, rec_polys, where the pipeline gave one)."""
    boxes = ocr.get("rec_boxes") or []
    texts = ocr.get("rec_texts") or []
    if straight is None:
        return [Line(tuple(float(v) for v in box), text) for box, text in zip(boxes, texts)]
    polys = ocr.get("rec_polys") or []
    if len(polys) != len(texts):
        polys = [deskew.corners(box) for box in boxes]
    return [Line(straight.to_straight(poly), text) for poly, text in zip(polys, texts)]


def block_text(indexes: list[int], lines: list[Line]) -> str:
    return " ".join(lines[i].text.strip() for i in sort_lines(indexes, lines)
                    if lines[i].text.strip())


def name_titles(blocks: list[Block], lines: list[Line]) -> None:
    """Titles by their lines' height: a short text or header block (at most 2 lines) whose
    lines are 1.4× the page's median line or more becomes a paragraph_title (the model misses large
    titles); the first title, when it comes before any text and is the page's largest line,
    becomes the doc_title."""
    heights = [line.box[3] - line.box[1] for line in lines]
    if not heights:
        return
    typical = median(heights)
    largest = max(heights)

    def height_of(block: Block) -> float:
        return max((heights[i] for i in block.lines), default=0.0)

    for block in blocks:  # a "header" in large type is a title, not a running head
        if (block.label in ("text", "header") and 0 < len(block.lines) <= 2
                and height_of(block) >= 1.4 * typical):
            block.label = "paragraph_title"
    for block in blocks:
        if block.label in ("header", "footer"):
            continue
        if block.label == "paragraph_title" and height_of(block) >= largest - 1e-6 \
                and height_of(block) >= 1.4 * typical:
            block.label = "doc_title"
        break


# what a bibliography entry carries: a leading number ([1], 1., (1)), GB/T 7714's type marks
# ([J], [M], ...), a cited year ("(2019)", ", 2019."), "et al.", a DOI or arXiv id, pages
# or a volume
_CITATION = re.compile(
    r"^\s*(\[\d{1,3}\]|\(\d{1,3}\)|\d{1,3}\.\s)"
    r"|\[(J|M|C|D|R|S|P|N|Z|A|EB/OL|DB/OL)\]"
    r"|\(\s*(19|20)\d{2}[a-z]?\s*\)|,\s*(19|20)\d{2}[a-z]?\."
    r"|\bet\s+al\b|\bdoi\b|doi\.org|arxiv|\bpp?\.\s*\d|\bvol\.\s*\d", re.I)


def name_references(blocks: list[Block], lines: list[Line]) -> None:
    """A `reference` block (CDLA's class for a bibliography's entries) that carries nothing
    of a citation is text. The model, trained on Chinese papers, where Latin-script prose
    is mostly the reference list, calls plain English paragraphs `reference`; PaddleX's own
    layout model (PP-DocLayout) calls them text, and the Markdown reads them as text."""
    for block in blocks:
        if block.label == "reference" and not _CITATION.search(block_text(block.lines, lines)):
            block.label = "text"


def parse_page(image: np.ndarray, ocr: dict[str, Any], options: LayoutOptions,
               detect: Callable[[np.ndarray], list[np.ndarray]],
               table_structure: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
               table_vocab: list[str],
               ruled_lines: Callable[[np.ndarray], np.ndarray] | None = None
               ) -> tuple[dict[str, Any], str]:
    """(prunedResult, Markdown) for one page. `detect`: the layout model on its
    preprocessed input; `table_structure`: SLANet_plus on its preprocessed input;
    `ruled_lines`: the ruled-table line model on its (None: every table goes to
    SLANet_plus). A skewed scan is straightened first (services/layout/deskew.py): regions
    and tables are found on the straight page, and their boxes are given on the page as
    sent."""
    height, width = image.shape[:2]
    skew = deskew.estimate(ocr)
    straight = deskew.Straighten((height, width), skew) \
        if abs(skew) >= deskew.MIN_ANGLE else None
    work = straight.image(image) if straight is not None else image
    found = layout_regions.postprocess(detect(layout_regions.preprocess(work)),
                                       work.shape[:2], options.layout_threshold)
    found = layout_regions.drop_contained(found)
    lines = ocr_lines(ocr, straight)
    blocks = [Block(region.label, region.box) for region in found]
    loose = assign_lines(blocks, lines)
    for block in blocks:  # a table the model took for text: its lines in rows and columns
        if block.label == "text" and is_grid(block.lines, lines):
            block.label = "table"
            block.box = union([block.box, *(lines[i].box for i in block.lines)])
    blocks += group_loose_lines(loose, lines)
    blocks = [b for b in blocks if b.lines or b.label in ("table", "image")]
    for block in blocks:
        if block.label in TEXT_LIKE and block.lines:  # the region, grown to its lines
            block.box = tuple(min(a, b) if k < 2 else max(a, b) for k, (a, b) in
                              enumerate(zip(block.box, _union(block, lines))))
    blocks = [part for block in blocks for part in split_paragraphs(block, lines)]
    name_references(blocks, lines)
    name_titles(blocks, lines)
    ordered = reading_order(blocks, width)
    table_results = []
    for block in ordered:
        if block.label == "table" and options.use_table_recognition:
            block.content, table_json = recognise_table(
                work, block, lines, table_structure, table_vocab,
                None if options.use_e2e_wired_table_rec_model else ruled_lines)
            if straight is not None:
                table_json["cell_box_list"] = [
                    [round(v, 2) for v in straight.to_page(cell)]
                    for cell in table_json["cell_box_list"]]
            table_json["table_region_id"] = len(table_results)
            table_results.append(table_json)
        elif block.label != "image":
            block.content = block_text(block.lines, lines)
    if straight is not None:  # every box back on the page as sent
        for block in ordered:
            block.box = straight.to_page(block.box)
        for region in found:
            region.box = straight.to_page(region.box)
    parsing = [{"block_label": b.label, "block_content": b.content,
                "block_bbox": [int(round(v)) for v in b.box], "block_id": i,
                "block_order": i + 1 if b.label not in options.markdown_ignore_labels
                else None}
               for i, b in enumerate(ordered)]
    pruned = {"width": width, "height": height, "model_settings": options.settings(),
              "parsing_res_list": parsing,
              "layout_det_res": {"boxes": [r.as_json(_cls_id(r.label)) for r in found]},
              "overall_ocr_res": ocr}
    if options.use_table_recognition and table_results:
        pruned["table_res_list"] = table_results
    text = markdown.page_markdown([(b.label, b.content) for b in ordered],
                                  options.markdown_ignore_labels, options.pretty_markdown)
    return pruned, text


def _union(block: Block, lines: list[Line]):
    boxes = [lines[i].box for i in block.lines]
    return (min(b[0] for b in boxes), min(b[1] for b in boxes),
            max(b[2] for b in boxes), max(b[3] for b in boxes))


def _cls_id(label: str) -> int:
    for i, name in enumerate(layout_regions.CDLA_LABELS):
        if layout_regions.PADDLEX_LABEL[name] == label:
            return i
    return -1


def recognise_table(image: np.ndarray, block: Block, lines: list[Line],
                    table_structure, vocab: list[str], ruled_lines=None
                    ) -> tuple[str, dict[str, Any]]:
    """The table block's HTML, its cells filled from the OCR lines inside it: a ruled table
    (long rules both ways in its crop) from the line model's cells when `ruled_lines` is
    given and finds cells, any other from SLANet_plus's structure."""
    x0, y0, x1, y1 = (int(max(0, v)) for v in block.box)
    x1, y1 = min(x1, image.shape[1]), min(y1, image.shape[0])
    crop = image[y0:y1, x0:x1]
    if crop.size == 0:
        return "", {"pred_html": "", "cell_box_list": []}
    inside = [(list(np.subtract(lines[i].box, (x0, y0, x0, y0))), lines[i].text)
              for i in block.lines]
    found = ruled.recognise(crop, inside, ruled_lines) \
        if ruled_lines is not None and ruled.is_ruled(crop) else None
    if found is not None:
        table_html, cells = found
    else:
        tensor, _ = tables.preprocess(crop)
        loc, probs = table_structure(tensor)
        tokens, cells = tables.decode(loc, probs, vocab, crop.shape[:2])
        matched = tables.match_lines(cells, inside)
        table_html = tables.to_html(tokens, matched, [text for _, text in inside])
    cell_boxes = [[round(float(v) + off, 2) for v, off in zip(cell, (x0, y0, x0, y0))]
                  for cell in cells]
    return table_html, {"pred_html": table_html, "cell_box_list": cell_boxes,
                        "table_ocr_pred": {"rec_texts": [t for _, t in inside]}}
