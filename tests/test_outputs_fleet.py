"""Searchable PDF, text and the ocrfleet client against a real fleet on loopback (one
real-engine worker behind the gateway). Each PDF is checked against the OCR JSON of the same
pass (the ZIP answer carries both): pdftotext gives back every page's lines (CER <= 0.02),
pdftotext -bbox puts the words of >= 95 % of lines in their box (IoU >= 0.5), page count and
sizes are the input's, the original content streams are byte-identical, and pages render
exactly as before. Then `ocrfleet batch` on a mixed folder, killed halfway and run again."""

import io
import json
import os
import signal
import subprocess
import sys
import time
import zipfile

import pikepdf
import pytest
import requests
from PIL import Image

from samples import documents
from scripts.fleet import REPO_ROOT, free_port, gateway_process, stop_all, worker_process
from tests import pdfcheck
from tests.test_worker_bad_input import mutations

pytestmark = pytest.mark.engine

CJK_LINES = ["发票号码一二三", "合计金额五十元"]


@pytest.fixture(scope="module")
def gateway_url(tmp_path_factory):
    pdfcheck.need_poppler()
    logs = tmp_path_factory.mktemp("outputs-fleet")
    port = free_port()
    worker = worker_process(port, {"OCR_THREADS": "1"}, logs / "worker.log").start()
    gateway = None
    try:
        worker.wait_ready(180)
        gateway = gateway_process(free_port(), {"GATEWAY_REPLICAS": f"http://127.0.0.1:{port}",
                                                "GATEWAY_PROCESSES": "1"},
                                  logs / "gateway.log").start().wait_ready(60)
        yield gateway.ready_url.rsplit("/", 1)[0]
    finally:
        stop_all([p for p in (worker, gateway) if p])


def ocr(url, data, accept, **fields):
    return requests.post(f"{url}/ocr", files={"file": ("doc", data)}, data=fields,
                         headers={"Accept": accept}, timeout=300)


def bundle(url, data, **fields):
    """(JSON answer, text, searchable PDF) from one OCR pass."""
    response = ocr(url, data, "application/zip", **fields)
    assert response.status_code == 200, response.text
    with zipfile.ZipFile(io.BytesIO(response.content)) as archive:
        return (json.loads(archive.read("result.json")), archive.read("text.txt").decode(),
                archive.read("searchable.pdf"))


def ocr_lines(answer):
    """Per OCR'd page: (page index, width px, height px, [(text, box px)])."""
    result = answer["result"]
    info = result["dataInfo"]
    sizes = [info] if info["type"] == "image" else info["pages"]
    indices = info.get("pageIndices") or range(len(sizes))
    return [(index, size["width"], size["height"],
             list(zip(entry["prunedResult"]["rec_texts"], entry["prunedResult"]["rec_boxes"])))
            for index, size, entry in zip(indices, sizes, result["ocrResults"])]


def check_searchable(original_pdf, answer, pdf, vector_text=False):
    texts, words = pdfcheck.page_texts(pdf), pdfcheck.page_words(pdf)
    sizes = pdfcheck.page_sizes(pdf)
    if original_pdf is not None:
        assert sizes == pdfcheck.page_sizes(original_pdf)  # page count and sizes
        layered = {index for index, *_ in ocr_lines(answer)}
        before = pdfcheck.content_streams(original_pdf)
        after = pdfcheck.content_streams(pdf)
        for index, (original, now) in enumerate(zip(before, after)):
            # the layer adds a stream before (q) and after (Q, then the layer); nothing else
            assert (now[1:-1] if index in layered else now) == original
        for old, new in zip(pdfcheck.render(original_pdf), pdfcheck.render(pdf)):
            assert pdfcheck.differing_pixels(old, new) == 0  # nothing visible was added
    scores = []
    for index, width, height, lines in ocr_lines(answer):
        assert lines, f"page {index + 1}: the engine read nothing"
        if not vector_text:
            reference = "".join(text for text, _ in lines)
            assert pdfcheck.cer(reference, texts[index]) <= 0.02, (reference, texts[index])
        sx, sy = sizes[index][0] / width, sizes[index][1] / height
        boxes = [(x0 * sx, y0 * sy, x1 * sx, y1 * sy) for _, (x0, y0, x1, y1) in lines]
        scores += pdfcheck.line_ious(boxes, words[index])
    assert sum(score >= 0.5 for score in scores) >= 0.95 * len(scores), scores


def test_scanned_pdf_with_latin_and_cjk_pages(gateway_url, cjk_font):
    latin = documents.text_image(documents.english_lines(4, seed=3), size=28)
    cjk = documents.text_image(CJK_LINES + ["Total 50"], font_path=cjk_font, size=36)
    scanned = documents.image_pdf([latin, cjk])
    answer, text, pdf = bundle(gateway_url, scanned)
    check_searchable(scanned, answer, pdf)
    assert "发票" in pdfcheck.page_texts(pdf)[1]
    pages = text.split("\f")
    assert len(pages) == 2
    for page, (_, _, _, lines) in zip(pages, ocr_lines(answer)):
        assert page.splitlines() == [t for t, _ in sorted(lines, key=lambda l: l[1][1])]


def test_rotated_page_and_cropbox_page(gateway_url):
    upright = documents.text_image(["Rotated page", "scanned sideways"], size=32)
    cropped = documents.text_image(["OUTSIDE THE CROP", "Inside the crop box",
                                    "visible text here"], size=32)
    source = documents.image_pdf([upright.rotate(90, expand=True), cropped])
    with pikepdf.open(io.BytesIO(source)) as document:
        document.pages[0].obj.Rotate = 90  # the viewer turns the sideways scan upright
        x0, y0, x1, y1 = (float(v) for v in document.pages[1].mediabox)
        document.pages[1].obj.CropBox = pikepdf.Array([x0 + 8, y0 + 4, x1 - 6,
                                                       y1 - (y1 - y0) * 0.3])
        buffer = io.BytesIO()
        document.save(buffer)
    prepared = buffer.getvalue()
    answer, _, pdf = bundle(gateway_url, prepared)
    check_searchable(prepared, answer, pdf)
    texts = pdfcheck.page_texts(pdf)
    assert "Rotated" in texts[0] and "Inside" in texts[1] and "OUTSIDE" not in texts[1]


def test_born_digital_pdf_keeps_its_vector_content(gateway_url):
    vector = documents.labelled_pdf(2, lines_per_page=2)
    answer, _, pdf = bundle(gateway_url, vector, pageRange="2")
    assert answer["result"]["dataInfo"]["pageIndices"] == [1]
    check_searchable(vector, answer, pdf, vector_text=True)
    with pikepdf.open(io.BytesIO(pdf)) as document:
        names = [[n for n in p.resources.get("/XObject", {}).keys() if "OcrText" in n]
                 for p in document.pages]
    assert [len(n) for n in names] == [0, 1]  # only the OCR'd page has a layer


def test_image_and_tiff_inputs(gateway_url, cjk_font):
    image = documents.text_image(["Receipt 2041", *CJK_LINES], font_path=cjk_font, size=34)
    png = io.BytesIO()
    image.save(png, format="PNG", dpi=(150, 150))
    answer, _, pdf = bundle(gateway_url, png.getvalue())
    check_searchable(None, answer, pdf)
    assert [tuple(round(v, 1) for v in s) for s in pdfcheck.page_sizes(pdf)] == \
        [(round(image.width * 72 / 150, 1), round(image.height * 72 / 150, 1))]
    tiff = documents.labelled_tiff(3)
    answer, text, pdf = bundle(gateway_url, tiff)
    check_searchable(None, answer, pdf)
    assert len(pdfcheck.page_texts(pdf)) == 3 and len(text.split("\f")) == 3
    with Image.open(io.BytesIO(tiff)) as frames:
        assert all(size == (round(frames.width * 72 / 150, 2), round(frames.height * 72 / 150,
                                                                     2))
                   for size in [tuple(round(v, 2) for v in s)
                                for s in pdfcheck.page_sizes(pdf)])


def test_text_and_pdf_answers_and_their_errors(gateway_url):
    image = documents.to_png(documents.text_image(["Plain text answer"]))
    response = ocr(gateway_url, image, "text/plain")
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain")
    assert response.text.strip() == "Plain text answer" and response.headers["X-Ocr-Pages"] == "1"
    response = ocr(gateway_url, image, "application/pdf")
    assert response.status_code == 200 and response.content.startswith(b"%PDF-")
    assert "Plain text answer" in pdfcheck.page_texts(response.content)[0]
    refused = ocr(gateway_url, image, "image/png")
    assert refused.status_code == 406 and refused.json()["errorCode"] == 406
    for name, data in mutations(seed=11, count=8):
        damaged = ocr(gateway_url, data, "application/pdf")
        assert damaged.status_code == 200 or (
            400 <= damaged.status_code < 500 and damaged.json()["errorCode"] ==
            damaged.status_code), (name, damaged.status_code, damaged.text[:200])


def run_cli(*args, env=None):
    return subprocess.Popen([sys.executable, "-m", "ocrfleet.cli", *args], cwd=REPO_ROOT,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)


def test_batch_killed_halfway_then_resumed(gateway_url, tmp_path):
    source, target = tmp_path / "in", tmp_path / "out"
    (source / "letters").mkdir(parents=True)
    files = {
        "a.pdf": documents.labelled_pdf(2, lines_per_page=0),
        "letters/b.png": documents.to_png(documents.text_image(["Letter b"])),
        "letters/c.jpg": documents.to_jpeg(documents.text_image(["Letter c"])),
        "d.tiff": documents.labelled_tiff(2),
        "e.pdf": documents.image_pdf([documents.text_image(["Scanned e"])]),
        "broken.pdf": b"%PDF-1.7 this file ends here",
    }
    for name, data in files.items():
        (source / name).write_bytes(data)
    args = ["batch", str(source), str(target), "--url", gateway_url, "--format", "txt,pdf",
            "--concurrency", "1", "--no-progress"]
    first = run_cli(*args)
    deadline = time.monotonic() + 240
    while not list(target.rglob("*.pdf")) and time.monotonic() < deadline:
        assert first.poll() is None, first.stdout.read().decode()
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(10)
    done_first = {p: (p.stat().st_ino, p.stat().st_mtime_ns)
                  for p in target.rglob("*") if p.is_file() and not p.name.startswith(".")}
    assert done_first and len(done_first) < 2 * 5  # killed halfway
    second = run_cli(*args)
    output, _ = second.communicate(timeout=300)
    assert second.returncode == 1, output.decode()  # the broken file failed
    for path, stamp in done_first.items():  # finished before the kill: not done again
        assert (path.stat().st_ino, path.stat().st_mtime_ns) == stamp, path
    written = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    expected = sorted([f"{stem}.{fmt}" for stem in ("a", "letters/b", "letters/c", "d", "e")
                       for fmt in ("txt", "pdf")] + ["ocrfleet-report.json"])
    assert written == expected  # every good file once; nothing else (no temporary files)
    report = json.loads((target / "ocrfleet-report.json").read_text())
    assert [f["file"] for f in report["failures"]] == ["broken.pdf"]
    assert report["failures"][0]["status"] == 422
    assert "Letter b" in (target / "letters/b.txt").read_text()
    assert len(pdfcheck.page_texts((target / "a.pdf").read_bytes())) == 2
    assert (target / "d.txt").read_text().count("\f") == 1
