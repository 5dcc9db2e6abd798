"""The shared request parser, without a server: fields, types, ranges, sniffing, page ranges."""

import base64

import pytest

from services.ocr_api.errors import ApiError
from services.ocr_api.request import (form_fields_to_json, parse_json_body, parse_ocr_request,
                                      resolve_page_range)
from services.ocr_api.sniff import sniff_kind

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 32
PDF = b"%PDF-1.7\n" + b"\0" * 32


def parse(**fields):
    return parse_ocr_request(fields, max_bytes=1000)


def status_of(**fields):
    with pytest.raises(ApiError) as caught:
        parse(**fields)
    return caught.value.status, caught.value.message


def test_sniffs_pdf_and_images():
    assert sniff_kind(PDF) == "pdf"
    assert sniff_kind(PNG) == "image"
    assert sniff_kind(b"\xff\xd8\xff\xe0rest") == "image"
    assert sniff_kind(b"RIFF\0\0\0\0WEBPVP8 ") == "image"
    assert sniff_kind(b"hello world") is None


def test_valid_request_maps_params_to_pipeline_kwargs():
    request = parse(file=base64.b64encode(PNG).decode(), fileType=1, textDetThresh=0.25,
                    textDetLimitType="max", textDetLimitSideLen=960, logId="abc-1")
    assert request.kind == "image" and request.file_bytes == PNG
    assert request.pipeline_params == {"text_det_thresh": 0.25, "text_det_limit_type": "max",
                                       "text_det_limit_side_len": 960}
    assert request.log_id == "abc-1"


def test_null_file_type_is_sniffed_and_data_uri_accepted():
    request = parse(file="data:application/pdf;base64," + base64.b64encode(PDF).decode())
    assert request.kind == "pdf"


@pytest.mark.parametrize("fields, status, words", [
    ({}, 422, "'file' is required"),
    ({"file": 12}, 422, "must be a string"),
    ({"file": ""}, 422, "empty"),
    ({"file": "%%%not base64"}, 422, "not valid base64"),
    ({"file": base64.b64encode(b"plain text").decode()}, 422, "neither a PDF"),
    ({"file": base64.b64encode(PNG).decode(), "fileType": 0}, 422, "fileType is 0"),
    ({"file": base64.b64encode(PDF).decode(), "fileType": 1}, 422, "fileType is 1"),
    ({"file": base64.b64encode(PNG).decode(), "fileType": 7}, 422, "fileType must be"),
    ({"file": base64.b64encode(PNG).decode(), "fileType": True}, 422, "fileType must be"),
    ({"file": base64.b64encode(PNG).decode(), "textDetThresh": 2}, 422, "textDetThresh"),
    ({"file": base64.b64encode(PNG).decode(), "textDetThresh": "x"}, 422, "textDetThresh"),
    ({"file": base64.b64encode(PNG).decode(), "textDetLimitSideLen": 1.5}, 422, "integer"),
    ({"file": base64.b64encode(PNG).decode(), "textDetLimitType": "mid"}, 422, "textDetLimit"),
    ({"file": base64.b64encode(PNG).decode(), "useTextlineOrientation": "yes"}, 422, "true or"),
    ({"file": base64.b64encode(PNG).decode(), "visualize": 1}, 422, "visualize"),
    ({"file": base64.b64encode(PNG).decode(), "pageRange": "3-1"}, 422, "backwards"),
    ({"file": base64.b64encode(PNG).decode(), "pageRange": "a"}, 422, "pageRange"),
    ({"file": "https://example.com/a.pdf"}, 422, "URL input is disabled"),
    ({"file": base64.b64encode(b"%PDF-" + b"x" * 2000).decode()}, 413, "limit"),
])
def test_bad_fields_get_a_clear_4xx(fields, status, words):
    got_status, message = status_of(**fields)
    assert got_status == status
    assert words in message


def test_body_must_be_a_json_object():
    with pytest.raises(ApiError) as caught:
        parse_json_body(b"{not json")
    assert caught.value.status == 400
    with pytest.raises(ApiError) as caught:
        parse_json_body(b"[1, 2]")
    assert caught.value.status == 422
    with pytest.raises(ApiError) as caught:
        parse_json_body(b"")
    assert caught.value.status == 400


def test_form_values_are_read_as_json_where_they_parse():
    assert form_fields_to_json({"fileType": "0", "visualize": "true", "textDetThresh": "0.3",
                                "logId": "123", "pageRange": "2"}) == {
        "fileType": 0, "visualize": True, "textDetThresh": 0.3, "logId": "123",
        "pageRange": "2"}


def test_page_ranges():
    assert resolve_page_range(None, 3) == [0, 1, 2]
    assert resolve_page_range("2", 3) == [1]
    assert resolve_page_range("1-2, 3", 5) == [0, 1, 2]
    assert resolve_page_range("4-", 6) == [3, 4, 5]
    assert resolve_page_range("3,1,3", 3) == [0, 2]
    with pytest.raises(ApiError) as caught:
        resolve_page_range("2-9", 4)
    assert caught.value.status == 422 and "has 4 page" in caught.value.message
