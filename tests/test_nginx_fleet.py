"""nginx (Debian's package) in front of workers on loopback, with the gateway in its one-URL
mode: the rendered config passes `nginx -t`, least_conn spreads pages over the workers, a dead
worker is passed over (proxy_next_upstream), a worker added by re-rendering + reload starts
receiving pages, and nginx's own errors come back as PaddleX JSON."""

import re
import signal
import time

import pytest
import requests

from deploy.nginx import render as nginx
from samples import documents
from scripts.fleet import (ManagedProcess, free_port, gateway_process, http_status, stop_all,
                           worker_process)
from tests.conftest import b64, post_ocr

pytestmark = [pytest.mark.nginx, pytest.mark.slow,
              pytest.mark.skipif(nginx.find_nginx() is None,
                                 reason="nginx is not installed (.ci/run installs it)")]
SIM = {"OCR_ENGINE": "sim", "OCR_VISUALIZE": "false", "OCR_SIM_PAGE_MS": "60"}


def pages_served(url):
    text = requests.get(f"{url}/metrics", timeout=5).text
    match = re.search(r'^ocr_worker_pages_total\{outcome="ok"\} ([0-9.]+)', text, re.M)
    return float(match.group(1)) if match else 0.0


def test_rendered_config_passes_nginx_t(tmp_path):
    for balance in ("least_conn", "round_robin"):
        config = nginx.write_config(["127.0.0.1:8101", "127.0.0.1:8102"],
                                    tmp_path / f"{balance}.conf", tmp_path / "run",
                                    balance=balance)
        text = config.read_text()
        assert ("least_conn;" in text) == (balance == "least_conn")
        for directive in ("keepalive 64;", "max_fails=3 fail_timeout=10s",
                          "proxy_next_upstream error timeout http_502 non_idempotent;",
                          "proxy_next_upstream_tries 3;", "client_max_body_size 300m;",
                          "proxy_read_timeout 600s;", 'proxy_set_header Connection "";'):
            assert directive in text, directive
        assert "successful" in nginx.check_config(config, tmp_path / "run")
        # busy is not down: a worker's 503 must never count toward max_fails
        failure_set = re.search(r"proxy_next_upstream ([^;]*);", text).group(1).split()
        assert "http_503" not in failure_set and "http_429" not in failure_set


def test_committed_example_matches_the_template():
    example = nginx.TEMPLATE.with_name("nginx.conf.example")
    expected = nginx.render(["127.0.0.1:8101", "127.0.0.1:8102"],
                            run_dir="/var/lib/ocrfleet/nginx")
    assert example.read_text() == expected, "re-render: python -m deploy.nginx.render ..."


def test_fleet_behind_nginx(tmp_path):
    ports = [free_port() for _ in range(3)]
    workers = [worker_process(p, SIM, tmp_path / f"w{p}.log").start() for p in ports]
    run_dir = tmp_path / "nginx"
    nginx_port = free_port()
    listen = f"127.0.0.1:{nginx_port}"
    processes = list(workers)
    try:
        for worker in workers:
            worker.wait_ready(60)
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        config = nginx.write_config([f"127.0.0.1:{p}" for p in ports[:2]],
                                    run_dir / "nginx.conf", run_dir, listen=listen)
        nginx.check_config(config, run_dir)
        proxy = ManagedProcess("nginx", nginx.nginx_command(config, run_dir),
                               ready_url=f"http://{listen}/healthz").start().wait_ready(20)
        processes.append(proxy)
        gateway_port = free_port()
        gateway = gateway_process(gateway_port, {"GATEWAY_UPSTREAM_URL": f"http://{listen}",
                                                 "GATEWAY_PROCESSES": "1"},
                                  tmp_path / "gateway.log").start().wait_ready(30)
        processes.append(gateway)
        gateway_url = f"http://127.0.0.1:{gateway_port}"
        pdf = b64(documents.labelled_pdf(8, lines_per_page=0))

        response = post_ocr(gateway_url, {"file": pdf})
        assert response.status_code == 200 and len(response.json()["result"]["ocrResults"]) == 8
        assert pages_served(urls[0]) > 0 and pages_served(urls[1]) > 0
        assert pages_served(urls[2]) == 0

        # a worker is added: re-render with three and reload nginx, no restart of anything
        nginx.write_config([f"127.0.0.1:{p}" for p in ports], run_dir / "nginx.conf", run_dir,
                           listen=listen)
        nginx.check_config(config, run_dir)
        nginx.reload(config, run_dir)
        deadline = time.monotonic() + 20
        while pages_served(urls[2]) == 0 and time.monotonic() < deadline:
            assert post_ocr(gateway_url, {"file": pdf}).status_code == 200
        assert pages_served(urls[2]) > 0

        # a worker dies: nginx passes over it, nothing is lost
        workers[0].signal_group(signal.SIGKILL)
        workers[0].process.wait(10)
        for _ in range(3):
            response = post_ocr(gateway_url, {"file": pdf})
            assert response.status_code == 200
            texts = [p["prunedResult"]["rec_texts"][0] for p in
                     response.json()["result"]["ocrResults"]]
            assert len(texts) == 8 and all(t.startswith("[simulated]") for t in texts)

        # no worker at all: nginx answers in the PaddleX envelope, not an HTML page
        for worker in workers[1:]:
            worker.signal_group(signal.SIGKILL)
            worker.process.wait(10)
        direct = requests.post(f"http://{listen}/ocr", json={"file": pdf}, timeout=30)
        assert direct.status_code == 502
        assert direct.json()["errorCode"] == 502 and "retry" in direct.json()["errorMsg"]
        assert http_status(f"{gateway_url}/healthz") == 200
    finally:
        stop_all(processes)
