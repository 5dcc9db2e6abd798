"""Two gateways share 32 sim workers on loopback (fleet mechanics, not OCR), behind one nginx
and as a replica list: the documents sent to both progress together, because each gateway
process takes its documents' share of the fleet (gateway/flow/share.py), and the fleet's slots are
learned from the workers, not configured. Progress is read from the NDJSON streams, page by
page: no wall-clock figure is asserted."""

from __future__ import annotations

import base64
import json
import threading
import time

import pytest
import requests

from deploy.nginx import render as nginx
from services.ocr_api.fleet_board import BOARD_HEADER, Board
from samples import documents
from scripts.fleet import ManagedProcess, free_port, gateway_process, stop_all, worker_process

# starts servers; with the machine to itself, after the rest (`make test`): at 2 cores shared
# with three other test processes, a lone document was at 101 of 120 pages once in CI when the
# first ended, for want of CPU, not of share (the threshold is 102)
pytestmark = [pytest.mark.slow, pytest.mark.alone]

WORKERS = 32
PAGES = 120
# 0.8 s pages: at 0.4 s (80 pages/s through two gateways) the gateways, on 2 cores shared
# with three other test processes in CI, could not keep their shares in flight, and one
# gateway's documents fell behind for want of CPU, not of share (a lone document at 99 of
# 120 once in CI; three copies of this test run at once failed five times in six, and
# passed eight times in nine at 0.8 s)
SIM = {"OCR_ENGINE": "sim", "OCR_SIM_PAGE_MS": "800", "OCR_VISUALIZE": "false",
       "OCR_LOG_LEVEL": "WARNING"}


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    logs = tmp_path_factory.mktemp("fleet-scale")
    ports = [free_port() for _ in range(WORKERS)]
    started = [worker_process(p, SIM, logs / f"worker-{p}.log").start() for p in ports]
    try:
        for worker in started:
            worker.wait_ready(120)
        yield [f"http://127.0.0.1:{p}" for p in ports], logs
    finally:
        stop_all(started)


@pytest.fixture
def processes():
    started: list[ManagedProcess] = []
    yield started
    stop_all(started)


def upstream_for(mode, urls, logs, processes) -> dict[str, str]:
    if mode == "list":
        return {"GATEWAY_REPLICAS": ",".join(urls)}
    if nginx.find_nginx() is None:
        pytest.fail("nginx is not installed (make system-deps installs it)")
    run_dir = logs / f"nginx-{free_port()}"
    port = free_port()
    config = nginx.write_config([u.removeprefix("http://") for u in urls],
                                run_dir / "nginx.conf", run_dir, listen=f"127.0.0.1:{port}")
    processes.append(ManagedProcess("nginx", nginx.nginx_command(config, run_dir),
                                    log_path=run_dir / "nginx.log").start())
    return {"GATEWAY_UPSTREAM_URL": f"http://127.0.0.1:{port}"}


@pytest.mark.parametrize("mode", [pytest.param("nginx", marks=pytest.mark.nginx), "list"])
def test_documents_through_two_gateways_progress_together(mode, workers, processes):
    urls, logs = workers
    wait_for_quiet_boards(urls)
    upstream = upstream_for(mode, urls, logs, processes)
    gateways = []
    for index in range(2):
        port = free_port()
        gateways.append(gateway_process(port, {**upstream, "GATEWAY_PROCESSES": "1",
                                               "GATEWAY_JOBS_ENABLED": "false",
                                               "GATEWAY_LOG_LEVEL": "WARNING"},
                                        logs / f"gateway-{mode}-{index}.log").start())
    processes.extend(gateways)
    for gateway in gateways:
        gateway.wait_ready(60)
    # one gateway gets three documents, the other one: shares go by documents, not gateways
    targets = [gateways[0], gateways[0], gateways[0], gateways[1]]
    body = json.dumps({"file": base64.b64encode(documents.labelled_pdf(
        PAGES, lines_per_page=0)).decode(), "visualize": False})
    done = [0] * len(targets)
    first_finish: list[list[int]] = []  # everyone's progress when the first document ends
    looks: list[list[dict]] = []  # both gateways' /fleet shares, while every document sends
    lock = threading.Lock()
    start = threading.Barrier(len(targets))

    def read(index: int) -> None:
        url = gateways.index(targets[index])
        start.wait()
        with requests.post(f"{gateways[url].ready_url.rsplit('/', 1)[0]}/ocr", data=body,
                           headers={"Content-Type": "application/json",
                                    "Accept": "application/x-ndjson"},
                           stream=True, timeout=300) as answer:
            assert answer.status_code == 200
            for line in answer.iter_lines():
                if b'"pageIndex"' in line:
                    assert b'"errorCode"' not in line, line[:300]
                    with lock:
                        done[index] += 1
                        if done[index] == PAGES and not first_finish:
                            first_finish.append(list(done))

    def watch() -> None:
        """How the gateways see the fleet, every 0.2 s from a quarter of the pages back until
        a document has fewer than a fleet's worth of pages left (all four still send)."""
        while len(looks) < 200:
            with lock:
                back, least_left = sum(done), PAGES - max(done)
            if least_left <= WORKERS:
                return
            if back >= len(targets) * PAGES // 4:
                looks.append([fleet_share(g) for g in gateways])
            time.sleep(0.2)

    threads = [threading.Thread(target=read, args=(i,)) for i in range(len(targets))]
    watcher = threading.Thread(target=watch)
    for thread in threads + [watcher]:
        thread.start()
    for thread in threads + [watcher]:
        thread.join(300)
    assert done == [PAGES] * len(targets)
    [progress] = first_finish
    # while every document still sent, each gateway met all the workers behind it, counted the
    # other's documents as the other did, and held the fleet's part its documents' weights
    # call for (gateway.flow.lead: a look, not one instant, as a document can be between chunks)
    def agreed(look: list[dict]) -> bool:
        fleet = [share["fleetDocuments"] for share in look]
        return ([share["workers"] for share in look] == [WORKERS, WORKERS]
                and abs(fleet[0] - fleet[1]) <= 0.5
                and all(s["fleetDocuments"] > s["documents"] and abs(
                    s["limit"] - s["fleetSlots"] * s["documents"] / s["fleetDocuments"]) <= 2
                        for s in look))

    assert looks and any(agreed(look) for look in looks), looks[-3:]
    # the lone document on the second gateway kept pace with the three on the first: when the
    # first of the four ended, each had most of its pages. The first round of pages, before
    # the gateways have heard of each other, can be all one gateway's (32 workers, a quarter
    # of a document): the lead it gives is given back (gateway.flow.lead). Behind one balancer
    # that is 0.89-0.98 of the pages (0.86 without it); with a list, where a gateway finds
    # the workers the other left only as it hears from them, 0.7-0.97 (0.76-0.93)
    assert min(progress) >= (0.85 if mode == "nginx" else 0.6) * PAGES, progress


def wait_for_quiet_boards(urls: list[str], timeout_s: float = 30.0) -> None:
    """Until no worker's board carries a live gateway entry: the workers are shared by both
    modes, and the stopped gateways of the one before would otherwise be counted for up to
    `client_ttl_s` (their last demand as the others last heard it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        board = Board()
        for url in urls:
            board.merge(requests.get(f"{url}/readyz", timeout=5).headers.get(BOARD_HEADER))
        if not board.clients():
            return
        assert time.monotonic() < deadline, [(e.id, e.value) for e in board.clients()]
        time.sleep(0.2)


def fleet_share(gateway) -> dict:
    return requests.get(f"{gateway.ready_url.rsplit('/', 1)[0]}/fleet", timeout=5).json()["share"]
