"""Flow control end to end on loopback, with sim workers (fleet mechanics, not OCR): several
long PDFs at once on workers that admit one request each come back whole and in order, through
nginx and through the replica list; a full gateway answers 429 before any page of the new
document is sent; a client that goes away cancels its queued pages; a small request overtakes
long documents."""

from __future__ import annotations

import base64
import concurrent.futures
import json
import re
import socket
import time

import pytest
import requests

from deploy.nginx import render as nginx
from samples import documents
from scripts.fleet import ManagedProcess, free_port, gateway_process, stop_all, worker_process
from tests.conftest import wait_until

pytestmark = pytest.mark.slow  # starts servers: scheduled first (tests/conftest.py)

SIM = {"OCR_ENGINE": "sim", "OCR_SIM_PAGE_MS": "20", "OCR_QUEUE_SIZE": "1",
       "OCR_VISUALIZE": "false"}  # the fleet, not drawing: most of a sim page's CPU


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def metric(url: str, name: str, labels: str = "") -> float:
    text = requests.get(f"{url}/metrics", timeout=5).text
    pattern = rf"^{name}{re.escape(labels)} ([0-9.e+]+)$" if labels else rf"^{name} ([0-9.e+]+)$"
    match = re.search(pattern, text, re.M)
    return float(match.group(1)) if match else 0.0


def pages_served(url: str) -> float:
    return metric(url, "ocr_worker_pages_total", '{outcome="ok"}')


@pytest.fixture
def processes():
    started: list[ManagedProcess] = []
    yield started
    stop_all(started)


def start_workers(processes, tmp_path, count, env=SIM):
    ports = [free_port() for _ in range(count)]
    workers = [worker_process(p, env, tmp_path / f"worker-{p}.log").start() for p in ports]
    processes.extend(workers)
    for worker in workers:
        worker.wait_ready(60)
    return [f"http://127.0.0.1:{p}" for p in ports]


def start_gateway(processes, tmp_path, upstream: dict[str, str], **env):
    port = free_port()
    gateway = gateway_process(port, {**upstream, "GATEWAY_PROCESSES": "1",
                                     "GATEWAY_BACKOFF_S": "0.01", **env},
                              tmp_path / "gateway.log").start()
    processes.append(gateway)
    gateway.wait_ready(30)
    return f"http://127.0.0.1:{port}"


def start_nginx(processes, tmp_path, urls):
    run_dir = tmp_path / "nginx"
    listen = f"127.0.0.1:{free_port()}"
    config = nginx.write_config([u.removeprefix("http://") for u in urls],
                                run_dir / "nginx.conf", run_dir, listen=listen)
    proxy = ManagedProcess("nginx", nginx.nginx_command(config, run_dir),
                           ready_url=f"http://{listen}/healthz").start()
    processes.append(proxy)
    proxy.wait_ready(20)
    return f"http://{listen}"


def texts(body):
    return [page["prunedResult"]["rec_texts"][0] for page in body["result"]["ocrResults"]]


@pytest.mark.parametrize("mode", [pytest.param("nginx", marks=pytest.mark.nginx), "list"])
def test_long_pdfs_at_once_on_busy_workers_all_come_back_in_order(mode, processes, tmp_path):
    """The load that failed every document before: more pages at once than the workers admit
    (each admits one request). Behind nginx the workers answer 503 all the time; busy is not
    down: every document comes back complete and in order, and no worker is ejected or
    marked dead. With the replica list the gateway never sends a worker more than it admits
    (X-Ocr-Capacity, read at the first probe)."""
    if mode == "nginx" and nginx.find_nginx() is None:
        pytest.skip("nginx is not installed (.ci/run installs it)")
    urls = start_workers(processes, tmp_path, 2)
    upstream = ({"GATEWAY_UPSTREAM_URL": start_nginx(processes, tmp_path, urls)}
                if mode == "nginx" else {"GATEWAY_REPLICAS": ",".join(urls)})
    # a limit above what the workers admit, so the gateway meets 503s and must back off
    gateway = start_gateway(processes, tmp_path, upstream, GATEWAY_REPLICA_TARGET="4",
                            GATEWAY_MAX_ATTEMPTS="1")
    pdfs = [documents.labelled_pdf(8, seed=i, lines_per_page=0) for i in range(4)]
    expected = [texts(requests.post(f"{urls[0]}/ocr", json={"file": b64(pdf)}, timeout=60)
                      .json()) for pdf in pdfs]
    with concurrent.futures.ThreadPoolExecutor(len(pdfs)) as pool:
        answers = list(pool.map(lambda pdf: requests.post(
            f"{gateway}/ocr", json={"file": b64(pdf)}, timeout=120), pdfs))
    assert [a.status_code for a in answers] == [200] * len(pdfs), \
        [a.json().get("errorMsg") for a in answers]
    assert [texts(a.json()) for a in answers] == expected
    busy = metric(gateway, "ocr_gateway_attempts_total", '{outcome="busy"}')
    if mode == "nginx":  # behind the balancer the gateway meets 503s and backs off
        assert busy > 0
    else:  # with the list it reads each worker's admission slots (its probe) and stays under
        assert busy == 0
    assert metric(gateway, "ocr_gateway_retries_total", '{reason="503"}') == 0
    # and the fleet is still up for the next request (nginx did not mark workers dead)
    assert requests.post(f"{gateway}/ocr", json={"file": b64(pdfs[0])},
                         timeout=60).status_code == 200


def test_a_full_queue_answers_429_before_any_page_of_the_new_document_is_sent(
        processes, tmp_path):
    urls = start_workers(processes, tmp_path, 1, {**SIM, "OCR_SIM_PAGE_MS": "100"})
    gateway = start_gateway(processes, tmp_path, {"GATEWAY_REPLICAS": urls[0]},
                            GATEWAY_QUEUE_PAGES="10")
    first = documents.labelled_pdf(10, lines_per_page=0)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        admitted = pool.submit(requests.post, f"{gateway}/ocr", json={"file": b64(first)},
                               timeout=60)
        wait_until(lambda: metric(gateway, "ocr_gateway_queued_pages") > 0, what="queued pages")
        refused = requests.post(f"{gateway}/ocr", timeout=30, json={
            "file": b64(documents.labelled_pdf(5, seed=1, lines_per_page=0))})
        assert refused.status_code == 429 and refused.json()["errorCode"] == 429
        assert int(refused.headers["Retry-After"]) >= 1
        assert admitted.result().status_code == 200  # the admitted one is not failed
    assert pages_served(urls[0]) == 10  # not one page of the refused document


def test_a_client_that_goes_away_cancels_its_queued_pages(processes, tmp_path):
    urls = start_workers(processes, tmp_path, 1, {**SIM, "OCR_SIM_PAGE_MS": "100"})
    gateway = start_gateway(processes, tmp_path, {"GATEWAY_REPLICAS": urls[0]})
    pdf = documents.labelled_pdf(40, lines_per_page=0)
    with requests.post(f"{gateway}/ocr", json={"file": b64(pdf)}, stream=True, timeout=60,
                       headers={"Accept": "application/x-ndjson"}) as response:
        first = json.loads(next(response.iter_lines()))
        assert first["pageIndex"] == 0 and first["numPages"] == 40
    # the stream is closed: the gateway stops sending; the worker settles well short of 40
    settled = wait_until(lambda: _stable(lambda: pages_served(urls[0])), what="the worker idle")
    assert settled < 20
    # the same for a plain JSON request whose client hangs up
    before = pages_served(urls[0])
    try:
        requests.post(f"{gateway}/ocr", json={"file": b64(pdf)}, timeout=0.5)
    except requests.Timeout:
        pass
    settled = wait_until(lambda: _stable(lambda: pages_served(urls[0])), what="the worker idle")
    assert settled - before < 25


def test_a_closed_stream_frees_its_queued_pages_before_its_next_line(processes, tmp_path):
    # pages of 12 s: the next line, and the failed write that used to notice the hang-up,
    # would be 20 s away; the client check frees the document's pages long before
    urls = start_workers(processes, tmp_path, 1, {**SIM, "OCR_SIM_PAGE_MS": "12000"})
    gateway = start_gateway(processes, tmp_path, {"GATEWAY_REPLICAS": urls[0]})
    body = json.dumps({"file": b64(documents.labelled_pdf(6, lines_per_page=0))}).encode()
    port = int(gateway.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        client.sendall(b"POST /ocr HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       b"Accept: application/x-ndjson\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n" % len(body) + body)
        wait_until(lambda: metric(gateway, "ocr_gateway_queued_pages") == 6,
                   what="the document admitted")
    # closed (the web page's Cancel): nothing answered yet, the first page still in flight
    wait_until(lambda: metric(gateway, "ocr_gateway_queued_pages") == 0, timeout=8,
               what="the closed stream's pages freed")


def test_the_memory_budget_refuses_a_body_it_cannot_hold_until_an_answer_has_gone(
        processes, tmp_path):
    urls = start_workers(processes, tmp_path, 1, {**SIM, "OCR_SIM_PAGE_MS": "300"})
    gateway = start_gateway(processes, tmp_path, {"GATEWAY_REPLICAS": urls[0]},
                            GATEWAY_QUEUE_BYTES=str(4 * 2**20), GATEWAY_ANSWER_MEMORY_MB="1")
    small = documents.labelled_pdf(4, lines_per_page=0)
    large = {"file": b64(small + b"%" * (500 * 1024))}  # about 2.7 MB to hold while read
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        held = pool.submit(requests.post, f"{gateway}/ocr", json={"file": b64(small)},
                           timeout=60)
        wait_until(lambda: metric(gateway, "ocr_gateway_held_bytes") > 2**20,
                   what="the first answer's room held")
        refused = requests.post(f"{gateway}/ocr", json=large, timeout=30)
        assert refused.status_code == 429 and "MB held" in refused.json()["errorMsg"]
        assert int(refused.headers["Retry-After"]) >= 1
        assert held.result().status_code == 200
    # the answer has gone: its room is given back, and the large body now fits
    wait_until(lambda: metric(gateway, "ocr_gateway_held_bytes") == 0, what="room given back")
    assert requests.post(f"{gateway}/ocr", json=large, timeout=60).status_code == 200
    assert metric(gateway, "ocr_gateway_held_bytes") == 0


def _stable(read, quiet_s: float = 1.5) -> float | None:
    """The value once it has not changed for quiet_s, else None."""
    first = read()
    deadline = time.monotonic() + quiet_s
    while time.monotonic() < deadline:
        time.sleep(0.1)
        if read() != first:
            return None
    return first if first else None


def test_a_small_request_overtakes_long_documents(processes, tmp_path):
    urls = start_workers(processes, tmp_path, 1, {**SIM, "OCR_SIM_PAGE_MS": "50"})
    gateway = start_gateway(processes, tmp_path, {"GATEWAY_REPLICAS": urls[0]})
    long_pdf = b64(documents.labelled_pdf(20, lines_per_page=0))
    image = b64(documents.to_png(documents.text_image(["one line"], size=32)))
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        longs = [pool.submit(requests.post, f"{gateway}/ocr", json={"file": long_pdf},
                             timeout=120) for _ in range(3)]
        wait_until(lambda: pages_served(urls[0]) >= 3, what="the long documents under way")
        small = requests.post(f"{gateway}/ocr", json={"file": image, "fileType": 1},
                              timeout=60)
        assert small.status_code == 200
        # it came back while all three long documents were still being worked on
        assert not any(f.done() for f in longs)
        assert all(f.result().status_code == 200 for f in longs)
