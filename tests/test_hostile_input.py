"""Hostile and malformed requests at both tiers, without the real engine: the worker app on the
`sim` engine, and the gateway app in front of it (the worker served over HTTP on 127.0.0.1).
Every answer is a JSON envelope with errorCode == HTTP status, a 4xx for bad input (never a
500), with an error message that echoes at most a short excerpt; valid requests still pass
afterwards. Hand-written cases for the known attacks, then seeded property-based fuzzing
(hypothesis) of the JSON fields and raw bodies, JSON and multipart.

No test asserts on wall-clock time: the hostile inputs here took seconds to minutes before
(cubic backtracking, int() of huge digit strings); pytest's timeout is the bound."""

import ast
import base64
import io
import json
import threading

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from PIL import Image
from werkzeug.serving import make_server

from gateway.app import create_app as create_gateway
from gateway.config import GatewayConfig
from services.ocr_api.errors import ApiError, excerpt
from services.ocr_api.page_range import MAX_PARTS, MAX_SPEC_CHARS, parse_page_range
from services.ocr_api.request import PIPELINE_PARAMS, form_fields_to_json, parse_json_body
from services.ocr_worker.app import create_app as create_worker
from services.ocr_worker.config import WorkerConfig
from tests.conftest import REPO_ROOT

MAX_MESSAGE = 400  # no errorMsg in this file may be longer: excerpts only


def png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (24, 16), "white").save(buffer, "PNG")
    return buffer.getvalue()


PNG_B64 = base64.b64encode(png()).decode()


@pytest.fixture(scope="module")
def tiers():
    """{"worker": test client, "gateway": test client}; the gateway's replica is the same
    kind of worker app, served on a loopback port."""
    config = WorkerConfig(engine="sim", sim_page_ms=0, warmup=False, max_bytes=4_000_000,
                          max_pages=20, queue_size=64)
    worker, upstream_app = create_worker(config), create_worker(config)
    server = make_server("127.0.0.1", 0, upstream_app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    gateway = create_gateway(GatewayConfig(
        replicas=(f"http://127.0.0.1:{server.server_port}",), max_bytes=4_000_000,
        max_pages=20), start=False)
    for app in (worker, upstream_app):
        assert app.extensions["ocr_service"].batcher.ready.wait(30)
    yield {"worker": worker.test_client(), "gateway": gateway.test_client()}
    server.shutdown()
    server.server_close()
    gateway.extensions["gateway_service"].shutdown()
    for app in (worker, upstream_app):
        app.extensions["ocr_service"].shutdown(5)


def check_envelope(response, allowed=range(400, 500)):
    """The answer is a PaddleX envelope; its status one of `allowed` (or 200 with a result);
    its message short. Returns (status, body)."""
    body = response.get_json(silent=True)
    assert body is not None, f"not JSON: {response.status_code} {response.data[:200]!r}"
    status = response.status_code
    if status == 200:
        assert body["errorCode"] == 0 and "result" in body
    else:
        assert status in allowed, body
        assert body["errorCode"] == status
        assert len(body["errorMsg"]) <= MAX_MESSAGE, body["errorMsg"][:MAX_MESSAGE]
    return status, body


def post_json_bytes(client, raw: bytes, content_type="application/json"):
    return client.post("/ocr", data=raw, headers={"Content-Type": content_type})


TIERS = ["worker", "gateway"]


# ---- the known attacks -------------------------------------------------------------------------
HOSTILE_PAGE_RANGES = {
    "1 MB of spaces then x": " " * 1_000_000 + "x",
    "spaces under the length cap": " " * (MAX_SPEC_CHARS - 1) + "x",
    "thousands of digits": "1-" + "9" * 5000,
    "a 20-digit page": "99999999999999999999",
    "too many parts": ",".join(["1"] * (MAX_PARTS + 1)),
    "unicode digits": "１-２",
    "superscript two": "²",
    "arabic-indic digits": "٣",
    "lone surrogate": "\ud800",
    "nul": "1\x00",
    "only a comma": ",",
    "zero": "0",
    "backwards": "5-2",
    "past the end": "2",  # the document has one page
}


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("case", list(HOSTILE_PAGE_RANGES))
def test_hostile_page_ranges_get_a_short_422(tiers, tier, case):
    spec = HOSTILE_PAGE_RANGES[case]
    raw = json.dumps({"file": PNG_B64, "pageRange": spec}).encode()
    status, body = check_envelope(post_json_bytes(tiers[tier], raw))
    assert status == 422 and "pageRange" in body["errorMsg"]


def test_page_range_parser_has_no_regular_expression():
    """Linear by construction: the parser splits and strips, it never backtracks."""
    tree = ast.parse((REPO_ROOT / "services/ocr_api/page_range.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "re" not in imported and "regex" not in imported


def test_page_range_work_is_bounded_by_caps_not_input():
    for spec in (" " * 10**7 + "x", ",".join(["1-"] * 10**5)):
        with pytest.raises(ApiError) as caught:
            parse_page_range(spec)
        assert caught.value.status == 422 and len(caught.value.message) < 200
    # many overlapping open ranges resolve by merging, not by expanding each one
    from services.ocr_api.page_range import resolve_page_range

    assert resolve_page_range(",".join(["1-"] * (MAX_PARTS - 1)), 2000) == list(range(2000))
    assert resolve_page_range("3-4, 1 - 2 ,-1,7-,9", 9) == [0, 1, 2, 3, 6, 7, 8]


BAD_BODIES = {
    "nested arrays past the recursion limit": b"[" * 5000 + b"]" * 5000,
    "nested objects": b'{"a":' * 5000 + b"1" + b"}" * 5000,
    "nested in a field": b'{"file":"' + PNG_B64.encode() + b'","visualize":'
                         + b"[" * 3000 + b"]" * 3000 + b"}",
    "a million values": b"[" + b"0," * 1_000_000 + b"0]",
    "open brackets only": b"[" * 200_000,
    "not UTF-8": b'{"file":"\xff\xfe"}',
    "UTF-16, not base64": json.dumps({"file": "%%%"}).encode("utf-16"),
    "null": b"null",
    "array": b"[1,2]",
    "number": b"1e999999",
    "string": b'"' + b"x" * 100_000 + b'"',
    "empty": b"",
    "NaN file": b'{"file": NaN}',
    "huge int": b'{"file": "x", "fileType": ' + b"9" * 5000 + b"}",
    "int under the str limit": b'{"file":"' + PNG_B64.encode() + b'","textDetLimitSideLen":'
                               + b"9" * 4000 + b"}",
    "infinity": b'{"file":"' + PNG_B64.encode() + b'","textDetThresh":Infinity}',
    "minus infinity": b'{"file":"' + PNG_B64.encode() + b'","textDetUnclipRatio":-Infinity}',
    "1e999": b'{"file":"' + PNG_B64.encode() + b'","textDetBoxThresh":1e999}',
    "huge choice": json.dumps({"file": PNG_B64, "textDetLimitType": "m" * 1_000_000}).encode(),
    "file is a list": b'{"file": [1, 2, 3]}',
    "file is an object": b'{"file": {"a": 1}}',
    "file is a huge number": b'{"file": 123456789012345678901234567890}',
    "data URI of nothing": b'{"file": "data:;base64,"}',
    "duplicate keys": b'{"file": "x", "file": "' + PNG_B64.encode() + b'", "fileType": 7}',
}


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("case", list(BAD_BODIES))
def test_bad_json_bodies_get_a_4xx(tiers, tier, case):
    status, _ = check_envelope(post_json_bytes(tiers[tier], BAD_BODIES[case]))
    assert 400 <= status < 500


@pytest.mark.parametrize("tier", TIERS)
def test_every_paddlex_field_with_every_wrong_type_gets_a_4xx(tiers, tier):
    wrong = [[], {}, [[[]]], "x" * 100_000, "", True, -1, 1.5, 10**30, "\ud800", "١", 0]
    fields = [*PIPELINE_PARAMS, "visualize", "fileType", "pageRange", "logId"]
    if tier == "gateway":
        fields.append("returnPartialResults")
    client = tiers[tier]
    for field in fields:
        for value in wrong:
            raw = json.dumps({"file": PNG_B64, "visualize": False, field: value}).encode()
            status, _ = check_envelope(post_json_bytes(client, raw))
            assert status == 200 or 400 <= status < 500, (field, value)


def multipart(parts: list[tuple[bytes, bytes]], boundary=b"B0undary") -> tuple[bytes, str]:
    """A raw multipart body from (header block, content) pairs."""
    body = b"".join(b"--" + boundary + b"\r\n" + head + b"\r\n\r\n" + content + b"\r\n"
                    for head, content in parts) + b"--" + boundary + b"--\r\n"
    return body, f"multipart/form-data; boundary={boundary.decode()}"


def disposition(name: bytes, filename: bytes | None = None) -> bytes:
    head = b'Content-Disposition: form-data; name="' + name + b'"'
    return head + (b'; filename="' + filename + b'"' if filename is not None else b"")


MULTIPART_CASES = {
    "no boundary": (b"--x\r\n", "multipart/form-data"),
    "garbage body": (b"garbage", "multipart/form-data; boundary=B0undary"),
    "truncated file part": (b"--B0undary\r\n" + disposition(b"file", b"a.png") + b"\r\n\r\n"
                            + png()[:10], "multipart/form-data; boundary=B0undary"),
    "part without a name": multipart([(b"Content-Disposition: form-data", b"abc")]),
    "empty file part": multipart([(disposition(b"file", b"a.png"), b"")]),
    "file part not an image": multipart([(disposition(b"file", b"a.png"), b"hello")]),
    "path traversal filename": multipart([(disposition(b"file", b"../../etc/passwd"),
                                           b"hello")]),
    "too many parts": multipart([(disposition(b"f%d" % i), b"v") for i in range(500)]),
    "non-UTF-8 field": multipart([(disposition(b"file", b"a.png"), png()),
                                  (disposition(b"pageRange"), b"\xff\xfe")]),
    "1 MB pageRange field": multipart([(disposition(b"file", b"a.png"), png()),
                                       (disposition(b"pageRange"), b" " * 1_000_000 + b"x")]),
    "deep JSON in a typed field": multipart([(disposition(b"file", b"a.png"), png()),
                                             (disposition(b"visualize"),
                                              b"[" * 5000 + b"]" * 5000)]),
    "NaN threshold": multipart([(disposition(b"file", b"a.png"), png()),
                                (disposition(b"textDetThresh"), b"NaN")]),
    "huge int field": multipart([(disposition(b"file", b"a.png"), png()),
                                 (disposition(b"textDetLimitSideLen"), b"9" * 5000)]),
    "base64 text as the file field": multipart([(disposition(b"file"), b"1234")]),
    "unicode field name": multipart([(disposition("файл".encode()), b"x")]),
    "header without colon": multipart([(b"garbage header line", b"x")]),
}


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("case", list(MULTIPART_CASES))
def test_multipart_edge_cases_get_a_4xx(tiers, tier, case):
    raw, content_type = MULTIPART_CASES[case]
    status, _ = check_envelope(post_json_bytes(tiers[tier], raw, content_type))
    assert 400 <= status < 500


@pytest.mark.parametrize("tier", TIERS)
def test_valid_requests_still_work_after_the_attacks(tiers, tier):
    client = tiers[tier]
    assert client.get("/healthz").status_code == 200
    status, body = check_envelope(client.post("/ocr", json={"file": PNG_B64,
                                                            "visualize": False}))
    assert status == 200 and len(body["result"]["ocrResults"]) == 1
    raw, content_type = multipart([(disposition(b"file", b"a.png"), png()),
                                   (disposition(b"visualize"), b"false"),
                                   (disposition(b"textDetThresh"), b"0.3"),
                                   (disposition(b"pageRange"), b"1")])
    status, body = check_envelope(post_json_bytes(client, raw, content_type))
    assert status == 200 and len(body["result"]["ocrResults"]) == 1


# ---- excerpts -----------------------------------------------------------------------------------
@pytest.mark.parametrize("value, expected", [
    ("short", '"short"'), (None, "null"), (True, "true"), (3, "3"), (0.5, "0.5"),
    ([1, 2], "a list of 2 item(s)"), ({"a": 1}, "an object with 1 key(s)"),
    ("a\nb\x00", '"a\\nb\\x00"'), ("\ud800", '"\\ud800"'),
])
def test_excerpts_are_short_printable_and_never_recurse(value, expected):
    assert excerpt(value) == expected


def test_excerpt_cuts_long_values():
    text = excerpt("x" * 10**6)
    assert len(text) < 80 and "more characters" in text
    assert "digits" in excerpt(10**4000) and len(excerpt(10**4000)) < 80
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    assert excerpt(deep) == "a list of 1 item(s)"


def test_form_fields_are_parsed_as_json_only_where_typed_and_short():
    fields = form_fields_to_json({"file": "1234", "pageRange": "2", "logId": "7",
                                  "textDetThresh": "0.3", "visualize": "false",
                                  "textDetLimitType": "max", "fileType": "9" * 100,
                                  "other": "[1]"})
    assert fields == {"file": "1234", "pageRange": "2", "logId": "7", "textDetThresh": 0.3,
                      "visualize": False, "textDetLimitType": "max", "fileType": "9" * 100,
                      "other": "[1]"}


def test_data_uri_prefix_is_stripped_without_a_regex():
    from services.ocr_api.request import decode_base64_file

    assert decode_base64_file("data:image/png;base64," + PNG_B64, 10**6) == png()
    assert decode_base64_file("  " + PNG_B64[:20] + "\n " + PNG_B64[20:], 10**6) == png()
    with pytest.raises(ApiError):
        decode_base64_file("data:" + "x" * 10**6 + ";base64,AAAA", 10**6)


def test_json_values_are_counted_before_parsing():
    with pytest.raises(ApiError) as caught:
        parse_json_body(b"[" + b"[]," * 20_000 + b"[]]")
    assert caught.value.status == 400 and "JSON values" in caught.value.message


# ---- fuzzing ------------------------------------------------------------------------------------
JSON_SCALARS = (st.none() | st.booleans() | st.integers() | st.integers(-10**400, 10**400)
                | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=50)
                | st.sampled_from(["1-3", "0", "-", "1,", "max", "min", PNG_B64, "٣", "1-２"]))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                           max_leaves=8)
FIELD_NAMES = [*PIPELINE_PARAMS, "visualize", "fileType", "pageRange", "logId", "file",
               "returnPartialResults"]
FUZZ = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


def fuzz_body(draw_fields: dict, keep_file: bool) -> bytes:
    fields = dict(draw_fields)
    if keep_file:
        fields.setdefault("file", PNG_B64)
    fields.setdefault("visualize", False)
    return json.dumps(fields, allow_nan=True).encode()


@pytest.mark.parametrize("tier", TIERS)
@FUZZ
@given(fields=st.dictionaries(st.sampled_from(FIELD_NAMES), JSON_VALUES, max_size=5),
       keep_file=st.booleans())
def test_fuzzed_json_fields_never_give_a_5xx(tiers, tier, fields, keep_file):
    check_envelope(post_json_bytes(tiers[tier], fuzz_body(fields, keep_file)))


@pytest.mark.parametrize("tier", TIERS)
@FUZZ
@given(raw=st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_fuzzed_raw_bodies_never_give_a_5xx(tiers, tier, raw):
    check_envelope(post_json_bytes(tiers[tier], raw))


@pytest.mark.parametrize("tier", TIERS)
@FUZZ
@given(fields=st.dictionaries(st.sampled_from(FIELD_NAMES),
                              st.binary(max_size=80) | st.sampled_from(
                                  [b"true", b"NaN", b"1e999", b"[[[", b"-0", b"9" * 100]),
                              max_size=5),
       with_file=st.booleans(), boundary=st.sampled_from([b"B0undary", b"x", b"--", b"a b"]))
def test_fuzzed_multipart_never_gives_a_5xx(tiers, tier, fields, with_file, boundary):
    parts = [(disposition(name.encode()), value) for name, value in fields.items()]
    if with_file:
        parts.insert(0, (disposition(b"file", b"doc.png"), png()))
    raw, content_type = multipart(parts, boundary)
    check_envelope(post_json_bytes(tiers[tier], raw, content_type))
