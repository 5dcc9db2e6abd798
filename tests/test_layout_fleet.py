"""POST /layout-parsing through the gateway (issue 50, step 2): a PDF's pages split across
two sim workers (their OCR simulated, one marked line per page; the layout models real)
come back in page order as PaddleX's PP-StructureV3 answer, as NDJSON lines in order and as
the document's Markdown with page breaks; an image goes to one worker; formats the endpoint
cannot give are a 406, fields it cannot honour a 422 before any page is sent; layout answers
have page-cache keys of their own. One test on two real workers."""

from __future__ import annotations

import io
import json

import pytest
import requests
from PIL import Image

from gateway import outputs
from gateway.assemble import PageOutcome
from gateway.cache import key as cache_key
from gateway.endpoint import LAYOUT
from gateway.outputs import paddlex
from ocrfleet import cli
from samples import documents
from scripts.fleet import stop_all
from services.layout.markdown import document_markdown
from services.ocr_api.errors import ApiError
from services.ocr_api.headers import CACHED_PAGES
from tests.test_flow_integration import SIM, b64, pages_served, start_gateway, start_workers
from tests.test_layout import paddlex_validates

pytestmark = pytest.mark.slow  # starts servers: scheduled first (tests/conftest.py)

PAGES = 4


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """(gateway, workers): two sim workers behind a gateway that sends a page per chunk,
    its page cache on."""
    started: list = []
    tmp_path = tmp_path_factory.mktemp("layout-fleet")
    try:
        workers = start_workers(started, tmp_path, 2, {**SIM, "OCR_QUEUE_SIZE": "4"})
        gateway = start_gateway(started, tmp_path, {"GATEWAY_REPLICAS": ",".join(workers)},
                                GATEWAY_CACHE_ENABLED="true",
                                GATEWAY_CACHE_PATH=str(tmp_path / "cache.sqlite3"))
        yield gateway, workers
    finally:
        stop_all(started)


@pytest.fixture(scope="module")
def pdf_and_pages(fleet):
    """A labelled PDF and each page's Markdown as one worker gives it for the whole file:
    what the gateway must give back, page by page, in this order."""
    _, workers = fleet
    pdf = documents.labelled_pdf(PAGES, lines_per_page=1)
    whole = requests.post(f"{workers[0]}/layout-parsing", json={"file": b64(pdf)}, timeout=120)
    assert whole.status_code == 200, whole.text
    pages = [p["markdown"]["text"] for p in whole.json()["result"]["layoutParsingResults"]]
    assert len(pages) == PAGES and len(set(pages)) == PAGES  # each page its own
    return pdf, pages


def post(gateway: str, body: dict, accept: str | None = None, **options):
    headers = {"Accept": accept} if accept else {}
    return requests.post(f"{gateway}/layout-parsing", json=body, headers=headers, timeout=120,
                         **options)


def test_a_pdf_is_split_across_the_workers_and_comes_back_in_page_order(fleet, pdf_and_pages):
    gateway, workers = fleet
    pdf, expected = pdf_and_pages
    served = pages_served(workers[1])
    request = {"file": b64(pdf), "fileType": 0, "useTableRecognition": True,
               "markdownIgnoreLabels": ["footer"]}
    response = post(gateway, request)
    assert response.status_code == 200, response.text
    answer = response.json()
    result = answer["result"]
    assert "ocrResults" not in result
    assert [p["markdown"]["text"] for p in result["layoutParsingResults"]] == expected
    assert result["dataInfo"]["numPages"] == PAGES and result["dataInfo"]["type"] == "pdf"
    assert pages_served(workers[1]) > served  # the second worker read some of them
    paddlex_validates([(request, answer)])


def test_ndjson_streams_a_line_per_page_in_order(fleet, pdf_and_pages):
    gateway, _ = fleet
    pdf, expected = pdf_and_pages
    response = post(gateway, {"file": b64(pdf)}, "application/x-ndjson", stream=True)
    assert response.status_code == 200
    lines = [json.loads(line) for line in response.iter_lines() if line]
    pages, summary = lines[:-1], lines[-1]
    assert [p["pageIndex"] for p in pages] == list(range(PAGES))
    assert [p["layoutParsingResult"]["markdown"]["text"] for p in pages] == expected
    assert all("ocrResult" not in p for p in pages)
    assert summary["done"] and summary["errorCode"] == 0 and summary["numPages"] == PAGES


def test_markdown_is_the_whole_document_with_page_breaks(fleet, pdf_and_pages):
    gateway, _ = fleet
    pdf, expected = pdf_and_pages
    response = post(gateway, {"file": b64(pdf)}, "text/markdown")
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("text/markdown")
    assert response.text == document_markdown(expected)
    assert response.text.count("\n---\n") == PAGES - 1


def test_an_image_goes_to_one_worker_whole(fleet):
    gateway, _ = fleet
    buffer = io.BytesIO()
    Image.new("RGB", (320, 120), "white").save(buffer, "PNG")
    response = post(gateway, {"file": b64(buffer.getvalue()), "fileType": 1})
    assert response.status_code == 200, response.text
    result = response.json()["result"]
    assert len(result["layoutParsingResults"]) == 1 and result["dataInfo"]["type"] == "image"


@pytest.mark.parametrize("accept", ["application/pdf", "application/alto+xml",
                                    "text/vnd.hocr+html", "application/zip", "text/plain"])
def test_formats_the_endpoint_cannot_give_are_a_406(fleet, accept):
    gateway, _ = fleet
    response = post(gateway, {"file": b64(b"%PDF-1.4")}, accept)
    assert response.status_code == 406
    answer = response.json()
    assert answer["errorCode"] == 406 and "text/markdown" in answer["errorMsg"]


def test_fields_it_cannot_honour_are_a_422_before_any_page_is_sent(fleet, pdf_and_pages):
    gateway, _ = fleet
    pdf, _ = pdf_and_pages
    for field in ({"useSealRecognition": True}, {"textLayer": "auto"}, {"visualize": True}):
        response = post(gateway, {"file": b64(pdf), **field})
        assert response.status_code == 422, response.text
        assert next(iter(field)) in response.json()["errorMsg"]


def test_ocrfleet_batch_writes_each_documents_markdown(fleet, pdf_and_pages, tmp_path):
    gateway, _ = fleet
    pdf, expected = pdf_and_pages
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "report.pdf").write_bytes(pdf)
    assert cli.main(["batch", str(tmp_path / "in"), str(tmp_path / "out"), "--url", gateway,
                     "--format", "md", "--no-progress"]) == 0
    assert (tmp_path / "out" / "report.md").read_text() == document_markdown(expected)
    with pytest.raises(SystemExit):  # not one OCR pass with the others: alone
        cli.parser().parse_args(["batch", "a", "b", "--format", "md,json"])


def test_a_failed_page_keeps_its_place_in_the_json_and_the_markdown():
    """Partial mode: the failed page's entry keeps PaddleX's required fields, and the
    Markdown names it where its page would be."""
    ok = PageOutcome(0, {"prunedResult": {}, "markdown": {"text": "# One"}}, {"width": 1,
                                                                              "height": 1})
    failed = PageOutcome(1, error_code=504, error_msg="deadline -- passed")
    result = paddlex.document_result([ok, failed], False, LAYOUT)
    entry = result["layoutParsingResults"][1]
    assert entry["markdown"]["text"] == "" and entry["error"]["errorCode"] == 504
    text = b"".join(paddlex.markdown_chunks([ok, failed])).decode()
    assert text == "# One\n\n---\n\n<!-- page 2: deadline - - passed -->\n"


def test_each_endpoint_offers_its_own_formats():
    assert outputs.negotiate("text/markdown", outputs.LAYOUT_OFFERED) == outputs.MARKDOWN
    assert outputs.negotiate("text/*", outputs.LAYOUT_OFFERED) == outputs.MARKDOWN
    assert outputs.negotiate("*/*", outputs.LAYOUT_OFFERED) == outputs.JSON
    with pytest.raises(ApiError) as refused:
        outputs.negotiate("text/markdown")  # /ocr's
    assert refused.value.status == 406


def test_the_page_cache_answers_layout_pages_and_never_gives_them_to_ocr(fleet):
    gateway, _ = fleet
    body = {"file": b64(documents.labelled_pdf(2, lines_per_page=0, seed=7))}
    first, again = post(gateway, body), post(gateway, body)
    assert first.headers[CACHED_PAGES] == "0" and again.headers[CACHED_PAGES] == "2"
    assert again.json()["result"] == first.json()["result"]
    other_fields = post(gateway, {**body, "useTableRecognition": False})
    assert other_fields.headers[CACHED_PAGES] == "0"
    ocr = requests.post(f"{gateway}/ocr", json=body, timeout=60)
    assert ocr.headers[CACHED_PAGES] == "0" and len(ocr.json()["result"]["ocrResults"]) == 2


def test_layout_answers_have_page_cache_keys_of_their_own():
    """The page cache keys a layout answer by its endpoint and layout fields: never an /ocr
    answer for it, nor one read with other layout fields. /ocr's keys are unchanged."""
    ocr = cache_key.params_digest({}, None, None, "pdf")
    layout = cache_key.params_digest({}, None, None, "pdf", "/layout-parsing")
    tables_off = cache_key.params_digest({"useTableRecognition": False}, None, None, "pdf",
                                         "/layout-parsing")
    assert len({ocr, layout, tables_off}) == 3
    assert cache_key.params_digest({}, None, None, "pdf", "/ocr") == ocr


# ---- the real engine ----------------------------------------------------------------------------
@pytest.mark.engine
def test_a_report_on_two_real_workers_comes_back_page_by_page(tmp_path):
    """Two real workers, a 2-page generated report: each page's heading and table, in order,
    and the Markdown joins them."""
    from samples import layout_pages

    started: list = []
    try:
        workers = start_workers(started, tmp_path, 2, {"OCR_VISUALIZE": "false"})
        gateway = start_gateway(started, tmp_path, {"GATEWAY_REPLICAS": ",".join(workers)})
        request = {"file": b64(layout_pages.report_pdf(2)), "fileType": 0}
        response = post(gateway, request)
        assert response.status_code == 200, response.text
        markdown = post(gateway, request, "text/markdown").text
    finally:
        stop_all(started)
    pages = response.json()["result"]["layoutParsingResults"]
    texts = [page["markdown"]["text"] for page in pages]
    for number, text in enumerate(texts, 1):
        assert f"{layout_pages.TITLE} {number}" in text and "<table>" in text, text
        assert "Apples" in text
    assert markdown.index(f"{layout_pages.TITLE} 1") < markdown.index("\n---\n") \
        < markdown.index(f"{layout_pages.TITLE} 2")
    paddlex_validates([(request, response.json())])
