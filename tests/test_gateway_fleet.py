"""The gateway in front of real workers on loopback: its answer for a multi-page PDF equals one
worker's answer for the whole PDF; pages stream in order; a worker killed with SIGKILL in the
middle of a document loses no page; failed pages are named (or returned alongside the others
when partial results are asked for); logIds reach the workers."""

import base64
import concurrent.futures
import io
import json
import re
import signal
import time

import pypdfium2 as pdfium
import pytest
import requests

from samples import documents
from scripts.fleet import free_port, gateway_process, stop_all, worker_process
from tests.conftest import all_text, b64, post_ocr, wait_until

pytestmark = pytest.mark.slow  # starts servers: scheduled first (tests/conftest.py)

REAL = {"OCR_THREADS": "1"}
ENGINE_FIXTURES = {"fleet"}  # real workers: tests using it are marked engine (conftest)


def start_fleet(tmp_path, workers_env, count=2, gateway_env=None):
    ports = [free_port() for _ in range(count)]
    workers = [worker_process(port, workers_env, tmp_path / f"worker-{port}.log").start()
               for port in ports]
    for worker in workers:
        worker.wait_ready(120)
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    gateway_port = free_port()
    gateway = gateway_process(gateway_port, {"GATEWAY_REPLICAS": ",".join(urls),
                                             "GATEWAY_PROCESSES": "1", **(gateway_env or {})},
                              tmp_path / "gateway.log").start().wait_ready(60)
    return workers, urls, gateway, f"http://127.0.0.1:{gateway_port}"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("fleet")
    workers, urls, gateway, gateway_url = start_fleet(tmp_path, REAL)
    yield {"workers": workers, "urls": urls, "gateway": gateway, "url": gateway_url,
           "logs": tmp_path}
    stop_all([*workers, gateway])


def test_split_answer_equals_one_workers_answer(fleet):
    pdf = documents.labelled_pdf(6)
    via_gateway = post_ocr(fleet["url"], {"file": b64(pdf), "logId": "parity-gw"})
    direct = post_ocr(fleet["urls"][0], {"file": b64(pdf), "logId": "parity-direct"})
    assert via_gateway.status_code == direct.status_code == 200
    gateway_body, direct_body = via_gateway.json(), direct.json()
    assert gateway_body["logId"] == "parity-gw"
    assert [documents.has_page_label(t, n, 6) for n, t in
            enumerate(all_text(gateway_body), start=1)] == [True] * 6
    assert all_text(gateway_body) == all_text(direct_body)
    # not only the texts: boxes, scores and dataInfo are the same as unsplit
    assert gateway_body["result"] == direct_body["result"]


def test_sixteen_page_table_pdf_every_page_in_order_with_its_text(fleet):
    pages = 16
    pdf = documents.table_pdf(pages)
    response = post_ocr(fleet["url"], {"file": b64(pdf)}, timeout=300)
    assert response.status_code == 200
    texts = all_text(response.json())
    assert len(texts) == pages
    for number, text in enumerate(texts, start=1):
        assert "Quarterly report" in text and documents.has_page_label(text, number, pages), text
        for header in ("item", "quantity", "price", "total"):
            assert header in text.split(), (number, header)
        assert len(re.findall(r"\d+\.\d\d", text)) >= 12, text  # the table's amounts


def test_pages_are_spread_over_replicas_and_log_ids_reach_them(fleet):
    pdf = documents.labelled_pdf(4, lines_per_page=1)
    response = post_ocr(fleet["url"], {"file": b64(pdf), "logId": "follow-me-42"})
    assert response.status_code == 200
    for worker in fleet["workers"]:  # log lines are written as the answers go out
        wait_until(lambda: '"logId": "follow-me-42"' in worker.log_path.read_text(),
                   timeout=10, what=f"the logId in {worker.name}'s log")


def test_page_range_and_images_through_the_gateway(fleet):
    pdf = documents.labelled_pdf(5, lines_per_page=0)
    response = post_ocr(fleet["url"], {"file": b64(pdf), "pageRange": "2-3,5"})
    assert response.status_code == 200
    body = response.json()
    assert body["result"]["dataInfo"]["pageIndices"] == [1, 2, 4]
    assert [documents.has_page_label(t, n, 5) for n, t in
            zip((2, 3, 5), all_text(body))] == [True] * 3
    image = documents.text_image(["Gateway image passthrough"])
    response = post_ocr(fleet["url"], {"file": b64(documents.to_png(image)), "fileType": 1})
    assert response.status_code == 200
    assert response.json()["result"]["dataInfo"] == {"width": image.width,
                                                     "height": image.height, "type": "image"}
    assert all_text(response.json()) == ["Gateway image passthrough"]


def test_multipage_tiff_through_the_gateway_equals_one_worker(fleet):
    tiff = b64(documents.labelled_tiff(3))
    via_gateway = post_ocr(fleet["url"], {"file": tiff, "visualize": False})
    direct = post_ocr(fleet["urls"][0], {"file": tiff, "visualize": False})
    assert via_gateway.status_code == direct.status_code == 200
    assert via_gateway.json()["result"] == direct.json()["result"]
    assert via_gateway.json()["result"]["dataInfo"]["type"] == "tiff"
    ranged = post_ocr(fleet["url"], {"file": tiff, "visualize": False, "pageRange": "2-3"})
    assert ranged.status_code == 200
    assert ranged.json()["result"]["dataInfo"]["pageIndices"] == [1, 2]
    assert documents.has_page_label(all_text(ranged.json())[0], 2, 3)


def test_streaming_returns_one_line_per_page_in_order_then_a_summary(fleet):
    pdf = documents.labelled_pdf(5, lines_per_page=0)
    response = requests.post(f"{fleet['url']}/ocr", json={"file": b64(pdf)}, timeout=120,
                             headers={"Accept": "application/x-ndjson"}, stream=True)
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in response.iter_lines() if line]
    assert [line.get("pageIndex") for line in lines[:-1]] == [0, 1, 2, 3, 4]
    for number, line in enumerate(lines[:-1], start=1):
        texts = " ".join(line["ocrResult"]["prunedResult"]["rec_texts"])
        assert documents.has_page_label(texts, number, 5), texts
    summary = lines[-1]
    assert summary["done"] is True and summary["errorCode"] == 0
    assert summary["result"]["dataInfo"]["numPages"] == 5


def test_bad_input_is_a_4xx_from_the_gateway_too(fleet):
    cases = [
        ({"file": "###"}, 422),
        ({"file": b64(b"%PDF-1.7 truncated")}, 422),
        ({"file": b64(documents.labelled_pdf(2)), "pageRange": "9"}, 422),
        ({"file": b64(documents.labelled_pdf(1)), "textDetThresh": 7}, 422),
        ({"file": b64(documents.labelled_pdf(1)), "returnPartialResults": "yes"}, 422),
    ]
    for body, status in cases:
        response = post_ocr(fleet["url"], body)
        assert response.status_code == status, response.text
        assert response.json()["errorCode"] == status
    not_json = requests.post(f"{fleet['url']}/ocr", data=b"nope", timeout=10)
    assert not_json.status_code == 400 and not_json.json()["errorCode"] == 400
    assert requests.get(f"{fleet['url']}/ocr", timeout=10).status_code == 405


def test_damaged_files_never_cause_a_5xx_at_the_gateway(fleet):
    from tests.test_worker_bad_input import mutations

    for name, data in mutations(seed=7, count=24):
        response = post_ocr(fleet["url"], {"file": b64(data), "visualize": False}, timeout=120)
        assert response.status_code == 200 or 400 <= response.status_code < 500, \
            (name, response.status_code, response.text[:300])


def test_gateway_readiness_and_metrics(fleet):
    ready = requests.get(f"{fleet['url']}/readyz", timeout=5)
    assert ready.status_code == 200 and "2 of 2" in ready.json()["detail"]
    text = requests.get(f"{fleet['url']}/metrics", timeout=5).text
    for name in ("ocr_gateway_documents_total", "ocr_gateway_pages_total",
                 "ocr_gateway_replica_inflight", "ocr_gateway_request_seconds_bucket",
                 "ocr_gateway_page_seconds_bucket", 'ocr_gateway_replicas{state="ready"}'):
        assert name in text, name


@pytest.mark.engine
def test_sigkill_of_a_worker_mid_document_loses_no_page(tmp_path):
    workers, urls, gateway, url = start_fleet(tmp_path, REAL)
    try:
        pages = 10
        pdf = documents.labelled_pdf(pages)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(post_ocr, url, {"file": b64(pdf)}, 300)
            # wait until the victim is busy with pages of this document, then kill it
            deadline = time.monotonic() + 60
            victim, busy = workers[1], False
            while not busy and time.monotonic() < deadline:
                metrics = requests.get(f"{urls[1]}/metrics", timeout=5).text
                busy = re.search(r"^ocr_worker_inflight_requests [1-9]", metrics, re.M)
                time.sleep(0.02)
            assert busy, "the victim never received a page"
            victim.signal_group(signal.SIGKILL)
            response = pending.result(300)
        assert not victim.alive()
        assert response.status_code == 200, response.text
        texts = all_text(response.json())
        assert len(texts) == pages
        for number, text in enumerate(texts, start=1):
            assert documents.has_page_label(text, number, pages), (number, text)
        metrics = requests.get(f"{url}/metrics", timeout=5).text
        retries = re.findall(r'^ocr_gateway_retries_total\{reason="[^"]+"\} (\d+)', metrics, re.M)
        assert sum(float(n) for n in retries) >= 1, "no page was retried"
    finally:
        stop_all([*workers, gateway])


def mixed_size_pdf(sizes) -> bytes:
    pdf = pdfium.PdfDocument.new()
    for width, height in sizes:
        pdf.new_page(width, height)
    buffer = io.BytesIO()
    pdf.save(buffer)
    return buffer.getvalue()


def test_failed_pages_are_named_or_returned_beside_the_others(tmp_path):
    # workers that refuse pages too large for their pixel budget: the poster-size pages of
    # this document fail (422), the small ones succeed
    sim = {"OCR_ENGINE": "sim", "OCR_SIM_PAGE_MS": "50", "OCR_MAX_PIXELS": "10000"}
    workers, urls, gateway, url = start_fleet(tmp_path, sim)
    try:
        pdf = b64(mixed_size_pdf([(100, 100), (5000, 5000), (100, 100), (5000, 5000)]))
        response = post_ocr(url, {"file": pdf})
        assert response.status_code == 422
        message = response.json()["errorMsg"]
        assert message.startswith("Page(s) 2") and "could not be processed" in message
        assert "too large to render" in message and "returnPartialResults" in message

        partial = post_ocr(url, {"file": pdf, "returnPartialResults": True})
        assert partial.status_code == 200
        result = partial.json()["result"]
        assert len(result["ocrResults"]) == 4
        assert [entry["pageIndex"] for entry in result["failedPages"]] == [1, 3]
        for index, entry in enumerate(result["ocrResults"]):
            if index in (1, 3):
                assert entry["prunedResult"] is None and entry["error"]["errorCode"] == 422
            else:
                assert entry["prunedResult"]["rec_texts"][0].startswith("[simulated]")
        assert result["dataInfo"]["pages"][1] is None
        assert result["dataInfo"]["pages"][0] == {"width": 100, "height": 100}
    finally:
        stop_all([*workers, gateway])
