"""textLayer "auto" (issue 26, item 2): a born-digital PDF page is answered from its own text
layer, in PaddleX's shape and in the pixels it would be rendered at, marked in
prunedResult.model_settings.text_layer; a scan, a page whose only text is hidden (an earlier
OCR's layer) and an image-only page are OCR'd; the default "ignore" is unchanged; the
searchable PDF adds no second layer over a page that has text. Checked on the decoder, then
against the real engine (its OCR boxes of the same pages), then through a gateway for /ocr and
a job."""

import base64
import io
import time

import numpy as np
import pikepdf
import pytest
import requests
from reportlab.lib.utils import ImageReader
from reportlab.pdfgen import canvas

from gateway.outputs.layout import Line, PageText
from gateway.outputs.pdf import searchable_pdf
from samples import documents
from scripts.fleet import free_port, gateway_process
from services.documents.pdf import PDFIUM_LOCK, open_pdf, read_text_layer
from services.ocr_api.errors import ApiError
from services.ocr_api.request import parse_ocr_request
from services.ocr_worker.decode import DecodeLimits, TextLayerPage, open_document
from tests import pdfcheck
from tests.conftest import b64, post_ocr

LIMITS = DecodeLimits(max_pages=20, max_pixels=50_000_000, pdf_dpi=144, scan_dpi_max=400)
SCANNED_LINES = ["Scanned delivery note 4471", "received in good order"]


def expected_lines(number: int, total: int, seed: int = 0) -> list[str]:
    """The lines of page `number` of documents.labelled_pdf(total, 3, seed)."""
    return [documents.page_label(number, total),
            *documents.english_lines(3, seed + number, 4)]


def merged(*pdfs: bytes) -> bytes:
    out = pikepdf.new()
    sources = [pikepdf.open(io.BytesIO(pdf)) for pdf in pdfs]
    for source in sources:
        out.pages.extend(source.pages)
    buffer = io.BytesIO()
    out.save(buffer)
    return buffer.getvalue()


def scanned_page() -> bytes:
    return documents.image_pdf([documents.text_image(SCANNED_LINES, size=36)])


def mixed_pdf() -> bytes:
    """Two born-digital pages, then an image-only page."""
    return merged(documents.labelled_pdf(2), scanned_page())


def hidden_layer_pdf() -> bytes:
    """A scan with an invisible text layer over it (render mode 3), as an OCR tool writes it;
    the layer says something else than the scan, so it shows which one was read."""
    image = documents.text_image(SCANNED_LINES, size=36)
    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=(image.width * 0.5, image.height * 0.5))
    pdf.drawImage(ImageReader(image), 0, 0, image.width * 0.5, image.height * 0.5)
    text = pdf.beginText(10, image.height * 0.25)
    text.setTextRenderMode(3)
    text.setFont("Helvetica", 12)
    text.textLine("hidden words of an earlier reading")
    pdf.drawText(text)
    pdf.showPage()
    pdf.save()
    return buffer.getvalue()


def decode(pdf: bytes, mode: str = "auto"):
    request = parse_ocr_request({"file": b64(pdf), "textLayer": mode}, max_bytes=10**8)
    document = open_document(request, LIMITS)
    try:
        return list(document.pages()), dict(document.text_layer_marks)
    finally:
        document.close()


def poly_box(poly) -> tuple[float, float, float, float]:
    xs, ys = [x for x, _ in poly], [y for _, y in poly]
    return min(xs), min(ys), max(xs), max(ys)


# ---- the request --------------------------------------------------------------------------

def test_text_layer_is_validated_and_forwarded():
    pdf = documents.labelled_pdf(1)
    for fields in ({}, {"textLayer": None}, {"textLayer": "ignore"}):
        default = parse_ocr_request({"file": b64(pdf), **fields}, max_bytes=10**8)
        assert default.text_layer == "ignore" and default.api_params == {}
    auto = parse_ocr_request({"file": b64(pdf), "textLayer": "auto"}, max_bytes=10**8)
    assert auto.text_layer == "auto" and auto.pipeline_params == {}
    assert auto.forward_body(pdf, "pdf")["textLayer"] == "auto"  # each chunk carries it
    for bad in ("AUTO", "yes", True, 1, ["auto"]):
        with pytest.raises(ApiError) as caught:
            parse_ocr_request({"file": b64(pdf), "textLayer": bad}, max_bytes=10**8)
        assert caught.value.status == 422 and "textLayer" in str(caught.value)


# ---- reading the layer --------------------------------------------------------------------

def test_a_born_digital_page_is_read_from_its_text_without_a_render():
    pages, marks = decode(documents.labelled_pdf(2))
    assert marks == {0: "used", 1: "used"}
    for number, page in enumerate(pages, 1):
        assert isinstance(page, TextLayerPage)
        assert (page.width, page.height) == (1224, 1584)  # letter at 144 dpi, as rendered
        assert [line.text for line in page.lines] == expected_lines(number, 2)
        for line in page.lines:
            x0, y0, x1, y1 = poly_box(line.poly)
            assert 0 <= x0 < x1 <= page.width and 0 <= y0 < y1 <= page.height
            assert line.poly[0][0] < line.poly[1][0] and line.poly[0][1] < line.poly[3][1]
            assert "".join(text for text, _ in line.words) == line.text


def test_ignore_renders_every_page():
    pages, marks = decode(documents.labelled_pdf(2), "ignore")
    assert marks == {} and all(isinstance(page, np.ndarray) for page in pages)


def test_table_cells_are_lines_of_their_own():
    pages, _ = decode(documents.table_pdf(1, rows=4, seed=5))
    texts = [line.text for line in pages[0].lines]
    assert texts[:5] == ["Quarterly report Page 1 of 1", "item", "quantity", "price", "total"]
    assert len(texts) == 5 + 4 * 4


def dark_pixels(image: np.ndarray) -> np.ndarray:
    return image.min(axis=2) < 128


def test_boxes_sit_on_the_ink_of_a_rotated_and_cropped_page():
    with pikepdf.open(io.BytesIO(documents.labelled_pdf(1))) as pdf:
        pdf.pages[0].obj.Rotate = 90
        pdf.pages[0].obj.CropBox = pikepdf.Array([20, 30, 600, 780])
        buffer = io.BytesIO()
        pdf.save(buffer)
    source = buffer.getvalue()
    [page], _ = decode(source)
    [image], _ = decode(source, "ignore")
    assert (page.width, page.height) == (image.shape[1], image.shape[0])
    ink = dark_pixels(image)
    covered = np.zeros_like(ink)
    for line in page.lines:
        x0, y0, x1, y1 = (round(v) for v in poly_box(line.poly))
        assert y1 - y0 > 3 * (x1 - x0)  # turned a quarter: the lines run down the page
        assert ink[y0:y1, x0:x1].any()
        covered[y0:y1, x0:x1] = True
    assert ink[covered].sum() >= 0.99 * ink.sum()  # every glyph is inside a line's box


def test_what_is_not_read_from_the_layer():
    pages, marks = decode(scanned_page())
    assert marks == {} and isinstance(pages[0], np.ndarray)  # no text: OCR
    pages, marks = decode(hidden_layer_pdf())
    assert marks == {0: "unused"} and isinstance(pages[0], np.ndarray)  # hidden text: OCR
    with PDFIUM_LOCK:
        pdf = open_pdf(hidden_layer_pdf())
        try:
            layer = read_text_layer(pdf[0], 100, 100)
        finally:
            pdf.close()
    assert layer.lines == [] and layer.hidden == len("hiddenwordsofanearlierreading")


# ---- the searchable PDF -------------------------------------------------------------------

def test_the_searchable_pdf_adds_no_layer_to_a_page_with_text_of_its_own():
    source = mixed_pdf()
    lines = [Line("Scanned delivery note 4471", ((10, 10), (400, 10), (400, 50), (10, 50)))]
    born = [Line(text, ((10, 10), (400, 10), (400, 50), (10, 50)))
            for text in expected_lines(1, 2)]
    pages = [PageText(0, 1224, 1584, born, own_text=True),
             PageText(1, 1224, 1584, born, own_text=True),
             PageText(2, 462, 124, lines)]
    out = searchable_pdf(source, "pdf", pages, (documents.LATIN_FONTS[0],))
    before, after = pdfcheck.content_streams(source), pdfcheck.content_streams(out)
    assert after[:2] == before[:2] and after[2][1:-1] == before[2]


# ---- the real engine ----------------------------------------------------------------------

def ocr(url: str, pdf: bytes, **fields) -> dict:
    response = post_ocr(url, {"file": b64(pdf), "visualize": False, **fields}, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()["result"]


def test_the_worker_answers_born_digital_pages_from_their_text(worker_url):
    source = mixed_pdf()
    auto = ocr(worker_url, source, textLayer="auto", returnWordBox=True)
    plain = ocr(worker_url, source)
    assert ocr(worker_url, source, textLayer="ignore") == plain
    assert auto["dataInfo"] == plain["dataInfo"]  # sizes as rendered
    for number in (1, 2):
        layer = auto["ocrResults"][number - 1]["prunedResult"]
        read = plain["ocrResults"][number - 1]["prunedResult"]
        assert layer["model_settings"]["text_layer"] == "used"
        assert "text_layer" not in read["model_settings"]
        assert layer["rec_texts"] == expected_lines(number, 2)
        assert set(layer) >= {"rec_texts", "rec_scores", "rec_polys", "rec_boxes", "dt_polys",
                              "text_word", "text_word_boxes"}
        assert layer["rec_scores"] == [1.0] * len(layer["rec_texts"])
        # each line's box is close to the engine's box for the same line on the same page
        found = dict(zip(read["rec_texts"], read["rec_boxes"]))
        ious = [pdfcheck.iou(box, found[text])
                for text, box in zip(layer["rec_texts"], layer["rec_boxes"]) if text in found]
        assert len(ious) >= len(layer["rec_texts"]) - 1, (layer["rec_texts"], found)
        assert min(ious) >= 0.6, ious
    scan_auto, scan_plain = (result["ocrResults"][2]["prunedResult"] for result in (auto, plain))
    assert "text_layer" not in scan_auto["model_settings"]  # no text there: OCR'd
    assert scan_auto["rec_texts"] == scan_plain["rec_texts"] == SCANNED_LINES


def test_table_boxes_match_the_engines(worker_url):
    source = documents.table_pdf(1, seed=7)
    layer = ocr(worker_url, source, textLayer="auto")["ocrResults"][0]["prunedResult"]
    read = ocr(worker_url, source)["ocrResults"][0]["prunedResult"]
    assert sorted(layer["rec_texts"]) == sorted(read["rec_texts"])
    ious = [max(pdfcheck.iou(box, other) for other in read["rec_boxes"])
            for box in layer["rec_boxes"]]
    assert sum(ious) / len(ious) >= 0.7 and sum(i >= 0.5 for i in ious) >= 0.9 * len(ious)


def test_a_hidden_layer_is_read_again_by_the_engine(worker_url):
    result = ocr(worker_url, hidden_layer_pdf(), textLayer="auto")
    page = result["ocrResults"][0]["prunedResult"]
    assert page["model_settings"]["text_layer"] == "unused"
    assert page["rec_texts"] == SCANNED_LINES


def test_the_worker_refuses_a_bad_value(worker_url):
    response = post_ocr(worker_url, {"file": b64(scanned_page()), "textLayer": "always"})
    assert response.status_code == 422
    assert response.json()["errorCode"] == 422 and "textLayer" in response.json()["errorMsg"]


# ---- through a gateway --------------------------------------------------------------------

@pytest.fixture(scope="module")
def gateway_url(worker_url, tmp_path_factory):
    pdfcheck.need_poppler()
    logs = tmp_path_factory.mktemp("text-layer")
    gateway = gateway_process(free_port(), {"GATEWAY_REPLICAS": worker_url,
                                            "GATEWAY_PROCESSES": "1",
                                            "GATEWAY_JOBS_DB": str(logs / "jobs.sqlite3")},
                              logs / "gateway.log").start().wait_ready(60)
    try:
        yield gateway.ready_url.rsplit("/", 1)[0]
    finally:
        gateway.stop()


def test_the_gateway_passes_text_layer_to_every_chunk(gateway_url):
    result = ocr(gateway_url, mixed_pdf(), textLayer="auto")
    marks = [page["prunedResult"]["model_settings"].get("text_layer")
             for page in result["ocrResults"]]
    assert marks == ["used", "used", None]
    assert result["ocrResults"][0]["prunedResult"]["rec_texts"] == expected_lines(1, 2)
    response = post_ocr(gateway_url, {"file": b64(mixed_pdf()), "textLayer": "on"})
    assert response.status_code == 422 and "textLayer" in response.json()["errorMsg"]


def searchable(url: str, pdf: bytes, **fields) -> bytes:
    response = requests.post(f"{url}/ocr", files={"file": ("doc.pdf", pdf)}, data=fields,
                             headers={"Accept": "application/pdf"}, timeout=300)
    assert response.status_code == 200, response.text
    return response.content


def test_the_searchable_pdf_has_one_text_layer_in_auto(gateway_url):
    source = merged(mixed_pdf(), hidden_layer_pdf())
    auto = pdfcheck.page_texts(searchable(gateway_url, source, textLayer="auto"))
    doubled = pdfcheck.page_texts(searchable(gateway_url, source))
    # ignore (as before): the OCR layer over the page's own text doubles every word
    assert auto[0].split() == " ".join(expected_lines(1, 2)).split()
    assert doubled[0].split().count("receipt") == 2
    assert "Scanned delivery note" in auto[2]  # the image-only page got its layer
    assert auto[3].count("hidden words") == 1 and "Scanned" not in auto[3]  # kept as it was
    original = pdfcheck.content_streams(source)
    assert pdfcheck.content_streams(searchable(gateway_url, source, textLayer="auto"))[:2] \
        == original[:2]


def test_a_job_reads_the_text_layer(gateway_url):
    body = {"file": base64.b64encode(mixed_pdf()).decode(), "visualize": False,
            "textLayer": "auto"}
    submitted = requests.post(f"{gateway_url}/jobs", json=body, timeout=60)
    assert submitted.status_code in (200, 201, 202), submitted.text
    job_id = submitted.json()["result"]["jobId"]
    deadline = time.monotonic() + 240
    while True:
        status = requests.get(f"{gateway_url}/jobs/{job_id}", params={"wait": 30},
                              timeout=60).json()["result"]
        if status["state"] not in ("queued", "running") or time.monotonic() > deadline:
            break
    assert status["state"] == "succeeded", status
    result = requests.get(f"{gateway_url}/jobs/{job_id}/result", timeout=60).json()["result"]
    marks = [page["prunedResult"]["model_settings"].get("text_layer")
             for page in result["ocrResults"]]
    assert marks == ["used", "used", None]
