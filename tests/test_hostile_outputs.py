"""Hostile documents asked back as a searchable PDF or a ZIP: a few KB to a few MB that would
take the gateway past its memory (a page tree listing one page a million times under
`/Count 1`, a page tree that contains itself, a TIFF whose unread frame is 20000 x 20000).
Each gets a JSON 4xx, the gateway's own memory stays where it was (the PDF is built in a
capped child process, gateway/outputs/sandbox.py) and it answers the next request. Sim
engine on loopback."""

from __future__ import annotations

import base64
import io
import json
import time
import zlib

import pytest
import requests
from PIL import Image

from loadtest import procstats
from samples import documents
from scripts.fleet import free_port, gateway_process, stop_all, worker_process
from tests.hostile_pdfs import glyph_lines_pdf, surrogate_pdf

pytestmark = pytest.mark.slow  # starts servers: scheduled first (tests/conftest.py)


def pdf_of(objects: dict[int, bytes]) -> bytes:
    """A PDF written by hand from numbered objects (1: the catalog), with a correct xref."""
    out = io.BytesIO()
    out.write(b"%PDF-1.7\n")
    offsets = {}
    for number in sorted(objects):
        offsets[number] = out.tell()
        out.write(b"%d 0 obj\n%s\nendobj\n" % (number, objects[number]))
    xref = out.tell()
    size = max(objects) + 1
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % size)
    for number in range(1, size):
        out.write(b"%010d 00000 n \n" % offsets[number])
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (size, xref))
    return out.getvalue()


def raw_pdf(kids: bytes, count: int, media_box: bytes = b"0 0 200 100") -> bytes:
    """A catalog, a /Pages node with these /Kids, one page."""
    return pdf_of({1: b"<< /Type /Catalog /Pages 2 0 R >>",
                   2: b"<< /Type /Pages /Kids [" + kids + b"] /Count %d >>" % count,
                   3: b"<< /Type /Page /Parent 2 0 R /MediaBox [" + media_box + b"] >>"})


def deep_pdf(depth: int) -> bytes:
    """One page at the bottom of a page tree `depth` /Pages nodes deep."""
    objects = {1: b"<< /Type /Catalog /Pages 2 0 R >>"}
    for level in range(depth):
        number = level + 2
        parent = b" /Parent %d 0 R" % (number - 1) if level else b""
        objects[number] = b"<< /Type /Pages /Kids [%d 0 R] /Count 1%s >>" % (number + 1, parent)
    objects[depth + 2] = (b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 200 100] >>"
                          % (depth + 1))
    return pdf_of(objects)


def bomb_pdf(megabytes: int) -> bytes:
    """One page whose content stream inflates from a few hundred KB to `megabytes` MB."""
    packed = zlib.compress(b" " * (megabytes * 2**20), 9)
    return pdf_of({1: b"<< /Type /Catalog /Pages 2 0 R >>",
                   2: b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
                   3: b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 200 100] "
                      b"/Contents 4 0 R >>",
                   4: b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(packed)
                      + packed + b"\nendstream"})


def tiff_of(frames: list[Image.Image]) -> bytes:
    buffer = io.BytesIO()
    frames[0].save(buffer, format="TIFF", save_all=True, append_images=frames[1:],
                   compression="group4")
    return buffer.getvalue()


def huge_frame_tiff() -> bytes:
    # 400 M pixels, a few KB as CCITT G4
    return tiff_of([Image.new("1", (100, 50), 1), Image.new("1", (20000, 20000), 1)])


HOSTILE = {
    "one page listed a million times": (raw_pdf(b" ".join([b"3 0 R"] * 1_000_000), 1), {}),
    "a page tree that contains itself": (raw_pdf(b"2 0 R 3 0 R", 1), {}),
    "a 20000 x 20000 frame not read": (huge_frame_tiff(), {"pageRange": "1"}),
}


# Each asked back in every format: a 2xx answer or a 4xx JSON error, never the gateway's
# memory (the worker refuses what is over its limits; the gateway builds nothing unbounded).
FUZZ = {
    **HOSTILE,
    "a MediaBox a billion points wide": raw_pdf(b"3 0 R", 1, b"0 0 1000000000 1000000000"),
    "a page tree 3000 levels deep": deep_pdf(3000),
    "a content stream that inflates to 256 MB": bomb_pdf(256),
    "5000 one-pixel frames": tiff_of([Image.new("1", (1, 1), 1)] * 5000),
    # read from its text layer: 40,000 one-glyph lines (OCR'd instead), a lone surrogate
    "40000 one-glyph lines": (glyph_lines_pdf(40_000), {"textLayer": "auto"}),
    "a glyph whose ToUnicode is U+D800": (surrogate_pdf(), {"textLayer": "auto"}),
    "frames of mixed sizes, one of 12000 x 12000": tiff_of(
        [Image.new("1", (120, 60), 1), Image.new("1", (12000, 12000), 1),
         Image.new("1", (60, 120), 1)]),
}
FUZZ = {name: (value if isinstance(value, tuple) else (value, {}))
        for name, value in FUZZ.items()}
EVERY_ACCEPT = ["application/json", "application/x-ndjson", "text/plain", "application/pdf",
                "application/zip", "application/alto+xml", "text/vnd.hocr+html"]


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


def settled_growth(process, before: float, limit_mib: float = 150, timeout_s: float = 10) -> float:
    """The gateway's growth since `before` once it is under `limit_mib`, or as it stands after
    `timeout_s`: the heap is trimmed as the answer closes (gateway/app.py), which can be just
    after the client has read it."""
    deadline = time.monotonic() + timeout_s
    while (grown := gateway_rss_mib(process) - before) >= limit_mib \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    return grown


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
    assert settled_growth(process, before) < 150  # the work was not the gateway's
    good = documents.labelled_pdf(2, lines_per_page=0)
    after = requests.post(f"{url}/ocr", headers={"Accept": accept}, timeout=60,
                          json={"file": base64.b64encode(good).decode()})
    assert after.status_code == 200  # and the next document is served


@pytest.mark.parametrize("name", list(FUZZ))
def test_every_output_of_a_hostile_document_is_bounded(gateway, name):
    process, url = gateway
    data, fields = FUZZ[name]
    body = {"file": base64.b64encode(data).decode(), "returnPartialResults": True, **fields}
    before = gateway_rss_mib(process)
    for accept in EVERY_ACCEPT:
        answer = requests.post(f"{url}/ocr", headers={"Accept": accept}, timeout=120,
                               json=body)
        assert answer.status_code in (200, 413, 422), (accept, answer.text[:300])
        if answer.status_code != 200:
            assert answer.headers["Content-Type"].startswith("application/json"), accept
            assert answer.json()["errorCode"] == answer.status_code
        elif accept == "application/x-ndjson":  # an error can come as the stream's last line
            assert json.loads(answer.text.splitlines()[-1])["done"] is True
        assert settled_growth(process, before) < 150, accept  # the gateway's memory held
