"""`make run`'s launcher (scripts/run_fleet.py) as a user meets it: it brings up workers, nginx
(when installed) and the gateway, serves a document, stops everything on SIGTERM, and says
clearly when a port is taken. Uses the sim engine: this tests the launcher, not OCR."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import requests

from deploy.nginx import render as nginx
from loadtest import documents
from scripts.fleet import REPO_ROOT, free_port, free_port_block, http_status
from tests.conftest import b64


def launch(*args, **env):
    return subprocess.Popen(
        [sys.executable, "-m", "scripts.run_fleet", *args], cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "OCR_ENGINE": "sim",
             "OCR_SIM_PAGE_MS": "20", **env},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def ports_args(worker, nginx_port, gateway):
    return ["--workers", "2", "--worker-port", str(worker), "--nginx-port", str(nginx_port),
            "--gateway-port", str(gateway)]


def _taken(port):
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("with_nginx", [pytest.param(True, marks=pytest.mark.nginx), False])
def test_fleet_comes_up_serves_and_stops_on_sigterm(with_nginx):
    if with_nginx and nginx.find_nginx() is None:
        pytest.skip("nginx is not installed")
    worker, nginx_port, gateway = free_port_block(2), free_port(), free_port()
    args = ports_args(worker, nginx_port, gateway) + ([] if with_nginx else ["--no-nginx"])
    process = launch(*args)
    try:
        deadline = time.monotonic() + 90
        while http_status(f"http://127.0.0.1:{gateway}/readyz") != 200:
            assert process.poll() is None, process.stdout.read()
            assert time.monotonic() < deadline, "fleet not ready"
            time.sleep(0.2)
        pdf = b64(documents.labelled_pdf(4, lines_per_page=0))
        response = requests.post(f"http://127.0.0.1:{gateway}/ocr", json={"file": pdf},
                                 timeout=60)
        assert response.status_code == 200
        assert len(response.json()["result"]["ocrResults"]) == 4
        assert (http_status(f"http://127.0.0.1:{nginx_port}/healthz") == 200) == with_nginx
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
        assert process.returncode == 0, output
        assert ("nginx on 127.0.0.1" in output) == with_nginx
        if not with_nginx:
            assert "balances over the worker list itself" in output
        for port in (worker, worker + 1, gateway, nginx_port):
            assert not _taken(port), f"port {port} still served after stop"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


def test_a_taken_port_is_named_and_nothing_starts():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        process = launch("--workers", "1", "--worker-port", str(free_port()),
                         "--nginx-port", str(free_port()), "--gateway-port", str(taken))
        output, _ = process.communicate(timeout=30)
    assert process.returncode == 2
    assert f"port(s) {taken}" in output and "already in use" in output
