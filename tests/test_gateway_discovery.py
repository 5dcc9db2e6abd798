"""Replica-set mode with DNS discovery, on loopback: the gateway re-resolves a name (here a
resolver standing in for a k8s headless Service, answering loopback addresses 127.0.0.x), so a
replica added while it runs starts receiving pages and a removed one stops, with no restart."""

import re

import pytest

from gateway.app import create_app
from gateway.config import GatewayConfig
from samples import documents
from scripts.fleet import free_port, stop_all, worker_process
from tests.conftest import b64, wait_until

pytestmark = pytest.mark.slow  # starts servers: scheduled first (tests/conftest.py)

SIM = {"OCR_ENGINE": "sim", "OCR_VISUALIZE": "false", "OCR_SIM_PAGE_MS": "50"}


def pages_served(url: str) -> float:
    import requests

    text = requests.get(f"{url}/metrics", timeout=5).text
    match = re.search(r'^ocr_worker_pages_total\{outcome="ok"\} ([0-9.]+)', text, re.M)
    return float(match.group(1)) if match else 0.0


def test_replicas_join_and_leave_through_dns(tmp_path):
    port = free_port("127.0.0.2")
    hosts = ["127.0.0.2", "127.0.0.3"]
    dns = {"hosts": list(hosts)}
    workers = {host: worker_process(port, SIM, tmp_path / f"{host}.log", host=host).start()
               for host in ("127.0.0.2", "127.0.0.3", "127.0.0.4")}

    def resolver(name, resolved_port):
        assert name == "ocr-worker-headless.test" and resolved_port == port
        return [f"http://{host}:{port}" for host in dns["hosts"]]

    config = GatewayConfig(replica_dns=f"ocr-worker-headless.test:{port}", dns_refresh_s=0.2,
                           health_interval_s=0.2)
    app = create_app(config, resolver=resolver)
    service = app.extensions["gateway_service"]
    client = app.test_client()
    try:
        for worker in workers.values():
            worker.wait_ready(60)
        pdf = b64(documents.labelled_pdf(8, lines_per_page=0))

        def ocr_ok():
            response = client.post("/ocr", json={"file": pdf})
            assert response.status_code == 200, response.get_json()
            assert len(response.get_json()["result"]["ocrResults"]) == 8

        wait_until(lambda: client.get("/readyz").status_code == 200)
        wait_until(lambda: sum(1 for r in service.replicas.replicas() if r.ready) == 2)
        ocr_ok()
        url = {host: f"http://{host}:{port}" for host in workers}
        assert pages_served(url["127.0.0.2"]) > 0 and pages_served(url["127.0.0.3"]) > 0
        assert pages_served(url["127.0.0.4"]) == 0  # not in DNS yet

        dns["hosts"].append("127.0.0.4")  # `kubectl scale` adds a pod
        wait_until(lambda: sum(1 for r in service.replicas.replicas() if r.ready) == 3)
        ocr_ok()
        assert pages_served(url["127.0.0.4"]) > 0

        dns["hosts"].remove("127.0.0.2")  # a pod goes away
        wait_until(lambda: len(service.replicas.replicas()) == 2)
        before = pages_served(url["127.0.0.2"])
        ocr_ok()
        assert pages_served(url["127.0.0.2"]) == before
    finally:
        service.shutdown()
        stop_all(list(workers.values()))
