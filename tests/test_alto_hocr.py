"""The ALTO v4 and hOCR answers (gateway/outputs/alto.py, hocr.py), checked by real tools:
every ALTO document against the official ALTO 4.4 XSD with xmlschema (tests/schemas/, loaded
offline), every hOCR document with hocr-spec (the hOCR 1.2 spec's checker) and as strict XML,
and both parsed back and compared, line by line and word by word, with the JSON they were
written from: rotated lines, CJK text, characters XML must escape, several pages, a failed
page in partial mode. Then through a real gateway and real-engine worker on loopback: the
ZIP of one OCR pass (JSON, ALTO, hOCR agree), `Accept: application/alto+xml` on /ocr, and a
job's result in both formats."""

from __future__ import annotations

import base64
import io
import itertools
import json
import re
import zipfile
from pathlib import Path

import pytest
import requests
import xmlschema
from hocr_spec import HocrValidator
from lxml import etree, html

from gateway.assemble import PageOutcome
from gateway.outputs import (ALTO, HOCR, JSON, TEXT, ZIP, Answer, alto, hocr, negotiate,
                             prepare_fields, respond)
from gateway.outputs.words import page_words
from ocrfleet import batch, cli
from samples import documents

SCHEMAS = Path(__file__).parent / "schemas"
A = "{http://www.loc.gov/standards/alto/ns-v4#}"
CJK = "发票号码"


# ---- the tools ---------------------------------------------------------------------------------
_schema: list[xmlschema.XMLSchema] = []


def alto_schema() -> xmlschema.XMLSchema:
    """The official ALTO 4.4 XSD; its xlink import mapped to the copy beside it, nothing
    fetched (allow="local")."""
    if not _schema:
        _schema.append(xmlschema.XMLSchema(
            str(SCHEMAS / "alto-4-4.xsd"), allow="local",
            locations={"http://www.w3.org/1999/xlink": str(SCHEMAS / "xlink.xsd")}))
    return _schema[0]


def valid_alto(data: bytes) -> etree._Element:
    """The ALTO document, after the XSD says it is valid (every error listed otherwise)."""
    errors = [str(e) for e in alto_schema().iter_errors(io.BytesIO(data))]
    assert not errors, "\n".join(errors[:5])
    return etree.fromstring(data)


def valid_hocr(data: bytes) -> etree._Element:
    """The hOCR document, after hocr-spec finds no error and it parses as strict XML."""
    report = HocrValidator("standard").validate(io.BytesIO(data), filename="answer.hocr")
    assert report.is_valid(), report.format("text")
    etree.fromstring(data)  # XHTML: well-formed XML
    return html.fromstring(data)


# ---- reading answers back ----------------------------------------------------------------------
def alto_pages(root) -> list[dict]:
    """Per Page: its attributes and [(line text, line box, [(word, box, WC)])]; a line's text
    is its Strings joined with a space where there is an SP."""
    pages = []
    for page in root.iter(f"{A}Page"):
        lines = []
        for line in page.iter(f"{A}TextLine"):
            text, words = "", []
            for child in line:
                if child.tag == f"{A}SP":
                    text += " "
                elif child.tag == f"{A}String":
                    text += child.get("CONTENT")
                    words.append((child.get("CONTENT"), alto_box(child), float(child.get("WC"))))
            lines.append((text, alto_box(line), words))
        pages.append({"attrib": dict(page.attrib), "lines": lines})
    return pages


def alto_box(element) -> tuple[int, int, int, int]:
    x, y, w, h = (int(element.get(name)) for name in ("HPOS", "VPOS", "WIDTH", "HEIGHT"))
    return x, y, x + w, y + h


def title_box(title: str) -> tuple[int, ...]:
    return tuple(int(v) for v in re.search(r"bbox (\d+) (\d+) (\d+) (\d+)", title).groups())


def hocr_pages(root) -> list[dict]:
    """Per div.ocr_page: its title and [(line text, line box, [(word, box, x_wconf)])]."""
    pages = []
    for page in root.find_class("ocr_page"):
        lines = []
        for line in page.find_class("ocr_line"):
            words = [(w.text_content(), title_box(w.get("title")),
                      int(re.search(r"x_wconf (\d+)", w.get("title")).group(1)))
                     for w in line.find_class("ocrx_word")]
            lines.append((line.text_content(), title_box(line.get("title")), words))
        pages.append({"title": page.get("title"), "lines": lines,
                      "error": [e.text_content() for e in page.find_class("ocrfleet_error")]})
    return pages


def json_lines(entry: dict, size: tuple[int, int]) -> list[tuple[str, tuple[int, ...]]]:
    """(text, whole-pixel box clipped to the page) of each line of one `ocrResults` entry."""
    pruned = entry["prunedResult"]
    found = []
    for text, poly in zip(pruned["rec_texts"], pruned["rec_polys"]):
        xs, ys = [p[0] for p in poly], [p[1] for p in poly]
        box = (max(0, int(min(xs))), max(0, int(min(ys))),
               min(size[0], -int(-max(xs))), min(size[1], -int(-max(ys))))
        if text.strip():
            found.append((text.strip(), box))
    return found


# ---- synthetic pages ---------------------------------------------------------------------------
def rect(x0, y0, x1, y1):
    return [[x0, y0], [x1, y0], [x1, y1], [x0, y1]]


def pruned(lines: list[tuple[str, list, float]], words: list | None = None) -> dict:
    result = {"rec_texts": [t for t, _, _ in lines], "rec_polys": [p for _, p, _ in lines],
              "rec_scores": [s for _, _, s in lines]}
    if words is not None:
        result["text_word"] = [[w for w, _ in line] for line in words]
        result["text_word_boxes"] = [[b for _, b in line] for line in words]
    return result


def page(index: int, result: dict, width=600, height=400) -> PageOutcome:
    return PageOutcome(index, {"prunedResult": result}, {"width": width, "height": height})


ROTATED = [[100.4, 220.0], [400.0, 190.2], [403.0, 230.0], [103.0, 260.7]]  # ~6 degrees
SPECIAL = 'a<b & "c" \'d\' </span>\x01'
LINES = [("Invoice 42", rect(20, 20, 220, 50), 0.97), (CJK, rect(20, 80, 180, 120), 0.88),
         ("Rotated line", ROTATED, 0.9), (SPECIAL, rect(20, 300, 300, 330), 0.5)]
WORDS = [[("Invoice", [20, 20, 150, 50]), ("42", [160, 20, 220, 50])],
         [(c, [20 + 40 * i, 80, 60 + 40 * i, 120]) for i, c in enumerate(CJK)],
         [("Rotated", [100, 190, 250, 261]), ("line", [260, 190, 403, 261])],
         [("a<b", [20, 300, 80, 330]), ("&", [90, 300, 100, 330]), ('"c"', [110, 300, 150, 330]),
          ("'d'", [160, 300, 200, 330]), ("</span>\x01", [210, 300, 300, 330])]]


def document(word_boxes: bool) -> list[PageOutcome]:
    """Three pages: every kind of line (with or without word boxes), a failed page, an
    empty one (a blank scan)."""
    return [page(0, pruned(LINES, WORDS if word_boxes else None)),
            PageOutcome(1, error_code=500, error_msg='engine <died> & "said" so'),
            page(2, pruned([]), 300, 200)]


# ---- units -------------------------------------------------------------------------------------
@pytest.mark.parametrize("word_boxes", [True, False], ids=["words", "lines"])
def test_alto_is_valid_and_says_what_the_json_says(word_boxes):
    root = valid_alto(b"".join(alto.alto_chunks(document(word_boxes))))
    assert root.find(f"{A}Description/{A}MeasurementUnit").text == "pixel"
    first, failed, blank = alto_pages(root)
    assert first["attrib"] == {"ID": "p1", "PHYSICAL_IMG_NR": "1", "WIDTH": "600",
                               "HEIGHT": "400"}
    texts = [text for text, _, _ in first["lines"]]
    assert texts == ["Invoice 42", CJK, "Rotated line", 'a<b & "c" \'d\' </span>']
    boxes = [box for _, box, _ in first["lines"]]
    assert boxes[2] == (100, 190, 403, 261)  # the rotated line: its polygon's bounding box
    if word_boxes:
        assert [w for w, _, _ in first["lines"][1][2]] == list(CJK)  # no SP between them
        assert first["lines"][0][2] == [("Invoice", (20, 20, 150, 50), 0.97),
                                        ("42", (160, 20, 220, 50), 0.97)]
    else:
        assert all(len(words) == 1 and words[0][:2] == (text, box)
                   for text, box, words in first["lines"])
    assert failed["attrib"]["QUALITY"] == "Missing" and failed["lines"] == []
    assert 'engine <died> & "said" so' in failed["attrib"]["QUALITY_DETAIL"]
    assert blank["attrib"]["WIDTH"] == "300" and blank["lines"] == []


@pytest.mark.parametrize("word_boxes", [True, False], ids=["words", "lines"])
def test_hocr_is_valid_and_says_what_the_alto_says(word_boxes):
    pages = document(word_boxes)
    root = valid_hocr(b"".join(hocr.hocr_chunks(pages, len(pages))))
    assert root.xpath("//meta[@name='ocr-system']") and root.xpath(
        "//meta[@name='ocr-capabilities']/@content") == ["ocr_page ocr_line ocrx_word"]
    first, failed, blank = hocr_pages(root)
    assert first["title"] == "bbox 0 0 600 400; ppageno 0"
    from_alto = alto_pages(valid_alto(b"".join(alto.alto_chunks(pages))))[0]["lines"]
    assert [(t, b, [(w, wb, round(c * 100)) for w, wb, c in ws]) for t, b, ws in from_alto] \
        == first["lines"]
    assert failed["title"] == "ppageno 1" and failed["lines"] == []
    assert 'engine <died> & "said" so' in failed["error"][0]
    assert blank["title"] == "bbox 0 0 300 200; ppageno 2" and blank["lines"] == []


def test_word_boxes_that_do_not_spell_their_line_give_the_line_as_one_word():
    result = pruned(LINES[:3], [WORDS[0][:1], [], WORDS[2]])  # a word short; none; right
    result["text_word_boxes"][2] = result["text_word_boxes"][2][:1]  # a box short
    lines = page_words(page(0, result)).lines
    assert [[w.text for w in line.words] for line in lines] == [["Invoice 42"], [CJK],
                                                                ["Rotated line"]]


def test_a_rotated_line_s_words_are_as_high_as_the_line_where_they_lie():
    """PaddleX gives a rotated line's words the height between two of its corners (here
    220..230); each word's box is the slice of the line's polygon between its ends."""
    slivers = [[("Rotated", [100, 220, 250, 230]), ("line", [260, 220, 403, 230])]]
    (line,) = page_words(page(0, pruned([LINES[2]], slivers))).lines
    first, second = (word.box for word in line.words)
    assert first[0] == 100 and first[2] == 250 and 204 <= first[1] <= 206 and first[3] == 261
    assert second[0] == 260 and 189 <= second[1] <= 191 and 243 <= second[3] <= 246
    upright = page_words(page(0, pruned(LINES[:1], WORDS[:1]))).lines[0]
    assert [w.box for w in upright.words] == [(20, 20, 150, 50), (160, 20, 220, 50)]


def test_boxes_are_clipped_to_the_page_and_bad_shapes_left_out():
    result = pruned([("off the edge", rect(-5.5, 390, 700, 420), 1.2),
                     ("no shape", [], 0.9), ("nan", rect(float("nan"), 0, 1, 1), 0.9)])
    (line,) = page_words(page(0, result)).lines
    assert line.box == (0, 390, 600, 400) and line.confidence == 1.0
    valid_alto(b"".join(alto.alto_chunks([page(0, result)])))


def test_pages_are_written_as_they_come():
    """A page's XML is written before the next page is read: memory does not grow with
    the number of pages."""
    read = itertools.count()

    def pages():
        for index in range(3):
            next(read)
            yield page(index, pruned(LINES[:1]))

    chunks = alto.alto_chunks(pages())
    next(chunks), next(chunks)  # the head, page 1
    assert next(read) == 1
    chunks = hocr.hocr_chunks(pages(), 3)
    read = itertools.count()
    next(chunks), next(chunks)
    assert next(read) == 1


def test_accept_negotiation_and_fields():
    assert negotiate("application/alto+xml") == ALTO
    assert negotiate("text/vnd.hocr+html") == HOCR
    assert negotiate("application/json, application/alto+xml") == ALTO  # the more specific
    browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
    assert negotiate(browser) == JSON
    for fmt in (ALTO, HOCR):
        fields = {}
        prepare_fields(fmt, fields)
        assert fields == {"visualize": False}


class FakePdfBuilder:
    def build(self, *args):
        return io.BytesIO(b"%PDF-1.7 stand-in")


def answer(pages: list[PageOutcome]) -> Answer:
    return Answer("log-1", "pdf", False, lambda: iter(pages), lambda: b"", len(pages))


def test_respond_in_alto_hocr_and_the_zip_of_all():
    pages = document(True)
    for fmt, check in ((ALTO, valid_alto), (HOCR, valid_hocr)):
        response = respond(fmt, answer(pages), (), FakePdfBuilder())
        assert response.headers["Content-Type"] == f"{fmt}; charset=utf-8"
        assert response.headers["X-Ocr-Pages"] == "3"
        check(response.get_data())
    bundle = respond(ZIP, answer(pages), (), FakePdfBuilder()).get_data()
    with zipfile.ZipFile(io.BytesIO(bundle)) as archive:
        assert sorted(archive.namelist()) == ["result.alto.xml", "result.hocr", "result.json",
                                              "searchable.pdf", "text.txt"]
        valid_alto(archive.read("result.alto.xml"))
        valid_hocr(archive.read("result.hocr"))
    assert respond(TEXT, answer(pages), (), FakePdfBuilder()).get_data().startswith(b"Invoice")


def test_cli_formats_and_file_names():
    args = cli.parser().parse_args(["batch", "in", "out", "--format", "alto,hocr,json"])
    assert args.format == ["alto", "hocr", "json"]
    assert cli.parser().parse_args(["ocr", "x.png", "--format", "hocr"]).format == ["hocr"]
    names = batch.output_names([Path("a/scan.png")], ["alto", "hocr", "txt"])
    assert names[Path("a/scan.png")] == {"alto": Path("a/scan.alto.xml"),
                                         "hocr": Path("a/scan.hocr"), "txt": Path("a/scan.txt")}


# ---- through a real gateway and real-engine worker ---------------------------------------------
@pytest.fixture(scope="module")
def gateway_url(worker_url, tmp_path_factory):
    from scripts.fleet import free_port, gateway_process

    logs = tmp_path_factory.mktemp("alto-hocr")
    gateway = gateway_process(free_port(), {"GATEWAY_REPLICAS": worker_url,
                                            "GATEWAY_PROCESSES": "1",
                                            "GATEWAY_JOBS_DB": str(logs / "jobs.sqlite3")},
                              logs / "gateway.log").start()
    try:
        gateway.wait_ready(60)
        yield gateway.ready_url.rsplit("/", 1)[0]
    finally:
        gateway.stop()


@pytest.fixture(scope="module")
def two_pages(cjk_font) -> bytes:
    """A scanned PDF: a Latin page scanned askew (rotated lines), a CJK page."""
    latin = documents.text_image(["Rotated scan of a page", "second line 1234"], size=32)
    askew = latin.convert("L").rotate(5, expand=True, fillcolor=255)
    cjk = documents.text_image([CJK + "一二三", "合计金额五十元"], font_path=cjk_font, size=36)
    return documents.image_pdf([askew, cjk])


def check_agree(answer_json: dict, alto_data: bytes, hocr_data: bytes) -> None:
    """ALTO and hOCR valid, and line by line what the JSON says: same text (same words, where
    word boxes were asked for), same boxes, page sizes and numbers."""
    result = answer_json["result"]
    info = result["dataInfo"]
    sizes = [info] if info["type"] == "image" else info["pages"]
    alto_doc = alto_pages(valid_alto(alto_data))
    hocr_doc = hocr_pages(valid_hocr(hocr_data))
    assert len(alto_doc) == len(hocr_doc) == len(result["ocrResults"])
    for number, (entry, size, a, h) in enumerate(zip(result["ocrResults"], sizes, alto_doc,
                                                     hocr_doc)):
        w, h_px = size["width"], size["height"]
        assert a["attrib"]["WIDTH"] == str(w) and a["attrib"]["HEIGHT"] == str(h_px)
        assert h["title"] == f"bbox 0 0 {w} {h_px}; ppageno {number}"
        expected = sorted(json_lines(entry, (w, h_px)))
        assert expected, "the engine found no line"
        for lines in (a["lines"], h["lines"]):
            got = sorted((text, box) for text, box, _ in lines)
            assert [t for t, _ in got] == [t for t, _ in expected]
            assert all(max(abs(p - q) for p, q in zip(gb, eb)) <= 1
                       for (_, gb), (_, eb) in zip(got, expected))
            for _, box, words in lines:  # every word inside its line
                assert all(box[0] <= wb[0] <= wb[2] <= box[2] and box[1] <= wb[1] <= wb[3]
                           <= box[3] for _, wb, _ in words), (box, words)


def test_one_pass_zip_json_alto_hocr_agree_with_word_boxes(gateway_url, two_pages):
    response = requests.post(f"{gateway_url}/ocr", files={"file": ("doc.pdf", two_pages)},
                             data={"returnWordBox": "true"},
                             headers={"Accept": "application/zip"}, timeout=300)
    assert response.status_code == 200, response.text[:300]
    with zipfile.ZipFile(io.BytesIO(response.content)) as archive:
        answer_json = json.loads(archive.read("result.json"))
        check_agree(answer_json, archive.read("result.alto.xml"), archive.read("result.hocr"))
        root = etree.fromstring(archive.read("result.alto.xml"))
    assert any(len(line.findall(f"{A}String")) > 1 for line in root.iter(f"{A}TextLine"))
    assert CJK in "".join(s.get("CONTENT") for s in root.iter(f"{A}String"))


def test_ocrfleet_batch_writes_alto_and_hocr(gateway_url, tmp_path):
    (tmp_path / "in").mkdir()
    documents.text_image(["Batch of one", "page"], size=32).save(tmp_path / "in" / "scan.png")
    assert cli.main(["batch", str(tmp_path / "in"), str(tmp_path / "out"), "--url", gateway_url,
                     "--format", "alto,hocr", "--no-progress"]) == 0
    alto_lines = alto_pages(valid_alto((tmp_path / "out" / "scan.alto.xml").read_bytes()))
    hocr_lines = hocr_pages(valid_hocr((tmp_path / "out" / "scan.hocr").read_bytes()))
    assert [t for t, _, _ in alto_lines[0]["lines"]] == [t for t, _, _ in hocr_lines[0]["lines"]]
    assert "Batch" in alto_lines[0]["lines"][0][0]


def test_ocr_answers_alto_and_a_job_result_both_formats(gateway_url):
    png = io.BytesIO()
    documents.text_image(["Archive copy 2024", "hOCR & ALTO <ok>"], size=32).save(png, "PNG")
    body = {"file": base64.b64encode(png.getvalue()).decode(), "visualize": False}
    answer_json = requests.post(f"{gateway_url}/ocr", json=body, timeout=120).json()
    direct = requests.post(f"{gateway_url}/ocr", json=body, timeout=120,
                           headers={"Accept": "application/alto+xml"})
    assert direct.status_code == 200, direct.text[:300]
    assert direct.headers["Content-Type"] == "application/alto+xml; charset=utf-8"
    submitted = requests.post(f"{gateway_url}/jobs", json=body, timeout=30)
    assert submitted.status_code == 202, submitted.text[:300]
    status = submitted.json()["result"]
    for _ in range(6):
        state = requests.get(f"{status['statusUrl']}?wait=30", timeout=60).json()["result"]
        if state["state"] == "succeeded":
            break
    assert state["state"] == "succeeded", state
    job_alto = requests.get(status["resultUrl"], headers={"Accept": ALTO}, timeout=30)
    job_hocr = requests.get(status["resultUrl"], headers={"Accept": HOCR}, timeout=30)
    assert job_hocr.headers["Content-Type"] == "text/vnd.hocr+html; charset=utf-8"
    check_agree(answer_json, direct.content, job_hocr.content)
    check_agree(answer_json, job_alto.content, job_hocr.content)
    lines = [s.get("CONTENT") for s in etree.fromstring(job_alto.content).iter(f"{A}String")]
    pruned_result = answer_json["result"]["ocrResults"][0]["prunedResult"]
    assert len(lines) == len(pruned_result["rec_texts"])  # no word boxes asked: line = word
