"""Fault injection on loopback (sim workers: fleet mechanics, bounded in time): while one
100-page PDF streams through the gateway, one replica is killed (SIGKILL), another hangs
(SIGSTOP, later SIGCONT), a third is slow; behind nginx, a worker dies and nginx is reloaded.
Every page comes back exactly once and in order, within the deadline; the hung replica is
ejected, and re-admitted only once it answers again."""

from __future__ import annotations

import base64
import json
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from deploy.nginx import render as nginx
from samples import documents
from scripts.fleet import ManagedProcess, free_port, gateway_process, stop_all, worker_process
from tests.test_flow_integration import pages_served, start_nginx

pytestmark = pytest.mark.slow  # starts servers: scheduled first (tests/conftest.py)

PAGES = 100
FAST = {"OCR_ENGINE": "sim", "OCR_SIM_PAGE_MS": "40", "OCR_QUEUE_SIZE": "4",
        "OCR_VISUALIZE": "false"}  # the fleet, not drawing: most of a sim page's CPU
SLOW = {**FAST, "OCR_SIM_PAGE_MS": "400"}


@pytest.fixture
def processes():
    started: list[ManagedProcess] = []
    yield started
    for process in started:  # a stopped process cannot take SIGTERM until it is continued
        process.signal_group(signal.SIGCONT)
    stop_all(started)


def start_workers(processes, tmp_path, envs):
    ports = [free_port() for _ in envs]
    workers = [worker_process(p, env, tmp_path / f"worker-{p}.log").start()
               for p, env in zip(ports, envs)]
    processes.extend(workers)
    for worker in workers:
        worker.wait_ready(60)
    return workers, [f"http://127.0.0.1:{p}" for p in ports]


def start_gateway(processes, tmp_path, upstream, **env):
    port = free_port()
    gateway = gateway_process(port, {**upstream, "GATEWAY_PROCESSES": "1",
                                     "GATEWAY_PAGE_TIMEOUT_S": "3", "GATEWAY_EJECT_S": "1",
                                     "GATEWAY_HEALTH_INTERVAL_S": "0.3",
                                     "GATEWAY_BACKOFF_S": "0.05", **env},
                              tmp_path / "gateway.log").start()
    processes.append(gateway)
    gateway.wait_ready(30)
    return f"http://127.0.0.1:{port}"


def expected_texts(urls: list[str], pdf: bytes) -> list[str]:
    """Each page's text as the workers read it without the gateway: an equal share of the
    pages from each worker, at once."""
    file = base64.b64encode(pdf).decode()
    share = -(-PAGES // len(urls))
    ranges = [f"{first + 1}-{min(first + share, PAGES)}" for first in range(0, PAGES, share)]

    def read(url, page_range):
        body = requests.post(f"{url}/ocr", json={"file": file, "pageRange": page_range},
                             timeout=120).json()
        return [page["prunedResult"]["rec_texts"][0] for page in body["result"]["ocrResults"]]

    with ThreadPoolExecutor(len(urls)) as pool:
        return [text for part in pool.map(read, urls, ranges) for text in part]


def stream_with_faults(gateway: str, pdf: bytes, faults: dict[int, callable]) -> list[dict]:
    """Stream the document; after page N has arrived, run faults[N]. Every line returned."""
    lines = []
    with requests.post(f"{gateway}/ocr", json={"file": base64.b64encode(pdf).decode()},
                       headers={"Accept": "application/x-ndjson"}, stream=True,
                       timeout=120) as response:
        assert response.status_code == 200
        for raw in response.iter_lines():
            line = json.loads(raw)
            lines.append(line)
            if "pageIndex" in line and line["pageIndex"] in faults:
                faults.pop(line["pageIndex"])()
    return lines


def assert_every_page_once_in_order(lines, expected):
    pages = [line for line in lines if "pageIndex" in line]
    assert [line.get("errorMsg") for line in pages if "errorCode" in line] == []
    assert [line["pageIndex"] for line in pages] == list(range(PAGES))
    assert [line["ocrResult"]["prunedResult"]["rec_texts"][0] for line in pages] == expected
    assert lines[-1]["done"] is True and lines[-1]["errorCode"] == 0


def ejections(log_path, url: str) -> int:
    count = 0
    for raw in log_path.read_text().splitlines():
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        if record.get("msg") == "replica ejected" and record.get("replica") == url:
            count += 1
    return count


def served(url: str) -> int:
    return int(pages_served(url))


def test_kill_hang_and_slow_replicas_lose_no_page(processes, tmp_path):
    pdf = documents.labelled_pdf(PAGES, lines_per_page=0)
    workers, urls = start_workers(processes, tmp_path, [FAST, FAST, FAST, SLOW])
    expected = expected_texts(urls[:3], pdf)
    gateway = start_gateway(processes, tmp_path, {"GATEWAY_REPLICAS": ",".join(urls)})
    killed, hung = workers[1], workers[2]
    state = {}

    def kill():
        killed.signal_group(signal.SIGKILL)

    def hang():
        hung.signal_group(signal.SIGSTOP)
        state["hung_at"] = time.monotonic()

    def recover():
        state["served_before_recovery"] = served(urls[0])
        hung.signal_group(signal.SIGCONT)

    started = time.monotonic()
    lines = stream_with_faults(gateway, pdf, {10: kill, 25: hang, 70: recover})
    assert_every_page_once_in_order(lines, expected)
    assert time.monotonic() - started < 120  # within the request's deadline
    log = tmp_path / "gateway.log"
    # the dead one is ejected by its pages' connection errors; the hung one by a page timeout
    # when it held pages at the SIGSTOP (otherwise its failed probes alone keep it out)
    assert ejections(log, urls[1]) + ejections(log, urls[2]) >= 1
    # the recovered replica is re-admitted once it answers again: it serves pages anew
    deadline = time.monotonic() + 30
    pdf_small = base64.b64encode(documents.labelled_pdf(8, seed=3, lines_per_page=0)).decode()
    before = served(urls[2])
    while served(urls[2]) == before and time.monotonic() < deadline:
        assert requests.post(f"{gateway}/ocr", json={"file": pdf_small},
                             timeout=60).status_code == 200
    assert served(urls[2]) > before


@pytest.mark.nginx
@pytest.mark.skipif(nginx.find_nginx() is None, reason="nginx is not installed")
def test_a_dead_worker_and_an_nginx_reload_behind_the_balancer_lose_no_page(
        processes, tmp_path):
    pdf = documents.labelled_pdf(PAGES, seed=1, lines_per_page=0)
    workers, urls = start_workers(processes, tmp_path, [FAST, FAST, FAST])
    expected = expected_texts(urls[:3], pdf)
    balancer = start_nginx(processes, tmp_path, urls)
    listen = balancer.removeprefix("http://")
    run_dir = tmp_path / "nginx"
    config = run_dir / "nginx.conf"
    gateway = start_gateway(processes, tmp_path, {"GATEWAY_UPSTREAM_URL": balancer})

    def kill():
        workers[0].signal_group(signal.SIGKILL)

    def reload():
        nginx.write_config([u.removeprefix("http://") for u in urls[1:]],
                           run_dir / "nginx.conf", run_dir, listen=listen)
        nginx.reload(config, run_dir)

    lines = stream_with_faults(gateway, pdf, {15: kill, 40: reload})
    assert_every_page_once_in_order(lines, expected)
