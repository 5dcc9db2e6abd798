"""scripts/warmstart.py: the gunicorn servers the suite starts are forked from a preloaded
process (tests/conftest.py enables it), and behave as if started by Popen: their own settings,
their own session, their output in their log, their exit status reported."""

import os

import pytest
import requests

from scripts import warmstart
from scripts.fleet import free_port, gateway_process, worker_process

pytestmark = pytest.mark.slow  # starts servers: scheduled first (tests/conftest.py)


def test_a_warm_server_reads_its_own_settings_in_its_own_session(tmp_path):
    port = free_port()
    worker = worker_process(port, {"OCR_ENGINE": "sim", "OCR_QUEUE_SIZE": "3"},
                            tmp_path / "worker.log").start()
    try:
        assert isinstance(worker.process, warmstart.WarmProcess)  # this test checks a warm one
        worker.wait_ready(60)
        ready = requests.get(f"http://127.0.0.1:{port}/readyz", timeout=10).json()
        assert ready["capacity"]["slots"] == 3 and ready["engine"]["engine"] == "sim"
        assert "OCR_QUEUE_SIZE" not in os.environ  # the setting came from its env alone
        assert os.getsid(worker.pid) == worker.pid  # killed by group, as a Popen'd one
        assert ready["pid"] != worker.pid  # the master forked the process that answers
    finally:
        assert worker.stop() == 0 and not worker.group_alive()


def test_a_warm_server_that_cannot_boot_says_why_in_its_log(tmp_path):
    gateway = gateway_process(free_port(), {"GATEWAY_REPLICAS": "127.0.0.1:9",
                                            "GATEWAY_PROCESSES": "1"},
                              tmp_path / "gateway.log").start()
    try:  # the master reads the settings before it forks: its exit status comes back
        with pytest.raises(RuntimeError, match="exited with code 1"):
            gateway.wait_ready(60)
    finally:
        gateway.stop()
    assert "expected an http:// or https:// URL" in (tmp_path / "gateway.log").read_text()
