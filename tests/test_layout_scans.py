"""Layout parsing on scanned pages (issue 50): a page turned by a degree, grainy and JPEG'd
(loadtest/table_corpus.py's degrade) still gives its unruled table. The pieces: the page's
skew from its text lines and the page turned straight (services/layout/deskew.py); a text
region whose lines stand in rows and columns read as a table (order.is_grid); a line in both
an image and a text region read as text (order.assign_lines); a grainy table crop denoised
for SLANet_plus (tables.denoise). The end-to-end test runs the real layout and table models
on the page with the cells' text boxes as its OCR lines, turned as the page was."""

from __future__ import annotations

import random

import cv2
import numpy as np
import pytest

from services.layout import deskew, order, tables
from services.layout.order import Block, Line


# ---- skew ---------------------------------------------------------------------------------------
def _turned(box, angle):
    """A box's corners turned by `angle` degrees (y down) about the origin."""
    x0, y0, x1, y1 = box
    a = np.radians(angle)
    rot = np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
    return (np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]]) @ rot.T).tolist()


def test_the_skew_is_the_long_lines_angle_and_short_or_steep_ones_do_not_count():
    lines = [_turned((100, 100 + 40 * k, 900, 125 + 40 * k), -1.1) for k in range(5)]
    ocr = {"rec_polys": lines + [_turned((50, 50, 60, 80), 30)] * 9  # short and steep
           + [_turned((100, 600, 900, 625), 45)]}  # a stamp
    assert deskew.estimate(ocr) == pytest.approx(-1.1, abs=0.01)
    assert deskew.estimate({"rec_polys": lines[:1]}) == 0.0  # one line tells nothing
    assert deskew.estimate({"dt_polys": lines}) == pytest.approx(-1.1, abs=0.01)
    straight = [_turned((100, 100, 900, 125), 0)] * 3
    assert deskew.estimate({"rec_polys": straight}) == 0.0


def test_a_turned_page_is_straightened_on_a_canvas_that_holds_it_and_boxes_map_back():
    page = np.full((400, 300, 3), 255, np.uint8)
    page[100:110, 50:250] = 0  # a line of ink, turned by -1 degree below
    turn = deskew.Straighten(page.shape[:2], 1.0)  # cv2: +1 turns it anticlockwise
    turned = turn.image(page)
    ys = np.nonzero(turned.min(axis=2) < 128)[0]
    assert ys.max() - ys.min() > 10  # the line now rises: turned
    back = deskew.Straighten(turned.shape[:2], -1.0)
    assert back.size[0] >= turned.shape[1] and back.size[1] >= turned.shape[0]
    straight = back.image(turned)
    rows = np.nonzero(straight.min(axis=2) < 128)[0]
    assert rows.max() - rows.min() <= 12  # level again
    box = (60.0, 200.0, 240.0, 220.0)
    again = back.to_page(back.to_straight(deskew.corners(box)))
    assert again[0] <= box[0] and again[1] <= box[1] and again[2] >= box[2] \
        and again[3] >= box[3]
    assert all(abs(a - b) < 8 for a, b in zip(again, box))
    x0, y0, x1, y1 = back.to_page((-50, -50, 1e4, 1e4))
    assert (x0, y0) == (0, 0) and (x1, y1) == (turned.shape[1], turned.shape[0])


# ---- a text region that is a table --------------------------------------------------------------
def _grid(rows, cols, x_step=200, y_step=40, text="Cell 12"):
    return [Line((50 + c * x_step, 100 + r * y_step, 50 + c * x_step + 90, 125 + r * y_step),
                 text) for r in range(rows) for c in range(cols)]


def test_lines_in_rows_and_columns_are_a_grid_and_prose_is_not():
    grid = _grid(5, 3)
    assert order.is_grid(list(range(len(grid))), grid)
    prose = [Line((50, 100 + 30 * r, 900, 125 + 30 * r),
                  "a line of running text with many words on it") for r in range(8)]
    assert not order.is_grid(list(range(len(prose))), prose)
    two_columns = [Line((50 + 460 * c, 100 + 30 * r, 480 + 460 * c, 125 + 30 * r),
                        "text set in two columns, many words a line") for r in range(8)
                   for c in range(2)]
    assert not order.is_grid(list(range(len(two_columns))), two_columns)
    assert not order.is_grid(list(range(4)), _grid(2, 2))  # too few rows to tell
    touching = _grid(5, 3, x_step=95)  # "columns" a few pixels apart: words of one line
    assert not order.is_grid(list(range(len(touching))), touching)
    with_caption = [Line((50, 50, 600, 75), "Table 1. A caption")] + grid
    assert order.is_grid(list(range(len(with_caption))), with_caption)


def test_a_line_in_an_image_and_a_text_region_goes_to_the_text():
    lines = [Line((10, 10, 100, 30), "header cell")]
    image = Block("image", (0, 0, 500, 200))
    text = Block("text", (0, 15, 200, 200))  # holds 3/4 of the line, the image all of it
    assert order.assign_lines([image, text], lines) == []
    assert text.lines == [0] and image.lines == []
    alone = Block("image", (0, 0, 500, 200))
    assert order.assign_lines([alone], lines) == [] and alone.lines == [0]


# ---- SLANet_plus's input ------------------------------------------------------------------------
def test_a_grainy_crop_is_denoised_and_a_clean_one_left_as_it_is():
    clean = np.full((300, 400, 3), 255, np.uint8)
    cv2.putText(clean, "Subtotal 42", (20, 150), cv2.FONT_HERSHEY_SIMPLEX, 1.2, (0, 0, 0), 2)
    assert tables.noise_sigma(clean) == 0.0
    assert tables.denoise(clean) is clean
    grain = np.random.default_rng(1).normal(0, 6, clean.shape[:2] + (1,))
    grainy = np.clip(clean + grain, 0, 255).astype(np.uint8)
    assert tables.noise_sigma(grainy) > tables.NOISY
    smooth = tables.denoise(grainy)
    assert smooth.shape == grainy.shape and tables.noise_sigma(smooth) < tables.NOISY


# ---- end to end on the benchmark's degraded scans -----------------------------------------------
def _scan_with_lines(kind: str, index: int, dpi: int):
    """A table-corpus page degraded as `make bench-layout` degrades it, and its OCR: each
    cell's text box turned as degrade() turned the page (its angle drawn as it draws it)."""
    from loadtest import table_corpus

    spec = table_corpus.make_table(kind, index)
    clean = table_corpus.render(spec, dpi)
    seed = spec.seed + dpi
    scan = table_corpus.degrade(clean, dpi, seed)
    rng = random.Random(seed)
    angle = rng.uniform(0.4, 1.2) * rng.choice((-1, 1))  # PIL: anticlockwise, as cv2's
    turn = deskew.Straighten((clean.height, clean.width), angle)
    assert abs(turn.size[0] - scan.width) <= 2 and abs(turn.size[1] - scan.height) <= 2
    polys = [np.round(cv2.transform(np.array([deskew.corners(box)], np.float64),
                                    turn.forward)[0]).astype(int).tolist()
             for box, _ in clean.info["words"]]
    ocr = {"rec_texts": [text for _, text in clean.info["words"]], "rec_polys": polys,
           "rec_boxes": [[min(p[0] for p in poly), min(p[1] for p in poly),
                          max(p[0] for p in poly), max(p[1] for p in poly)] for poly in polys],
           "rec_scores": [1.0] * len(polys)}
    return cv2.cvtColor(np.asarray(scan), cv2.COLOR_RGB2BGR), ocr, spec.html()


@pytest.fixture(scope="module")
def layout_models():
    from services.layout.models import LayoutModels
    from services.ocr_worker.config import WorkerConfig

    models = LayoutModels(WorkerConfig().model_dir)
    if models.missing():
        pytest.skip(models.missing())
    models.load()
    return models


# unruled-2: the layout model calls its table `text` on the scan (straight or not);
# unruled-3: SLANet_plus reads two of its three columns in the grainy crop
@pytest.mark.parametrize("index", [1, 2])
@pytest.mark.parametrize("dpi", [150, 300])
def test_an_unruled_table_on_a_degraded_scan_is_found_and_read(layout_models, index, dpi):
    from services.layout.page import parse_page
    from services.layout.request import LayoutOptions

    image, ocr, truth = _scan_with_lines("unruled", index, dpi)
    pruned, text = parse_page(image, ocr, LayoutOptions(), layout_models.detect,
                              layout_models.table_structure, layout_models.table_vocab,
                              layout_models.ruled_lines)
    found = [b for b in pruned["parsing_res_list"] if b["block_label"] == "table"]
    assert len(found) == 1, [(b["block_label"], b["block_bbox"])
                             for b in pruned["parsing_res_list"]]
    assert found[0]["block_content"] == truth
    x0, y0, x1, y1 = found[0]["block_bbox"]  # on the page as sent, around every cell
    for box in ocr["rec_boxes"]:
        assert x0 - 2 <= box[0] and y0 - 2 <= box[1] and box[2] <= x1 + 2 and box[3] <= y1 + 2
    assert 0 <= x0 < x1 <= image.shape[1] and 0 <= y0 < y1 <= image.shape[0]
    assert "<table>" in text
