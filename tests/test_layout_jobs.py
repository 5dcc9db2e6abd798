"""Layout parsing as an async job (issue 50): `POST /jobs` with `"endpoint": "/layout-parsing"`
stores the document with its endpoint, and the job's result is /layout-parsing's answer
(PaddleX's `layoutParsingResults` JSON, `layoutParsingResult` NDJSON lines, the document's
Markdown with page breaks). All through the public HTTP interface.

- The endpoint survives either store: a job submitted to a gateway that runs no jobs
  (GATEWAY_JOBS_RUNNERS=0) is run by another gateway sharing its store, once on Redis, once
  on the SQLite file, and comes back from the first with its pages in order (against a
  worker's own answer for the whole file).
- A bad `endpoint`, or a layout field the fleet cannot honour, is a 4xx JSON error before
  anything is stored; a layout job's result answers only in the layout formats, an /ocr job's
  never in Markdown.
- One test on the real engine: a generated 3-page report's headings and tables, in order.

The fleet: two sim workers (OCR simulated, the layout models real), Redis, and two gateways per
store."""

from __future__ import annotations

import functools
import io
import itertools
import json

import pytest
import requests
from PIL import Image

from samples import layout_pages
from scripts.fleet import free_port, gateway_process, redis_process, stop_all
from services.layout.markdown import document_markdown
from tests import conftest
from tests.conftest import b64
from tests.test_flow_integration import SIM, start_workers

pytestmark = pytest.mark.slow  # starts servers: scheduled first (tests/conftest.py)

PAGES = 3
LAYOUT = "/layout-parsing"
wait_until = functools.partial(conftest.wait_until, timeout=120.0)


def start_gateway(started: list, logs, name: str, env: dict[str, str]) -> str:
    port = free_port()
    process = gateway_process(port, {"GATEWAY_PROCESSES": "1", "GATEWAY_BACKOFF_S": "0.01",
                                     **env}, logs / f"gateway-{name}-{port}.log")
    started.append(process)
    process.start().wait_ready(60)
    return f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """{"workers": [...], "sqlite": (front, back), "redis": (front, back)}: per store, a
    gateway that takes jobs but runs none and one that runs them, sharing the store."""
    logs = tmp_path_factory.mktemp("layout-jobs")
    started: list = []
    try:
        redis_port = free_port()
        redis = redis_process(redis_port, logs / "redis", logs / "redis.log").start()
        started.append(redis)
        workers = start_workers(started, logs, 2, {**SIM, "OCR_QUEUE_SIZE": "4"})
        redis.wait_ready(60)
        replicas = {"GATEWAY_REPLICAS": ",".join(workers)}
        stores = {"sqlite": {"GATEWAY_JOBS_DB": str(logs / "jobs.sqlite3")},
                  "redis": {"GATEWAY_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0"}}
        gateways = {}
        for kind, store in stores.items():
            front = start_gateway(started, logs, f"{kind}-front",
                                  {**replicas, **store, "GATEWAY_JOBS_RUNNERS": "0"})
            back = start_gateway(started, logs, f"{kind}-back", {**replicas, **store})
            gateways[kind] = (front, back)
        yield {"workers": workers, **gateways}
    finally:
        stop_all(started)


@pytest.fixture(scope="module")
def report_and_pages(fleet):
    """A generated 3-page report and each page's Markdown as one worker gives it for the
    whole file: what a job must give back, page by page, in this order."""
    pdf = layout_pages.report_pdf(PAGES)
    whole = requests.post(f"{fleet['workers'][0]}/layout-parsing", json={"file": b64(pdf)},
                          timeout=120)
    assert whole.status_code == 200, whole.text
    pages = [p["markdown"]["text"] for p in whole.json()["result"]["layoutParsingResults"]]
    assert len(pages) == PAGES and len(set(pages)) == PAGES  # each page its own
    return pdf, pages


def submit(gateway: str, document: bytes, **fields) -> requests.Response:
    return requests.post(f"{gateway}/jobs", json={"file": b64(document), **fields}, timeout=60)


def follow(gateway: str, job_id: str) -> dict:
    """Long-poll until the job ends; its last status."""
    for calls in itertools.count(1):
        answer = requests.get(f"{gateway}/jobs/{job_id}", params={"wait": 20}, timeout=60)
        assert answer.status_code == 200, answer.text
        status = answer.json()["result"]
        if status["state"] not in ("queued", "running"):
            return status
        assert calls < 10, status


def result(gateway: str, job_id: str, accept: str | None = None, **options):
    headers = {"Accept": accept} if accept else {}
    return requests.get(f"{gateway}/jobs/{job_id}/result", headers=headers, timeout=60,
                        **options)


@pytest.mark.parametrize("store", ["sqlite", "redis"])
def test_a_layout_job_made_on_one_gateway_runs_on_another_and_keeps_its_endpoint(
        fleet, report_and_pages, store):
    front, back = fleet[store]
    pdf, expected = report_and_pages
    answer = submit(front, pdf, fileType=0, endpoint=LAYOUT, useTableRecognition=True)
    assert answer.status_code == 202, answer.text
    status = answer.json()["result"]
    job_id = status["jobId"]
    assert status["endpoint"] == LAYOUT and status["numPages"] == PAGES
    assert answer.headers["Location"].endswith(f"/jobs/{job_id}")

    # the front runs no jobs (GATEWAY_JOBS_RUNNERS=0): the back, reading the store, ran it
    done = follow(front, job_id)
    assert done["state"] == "succeeded", done
    assert done["endpoint"] == LAYOUT
    assert done["pagesDone"] == PAGES and done["pagesFailed"] == 0
    assert requests.get(f"{back}/jobs/{job_id}", timeout=10).json()["result"]["endpoint"] \
        == LAYOUT

    whole = result(front, job_id)
    assert whole.status_code == 200, whole.text
    body = whole.json()
    assert body["errorCode"] == 0 and "ocrResults" not in body["result"]
    pages = body["result"]["layoutParsingResults"]
    assert [p["markdown"]["text"] for p in pages] == expected
    assert body["result"]["dataInfo"]["numPages"] == PAGES
    assert body["result"]["dataInfo"]["type"] == "pdf"

    stream = result(front, job_id, "application/x-ndjson", stream=True)
    assert stream.status_code == 200
    lines = [json.loads(line) for line in stream.iter_lines() if line]
    assert [line["pageIndex"] for line in lines[:-1]] == list(range(PAGES))
    assert [line["layoutParsingResult"]["markdown"]["text"] for line in lines[:-1]] == expected
    assert all("ocrResult" not in line for line in lines)
    assert lines[-1]["done"] is True and lines[-1]["jobId"] == job_id
    assert lines[-1]["state"] == "succeeded" and lines[-1]["numPages"] == PAGES

    markdown = result(front, job_id, "text/markdown")
    assert markdown.status_code == 200, markdown.text
    assert markdown.headers["Content-Type"] == "text/markdown; charset=utf-8"
    assert markdown.text == document_markdown(expected)
    assert markdown.text.count("\n---\n") == PAGES - 1  # a page break between pages
    positions = [markdown.text.index(page.strip()) for page in expected]
    assert positions == sorted(positions)

    for accept in ("application/pdf", "text/plain", "application/zip"):
        refused = result(front, job_id, accept)
        assert refused.status_code == 406, (accept, refused.text)
        assert "text/markdown" in refused.json()["errorMsg"]


def test_a_multipart_upload_names_the_endpoint_as_a_form_field(fleet, report_and_pages):
    front, _ = fleet["sqlite"]
    pdf, expected = report_and_pages
    answer = requests.post(f"{front}/jobs", files={"file": ("report.pdf", pdf)},
                           data={"endpoint": "layout-parsing", "pageRange": "2"}, timeout=60)
    assert answer.status_code == 202, answer.text
    status = answer.json()["result"]
    assert status["endpoint"] == LAYOUT and status["numPages"] == 1
    assert follow(front, status["jobId"])["state"] == "succeeded"
    markdown = result(front, status["jobId"], "text/markdown")
    assert markdown.text == document_markdown([expected[1]])


@pytest.mark.parametrize("fields, named", [
    ({"endpoint": "/nope"}, "endpoint"),
    ({"endpoint": 5}, "endpoint"),
    ({"endpoint": "/layout-parsing/"}, "endpoint"),
    ({"endpoint": LAYOUT, "useSealRecognition": True}, "useSealRecognition"),
    ({"endpoint": LAYOUT, "visualize": True}, "visualize"),
    ({"endpoint": LAYOUT, "layoutThreshold": "high"}, "layoutThreshold"),
])
def test_a_bad_field_is_a_clear_4xx_json_error_before_any_job_is_made(fleet, report_and_pages,
                                                                       fields, named):
    front, _ = fleet["redis"]
    pdf, _ = report_and_pages
    answer = submit(front, pdf, **fields)
    assert answer.status_code == 422, answer.text
    assert answer.headers["Content-Type"].startswith("application/json")
    body = answer.json()
    assert body["errorCode"] == 422 and named in body["errorMsg"]
    assert "result" not in body and "Location" not in answer.headers


def test_an_ocr_job_says_so_and_gives_no_markdown(fleet):
    front, _ = fleet["sqlite"]
    buffer = io.BytesIO()
    Image.new("RGB", (320, 120), "white").save(buffer, "PNG")
    answer = submit(front, buffer.getvalue(), visualize=False)  # no endpoint: /ocr
    assert answer.status_code == 202, answer.text
    job_id = answer.json()["result"]["jobId"]
    assert answer.json()["result"]["endpoint"] == "/ocr"
    assert follow(front, job_id)["state"] == "succeeded"
    assert "ocrResults" in result(front, job_id).json()["result"]
    refused = result(front, job_id, "text/markdown")
    assert refused.status_code == 406 and "application/pdf" in refused.json()["errorMsg"]


# ---- the real engine ----------------------------------------------------------------------------
def test_a_report_as_a_layout_job_on_the_real_engine_gives_its_headings_and_tables_in_order(
        worker_url, tmp_path):
    started: list = []
    try:
        gateway = start_gateway(started, tmp_path, "engine", {
            "GATEWAY_REPLICAS": worker_url, "GATEWAY_JOBS_DB": str(tmp_path / "jobs.sqlite3")})
        answer = submit(gateway, layout_pages.report_pdf(PAGES), endpoint=LAYOUT)
        assert answer.status_code == 202, answer.text
        job_id = answer.json()["result"]["jobId"]
        done = follow(gateway, job_id)
        assert done["state"] == "succeeded" and done["pagesDone"] == PAGES, done
        pages = result(gateway, job_id).json()["result"]["layoutParsingResults"]
        markdown = result(gateway, job_id, "text/markdown").text
    finally:
        stop_all(started)
    for number, page in enumerate(pages, 1):
        text = page["markdown"]["text"]
        assert f"{layout_pages.TITLE} {number}" in text and "<table>" in text, text
        assert "Apples" in text
    assert markdown.count("\n---\n") == PAGES - 1
    titles = [markdown.index(f"{layout_pages.TITLE} {number}") for number in (1, 2, 3)]
    breaks = [i for i in range(len(markdown)) if markdown.startswith("\n---\n", i)]
    assert titles[0] < breaks[0] < titles[1] < breaks[1] < titles[2]
    assert markdown.count("<table>") == PAGES
