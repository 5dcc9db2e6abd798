"""Answers under hostile load (issue 49, items 8 and 9), without a fleet: one slow document
costs its own searchable-PDF build and no one else's (a queued build's time starts when its
process does; a build over its time is killed alone), and the temporary disk that answers
spool to is bounded per gateway process, refused with a 503 and Retry-After before any work
once it is taken."""

from __future__ import annotations

import base64
import io
import json
import multiprocessing
import random
import struct
import threading
import time
import zipfile
from pathlib import Path

import pytest
import yaml
from PIL import Image
from werkzeug.serving import make_server

from gateway import outputs
from gateway.app import create_app as create_gateway
from gateway.assemble import PageOutcome
from gateway.config import GatewayConfig
from gateway.outputs import ZIP, Answer, respond
from gateway.outputs.layout import Line, PageText
from gateway.outputs.sandbox import PdfBuilder, SandboxLimits
from gateway.outputs.spool import DiskBudget, PageSpool
from samples import documents
from services.ocr_api.errors import ApiError
from services.ocr_worker.app import create_app as create_worker
from services.ocr_worker.config import WorkerConfig

FONTS = (documents.LATIN_FONTS[0],)


def blank_frames_tiff(frames: int, side: int = 5000) -> bytes:
    """`frames` blank side x side bilevel frames whose directories all point at one CCITT G4
    strip: about 100 bytes a frame, a 5000 x 5000 PDF page each to build (about a tenth of a
    second a frame)."""
    single = io.BytesIO()
    Image.new("1", (side, side), 1).save(single, format="TIFF", compression="group4")
    with Image.open(single) as image:
        offsets, counts = image.tag_v2[273], image.tag_v2[279]
        strip = b"".join(single.getvalue()[o:o + c] for o, c in zip(offsets, counts))
    # width, height, bits per sample, G4, white is zero, strip offset, samples per pixel,
    # rows per strip, strip length: (tag, type (3 short, 4 long), value)
    entries = [(256, 4, side), (257, 4, side), (258, 3, 1), (259, 3, 4), (262, 3, 0),
               (273, 4, 8), (277, 3, 1), (278, 4, side), (279, 4, len(strip))]
    out = io.BytesIO()
    out.write(b"II*\x00" + struct.pack("<I", 8 + len(strip)) + strip)
    for number in range(frames):
        following = out.tell() + 2 + 12 * len(entries) + 4
        out.write(struct.pack("<H", len(entries)))
        for tag, kind, value in entries:
            packed = struct.pack("<HH", value, 0) if kind == 3 else struct.pack("<I", value)
            out.write(struct.pack("<HHI", tag, kind, 1) + packed)
        out.write(struct.pack("<I", following if number < frames - 1 else 0))
    return out.getvalue()


def benign() -> tuple[bytes, list[PageText]]:
    line = Line("Invoice number 4711", ((20, 20), (300, 20), (300, 60), (20, 60)))
    return documents.labelled_pdf(1, lines_per_page=0), [PageText(0, 1224, 1584, [line])]


def built(builder: PdfBuilder, *args) -> bytes:
    """The PDF's bytes (the builder answers with its file, gone once closed)."""
    with builder.build(*args) as pdf:
        return pdf.read()


def build_in_thread(builder: PdfBuilder, *args) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def run():
        try:
            outcome["pdf"] = built(builder, *args)
        except ApiError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_a_slow_build_costs_only_itself():
    """One builder, a 6 s limit: a TIFF of 300 blank 5000 x 5000 frames (36 KB, some 30 s
    to build) is killed at its limit with a 422; the small PDF queued behind it is built
    once its turn comes (before, its wait counted against its own limit, and the killed
    pool took it along: a 422 "too complex" for a one-page PDF). The limit leaves the
    one-page PDF room on a machine busy with the rest of the suite (at 3 s it ran out)."""
    builder = PdfBuilder(SandboxLimits(memory_mb=512, timeout_s=6, processes=1))
    try:
        slow, slow_outcome = build_in_thread(builder, blank_frames_tiff(300), "tiff", [], FONTS)
        deadline = time.monotonic() + 30
        while not multiprocessing.active_children() and time.monotonic() < deadline:
            time.sleep(0.01)  # until the slow one runs
        pdf, pages = benign()
        quick, quick_outcome = build_in_thread(builder, pdf, "pdf", pages, FONTS)
        slow.join(60)
        quick.join(60)
        assert slow_outcome["error"].status == 422
        assert "more than 6 s" in slow_outcome["error"].message
        assert quick_outcome.get("pdf", b"").startswith(b"%PDF"), quick_outcome
        assert built(builder, pdf, "pdf", pages, FONTS).startswith(b"%PDF")  # and the next
    finally:
        builder.close()


# ---- the temporary disk -------------------------------------------------------------------
def outcome(index: int, size: int) -> PageOutcome:
    """A page whose result holds `size` bytes that do not compress (a visualization image)."""
    noise = base64.b64encode(random.Random(index).randbytes(size * 3 // 4)).decode()
    return PageOutcome(index, {"prunedResult": {"rec_texts": ["x"], "rec_polys": [
        [[0, 0], [9, 0], [9, 9], [0, 9]]]}, "ocrImage": noise}, {"width": 10, "height": 10})


def answer_of(pages: list[PageOutcome]) -> Answer:
    return Answer("log", "pdf", False, lambda: iter(pages), lambda: b"", len(pages))


class StandInBuilder:
    def build(self, *args):
        return io.BytesIO(b"%PDF-1.7 stand-in")


def test_spooled_pages_and_zips_share_the_process_disk_budget(monkeypatch):
    """Two answers of 400 KB on disk each fit a 1 MB budget, a third does not: a 503 with
    Retry-After, whether it is an answer's pages or its ZIP (which had no bound at all);
    closing an answer gives its bytes back."""
    monkeypatch.setattr(outputs, "ZIP_MEMORY_BYTES", 1000)
    disk = DiskBudget(2**20, 2**30)
    pages = [outcome(i, 100_000) for i in range(4)]
    held = []
    for _ in range(2):
        spool = PageSpool(1000, 2**30, disk)
        for page in pages:
            spool.append(page)
        held.append(spool)
    assert 800_000 < disk.used <= 2**20
    third = PageSpool(1000, 2**30, disk)
    with pytest.raises(ApiError) as refused:
        for page in pages:
            third.append(page)
    third.close()
    assert refused.value.status == 503 and refused.value.headers["Retry-After"]
    with pytest.raises(ApiError) as refused:
        respond(ZIP, answer_of(pages), (), StandInBuilder(), disk)
    assert refused.value.status == 503
    for spool in held:
        spool.close()
    assert disk.used == 0
    response = respond(ZIP, answer_of(pages), (), StandInBuilder(), disk)
    assert 250_000 < disk.used <= 2**20  # held until the answer is closed
    with zipfile.ZipFile(io.BytesIO(response.get_data())) as archive:
        assert len(json.loads(archive.read("result.json"))["result"]["ocrResults"]) == 4
    response.close()
    assert disk.used == 0


def test_a_zip_past_the_answer_bound_is_a_413_not_a_cut_off_200(monkeypatch):
    monkeypatch.setattr(outputs, "ZIP_MEMORY_BYTES", 1000)
    disk = DiskBudget(2**30, 200_000)
    with pytest.raises(ApiError) as refused:
        respond(ZIP, answer_of([outcome(i, 100_000) for i in range(3)]), (),
                StandInBuilder(), disk)
    assert refused.value.status == 413 and "NDJSON" in refused.value.message
    assert disk.used == 0


@pytest.fixture(scope="module")
def gateway():
    """A gateway test client with 1 MB of answer disk, its replica a sim worker on a
    loopback port that counts the requests it gets."""
    worker_config = WorkerConfig(engine="sim", sim_page_ms=0, warmup=False, max_pages=20)
    worker = create_worker(worker_config)
    seen = []

    def counted(environ, start_response):
        seen.append(environ["PATH_INFO"])
        return worker(environ, start_response)

    server = make_server("127.0.0.1", 0, counted, threaded=True)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    app = create_gateway(GatewayConfig(replicas=(f"http://127.0.0.1:{server.server_port}",),
                                       temp_disk_mb=1, answer_memory_mb=1), start=False)
    assert worker.extensions["ocr_service"].batcher.ready.wait(30)
    yield app.test_client(), app.extensions["gateway_service"], seen
    server.shutdown()
    server.server_close()
    app.extensions["gateway_service"].shutdown()
    worker.extensions["ocr_service"].shutdown(5)


def test_an_answer_is_refused_before_any_work_while_the_disk_is_taken(gateway):
    client, service, seen = gateway
    body = {"file": base64.b64encode(documents.labelled_pdf(1)).decode()}
    service.answer_disk.take(service.answer_disk.limit)  # answers in flight hold it all
    try:
        for accept in ("application/json", "application/zip", "text/plain"):
            before = [path for path in seen if path == "/ocr"]
            refused = client.post("/ocr", json=body, headers={"Accept": accept})
            assert refused.status_code == 503 and refused.headers["Retry-After"], accept
            assert refused.get_json()["errorCode"] == 503
            assert "NDJSON" in refused.get_json()["errorMsg"]
            assert [path for path in seen if path == "/ocr"] == before  # no page sent
        streamed = client.post("/ocr", json=body, headers={"Accept": "application/x-ndjson"})
        assert streamed.status_code == 200  # NDJSON holds nothing: served
        assert json.loads(streamed.get_data().splitlines()[-1])["errorCode"] == 0
    finally:
        service.answer_disk.give(service.answer_disk.limit)
    answered = client.post("/ocr", json=body)
    assert answered.status_code == 200 and answered.get_json()["errorCode"] == 0
    assert service.answer_disk.used == 0


def test_the_pods_temporary_disk_holds_every_process_budget():
    """deploy/k8s: the gateway's /tmp emptyDir fits GATEWAY_PROCESSES x GATEWAY_TEMP_DISK_MB
    with at least a GiB to spare (uploads, metrics files), so the budgets refuse before the
    kubelet evicts the pod."""
    base = Path(__file__).resolve().parent.parent / "deploy" / "k8s" / "base"
    env = dict(line.split("=", 1) for line in (base / "gateway.env").read_text().splitlines()
               if line and not line.startswith("#"))
    deployment = yaml.safe_load((base / "gateway-deployment.yaml").read_text())
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    size = next(v["emptyDir"]["sizeLimit"] for v in volumes if v["name"] == "tmp")
    assert size.endswith("Gi")
    budget_mb = int(env.get("GATEWAY_TEMP_DISK_MB", GatewayConfig.temp_disk_mb))
    assert int(env["GATEWAY_PROCESSES"]) * budget_mb + 1024 <= int(size[:-2]) * 1024
