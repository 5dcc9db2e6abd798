"""OCR_INSTANCES_PER_DEVICE=K: K engine processes behind one worker port sharing one device,
the device's threads split between them, each GPU handed to K processes."""

from __future__ import annotations

import os
import runpy
import time
from types import SimpleNamespace

import pytest
import requests

from scripts.fleet import free_port, worker_process
from services.ocr_api import settings as settings_module
from services.ocr_worker.config import WorkerConfig

pytestmark = pytest.mark.slow  # starts servers: scheduled first (tests/conftest.py)

GUNICORN_CONF = "services/ocr_worker/gunicorn.conf.py"


def test_settings_multiply_processes_and_split_threads():
    settings = WorkerConfig.from_env({"OCR_PROCESSES": "2", "OCR_INSTANCES_PER_DEVICE": "3",
                                      "OCR_THREADS": "7"})
    assert settings.gunicorn_workers == 6
    assert settings.instance_threads == 2  # 7 threads of the device, 3 instances
    single = WorkerConfig.from_env({"OCR_THREADS": "4"})
    assert (single.gunicorn_workers, single.instances_per_device) == (1, 1)
    assert WorkerConfig.from_env({"OCR_INSTANCES_PER_DEVICE": "4"}).instance_threads == 1


def test_each_card_goes_to_k_processes(monkeypatch, tmp_path):
    # every variable gunicorn.conf.py sets in os.environ is set here first, so that the
    # monkeypatch restores it (a leaked PROMETHEUS_MULTIPROC_DIR would be inherited by every
    # worker the later tests start)
    for name, value in {"PORT": str(free_port()), "CUDA_VISIBLE_DEVICES_LIST": "0,1",
                        "OCR_PROCESSES": "2", "OCR_INSTANCES_PER_DEVICE": "2", "OCR_THREADS": "4",
                        "CUDA_VISIBLE_DEVICES": "",
                        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics")}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(settings_module, "_HANDED_OVER", {})
    conf = runpy.run_path(GUNICORN_CONF)
    assert conf["workers"] == 4
    assert WorkerConfig.handed_over().threads == 2  # what each process runs with
    live: dict[int, SimpleNamespace] = {}
    server = SimpleNamespace(WORKERS=live)
    for pid in range(4):
        worker = SimpleNamespace()
        conf["pre_fork"](server, worker)
        live[pid] = worker
    assert sorted(w.ocr_device for w in live.values()) == ["0", "0", "1", "1"]
    # a process that died is replaced on the card it left
    dead = next(pid for pid, w in live.items() if w.ocr_device == "1")
    del live[dead]
    replacement = SimpleNamespace()
    conf["pre_fork"](server, replacement)
    assert replacement.ocr_device == "1" and os.environ["CUDA_VISIBLE_DEVICES"] == "1"


def test_k_processes_answer_behind_one_port(tmp_path):
    port = free_port()
    process = worker_process(port, {"OCR_ENGINE": "sim", "OCR_SIM_PAGE_MS": "5",
                                    "OCR_INSTANCES_PER_DEVICE": "3", "OCR_THREADS": "3",
                                    "OCR_LOG_LEVEL": "WARNING"}, tmp_path / "worker.log")
    try:
        process.start().wait_ready(60)
        pids: set[int] = set()
        deadline = time.monotonic() + 60
        while len(pids) < 3 and time.monotonic() < deadline:
            # a new connection each time, so that any of the processes may accept it
            response = requests.get(f"http://127.0.0.1:{port}/readyz", timeout=5,
                                    headers={"Connection": "close"})
            if response.status_code == 200:
                pids.add(response.json()["pid"])
        assert len(pids) == 3, f"only {pids} answered"
        assert process.pid not in pids  # the gunicorn master serves nothing itself
        answer = requests.post(f"http://127.0.0.1:{port}/ocr", timeout=30, json={
            "file": _png_b64(), "fileType": 1, "visualize": False}).json()
        assert answer["errorCode"] == 0
    finally:
        process.stop()


def _png_b64() -> str:
    import base64

    from samples import documents

    return base64.b64encode(documents.to_png(documents.text_image(["one line"]))).decode()


def test_gpu_overlay_runs_two_instances_on_its_card():
    import yaml

    from tests.conftest import REPO_ROOT

    overlay = yaml.safe_load((REPO_ROOT / "deploy/k8s/overlays/gpu/kustomization.yaml")
                             .read_text())
    [generator] = [g for g in overlay["configMapGenerator"] if g["name"] == "ocr-worker-config"]
    env = dict(literal.split("=", 1) for literal in generator["literals"])
    settings = WorkerConfig.from_env({"OCR_PROCESSES": "1", **env})
    assert settings.instances_per_device == 2 and settings.gunicorn_workers == 2
    assert settings.instance_threads * 2 == int(env["OCR_THREADS"])
