"""The web page's "Layout → Markdown" in a real browser (Debian's chromium, headless, driven by
Playwright): the document goes to POST /layout-parsing and each page's Markdown is shown
rendered, headings as heading elements and tables as real HTML tables, with copies and
downloads of the Markdown.

Document text never becomes markup: the page's own renderer (gateway/ui/app.js) rebuilds only
a table's structure (table, thead, tbody, tr, th, td; colspan and rowspan) and shows every
other tag as text. Checked with an answer whose Markdown is hostile (served to the page by
Playwright in place of the gateway's, so that every trick reaches the renderer as written),
and with a real page that says `<script>` and `onerror`, read by the real engine."""

from __future__ import annotations

import json

import pytest
import requests

from samples import layout_pages
from samples.accuracy_corpus import _pdf
from scripts.browser import chromium_missing
from scripts.fleet import free_port, gateway_process, stop_all
from tests.test_web_ui import (browser, context, download,  # noqa: F401
                               local_gateway, open_page, read_document)

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(chromium_missing() is not None,
                                 reason=chromium_missing() or "chromium is here")]

ALLOWED_ATTRIBUTES = {"td:colspan", "td:rowspan", "th:colspan", "th:rowspan", "div:class",
                      "p:class", "pre:class"}


def layout_answer(markdown: str) -> str:
    """A /layout-parsing NDJSON stream of one page whose Markdown is `markdown`."""
    page = {"logId": "hostile", "pageIndex": 0, "cached": False,
            "pageInfo": {"width": 100, "height": 100},
            "layoutParsingResult": {
                "prunedResult": {"parsing_res_list": [{"block_label": "table"}]},
                "markdown": {"text": markdown, "isStart": True, "isEnd": True, "images": {}},
                "outputImages": None, "inputImage": None}}
    summary = {"logId": "hostile", "errorCode": 0, "errorMsg": "Success", "done": True,
               "result": {"dataInfo": {"width": 100, "height": 100, "type": "image"}},
               "numPages": 1, "cachedPages": 0}
    return json.dumps(page) + "\n" + json.dumps(summary) + "\n"


def parse_layout(page, path) -> dict:
    """Upload `path` with "Layout → Markdown", wait until it is done; the stream's lines."""
    return read_document(page, path, "/layout-parsing", "#submit-layout")


def attributes(page, selector: str) -> set[str]:
    return set(page.evaluate(
        "(selector) => [...document.querySelectorAll(selector + ' *')].flatMap("
        "(e) => [...e.attributes].map((a) => e.localName + ':' + a.name))", selector))


HOSTILE = "\n\n".join([
    "# Title <img src=x onerror=\"window.pwned='heading'\">",
    "<script>window.pwned = 'script'</script> and <img src=x onerror=\"window.pwned='img'\">",
    '<div style="text-align: center;"><table><thead><tr><th colspan="2" '
    'onclick="window.pwned=1">&lt;script&gt;window.pwned=2&lt;/script&gt;</th></tr></thead>'
    '<tbody><tr><td><img src=x onerror="window.pwned=3"></td><td rowspan="x" style="color:red">'
    '<a href="javascript:window.pwned=4">link</a></td></tr>'
    '<tr><td rowspan="2">A &amp; B</td><td><iframe src="/"></iframe>'
    '<svg onload="window.pwned=5"></svg></td></tr></tbody></table></div>',
    '<div style="text-align: center;">Figure 1 <b onmouseover="window.pwned=6">bold</b></div>',
])


def test_hostile_markdown_is_shown_as_text_and_only_tables_are_built(context, local_gateway,
                                                                     tmp_path):
    page, _ = open_page(context, local_gateway["url"])
    dialogs = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.route("**/layout-parsing", lambda route: route.fulfill(
        status=200, content_type="application/x-ndjson", body=layout_answer(HOSTILE)))
    upload = tmp_path / "hostile.png"
    upload.write_bytes(b"\x89PNG\r\n\x1a\n")
    parse_layout(page, upload)

    rendered = "#page-1 .markdown"
    assert page.inner_text(f"{rendered} h1") == \
        "Title <img src=x onerror=\"window.pwned='heading'\">"
    assert page.inner_text(f"{rendered} > p") == \
        "<script>window.pwned = 'script'</script> and <img src=x onerror=\"window.pwned='img'\">"
    for tag in ("script", "img", "a", "iframe", "svg", "b", "style"):
        assert page.locator(f"{rendered} {tag}").count() == 0, tag
    assert attributes(page, rendered) <= ALLOWED_ATTRIBUTES, attributes(page, rendered)
    # the table: its structure rebuilt, its spans kept where they are numbers, text as text
    assert page.locator(f"{rendered} table").count() == 1
    assert page.locator(f"{rendered} table tr").count() == 3
    assert page.locator(f"{rendered} th").count() == 1
    assert page.locator(f"{rendered} td").count() == 4
    assert page.get_attribute(f"{rendered} th", "colspan") == "2"
    assert page.inner_text(f"{rendered} th") == "<script>window.pwned=2</script>"
    cells = page.locator(f"{rendered} td")
    assert cells.nth(0).inner_text() == '<img src=x onerror="window.pwned=3">'
    assert cells.nth(1).get_attribute("rowspan") is None  # "x" is no span
    assert cells.nth(1).inner_text() == '<a href="javascript:window.pwned=4">link</a>'
    assert cells.nth(2).inner_text() == "A & B" and cells.nth(2).get_attribute("rowspan") == "2"
    assert page.inner_text(f"{rendered} .center >> nth=1") == \
        'Figure 1 <b onmouseover="window.pwned=6">bold</b>'
    page.hover(f"{rendered} .center >> nth=1")
    page.click(f"{rendered} th")
    assert page.evaluate("() => window.pwned") is None and dialogs == []

    # the Markdown, as sent, to copy and to download; no OCR-only buttons
    assert page.text_content("#page-1 .md-source pre") == HOSTILE  # folded: its text
    assert page.is_hidden("#doc-pdf") and page.is_hidden("#doc-text")
    assert page.is_hidden("#doc-copy") and page.is_visible("#doc-md")
    page.click("#doc-md-copy")
    assert page.evaluate("() => navigator.clipboard.readText()") == HOSTILE + "\n"
    name, body = download(page, "#doc-md")
    assert (name, body.decode()) == ("hostile.md", HOSTILE + "\n")
    name, body = download(page, "#doc-json")
    envelope = json.loads(body)
    assert name == "hostile.json"
    assert envelope["result"]["layoutParsingResults"][0]["markdown"]["text"] == HOSTILE
    assert "ocrResults" not in envelope["result"]


def test_the_renderer_builds_headings_paragraphs_and_tables(context, local_gateway):
    page, _ = open_page(context, local_gateway["url"])
    html = page.evaluate("""() => {
        const box = document.createElement('div');
        box.append(window.ocrfleet.renderMarkdown(
          '# One\\n\\n## Two ##\\n\\nA line\\nand the next.\\n\\n---\\n\\n$$x^2$$\\n\\n'
          + '<table><tr><td>1<td>2<tr><td colspan=2>3</table>\\n\\n<!-- page 2: failed -->'));
        return box.innerHTML;
    }""")
    assert html == ("<h1>One</h1><h2>Two</h2><p>A line\nand the next.</p><hr>"
                    '<pre class="formula">x^2</pre><div class="table-block"><table><tr><td>1</td>'
                    '<td>2</td></tr><tr><td colspan="2">3</td></tr></table></div>'
                    '<p class="note">page 2: failed</p>')


# ---- the real engine: a gateway over one real worker -------------------------------------------
def report_with_hostile_text() -> bytes:
    """A page with a heading, a paragraph that says <script> and onerror, and a ruled table
    (reportlab reads its own markup in a Paragraph: the angle brackets are escaped there)."""
    paragraphs = [layout_pages.PARAGRAPHS[0],
                  "Beware of &lt;script&gt;alert(1)&lt;/script&gt; and "
                  "&lt;img src=x onerror=alert(2)&gt; in this text."]
    return _pdf(layout_pages.report_flowables(paragraphs=paragraphs))


@pytest.fixture
def gateway(worker_url, tmp_path):
    started: list = []
    port = free_port()
    process = gateway_process(port, {"GATEWAY_REPLICAS": worker_url, "GATEWAY_PROCESSES": "1",
                                     "GATEWAY_JOBS_DB": str(tmp_path / "jobs.sqlite3")},
                              tmp_path / "gateway.log")
    started.append(process)
    try:
        process.start().wait_ready(60)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_all(started)


def test_a_report_page_shows_its_heading_and_its_table_and_runs_none_of_its_text(
        context, gateway, tmp_path):
    path = tmp_path / "report.pdf"
    path.write_bytes(report_with_hostile_text())
    page, _ = open_page(context, gateway)
    dialogs = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    got = parse_layout(page, path)
    assert got["summary"]["done"] is True and got["summary"]["errorCode"] == 0
    markdown = got["pages"][0]["layoutParsingResult"]["markdown"]["text"]
    rendered = "#page-1 .markdown"
    headings = page.locator(f"{rendered} :is(h1, h2, h3, h4, h5, h6)")
    assert headings.count() >= 1
    assert layout_pages.TITLE in headings.first.inner_text(), markdown
    assert page.locator(f"{rendered} table").count() == markdown.count("<table>") == 1
    cells = page.locator(f"{rendered} table :is(td, th)")
    assert cells.count() == markdown.count("<td") + markdown.count("<th")
    assert cells.count() == sum(len(row) for row in layout_pages.TABLE), markdown
    texts = cells.all_inner_texts()
    assert "Apples" in texts and "Plums" in texts, texts
    assert page.locator(f"{rendered} > p").count() >= 2  # the paragraphs
    # the hostile line is text (as the engine read it), never markup or code run
    assert "script" in page.inner_text(rendered) and "onerror" in page.inner_text(rendered)
    for tag in ("script", "img", "a", "iframe"):
        assert page.locator(f"{rendered} {tag}").count() == 0, tag
    assert attributes(page, rendered) <= ALLOWED_ATTRIBUTES
    assert dialogs == []
    # the page's Markdown, downloaded, is the gateway's text/markdown for the document
    name, body = download(page, "#doc-md")
    whole = requests.post(f"{gateway}/layout-parsing", files={"file": path.read_bytes()},
                          headers={"Accept": "text/markdown"}, timeout=120)
    assert name == "report.md" and body.decode() == whole.text
    assert all(request.url.startswith(gateway + "/") or request.url.startswith("blob:")
               for request in page.seen), [r.url for r in page.seen]
