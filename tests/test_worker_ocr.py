"""The real engine (PP-OCRv6 tiny on onnxruntime) behind the worker's HTTP API, on generated
documents: recognised words, page order, the PaddleX envelope, multipart, pageRange,
visualization and metrics."""

import base64
import re

import cv2
import numpy as np
import requests
from PIL import Image

from samples import documents
from tests.conftest import all_text, b64, post_ocr


def words_of(text: str) -> set[str]:
    return set(re.findall(r"[A-Za-z0-9.,]+", text.lower()))


def test_english_image_words_and_envelope(worker_url):
    lines = ["Invoice number 48213", "Total amount due 1,234.56 USD"]
    image = documents.text_image(lines)
    response = post_ocr(worker_url, {"file": b64(documents.to_png(image)), "fileType": 1,
                                     "logId": "test-english-1", "visualize": False})
    assert response.status_code == 200
    body = response.json()
    assert list(body) == ["logId", "result", "errorCode", "errorMsg"]
    assert body["logId"] == "test-english-1"
    assert body["errorCode"] == 0 and body["errorMsg"] == "Success"
    result = body["result"]
    assert result["dataInfo"] == {"width": image.width, "height": image.height, "type": "image"}
    [page] = result["ocrResults"]
    assert set(page) == {"prunedResult", "ocrImage", "docPreprocessingImage", "inputImage"}
    assert page["ocrImage"] is None and page["inputImage"] is None
    pruned = page["prunedResult"]
    for key in ("rec_texts", "rec_scores", "rec_polys", "rec_boxes", "dt_polys"):
        assert key in pruned, key
    assert "input_path" not in pruned and "page_index" not in pruned
    assert pruned["rec_texts"] == lines
    assert len(pruned["rec_scores"]) == len(pruned["rec_boxes"]) == len(pruned["rec_polys"]) == 2
    assert all(0.8 < score <= 1.0 for score in pruned["rec_scores"])
    x0, y0, x1, y1 = pruned["rec_boxes"][0]
    assert 0 <= x0 < x1 <= image.width and 0 <= y0 < y1 <= image.height


def test_a_page_over_the_detector_cap_is_read_in_its_own_pixels(worker_url):
    """A page whose long side (4200 px) is over the detector's default cap is detected at
    0.73 of its size (long and narrow, it gets the area of a page at the cap: 3055 px); its
    lines are read from its own pixels and its boxes are where the lines are on the page, not
    on the scaled copy."""
    top, bottom = "Invoice number 48213", "Total amount due 1,234.56 USD"
    page = Image.new("RGB", (1200, 4200), "white")
    page.paste(documents.text_image([top], size=40), (60, 100))
    page.paste(documents.text_image([bottom], size=40), (60, 3900))
    response = post_ocr(worker_url, {"file": b64(documents.to_png(page)), "fileType": 1})
    assert response.status_code == 200
    pruned = response.json()["result"]["ocrResults"][0]["prunedResult"]
    assert pruned["rec_texts"] == [top, bottom]
    assert pruned["text_det_params"]["max_side_limit"] == 3055
    (_, top_y0, _, top_y1), (_, bottom_y0, _, bottom_y1) = pruned["rec_boxes"]
    assert 100 <= top_y0 < top_y1 <= 260 and 3900 <= bottom_y0 < bottom_y1 <= 4060


def test_chinese_image(worker_url, cjk_font):
    image = documents.text_image(["发票号码 12345", "客户名称"], font_path=cjk_font)
    response = post_ocr(worker_url, {"file": b64(documents.to_jpeg(image))})
    assert response.status_code == 200
    texts = response.json()["result"]["ocrResults"][0]["prunedResult"]["rec_texts"]
    joined = "".join(texts).replace(" ", "")
    assert "发票号码" in joined and "12345" in joined and "客户名称" in joined


def test_multipage_pdf_every_page_in_order(worker_url):
    pdf = documents.labelled_pdf(4)
    response = post_ocr(worker_url, {"file": b64(pdf), "fileType": 0})
    assert response.status_code == 200
    result = response.json()["result"]
    assert result["dataInfo"]["type"] == "pdf" and result["dataInfo"]["numPages"] == 4
    assert len(result["dataInfo"]["pages"]) == 4
    # 144 DPI, as PaddleX serving renders (scale 2.0): a Letter page is 1224 x 1584
    assert result["dataInfo"]["pages"][0] == {"width": 1224, "height": 1584}
    texts = all_text(response.json())
    assert len(texts) == 4
    for number, text in enumerate(texts, start=1):
        assert documents.has_page_label(text, number, 4), (number, text)


def test_page_range_selects_pages(worker_url):
    pdf = documents.labelled_pdf(5)
    response = post_ocr(worker_url, {"file": b64(pdf), "pageRange": "2,4-5"})
    assert response.status_code == 200
    body = response.json()
    texts = all_text(body)
    assert [documents.has_page_label(t, n, 5) for n, t in zip((2, 4, 5), texts)] == [True] * 3
    assert body["result"]["dataInfo"]["pageIndices"] == [1, 3, 4]
    assert body["result"]["dataInfo"]["numPages"] == 3


def test_scanned_pdf_and_multipart_upload(worker_url):
    pages = [documents.text_image([f"Scanned sheet {n}", "Delivery address"], size=36)
             for n in (1, 2)]
    pdf = documents.image_pdf(pages)
    response = requests.post(f"{worker_url}/ocr", files={"file": ("scan.pdf", pdf)},
                             data={"fileType": "0"}, timeout=120)
    assert response.status_code == 200
    texts = all_text(response.json())
    assert "Scanned sheet 1" in texts[0] and "Scanned sheet 2" in texts[1]


def test_multipage_tiff_gives_one_result_per_frame(worker_url):
    response = post_ocr(worker_url, {"file": b64(documents.labelled_tiff(3)), "fileType": 1,
                                     "visualize": False})
    assert response.status_code == 200
    body = response.json()
    info = body["result"]["dataInfo"]
    assert info["type"] == "tiff" and info["numPages"] == 3 and len(info["pages"]) == 3
    for number, text in enumerate(all_text(body), start=1):
        assert documents.has_page_label(text, number, 3), text


def test_detection_parameters_reach_the_pipeline(worker_url):
    image = documents.text_image(["Quarterly budget report"])
    body = {"file": b64(documents.to_png(image)), "textDetThresh": 0.25,
            "textDetBoxThresh": 0.5, "textDetUnclipRatio": 1.8, "textDetLimitSideLen": 736,
            "textDetLimitType": "max", "textRecScoreThresh": 0.99}
    response = post_ocr(worker_url, body)
    assert response.status_code == 200
    pruned = response.json()["result"]["ocrResults"][0]["prunedResult"]
    assert pruned["text_det_params"]["thresh"] == 0.25
    assert pruned["text_det_params"]["box_thresh"] == 0.5
    assert pruned["text_det_params"]["unclip_ratio"] == 1.8
    assert pruned["text_det_params"]["limit_side_len"] == 736
    assert pruned["text_det_params"]["limit_type"] == "max"
    assert pruned["text_rec_score_thresh"] == 0.99
    assert all(score >= 0.99 for score in pruned["rec_scores"])


def test_paddlex_docs_client_code_works_unchanged(worker_url, tmp_path):
    """The Python client from PaddleOCR's serving docs (General OCR pipeline), as written
    there: it sends only file + fileType and decodes every page's ocrImage, so images are on
    by default, as in PaddleX serving."""
    file_path = tmp_path / "demo.jpg"
    file_path.write_bytes(documents.to_jpeg(documents.text_image(["Receipt 2026 total 18.40"])))
    API_URL = f"{worker_url}/ocr"

    with open(file_path, "rb") as file:
        file_bytes = file.read()
        file_data = base64.b64encode(file_bytes).decode("ascii")

    payload = {"file": file_data, "fileType": 1}

    response = requests.post(API_URL, json=payload)

    assert response.status_code == 200
    result = response.json()["result"]
    for i, res in enumerate(result["ocrResults"]):
        print(res["prunedResult"])
        ocr_img_path = tmp_path / f"ocr_{i}.jpg"
        with open(ocr_img_path, "wb") as f:
            f.write(base64.b64decode(res["ocrImage"]))
        print(f"Output image saved at {ocr_img_path}")
    assert cv2.imread(str(tmp_path / "ocr_0.jpg")) is not None
    assert result["ocrResults"][0]["prunedResult"]["rec_texts"] == ["Receipt 2026 total 18.40"]


def test_visualize_returns_decodable_jpeg_images(worker_url):
    image = documents.text_image(["Visual check 42"])
    response = post_ocr(worker_url, {"file": b64(documents.to_png(image)), "visualize": True})
    assert response.status_code == 200
    page = response.json()["result"]["ocrResults"][0]
    for key in ("ocrImage", "inputImage"):
        decoded = cv2.imdecode(np.frombuffer(base64.b64decode(page[key]), np.uint8),
                               cv2.IMREAD_COLOR)
        assert decoded is not None and decoded.shape[0] > 10, key
    assert page["prunedResult"]["rec_texts"] == ["Visual check 42"]


def test_health_readiness_and_metrics(worker_url):
    assert requests.get(f"{worker_url}/healthz", timeout=5).json()["errorCode"] == 0
    ready = requests.get(f"{worker_url}/readyz", timeout=5)
    assert ready.status_code == 200
    assert ready.json()["engine"]["det_model"] == "PP-OCRv6_tiny_det"
    post_ocr(worker_url, {"file": b64(documents.to_png(documents.text_image(["metrics"])))})
    text = requests.get(f"{worker_url}/metrics", timeout=5).text
    for name in ("ocr_worker_requests_total", "ocr_worker_pages_total",
                 "ocr_worker_queue_depth", "ocr_worker_inflight_requests",
                 'ocr_worker_stage_seconds_bucket{le="0.005",stage="inference"}',
                 'stage="decode"', 'stage="render"', "ocr_worker_model_load_seconds",
                 "ocr_worker_engine_info"):
        assert name in text, name
    ok = re.search(r'ocr_worker_requests_total\{code="200",outcome="ok"\} (\d+)', text)
    assert ok and float(ok.group(1)) >= 1
