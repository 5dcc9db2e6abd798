"""Hostile documents asked back as a searchable PDF or a ZIP: a few KB to a few MB that would
take the gateway past its memory (a page tree listing one page a million times under
`/Count 1`, a page tree that contains itself, a TIFF whose unread frame is 20000 x 20000).
Each gets a JSON 4xx, the gateway's own memory stays where it was (the PDF is built in a
capped child process, gateway/outputs/sandbox.py) and it answers the next request. Sim
engine on loopback."""

from __future__ import annotations

import base64
import io

import pytest
import requests
from PIL import Image

from loadtest import documents, procstats
from scripts.fleet import free_port, gateway_process, stop_all, worker_process

pytestmark = pytest.mark.slow  # starts servers: scheduled first (tests/conftest.py)


def raw_pdf(kids: bytes, count: int) -> bytes:
    """A PDF written by hand: a catalog, a /Pages node with these /Kids, one page."""
    objects = {1: b"<< /Type /Catalog /Pages 2 0 R >>",
               2: b"<< /Type /Pages /Kids [" + kids + b"] /Count %d >>" % count,
               3: b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 200 100] >>"}
    out = io.BytesIO()
    out.write(b"%PDF-1.7\n")
    offsets = {}
    for number, body in objects.items():
        offsets[number] = out.tell()
        out.write(b"%d 0 obj\n%s\nendobj\n" % (number, body))
    xref = out.tell()
    out.write(b"xref\n0 4\n0000000000 65535 f \n")
    for number in (1, 2, 3):
        out.write(b"%010d 00000 n \n" % offsets[number])
    out.write(b"trailer\n<< /Size 4 /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % xref)
    return out.getvalue()


def huge_frame_tiff() -> bytes:
    small = Image.new("1", (100, 50), 1)
    huge = Image.new("1", (20000, 20000), 1)  # 400 M pixels, a few KB as CCITT G4
    buffer = io.BytesIO()
    small.save(buffer, format="TIFF", save_all=True, append_images=[huge],
               compression="group4")
    return buffer.getvalue()


HOSTILE = {
    "one page listed a million times": (raw_pdf(b" ".join([b"3 0 R"] * 1_000_000), 1), {}),
    "a page tree that contains itself": (raw_pdf(b"2 0 R 3 0 R", 1), {}),
    "a 20000 x 20000 frame not read": (huge_frame_tiff(), {"pageRange": "1"}),
}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    logs = tmp_path_factory.mktemp("hostile-outputs")
    worker_port, gateway_port = free_port(), free_port()
    processes = [worker_process(worker_port, {"OCR_ENGINE": "sim"}, logs / "worker.log"),
                 gateway_process(gateway_port, {
                     "GATEWAY_REPLICAS": f"http://127.0.0.1:{worker_port}",
                     "GATEWAY_PROCESSES": "1", "GATEWAY_JOBS_ENABLED": "false",
                     "GATEWAY_OUTPUT_MEMORY_MB": "256"}, logs / "gateway.log")]
    try:
        for process in processes:
            process.start().wait_ready(60)
        yield processes[1], f"http://127.0.0.1:{gateway_port}"
    finally:
        stop_all(processes)


def gateway_rss_mib(process) -> float:
    """The gateway's master and worker (not its PDF builders, which may be replaced)."""
    pids = [process.pid, procstats.gunicorn_worker_pid(process.pid)]
    return sum(procstats.rss_kib(pid) for pid in pids) / 1024


@pytest.mark.parametrize("accept", ["application/pdf", "application/zip"])
@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_document_is_refused_in_every_output_without_costing_the_gateway(
        gateway, name, accept):
    process, url = gateway
    data, fields = HOSTILE[name]
    before = gateway_rss_mib(process)
    answer = requests.post(f"{url}/ocr", headers={"Accept": accept}, timeout=120,
                           json={"file": base64.b64encode(data).decode(), **fields})
    assert answer.status_code in (413, 422), answer.text[:300]
    assert answer.headers["Content-Type"].startswith("application/json")
    assert answer.json()["errorCode"] == answer.status_code
    assert gateway_rss_mib(process) - before < 150  # the work was not the gateway's
    good = documents.labelled_pdf(2, lines_per_page=0)
    after = requests.post(f"{url}/ocr", headers={"Accept": accept}, timeout=60,
                          json={"file": base64.b64encode(good).decode()})
    assert after.status_code == 200  # and the next document is served
