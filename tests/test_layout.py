"""POST /layout-parsing (issue 50): the pure pieces of services/layout/, the worker's answers
against PaddleX's own pydantic models (PP-StructureV3's InferResult), and a generated page
(title, two paragraphs, a ruled table) through the real engine."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys

import numpy as np
import pytest

from services.layout import markdown, order, regions, tables
from services.layout.request import LayoutOptions, parse_layout_fields
from services.ocr_api.errors import ApiError
from services.ocr_worker.app import create_app
from services.ocr_worker.config import WorkerConfig


# ---- pure pieces ------------------------------------------------------------------------------
def test_markdown_headings_tables_and_ignored_labels():
    text = markdown.page_markdown([("header", "Page header"), ("doc_title", "Report"),
                                   ("paragraph_title", "Part  one"), ("text", "Body."),
                                   ("table", "<html><body><table><tr><td>a</td></tr></table>"
                                             "</body></html>"), ("footer", "3")])
    assert text.split("\n\n") == ["# Report", "## Part one", "Body.",
                                  '<div style="text-align: center;"><table><tr><td>a</td></tr>'
                                  "</table></div>"]
    assert markdown.document_markdown(["# A", "B"]) == "# A\n\n---\n\nB\n"


def test_lines_go_to_their_regions_and_the_rest_become_text_blocks():
    lines = [order.Line((10, 10, 100, 20), "in"), order.Line((10, 500, 100, 510), "loose")]
    blocks = [order.Block("text", (0, 0, 200, 50))]
    loose = order.assign_lines(blocks, lines)
    assert blocks[0].lines == [0] and loose == [1]
    assert [b.lines for b in order.group_loose_lines(loose, lines)] == [[1]]


def test_reading_order_reads_columns_left_to_right_under_a_full_width_title():
    title = order.Block("paragraph_title", (0, 0, 1000, 40))
    right = order.Block("text", (520, 60, 1000, 400))
    left_top = order.Block("text", (0, 60, 480, 200))
    left_bottom = order.Block("text", (0, 220, 480, 400))
    ordered = order.reading_order([right, left_bottom, title, left_top], 1000)
    assert ordered == [title, left_top, left_bottom, right]


def test_paragraphs_apart_are_split():
    lines = [order.Line((0, 0, 100, 10), "a"), order.Line((0, 12, 100, 22), "b"),
             order.Line((0, 40, 100, 50), "c")]
    parts = order.split_paragraphs(order.Block("text", (0, 0, 100, 50), [0, 1, 2]), lines)
    assert [p.lines for p in parts] == [[0, 1], [2]]


def test_paragraphs_are_split_by_gaps_wider_than_the_blocks_own_line_spacing():
    """Rows 17 px high, 4 px apart within a paragraph and 11 apart between two (under 0.7
    line heights, over twice the block's usual gap), in a reference block as in a text one."""
    tops = [0, 21, 42, 70, 91, 112, 140, 161]
    lines = [order.Line((0, t, 100, t + 17), str(i)) for i, t in enumerate(tops)]
    for label in ("text", "reference"):
        parts = order.split_paragraphs(order.Block(label, (0, 0, 100, 178),
                                                   list(range(8))), lines)
        assert [p.lines for p in parts] == [[0, 1, 2], [3, 4, 5], [6, 7]]
        assert {p.label for p in parts} == {label}


def test_a_header_in_large_type_is_a_title():
    from services.layout.page import name_titles

    lines = [order.Line((0, 0, 300, 40), "Report")] + [
        order.Line((0, 60 + 25 * i, 500, 80 + 25 * i), "body") for i in range(6)]
    blocks = [order.Block("header", (0, 0, 300, 40), [0]),
              order.Block("text", (0, 60, 500, 205), list(range(1, 7)))]
    name_titles(blocks, lines)
    assert [b.label for b in blocks] == ["doc_title", "text"]
    small = [order.Line((0, 0, 300, 20), "Running head")] + lines[1:]
    blocks = [order.Block("header", (0, 0, 300, 20), [0]), blocks[1]]
    name_titles(blocks, small)
    assert blocks[0].label == "header"


@pytest.mark.parametrize("text, label", [
    ("The invoice for Leeds was signed on 03/03/2028 and filed by Y. Kowalski.", "text"),
    ("Total due: EUR 17,194.47 (reference 8687-I80), payable within 14 days.", "text"),
    ("[3] A. Smith, Reading tables, Pattern Recognit. 12 (4), pp. 33-41.", "reference"),
    ("Smith, J. and Lee, K. (2019). Reading tables. Springer.", "reference"),
    ("Lee K, et al. Reading tables. arXiv:1901.00001", "reference"),
    ("张三. 表格识别方法研究[J]. 计算机学报, 2019, 42(3): 1-10.", "reference"),
])
def test_a_reference_block_without_a_citation_is_text(text, label):
    """CDLA's `reference` (a bibliography entry) is what the model calls most English prose:
    it stays a reference only where the block reads like one."""
    from services.layout.page import name_references

    lines = [order.Line((0, 0, 900, 20), text)]
    blocks = [order.Block("reference", (0, 0, 900, 20), [0])]
    name_references(blocks, lines)
    assert blocks[0].label == label


def test_table_cells_are_filled_from_the_lines_with_spans():
    tokens = ["<tr>", "<td></td>", "<td", ' colspan="2"', ">", "</td>", "</tr>"]
    cells = np.array([[0, 0, 50, 20], [50, 0, 150, 20]], dtype=float)
    lines = [([55, 2, 140, 18], "wide & <b>"), ([2, 2, 45, 18], "x")]
    html = tables.to_html(tokens, tables.match_lines(cells, lines), [t for _, t in lines])
    assert html == ('<html><body><table><tr><td>x</td><td colspan="2">wide &amp; &lt;b&gt;'
                    "</td></tr></table></body></html>")


def test_a_wider_table_around_a_better_scored_one_is_the_same_table():
    inner = regions.Region("table", 0.93, (69, 138, 636, 406))
    wider = regions.Region("table", 0.51, (71, 134, 1184, 409))
    text = regions.Region("text", 0.4, (0, 0, 2000, 2000))
    assert regions.drop_contained([wider, inner, text]) == [inner, text]


def test_layout_nms_keeps_the_best_of_overlapping_boxes():
    boxes = np.array([[0, 0, 10, 10], [1, 1, 10, 10], [20, 20, 30, 30]], dtype=float)
    assert regions.nms(boxes, np.array([0.9, 0.8, 0.7])) == [0, 2]


@pytest.mark.parametrize("fields", [
    {"useSealRecognition": True}, {"useFormulaRecognition": True},
    {"useRegionDetection": True}, {"layoutNms": False}, {"layoutUnclipRatio": 1.5},
    {"outputFormats": ["docx"]}, {"visualize": True}, {"textLayer": "auto"},
    {"useE2eWirelessTableRecModel": False}, {"useWirelessTableCellsTransToHtml": True},
    {"useE2eWiredTableRecModel": "yes"}, {"layoutThreshold": 2},
    {"layoutThreshold": {"12": 0.3}}, {"markdownIgnoreLabels": "header"},
    {"useTableRecognition": "yes"}, {"useTableOrientationClassify": True},
    {"returnMarkdownImages": True},
])
def test_fields_this_fleet_cannot_honour_are_refused(fields):
    with pytest.raises(ApiError) as refused:
        parse_layout_fields(fields)
    assert refused.value.status == 422
    assert next(iter(fields)) in str(refused.value) or "layoutThreshold" in str(refused.value)


def test_the_fields_that_apply_are_taken():
    options, forward = parse_layout_fields({
        "useTableRecognition": False, "layoutThreshold": {"4": 0.3}, "prettifyMarkdown": False,
        "markdownIgnoreLabels": ["footer"], "useSealRecognition": False, "layoutNms": None,
        "useTableOrientationClassify": False, "showFormulaNumber": True})
    assert options == LayoutOptions(False, {4: 0.3}, ["footer"], False)
    assert forward["layoutThreshold"] == {"4": 0.3}


# ---- PaddleX's own models ---------------------------------------------------------------------
PADDLEX_VALIDATE = r"""
import importlib.util, json, sys, types
from pathlib import Path
root = Path(importlib.util.find_spec("paddlex").origin).parent
for name in ("paddlex", "paddlex.inference", "paddlex.inference.serving"):
    stub = types.ModuleType(name)
    stub.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
    sys.modules[name] = stub
from paddlex.inference.serving.schemas import pp_structurev3 as s
from paddlex.inference.serving.infra import models
for request, answer in json.load(sys.stdin):
    s.InferRequest(**request)
    models.AIStudioResultResponse[s.InferResult](**answer)
print("ok")
"""


def paddlex_validates(pairs: list[tuple[dict, dict]]) -> None:
    """Each (request, answer) through PaddleX's InferRequest and InferResult envelope."""
    done = subprocess.run([sys.executable, "-c", PADDLEX_VALIDATE], input=json.dumps(pairs),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


@pytest.fixture(scope="module")
def sim_client():
    """A worker on the sim engine (one fixed line per page) and the real layout models."""
    app = create_app(WorkerConfig(engine="sim", sim_page_ms=1.0, warmup=False))
    service = app.extensions["ocr_service"]
    assert service.batcher.ready.wait(10)
    yield app.test_client()
    service.shutdown(5)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@pytest.mark.parametrize("body, status", [
    ({}, 422), ({"file": "bm90IGEgZG9jdW1lbnQ="}, 422), ({"file": "x", "fileType": 7}, 422),
    ({"file": "SUkq", "useChartRecognition": True}, 422),
])
def test_bad_inputs_are_json_4xx(sim_client, body, status):
    response = sim_client.post("/layout-parsing", json=body)
    assert response.status_code == status
    answer = response.get_json()
    assert answer["errorCode"] == status and answer["errorMsg"]
    assert sim_client.post("/layout-parsing", data=b"{").status_code == 400


def test_every_page_of_a_pdf_is_answered_in_paddlexs_shape(sim_client):
    from samples.layout_pages import report_pdf

    request = {"file": b64(report_pdf(2)), "fileType": 0, "useTableRecognition": True}
    response = sim_client.post("/layout-parsing", json=request)
    assert response.status_code == 200, response.data
    answer = response.get_json()
    pages = answer["result"]["layoutParsingResults"]
    assert len(pages) == 2 and answer["result"]["dataInfo"]["numPages"] == 2
    for page in pages:
        blocks = page["prunedResult"]["parsing_res_list"]
        assert {"table"} <= {b["block_label"] for b in blocks}
        assert set(blocks[0]) == {"block_label", "block_content", "block_bbox", "block_id",
                                  "block_order"}
    paddlex_validates([(request, answer)])


# ---- the real engine ----------------------------------------------------------------------------
@pytest.mark.engine
def test_a_report_page_comes_back_as_heading_paragraphs_and_table():
    from samples import layout_pages

    app = create_app(WorkerConfig(warmup=False))
    service = app.extensions["ocr_service"]
    try:
        assert service.batcher.ready.wait(120)
        request = {"file": b64(layout_pages.report_pdf(1)), "fileType": 0}
        response = app.test_client().post("/layout-parsing", json=request)
        assert response.status_code == 200, response.data
        answer = response.get_json()
    finally:
        service.shutdown(5)
    page = answer["result"]["layoutParsingResults"][0]
    text = page["markdown"]["text"]
    assert re.search(r"^#+ Quarterly Report$", text, re.M), text
    first, second = (text.index(p.split(".")[0]) for p in layout_pages.PARAGRAPHS)
    assert first < second < text.index("<table>"), text
    table = text[text.index("<table>"):text.index("</table>")]
    rows = re.findall(r"<tr>(.*?)</tr>", table)
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in rows]
    assert cells == layout_pages.TABLE, cells
    paddlex_validates([(request, answer)])


# ---- ruled tables (services/layout/ruled.py) ----------------------------------------------------
def table_crop(kind: str, dpi: int = 150):
    """A generated table (loadtest/table_corpus.py), its crop (BGR, a few points of margin),
    its text boxes in crop pixels and its HTML."""
    import cv2

    from loadtest import table_corpus

    spec = table_corpus.make_table(kind, 0)
    page = table_corpus.render(spec, dpi)
    x0, y0, x1, y1 = page.info["table_box"]
    pad = int(4 * dpi / 72)
    x0, y0 = x0 - pad, y0 - pad
    crop = cv2.cvtColor(np.asarray(page), cv2.COLOR_RGB2BGR)[y0:y1 + pad, x0:x1 + pad]
    words = [([b[0] - x0, b[1] - y0, b[2] - x0, b[3] - y0], text)
             for b, text in page.info["words"]]
    return crop, words, spec.html()


def test_the_switch_tells_ruled_tables_from_unruled_ones_by_their_rules():
    from services.layout import ruled

    for kind, expected in (("ruled", True), ("spanning", True), ("unruled", False)):
        crop, _, _ = table_crop(kind)
        assert ruled.is_ruled(crop) is expected, (kind, ruled.rulings(crop))
    blank = np.full((200, 400, 3), 255, np.uint8)
    assert ruled.rulings(blank) == (0, 0) and not ruled.is_ruled(blank)


def test_cells_in_a_grid_become_rows_and_columns_with_spans():
    """TableRecover's decoding on cell polygons ([tl, bl, br, tr]): a header cell over two
    columns and a first-column cell over two rows."""
    from services.layout import ruled

    def quad(x0, y0, x1, y1):
        return [[x0, y0], [x0, y1], [x1, y1], [x1, y0]]

    cells = [quad(0, 0, 100, 80), quad(100, 0, 300, 40), quad(100, 40, 200, 80),
             quad(200, 40, 300, 80), quad(0, 80, 100, 160), quad(100, 80, 200, 120),
             quad(200, 80, 300, 120), quad(100, 120, 200, 160), quad(200, 120, 300, 160)]
    logic = ruled.logical_cells(np.array(cells, dtype=float))
    assert logic.tolist() == [[0, 1, 0, 0], [0, 0, 1, 2], [1, 1, 1, 1], [1, 1, 2, 2],
                              [2, 3, 0, 0], [2, 2, 1, 1], [2, 2, 2, 2], [3, 3, 1, 1],
                              [3, 3, 2, 2]]
    html = ruled.to_html(logic, ["A", "B & C", "b", "c", "x", "1", "2", "3", "4"])
    assert html == ('<html><body><table><tr><td rowspan="2">A</td><td colspan="2">B &amp; C'
                    '</td></tr><tr><td>b</td><td>c</td></tr><tr><td rowspan="2">x</td>'
                    '<td>1</td><td>2</td></tr><tr><td>3</td><td>4</td></tr></table>'
                    '</body></html>')


@pytest.mark.parametrize("dpi", [150, 300])
def test_a_ruled_table_with_spanning_cells_is_read_by_the_line_model(dpi):
    from services.layout import ruled
    from services.layout.models import LayoutModels
    from services.ocr_worker.config import WorkerConfig

    models = LayoutModels(WorkerConfig().model_dir)
    crop, words, truth = table_crop("spanning", dpi)
    html, boxes = ruled.recognise(crop, words, models.ruled_lines)
    assert html == truth
    assert len(boxes) == truth.count("<td")


def test_ruled_tables_go_to_the_line_model_unless_the_request_asks_for_the_structure_model():
    from services.layout import page as layout_page
    from services.layout.order import Block, Line

    crop, words, _ = table_crop("ruled")
    lines = [Line(tuple(box), text) for box, text in words]
    block = Block("table", (0, 0, crop.shape[1], crop.shape[0]), list(range(len(lines))))
    calls = []

    def structure(tensor):
        calls.append("slanet")
        raise RuntimeError("stop here")

    def line_model(tensor):
        calls.append("ruled")
        return np.zeros(tensor.shape[2:], np.int64)  # no lines: no cells, so SLANet_plus

    with pytest.raises(RuntimeError):
        layout_page.recognise_table(crop, block, lines, structure, [], line_model)
    assert calls == ["ruled", "slanet"]
    calls.clear()
    with pytest.raises(RuntimeError):
        layout_page.recognise_table(crop, block, lines, structure, [], None)
    assert calls == ["slanet"]
    options, forward = parse_layout_fields({"useE2eWiredTableRecModel": True,
                                            "useWiredTableCellsTransToHtml": True})
    assert options.use_e2e_wired_table_rec_model and options.use_wired_table_cells_trans_to_html
    assert forward == {"useE2eWiredTableRecModel": True, "useWiredTableCellsTransToHtml": True}


# ---- the benchmark's measures (loadtest/teds.py, samples/layout_regions.py) ---------------------
def test_teds_scores_structure_and_content_as_pubtabnet_does():
    from loadtest import teds

    truth = ('<html><body><table><tr><td rowspan="2">A</td><td>b</td></tr><tr><td>c</td></tr>'
             "</table></body></html>")
    assert teds.teds(truth, truth) == 1.0
    assert teds.teds("<table><thead><tr><th rowspan='2'>A</th><td>b</td></tr></thead><tbody>"
                     "<tr><td>c</td></tr></tbody></table>", truth) == 1.0
    typo = teds.teds(truth.replace(">b<", ">x<"), truth)
    assert typo == pytest.approx(1 - 1 / 5)  # one of 5 nodes' content entirely wrong
    assert teds.teds(truth.replace(">b<", ">x<"), truth, structure_only=True) == 1.0
    assert teds.teds(truth.replace(' rowspan="2"', ""), truth) == pytest.approx(1 - 1 / 5)
    assert teds.teds("", truth) == 0.0 and teds.teds("<p>no table</p>", truth) == 0.0
    assert teds.match([[0, 0, 10, 10], [0, 0, 10, 10]], [[1, 1, 10, 10]]) == 1
    assert teds.f1(1, 2, 1)["f1"] == pytest.approx(2 / 3)


def test_the_accuracy_corpus_pages_have_their_regions_recorded():
    from samples import layout_regions

    pages = {page.name: page for page in layout_regions.pages()}
    prose = [kind for kind, _ in pages["en-prose-helvetica-10pt/p1"].regions]
    assert prose[0] == "title" and prose.count("title") == 1 and prose.count("text") >= 5
    invoice = pages["en-invoice-table/p1"]
    assert [kind for kind, _ in invoice.regions] == ["title", "table"]
    (x0, y0, x1, y1), height, width = invoice.regions[1][1], *invoice.image.shape[:2]
    assert 0 < x0 < x1 < width and 0 < y0 < y1 < height and (y1 - y0) > height / 2
