"""The web page at `/` in a real browser (Debian's chromium, headless, driven by Playwright).

Without OCR (fast): the gateway app in this process over replicas found by a fake DNS
resolver: the page and its assets come from the gateway alone under a CSP, the fleet panel
lists the replicas and picks up a new one without a reload, errors are shown in words, the
API key stays in session storage and goes out as a Bearer token.
With the real engine: a gateway and two real workers on loopback: a 3-page PDF streams into
three page panels with the right texts and boxes, the progress reaches 3/3, the copies and
downloads hold the text, a page that fails is shown without hiding the others."""

from __future__ import annotations

import io
import json
import re
import threading
import time

import pypdfium2 as pdfium
import pytest
import requests
from werkzeug.serving import make_server

from gateway.app import create_app
from gateway.config import GatewayConfig
from samples import documents
from scripts.browser import chromium, chromium_missing
from scripts.fleet import free_port, stop_all
from scripts.ui_screenshots import start_fleet

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(chromium_missing() is not None,
                                 reason=chromium_missing() or "chromium is here")]

PAGE_TIMEOUT_MS = 10_000
OCR_TIMEOUT_MS = 240_000


@pytest.fixture(scope="module")
def browser():
    with chromium() as launched:
        yield launched


@pytest.fixture
def context(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900},
                                  permissions=["clipboard-read", "clipboard-write"])
    context.set_default_timeout(PAGE_TIMEOUT_MS)
    yield context
    context.close()


def open_page(context, base_url: str):
    """A tab on the gateway's page, with every URL it asks for recorded in `page.seen`."""
    page = context.new_page()
    page.seen = []
    page.on("request", lambda request: page.seen.append(request))
    response = page.goto(base_url + "/")
    page.wait_for_selector("#fleet-table tbody tr")
    return page, response


# ---- the gateway in this process, replicas from a fake DNS name ------------------------------
class FakeDns:
    """The resolver the gateway's DNS mode calls: whatever `urls` holds now."""

    def __init__(self, urls: list[str]):
        self.urls = list(urls)

    def __call__(self, host: str, port: int) -> list[str]:
        return list(self.urls)


@pytest.fixture(scope="module")
def local_gateway():
    dns = FakeDns([f"http://127.0.0.1:{free_port()}"])  # nothing listens: never ready
    config = GatewayConfig(replica_dns="workers.test:8101", dns_refresh_s=0.2,
                           health_interval_s=0.2, max_bytes=4096)
    app = create_app(config, resolver=dns)
    server = make_server("127.0.0.1", free_port(), app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield {"url": f"http://127.0.0.1:{server.server_port}", "dns": dns}
    server.shutdown()
    thread.join(10)
    app.extensions["gateway_service"].shutdown()


def test_the_page_comes_from_the_gateway_alone_under_a_csp(context, local_gateway):
    base = local_gateway["url"]
    page, response = open_page(context, base)
    assert response.status == 200
    assert "default-src 'self'" in response.headers["content-security-policy"]
    assert page.title() == "ocrfleet"
    asked = {request.url for request in page.seen}
    assert f"{base}/ui/app.js" in asked and f"{base}/fleet" in asked
    assert all(url.startswith(base + "/") for url in asked), asked
    assert requests.get(f"{base}/ui/app.js", timeout=10).status_code == 200


def test_the_form_is_usable_from_the_keyboard_and_fits_a_phone(context, local_gateway):
    page, _ = open_page(context, local_gateway["url"])
    order = []
    for _ in range(8):
        page.keyboard.press("Tab")
        order.append(page.evaluate("() => document.activeElement.id"))
    assert order[:7] == ["api-key", "file", "page-range", "det-limit", "det-limit-type",
                         "score-thresh", "submit"], order
    page.set_viewport_size({"width": 360, "height": 740})
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 360


def test_the_fleet_panel_picks_up_a_new_replica_without_a_reload(context, local_gateway):
    dns = local_gateway["dns"]
    fleet = requests.get(f"{local_gateway['url']}/fleet", timeout=10).json()
    assert fleet["mode"] == "dns"
    assert [r["url"] for r in fleet["replicas"]] == dns.urls
    assert set(fleet["replicas"][0]) >= {"url", "ready", "inflight", "served"}
    page, _ = open_page(context, local_gateway["url"])
    first = dns.urls[0]
    rows = page.locator("#fleet-table tbody tr")
    assert rows.count() == 1
    assert rows.first.get_attribute("data-url") == first
    page.evaluate("() => { window.sameDocument = true; }")
    added = f"http://127.0.0.1:{free_port()}"
    dns.urls.append(added)
    try:
        page.wait_for_selector(f'#fleet-table tr[data-url="{added}"]')
        assert page.evaluate("() => window.sameDocument === true")  # no reload happened
        assert "0 of 2 replicas ready" in page.inner_text("#fleet-summary")
        assert page.inner_text(f'#fleet-table tr[data-url="{added}"] td.url') == \
            added.removeprefix("http://")
    finally:
        dns.urls.remove(added)
    page.wait_for_selector(f'#fleet-table tr[data-url="{added}"]', state="detached")


def test_errors_are_shown_in_words(context, local_gateway, tmp_path):
    base = local_gateway["url"]
    page, _ = open_page(context, base)
    page.click("#submit")
    assert page.inner_text("#message") == "Choose a file first."

    broken = tmp_path / "broken.pdf"
    broken.write_bytes(b"%PDF-1.7 truncated")
    expected = requests.post(f"{base}/ocr", files={"file": broken.read_bytes()},
                             timeout=10).json()["errorMsg"]
    page.set_input_files("#file", str(broken))
    page.click("#submit")
    message = page.locator("#message")
    message.filter(has_text="HTTP 422").wait_for()
    assert expected in message.inner_text()
    assert "cannot process this document" in message.inner_text()
    assert page.locator("#pages .page").count() == 0
    assert page.is_hidden("#progress-block")

    big = tmp_path / "big.png"
    big.write_bytes(documents.to_png(documents.text_image(["x"] * 3, width=400)) + b"\0" * 5000)
    page.set_input_files("#file", str(big))
    page.click("#submit")
    message.filter(has_text="HTTP 413").wait_for()
    assert "too large" in message.inner_text()
    assert "4096-byte limit" in message.inner_text()  # the gateway's own errorMsg
    assert not page.is_disabled("#submit")


def test_the_api_key_stays_in_session_storage_and_goes_out_as_a_bearer_token(
        context, local_gateway, tmp_path):
    base = local_gateway["url"]
    page, _ = open_page(context, base)
    page.fill("#api-key", "s3cret-key")
    assert page.evaluate("() => sessionStorage.getItem('ocrfleet.apiKey')") == "s3cret-key"
    page.reload()
    assert page.input_value("#api-key") == "s3cret-key"
    with page.expect_request(f"{base}/fleet") as fleet_request:
        pass
    assert fleet_request.value.headers["authorization"] == "Bearer s3cret-key"
    broken = tmp_path / "broken.pdf"
    broken.write_bytes(b"%PDF-1.7 truncated")
    page.set_input_files("#file", str(broken))
    with page.expect_request(f"{base}/ocr") as ocr_request:
        page.click("#submit")
    assert ocr_request.value.headers["authorization"] == "Bearer s3cret-key"
    assert ocr_request.value.headers["accept"] == "application/x-ndjson"
    assert page.evaluate("() => localStorage.length") == 0  # never kept beyond the session
    other_tab_session = context.browser.new_context()
    try:
        fresh = other_tab_session.new_page()
        fresh.goto(base + "/")
        assert fresh.input_value("#api-key") == ""
    finally:
        other_tab_session.close()


def test_progress_reads_pages_rate_and_time_left(context, local_gateway):
    page, _ = open_page(context, local_gateway["url"])
    text = page.evaluate("() => window.ocrfleet.progressText(2, 10, 4, false)")
    assert text == "2 of 10 pages · 0.50 pages/s · about 16 s left"
    assert page.evaluate("() => window.ocrfleet.progressText(0, null, 1, false)") == \
        "0 pages done · waiting for the first page…"
    assert page.evaluate("() => window.ocrfleet.progressText(3, 3, 2, true)") == \
        "3 of 3 pages · 1.50 pages/s · finished in 2.0 s"
    assert page.evaluate("() => window.ocrfleet.progressText(4, 10, 2, false, 3)") == \
        "4 of 10 pages · 3 of 4 pages from the cache · 2.00 pages/s · about 3 s left"
    assert page.evaluate("() => window.ocrfleet.progressText(3, 3, 2, true, 0)") == \
        "3 of 3 pages · 1.50 pages/s · finished in 2.0 s"  # none from the cache: not said
    shapes = page.evaluate("() => window.ocrfleet.boxShapes({rec_polys: [], "
                           "rec_boxes: [[1, 2, 3, 4]]})")
    assert shapes == [[[1, 2], [3, 2], [3, 4], [1, 4]]]


# ---- a real fleet: a gateway over two real workers -------------------------------------------
@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    # a 2-megapixel budget: Letter pages at 144 dpi fit, a 60000-pt page cannot be rendered
    processes, url = start_fleet(tmp_path_factory.mktemp("ui-fleet"),
                                 worker_env={"OCR_MAX_PIXELS": "2000000"})
    yield url
    stop_all(processes)


def read_document(page, path, route: str = "/ocr", button: str = "#submit") -> dict:
    """Upload `path` with `button` (the one that posts to `route`), wait for the summary, and
    return the stream's lines as the page got them (per page index, and the summary)."""
    page.set_input_files("#file", str(path))
    with page.expect_response(lambda r: r.url.endswith(route),
                              timeout=OCR_TIMEOUT_MS) as response_info:
        page.click(button)
    page.wait_for_selector("#progress-text:has-text('finished')", timeout=OCR_TIMEOUT_MS)
    lines = [json.loads(line) for line in response_info.value.text().splitlines() if line]
    return {"pages": {line["pageIndex"]: line for line in lines if "pageIndex" in line},
            "summary": lines[-1]}


def download(page, selector: str) -> tuple[str, bytes]:
    with page.expect_download() as info:
        page.click(selector)
    return info.value.suggested_filename, open(info.value.path(), "rb").read()


def panel_texts(page, number: int) -> list[str]:
    return page.locator(f"#page-{number} .lines li").all_inner_texts()


@pytest.mark.engine
def test_a_three_page_pdf_streams_into_three_panels_with_texts_boxes_and_downloads(
        context, fleet, tmp_path):
    pdf = tmp_path / "letter.pdf"
    pdf.write_bytes(documents.labelled_pdf(3))
    page, _ = open_page(context, fleet)
    page.fill("#score-thresh", "0.3")
    got = read_document(page, pdf)
    assert got["summary"]["done"] is True and got["summary"]["errorCode"] == 0
    assert page.locator("#pages .page").count() == 3
    for number in (1, 2, 3):
        line = got["pages"][number - 1]
        pruned = line["ocrResult"]["prunedResult"]
        texts = panel_texts(page, number)
        assert texts == pruned["rec_texts"]
        assert documents.has_page_label(" ".join(texts), number, 3), texts
        boxes = page.locator(f"#page-{number} svg .box")
        assert boxes.count() == len(pruned["rec_boxes"]) == len(texts) > 1
        assert page.get_attribute(f"#page-{number} svg", "viewBox") == \
            f"0 0 {line['pageInfo']['width']} {line['pageInfo']['height']}"
        # the page image the worker rendered, decoded in the browser, behind the boxes
        assert page.get_attribute(f"#page-{number} img", "src").startswith("blob:")
        assert page.evaluate(f"() => document.querySelector('#page-{number} img')"
                             ".naturalWidth") > 0
    assert page.get_attribute("#progress", "value") == "3"
    assert page.get_attribute("#progress", "max") == "3"
    assert page.inner_text("#progress-text").startswith("3 of 3 pages")

    # hovering a line lights its box, hovering a box lights its line, focus works too
    page.hover("#page-2 .lines li >> nth=1")
    assert page.locator('#page-2 .box.hot').get_attribute("data-index") == "1"
    page.hover('#page-1 svg .box[data-index="0"]')
    assert page.locator("#page-1 .lines li.hot").inner_text() == panel_texts(page, 1)[0]
    page.focus("#page-3 .lines li >> nth=2")
    assert page.locator('#page-3 .box.hot').get_attribute("data-index") == "2"

    # a phone's width: one column, nothing wider than the screen
    page.set_viewport_size({"width": 390, "height": 844})
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
    page.set_viewport_size({"width": 1280, "height": 900})

    # copies and downloads
    page.click('#page-2 [data-action="copy"]')
    assert page.evaluate("() => navigator.clipboard.readText()") == "\n".join(
        panel_texts(page, 2))
    name, body = download(page, "#doc-json")
    envelope = json.loads(body)
    assert name == "letter.json"
    assert envelope["errorCode"] == 0 and envelope["logId"] == got["summary"]["logId"]
    assert envelope["result"]["dataInfo"] == got["summary"]["result"]["dataInfo"]
    assert [r["prunedResult"]["rec_texts"] for r in envelope["result"]["ocrResults"]] == \
        [panel_texts(page, n) for n in (1, 2, 3)]
    name, body = download(page, "#doc-text")
    assert name == "letter.txt"
    assert body.decode().split("\n\f") == ["\n".join(panel_texts(page, n)) for n in (1, 2, 3)]
    name, body = download(page, '#page-3 [data-action="json"]')
    page_envelope = json.loads(body)
    assert name == "letter-page-3.json"
    assert page_envelope["result"]["ocrResults"] == [got["pages"][2]["ocrResult"]]
    assert page_envelope["result"]["dataInfo"]["pageIndices"] == [2]
    name, body = download(page, '#page-1 [data-action="text"]')
    assert (name, body.decode()) == ("letter-page-1.txt", "\n".join(panel_texts(page, 1)))

    # the searchable PDF: a PDF where the gateway makes one, else a message that says so
    downloads = []
    page.on("download", lambda item: downloads.append(item))
    page.click("#doc-pdf")
    page.wait_for_selector("#doc-pdf:not([disabled])", timeout=OCR_TIMEOUT_MS)
    if downloads:
        assert open(downloads[0].path(), "rb").read().startswith(b"%PDF")
    else:
        assert "searchable PDF" in page.inner_text("#message")

    # the fleet panel lists both workers, and their served counts have moved (polled)
    rows = page.locator("#fleet-table tbody tr")
    deadline = time.monotonic() + 15
    while sum(map(int, page.locator("#fleet-table td:nth-child(4)").all_inner_texts())) < 3:
        assert time.monotonic() < deadline, page.inner_text("#fleet-table")
        page.wait_for_timeout(100)
    assert rows.count() == 2
    for row in rows.all():
        assert row.get_attribute("data-url").startswith("http://127.0.0.1:")
        assert row.locator("td").nth(1).inner_text() == "yes"
    assert all(request.url.startswith(fleet + "/") or request.url.startswith("blob:")
               for request in page.seen), [r.url for r in page.seen]


@pytest.mark.engine
def test_a_failed_page_is_shown_in_words_and_the_others_still_are(context, fleet, tmp_path):
    document = pdfium.PdfDocument(documents.labelled_pdf(3, lines_per_page=1))
    document[1].set_mediabox(0, 0, 60000, 60000)  # too large to render within 2 megapixels
    buffer = io.BytesIO()
    document.save(buffer)
    path = tmp_path / "one-bad-page.pdf"
    path.write_bytes(buffer.getvalue())
    page, _ = open_page(context, fleet)
    got = read_document(page, path)
    assert got["pages"][1]["errorCode"] == 422
    assert page.locator("#pages .page").count() == 3
    assert page.locator("#page-2.failed").count() == 1
    assert got["pages"][1]["errorMsg"] in page.inner_text("#page-2 .page-error")
    for number in (1, 3):
        assert documents.has_page_label(" ".join(panel_texts(page, number)), number, 3)
    assert re.search(r"Page\(s\) 2 could not be processed", page.inner_text("#message"))
    assert page.get_attribute("#progress", "value") == "3"
    name, body = download(page, "#doc-json")
    envelope = json.loads(body)
    assert envelope["result"]["failedPages"] == [
        {"pageIndex": 1, "errorCode": 422, "errorMsg": got["pages"][1]["errorMsg"]}]
    assert envelope["result"]["ocrResults"][1]["error"]["errorCode"] == 422
    assert envelope["result"]["dataInfo"]["numPages"] == 2


@pytest.mark.engine
def test_an_image_is_drawn_from_the_upload_itself_without_visualization(context, fleet,
                                                                        tmp_path):
    image = documents.text_image(["Drawn from the upload", "second line 42"])
    path = tmp_path / "photo.png"
    path.write_bytes(documents.to_png(image))
    page, _ = open_page(context, fleet)
    got = read_document(page, path)
    line = got["pages"][0]
    assert line["ocrResult"]["inputImage"] is None  # visualize: false was asked for
    assert panel_texts(page, 1) == line["ocrResult"]["prunedResult"]["rec_texts"] == \
        ["Drawn from the upload", "second line 42"]
    assert page.locator("#page-1 svg .box").count() == 2
    assert page.get_attribute("#progress", "max") == "1"
    assert page.evaluate("() => document.querySelector('#page-1 img').naturalWidth") == \
        image.width


# ---- the page cache: a gateway with its cache on over sim workers ----------------------------
def test_the_progress_says_how_many_pages_came_from_the_cache(context, tmp_path):
    from tests.test_cache_flow import SIM
    from tests.test_flow_integration import start_gateway, start_workers

    processes = []
    try:
        workers = start_workers(processes, tmp_path, 1, SIM)
        gateway = start_gateway(processes, tmp_path, {"GATEWAY_REPLICAS": workers[0]},
                                GATEWAY_CACHE_ENABLED="true",
                                GATEWAY_CACHE_PATH=str(tmp_path / "cache.sqlite3"),
                                GATEWAY_JOBS_DB=str(tmp_path / "jobs.sqlite3"))
        path = tmp_path / "twice.pdf"
        path.write_bytes(documents.repeated_pdf(2, 4))  # pages 3 and 4 are pages 1 and 2 again
        page, _ = open_page(context, gateway)
        got = read_document(page, path)
        cached = [got["pages"][i]["cached"] for i in range(4)]
        # pages 1 and 2 are read; 3 and 4 wait for their twins in flight, unless a twin's
        # first attempt let go (a busy worker) and the waiting page was read itself
        assert cached[:2] == [False, False] and got["summary"]["cachedPages"] == sum(cached)
        if any(cached):
            assert f"4 of 4 pages · {sum(cached)} of 4 pages from the cache · " in \
                page.inner_text("#progress-text")
        got = read_document(page, path)  # again: every page from the cache
        assert got["summary"]["cachedPages"] == 4
        assert "4 of 4 pages · 4 of 4 pages from the cache · " in \
            page.inner_text("#progress-text")
        assert page.locator("#pages .page").count() == 4
    finally:
        stop_all(processes)
