"""Every malformed request gets a 4xx PaddleX envelope with errorCode == HTTP status and an
actionable errorMsg; the worker stays healthy and keeps serving."""

import base64
import functools
import io
import zlib

import pytest
import requests
from PIL import Image

from samples import documents
from tests.conftest import b64, post_ocr


def png_bytes():
    return documents.to_png(documents.text_image(["healthy after errors"]))


def bomb_png(width=40000, height=40000) -> bytes:
    """A tiny PNG whose header claims 1.6 gigapixels of zeros."""
    import struct

    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    row = b"\0" + b"\0" * (width // 8)
    compressor = zlib.compressobj(9)
    data = b"".join(compressor.compress(row) for _ in range(200)) + compressor.flush()
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data)
            + chunk(b"IEND", b""))


def encrypted_pdf() -> bytes:
    """A PDF whose trailer names a standard-security (password) encryption dictionary."""
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 200 200] >>",
        b"<< /Filter /Standard /V 2 /R 3 /Length 128 /P -4 "
        b"/O <" + b"11" * 32 + b"> /U <" + b"22" * 32 + b"> >>",
    ]
    out = io.BytesIO()
    out.write(b"%PDF-1.7\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % number + body + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for offset in offsets:
        out.write(b"%010d 00000 n \n" % offset)
    out.write(b"trailer\n<< /Size %d /Root 1 0 R /Encrypt 4 0 R /ID [<aa><aa>] >>\n"
              % (len(objects) + 1))
    out.write(b"startxref\n%d\n%%%%EOF\n" % xref)
    return out.getvalue()


# The documents are made when a test first needs them, not at collection: every pytest
# process collects this module (and test_outputs_fleet, test_gateway_fleet import it).
PNG = functools.cache(png_bytes)
PDF = functools.cache(lambda: documents.labelled_pdf(2))
TIFF = functools.cache(lambda: documents.labelled_tiff(3))

# name -> the requests.post keyword arguments, built on use
CASES = {
    "not json": lambda: dict(data=b"{this is not json",
                             headers={"Content-Type": "application/json"}),
    "empty body": lambda: dict(data=b"", headers={"Content-Type": "application/json"}),
    "json array": lambda: dict(json=[1, 2, 3]),
    "missing file": lambda: dict(json={"fileType": 1}),
    "file not a string": lambda: dict(json={"file": {"a": 1}}),
    "file null": lambda: dict(json={"file": None}),
    "bad base64": lambda: dict(json={"file": "@@@###"}),
    "empty file": lambda: dict(json={"file": ""}),
    "unknown fileType": lambda: dict(json={"file": b64(PNG()), "fileType": 5}),
    "fileType string": lambda: dict(json={"file": b64(PNG()), "fileType": "pdf"}),
    "not an image or pdf": lambda: dict(json={"file": b64(b"GIF89a" + b"\0" * 100)}),
    "image declared pdf": lambda: dict(json={"file": b64(PNG()), "fileType": 0}),
    "pdf declared image": lambda: dict(json={"file": b64(PDF()), "fileType": 1}),
    "truncated png": lambda: dict(json={"file": b64(PNG()[: len(PNG()) // 2]), "fileType": 1}),
    "truncated jpeg": lambda: dict(json={"file": b64(documents.to_jpeg(
        documents.text_image(["truncated"]))[:400]), "fileType": 1}),
    "garbage after png magic": lambda: dict(
        json={"file": b64(b"\x89PNG\r\n\x1a\n" + b"junk" * 50)}),
    "truncated multipage tiff": lambda: dict(json={"file": b64(TIFF()[: len(TIFF()) * 2 // 3])}),
    "truncated pdf": lambda: dict(json={"file": b64(PDF()[:300]), "fileType": 0}),
    "pdf header only": lambda: dict(json={"file": b64(b"%PDF-1.7\n%%EOF")}),
    "encrypted pdf": lambda: dict(json={"file": b64(encrypted_pdf())}),
    "decompression bomb": lambda: dict(json={"file": b64(bomb_png())}),
    "too many pages": lambda: dict(
        json={"file": b64(documents.labelled_pdf(21, lines_per_page=0))}),
    "page range beyond document": lambda: dict(json={"file": b64(PDF()), "pageRange": "3"}),
    "threshold out of range": lambda: dict(json={"file": b64(PNG()), "textDetThresh": 1.5}),
    "negative unclip": lambda: dict(json={"file": b64(PNG()), "textDetUnclipRatio": -1}),
    "limit side len string": lambda: dict(json={"file": b64(PNG()), "textDetLimitSideLen": "960"}),
    "bad limit type": lambda: dict(json={"file": b64(PNG()), "textDetLimitType": "both"}),
    "unloaded module": lambda: dict(json={"file": b64(PNG()), "useDocOrientationClassify": True}),
    "url input disabled": lambda: dict(json={"file": "http://127.0.0.1:9/scan.pdf"}),
    "multipart without file": lambda: dict(data={"fileType": "1"}, files={"other": ("x", b"y")}),
}

EXPECTED_STATUS = {"not json": 400, "empty body": 400, "too many pages": 413}


@pytest.mark.parametrize("name", list(CASES))
def test_malformed_request_gets_json_4xx(worker_url, name):
    response = requests.post(f"{worker_url}/ocr", timeout=60, **CASES[name]())
    assert 400 <= response.status_code < 500, (name, response.status_code, response.text)
    assert response.status_code == EXPECTED_STATUS.get(name, 422), (name, response.text)
    body = response.json()
    assert body["errorCode"] == response.status_code
    assert isinstance(body["errorMsg"], str) and len(body["errorMsg"]) > 15
    assert "Traceback" not in body["errorMsg"] and "File \"" not in body["errorMsg"]
    assert body["logId"]


def test_body_over_the_size_limit_is_413(worker_url):
    huge = "A" * (70 * 1024 * 1024 * 4 // 3)
    response = requests.post(f"{worker_url}/ocr", json={"file": huge}, timeout=60)
    assert response.status_code == 413
    assert response.json()["errorCode"] == 413


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
def test_wrong_method_is_405_json(worker_url, method):
    response = requests.request(method, f"{worker_url}/ocr", timeout=10)
    assert response.status_code == 405
    assert response.json()["errorCode"] == 405


def test_unknown_path_is_404_json(worker_url):
    response = requests.get(f"{worker_url}/nope", timeout=10)
    assert response.status_code == 404 and response.json()["errorCode"] == 404


def test_worker_still_healthy_and_correct_after_bad_input(worker_url):
    for case in ("truncated pdf", "decompression bomb", "encrypted pdf", "truncated png"):
        requests.post(f"{worker_url}/ocr", timeout=60, **CASES[case]())
    assert requests.get(f"{worker_url}/readyz", timeout=5).status_code == 200
    response = post_ocr(worker_url, {"file": b64(PNG())})
    assert response.status_code == 200
    assert response.json()["result"]["ocrResults"][0]["prunedResult"]["rec_texts"] == [
        "healthy after errors"]


def mutations(seed: int, count: int):
    """Damaged copies of valid files: truncations, flipped bytes, overwritten runs."""
    import random

    rng = random.Random(seed)
    originals = {"png": PNG(), "pdf": PDF(), "tiff": TIFF(),
                 "jpeg": documents.to_jpeg(documents.text_image(["fuzz"]))}
    for index in range(count):
        kind = list(originals)[index % len(originals)]
        data = bytearray(originals[kind])
        style = rng.choice(("truncate", "flip", "overwrite"))
        if style == "truncate":
            data = data[: rng.randint(8, len(data) - 1)]
        elif style == "flip":
            for _ in range(rng.randint(1, 20)):
                position = rng.randint(8, len(data) - 1)
                data[position] ^= 1 << rng.randint(0, 7)
        else:
            start = rng.randint(8, len(data) - 2)
            data[start:start + rng.randint(1, 64)] = rng.randbytes(64)
        yield f"{kind}-{style}-{index}", bytes(data)


def test_damaged_files_never_cause_a_5xx(worker_url):
    """A reproducible fuzz pass: each damaged file is answered 200 (still decodable) or a
    4xx envelope; never a 5xx, never a hang, and the worker keeps serving."""
    for name, data in mutations(seed=2026, count=48):
        response = post_ocr(worker_url, {"file": b64(data), "visualize": False}, timeout=60)
        assert response.status_code == 200 or 400 <= response.status_code < 500, \
            (name, response.status_code, response.text[:300])
        assert response.json()["errorCode"] in (0, response.status_code), name
    assert requests.get(f"{worker_url}/readyz", timeout=5).status_code == 200
