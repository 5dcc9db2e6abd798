"""The page cache end to end on loopback, with sim workers (the engine's output is a digest of
the page's pixels, so a wrong page served from the cache shows): a 40-page PDF built from 4
distinct pages reads 4 pages cold and none warm; cached answers equal uncached ones field for
field for an image, a PDF and a TIFF, through /ocr and /jobs, as JSON and as text, and for a
PDF in every other format (searchable PDF, ALTO, hOCR, the ZIP's members, NDJSON lines, whose
`cached` flags and `cachedPages` say which pages came from the cache); an API key's entries
are its own; two gateway processes on one Redis read a page once."""

from __future__ import annotations

import base64
import concurrent.futures
import io
import json
import re
import time
import zipfile

import pypdfium2 as pdfium
import pytest
import requests

from samples import documents
from scripts.fleet import free_port, redis_process
from tests.conftest import wait_until
from tests.test_flow_integration import metric, processes, start_gateway, start_workers  # noqa: F401

pytestmark = pytest.mark.slow

SIM = {"OCR_ENGINE": "sim", "OCR_SIM_PAGE_MS": "30", "OCR_QUEUE_SIZE": "4",
       "OCR_VISUALIZE": "false"}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def served(workers) -> float:
    return sum(metric(url, "ocr_worker_pages_total", '{outcome="ok"}') for url in workers)


def ocr(gateway, data, headers=None, accept="application/json", **fields):
    response = requests.post(f"{gateway}/ocr", json={"file": b64(data), "visualize": False,
                                                     **fields},
                             headers={"Accept": accept, **(headers or {})}, timeout=120)
    assert response.status_code == 200, response.text[:300]
    return response


def same(a: dict, b: dict) -> bool:
    return {**a, "logId": None} == {**b, "logId": None}


@pytest.fixture
def fleet(processes, tmp_path):  # noqa: F811
    workers = start_workers(processes, tmp_path, 2, SIM)
    gateway = start_gateway(processes, tmp_path, {"GATEWAY_REPLICAS": ",".join(workers)},
                            GATEWAY_CACHE_ENABLED="true",
                            GATEWAY_CACHE_PATH=str(tmp_path / "cache.sqlite3"),
                            GATEWAY_JOBS_DB=str(tmp_path / "jobs.sqlite3"))
    return workers, gateway


def test_a_pdf_of_four_distinct_pages_reads_four_cold_none_warm_and_answers_the_same(fleet):
    workers, gateway = fleet
    pdf = documents.repeated_pdf(4, 40)
    before = served(workers)
    uncached = ocr(gateway, pdf, {"Cache-Control": "no-store"})
    assert served(workers) - before == 40 and "X-Ocr-Cached-Pages" in uncached.headers
    assert uncached.headers["X-Ocr-Cached-Pages"] == "0"
    before = served(workers)
    cold = ocr(gateway, pdf)
    assert served(workers) - before == 4  # the other 36 waited for their twin in flight
    assert cold.headers["X-Ocr-Cached-Pages"] == "36"
    warm = ocr(gateway, pdf)
    assert served(workers) - before == 4 and warm.headers["X-Ocr-Cached-Pages"] == "40"
    assert same(uncached.json(), cold.json()) and same(uncached.json(), warm.json())
    texts = [page["prunedResult"]["rec_texts"][0] for page in warm.json()["result"]["ocrResults"]]
    assert texts[0] == texts[4] != texts[1]
    text_uncached = ocr(gateway, pdf, {"Cache-Control": "no-cache"}, accept="text/plain")
    text_warm = ocr(gateway, pdf, accept="text/plain")
    assert text_warm.headers["X-Ocr-Cached-Pages"] == "40"
    assert text_uncached.text == text_warm.text
    # another file holding the same pages (other object numbers, metadata): all cached
    other = documents.repeated_pdf(4, 8)
    assert ocr(gateway, other).headers["X-Ocr-Cached-Pages"] == "8"
    assert served(workers) - before == 4 + 40  # only the no-cache request read pages
    # another parameter is another key
    assert ocr(gateway, pdf, textDetThresh=0.5).headers["X-Ocr-Cached-Pages"] == "36"
    page = requests.get(f"{gateway}/metrics", timeout=5).text
    assert 'ocr_gateway_cache_lookups_total{result="hit"}' in page
    assert metric(gateway, "ocr_gateway_cache_pages_total") >= 36 + 40 + 40 + 8


def ndjson(response) -> tuple[list[dict], dict]:
    lines = [json.loads(line) for line in response.text.splitlines() if line]
    return lines[:-1], lines[-1]


def without(line: dict, *names: str) -> dict:
    return {k: v for k, v in line.items() if k not in ("logId", *names)}


def pdf_pages(data: bytes) -> list[tuple[str, tuple[float, float]]]:
    """A searchable PDF as a reader sees it: each page's text layer and size."""
    document = pdfium.PdfDocument(data)
    try:
        return [(page.get_textpage().get_text_range(), tuple(page.get_size()))
                for page in document]
    finally:
        document.close()


def unnamed(data: bytes) -> bytes:
    """A searchable PDF's bytes but for what is random in every build, cached or not: the
    name of each page's text layer XObject (`/OcrText` and a token, so it never clashes
    with the page's own names) and the trailer's /ID."""
    data = re.sub(rb"/OcrText[A-Za-z0-9_-]+", b"/OcrText", data)
    return re.sub(rb"/ID \[<[0-9a-fA-F]*><[0-9a-fA-F]*>\]", b"/ID []", data)


def test_a_pdf_cached_answers_the_same_in_every_format_and_its_lines_say_which(fleet):
    workers, gateway = fleet
    pdf = documents.repeated_pdf(3, 6)
    formats = ["application/pdf", "application/alto+xml", "text/vnd.hocr+html",
               "application/zip", "application/x-ndjson"]
    uncached = {fmt: ocr(gateway, pdf, {"Cache-Control": "no-store"}, accept=fmt)
                for fmt in formats}
    before = served(workers)
    cold = ocr(gateway, pdf, accept="application/x-ndjson")
    assert served(workers) - before == 3
    warm = {fmt: ocr(gateway, pdf, accept=fmt) for fmt in formats}
    assert served(workers) - before == 3  # every format above from the cache
    for fmt in formats[:4]:
        assert warm[fmt].headers["X-Ocr-Cached-Pages"] == "6", fmt

    pages = pdf_pages(uncached["application/pdf"].content)
    assert len(pages) == 6 and pages[0][0] == pages[3][0] != pages[1][0]
    assert pdf_pages(warm["application/pdf"].content) == pages
    assert unnamed(warm["application/pdf"].content) == \
        unnamed(uncached["application/pdf"].content)
    for fmt in ("application/alto+xml", "text/vnd.hocr+html"):
        assert warm[fmt].content == uncached[fmt].content, fmt
    members = [zipfile.ZipFile(io.BytesIO(answers["application/zip"].content))
               for answers in (uncached, warm)]
    assert members[0].namelist() == members[1].namelist()
    assert same(*(json.loads(m.read("result.json")) for m in members))
    for name in ("text.txt", "result.alto.xml", "result.hocr"):
        assert members[0].read(name) == members[1].read(name), name
    assert pdf_pages(members[1].read("searchable.pdf")) == pages
    assert unnamed(members[0].read("searchable.pdf")) == \
        unnamed(members[1].read("searchable.pdf"))
    assert members[1].read("result.alto.xml") == warm["application/alto+xml"].content

    # NDJSON: the same lines but for `cached`, and a summary counting the cached pages
    first, first_summary = ndjson(uncached["application/x-ndjson"])
    again, again_summary = ndjson(cold)
    last, last_summary = ndjson(warm["application/x-ndjson"])
    assert [line["cached"] for line in first] == [False] * 6
    # cold: the first three are read; the last three wait for their twins in flight, unless a
    # twin's first attempt let go (a busy worker) and the waiting page was read itself
    cold_flags = [line["cached"] for line in again]
    assert cold_flags[:3] == [False] * 3
    assert [line["cached"] for line in last] == [True] * 6
    assert (first_summary["cachedPages"], again_summary["cachedPages"],
            last_summary["cachedPages"]) == (0, sum(cold_flags), 6)
    for lines in (again, last):
        assert [without(line, "cached") for line in lines] == \
            [without(line, "cached") for line in first]
    assert without(last_summary, "cachedPages") == without(first_summary, "cachedPages")

    # a job's NDJSON result says the same
    statuses = []

    def job_lines(headers=None):
        answer = requests.post(f"{gateway}/jobs", json={"file": b64(pdf), "visualize": False},
                               headers=headers or {}, timeout=60)
        job_id = answer.json()["result"]["jobId"]
        wait_until(lambda: requests.get(f"{gateway}/jobs/{job_id}", params={"wait": 5},
                                        timeout=30).json()["result"]["state"] == "succeeded",
                   60, what="the job to finish")
        statuses.append(requests.get(f"{gateway}/jobs/{job_id}", timeout=30).json()["result"])
        return ndjson(requests.get(f"{gateway}/jobs/{job_id}/result", timeout=30,
                                   headers={"Accept": "application/x-ndjson"}))

    job_uncached, job_uncached_summary = job_lines({"Cache-Control": "no-store"})
    job_cached, job_cached_summary = job_lines()
    assert [line["cached"] for line in job_uncached] == [False] * 6
    assert [line["cached"] for line in job_cached] == [True] * 6
    assert (job_uncached_summary["cachedPages"], job_cached_summary["cachedPages"]) == (0, 6)
    assert [status["cachedPages"] for status in statuses] == [0, 6]  # GET /jobs/{id} too
    assert [without(line, "cached") for line in job_cached] == \
        [without(line, "cached") for line in job_uncached]


@pytest.mark.parametrize("kind", ["image", "tiff"])
def test_images_and_tiffs_cached_answer_the_same_through_ocr_and_jobs(fleet, kind):
    workers, gateway = fleet
    pages = [documents.text_image([f"{kind} frame {i}"]) for i in range(3)]
    data = documents.to_png(pages[0]) if kind == "image" else documents.multipage_tiff(pages)
    count = 1 if kind == "image" else 3
    before = served(workers)
    uncached = ocr(gateway, data, {"Cache-Control": "no-store"})
    cold = ocr(gateway, data)
    warm = ocr(gateway, data)
    assert served(workers) - before == 2 * count
    assert warm.headers["X-Ocr-Cached-Pages"] == str(count)
    assert same(uncached.json(), warm.json()) and same(cold.json(), warm.json())
    assert ocr(gateway, data, {"Cache-Control": "no-cache"}, accept="text/plain").text == \
        ocr(gateway, data, accept="text/plain").text

    def job(headers=None):
        answer = requests.post(f"{gateway}/jobs", json={"file": b64(data), "visualize": False},
                               headers=headers or {}, timeout=60)
        assert answer.status_code in (200, 202), answer.text[:300]
        job_id = answer.json()["result"]["jobId"]
        wait_until(lambda: requests.get(f"{gateway}/jobs/{job_id}", params={"wait": 5},
                                        timeout=30).json()["result"]["state"] == "succeeded",
                   60, what="the job to finish")
        url = f"{gateway}/jobs/{job_id}/result"
        return (requests.get(url, timeout=30).json(),
                requests.get(url, headers={"Accept": "text/plain"}, timeout=30).text)

    before = served(workers)
    uncached_job = job({"Cache-Control": "no-store"})
    cached_job = job()
    assert served(workers) - before == count  # the no-store job's pages only
    assert same(uncached_job[0], cached_job[0]) and uncached_job[1] == cached_job[1]
    assert cached_job[1] == ocr(gateway, data, accept="text/plain").text


def test_an_api_keys_entries_are_its_own(processes, tmp_path):  # noqa: F811
    workers = start_workers(processes, tmp_path, 1, SIM)
    gateway = start_gateway(processes, tmp_path, {"GATEWAY_REPLICAS": workers[0]},
                            GATEWAY_CACHE_ENABLED="true",
                            GATEWAY_API_KEYS="key-one-0123456789,key-two-0123456789",
                            GATEWAY_CACHE_PATH=str(tmp_path / "cache.sqlite3"),
                            GATEWAY_JOBS_DB=str(tmp_path / "jobs.sqlite3"))
    image = documents.to_png(documents.text_image(["a private page"]))
    one, two = {"X-API-Key": "key-one-0123456789"}, {"X-API-Key": "key-two-0123456789"}
    assert ocr(gateway, image, one).headers["X-Ocr-Cached-Pages"] == "0"
    assert ocr(gateway, image, two).headers["X-Ocr-Cached-Pages"] == "0"
    assert ocr(gateway, image, one).headers["X-Ocr-Cached-Pages"] == "1"


def test_two_gateways_on_one_redis_read_a_page_once(processes, tmp_path):  # noqa: F811
    port = free_port()
    server = redis_process(port, tmp_path / "redis", tmp_path / "redis.log").start()
    processes.append(server)
    server.wait_ready(30)
    slow = {**SIM, "OCR_SIM_PAGE_MS": "600"}
    workers = start_workers(processes, tmp_path, 2, slow)
    for i in range(2):
        (tmp_path / f"g{i}").mkdir()
    gateways = [start_gateway(processes, tmp_path / f"g{i}",
                              {"GATEWAY_REPLICAS": ",".join(workers)},
                              GATEWAY_CACHE_ENABLED="true",
                              GATEWAY_REDIS_URL=f"redis://127.0.0.1:{port}/0")
                for i in range(2)]
    image = documents.to_png(documents.text_image(["read once by the fleet"]))
    before = served(workers)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda g: ocr(g, image), gateways * 2))
    assert served(workers) - before == 1
    assert all(same(answers[0].json(), a.json()) for a in answers)
    assert sorted(a.headers["X-Ocr-Cached-Pages"] for a in answers) == ["0", "1", "1", "1"]
    started = time.monotonic()
    assert ocr(gateways[1], image).headers["X-Ocr-Cached-Pages"] == "1"
    assert time.monotonic() - started < 0.6  # no engine time
