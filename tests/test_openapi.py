"""The OpenAPI documents (services/ocr_api/openapi.py, gateway/openapi.py,
services/ocr_worker/openapi.py): valid OpenAPI 3.1 (openapi-spec-validator), one operation
for every route the apps have and no other, PaddleX's own /ocr schema where ours follows it
(field names, types, envelope: its pydantic models), answers of the apps valid against
them, and docs/api.md naming every field, header and status the documents have and the
documents every one docs/api.md names. The live fleet under Schemathesis:
tests/test_schemathesis.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate

from gateway.app import create_app as create_gateway
from gateway.config import GatewayConfig, JobsConfig
from services.ocr_api.openapi import ERROR_REASONS, PATH
from services.ocr_worker.app import create_app as create_worker
from services.ocr_worker.config import WorkerConfig
from tests.conftest import b64

API_MD = Path(__file__).resolve().parents[1] / "docs" / "api.md"
REPLICA = "http://10.11.12.13:8101"  # never contacted: the apps are not started
KEY = "openapi-test-key-0123456789"
METHODS = {"get", "post", "put", "delete", "patch"}


JOBS_DB: list[Path] = []  # this module's job store (the jobs routes open it on first use)


@pytest.fixture(scope="module", autouse=True)
def jobs_db(tmp_path_factory):
    JOBS_DB[:] = [tmp_path_factory.mktemp("jobs") / "jobs.sqlite3"]
    yield


def gateway(jobs_enabled: bool = True, **config):
    jobs = JobsConfig(db_path=str(JOBS_DB[0]), enabled=jobs_enabled)
    return create_gateway(GatewayConfig(replicas=(REPLICA,), jobs=jobs, **config), start=False)


def worker(**config):
    return create_worker(WorkerConfig(engine="sim", **config), start=False)


def document_of(app, headers=None) -> dict:
    response = app.test_client().get(PATH, headers=headers or {})
    assert response.status_code == 200, response.data
    return response.get_json()


@pytest.fixture(scope="module")
def documents() -> dict[str, dict]:
    return {"gateway": document_of(gateway()), "worker": document_of(worker())}


# ---- valid, and the routes' own ----------------------------------------------------------------
@pytest.mark.parametrize("app, headers", [
    (lambda: gateway(), None),
    (lambda: gateway(api_keys=(KEY,)), {"X-API-Key": KEY}),
    (lambda: gateway(jobs_enabled=False), None),
    (lambda: worker(), None),
    (lambda: worker(api_tokens=(KEY,)), {"Authorization": f"Bearer {KEY}"}),
], ids=["gateway", "gateway-keys", "gateway-no-jobs", "worker", "worker-token"])
def test_each_document_is_valid_openapi_3_1_for_the_apps_routes(app, headers):
    built = app()
    document = document_of(built, headers)
    validate(document)
    assert document["openapi"] == "3.1.0"
    assert operations(document) == routes(built)
    keyed = headers is not None
    assert document["security"] == ([{"bearer": []}, {"apiKey": []}] if keyed else [{}])


def routes(app) -> set[tuple[str, str]]:
    """(method, OpenAPI path) of every route but Flask's own /static (nothing is there)."""
    found = set()
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static":
            continue
        path = re.sub(r"<(?:\w+:)?(\w+)>", lambda m: "{" + camel(m.group(1)) + "}", rule.rule)
        found |= {(method.lower(), path) for method in rule.methods - {"HEAD", "OPTIONS"}}
    return found


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def operations(document: dict) -> set[tuple[str, str]]:
    return {(method, path) for path, item in document["paths"].items()
            for method in item if method in METHODS}


def test_the_jobs_are_left_out_when_they_are_off():
    paths = document_of(gateway(jobs_enabled=False))["paths"]
    assert "/ocr" in paths and not any(path.startswith("/jobs") for path in paths)


def test_the_document_needs_the_key_when_keys_are_on():
    assert gateway(api_keys=(KEY,)).test_client().get(PATH).status_code == 401


# ---- PaddleX's /ocr ----------------------------------------------------------------------------
# PaddleX's pydantic models for OCR serving, as JSON Schema, and an answer built with them.
# In a process of its own: `paddlex.inference.serving` demands its serving plugin (FastAPI)
# and `paddlex` loads the whole inference stack, so the schema modules are loaded under
# bare package stubs, which must not meet the engine tests' real paddlex.
PADDLEX_SCHEMAS = r"""
import importlib.util, json, sys, types
from pathlib import Path
spec = importlib.util.find_spec("paddlex")
if spec is None:
    sys.exit(3)
root = Path(spec.origin).parent
for name in ("paddlex", "paddlex.inference", "paddlex.inference.serving"):
    stub = types.ModuleType(name)
    stub.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
    sys.modules[name] = stub
from paddlex.inference.serving.schemas import ocr
from paddlex.inference.serving.infra import models
found = {name: model.model_json_schema() for name, model in [
    ("InferRequest", ocr.InferRequest), ("OCRResult", ocr.OCRResult),
    ("InferResult", ocr.InferResult), ("AIStudioNoResultResponse",
    models.AIStudioNoResultResponse), ("ImageInfo", models.ImageInfo),
    ("PDFInfo", models.PDFInfo), ("TIFFInfo", models.TIFFInfo),
    ("PDFPageInfo", models.PDFPageInfo)]}
result = ocr.InferResult(ocrResults=[ocr.OCRResult(prunedResult={"rec_texts": ["a"]})],
                         dataInfo=models.PDFInfo(numPages=1, pages=[
                             models.PDFPageInfo(width=3, height=4)]))
found["answer"] = models.AIStudioResultResponse[ocr.InferResult](
    logId="x", result=result).model_dump()
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def paddlex() -> dict:
    done = subprocess.run([sys.executable, "-c", PADDLEX_SCHEMAS], capture_output=True,
                          text=True, timeout=120)
    if done.returncode == 3:
        pytest.skip("paddlex is not installed (the worker extra)")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def json_types(schema: dict) -> set[str] | None:
    """The JSON types a schema admits (None: any), from `type`, `enum`/`const` or anyOf."""
    if "anyOf" in schema:
        found = [json_types(part) for part in schema["anyOf"]]
        return None if None in found else set().union(*found)
    if "type" in schema:
        kinds = schema["type"]
        return set(kinds if isinstance(kinds, list) else [kinds])
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if values is None:
        return None
    names = {bool: "boolean", int: "integer", float: "number", str: "string",
             type(None): "null"}
    return {names[type(value)] for value in values}


def admits(ours: set[str] | None, theirs: set[str] | None) -> bool:
    if ours is None:
        return True
    widened = ours | ({"integer"} if "number" in ours else set())
    return theirs is not None and theirs <= widened


@pytest.mark.parametrize("name", ["gateway", "worker"])
def test_the_ocr_body_takes_every_paddlex_field_with_its_type(documents, paddlex, name):
    theirs = paddlex["InferRequest"]
    body = documents[name]["paths"]["/ocr"]["post"]["requestBody"]["content"]
    ours = body["application/json"]["schema"]
    assert ours["required"] == theirs["required"] == ["file"]
    for field, schema in theirs["properties"].items():
        assert field in ours["properties"], field
        assert admits(json_types(ours["properties"][field]), json_types(schema)), field
    assert set(ours["properties"]) <= set(body["multipart/form-data"]["schema"]["properties"])


def test_multipart_typed_fields_are_json_parts(documents):
    """A form's numbers and booleans are read as JSON text: declared as JSON parts, so that a
    string "false" (refused) and the boolean false (taken) differ on the wire too."""
    from services.ocr_api.request import TYPED_FORM_FIELDS

    form = documents["gateway"]["paths"]["/ocr"]["post"]["requestBody"]["content"][
        "multipart/form-data"]
    assert set(form["encoding"]) == TYPED_FORM_FIELDS
    assert all(part == {"contentType": "application/json"} for part in form["encoding"].values())


def test_every_optional_field_takes_null_as_paddlex_does(documents):
    fields = documents["worker"]["paths"]["/ocr"]["post"]["requestBody"]["content"][
        "application/json"]["schema"]["properties"]
    for name, schema in fields.items():
        if name != "file":
            assert Draft202012Validator({**schema}).is_valid(None), name


def ref_target(document: dict, schema: dict) -> dict:
    """A `$ref` followed to what it names."""
    while "$ref" in schema:
        target = document
        for part in schema["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        schema = target
    return schema


def test_the_envelopes_and_results_are_paddlexs(documents, paddlex):
    document = documents["worker"]
    components = document["components"]["schemas"]
    pairs = [("AIStudioNoResultResponse", "ErrorEnvelope"), ("OCRResult", "OcrPageResult"),
             ("InferResult", "OcrResult"), ("ImageInfo", "ImageInfo"), ("PDFInfo", "PDFInfo"),
             ("TIFFInfo", "TIFFInfo"), ("PDFPageInfo", "PageInfo")]
    for theirs_name, ours_name in pairs:
        theirs, ours = paddlex[theirs_name], components[ours_name]
        assert set(theirs["properties"]) <= set(ours["properties"]), ours_name
        assert set(theirs.get("required", [])) <= set(ours["required"]), ours_name
    envelope = components["OcrEnvelope"]
    assert set(envelope["required"]) == {"logId", "result", "errorCode", "errorMsg"}
    assert envelope["properties"]["errorCode"] == {"const": 0}
    assert envelope["properties"]["errorMsg"] == {"const": "Success"}
    assert_valid(document, {"$ref": "#/components/schemas/OcrEnvelope"}, paddlex["answer"])


# ---- answers against the document --------------------------------------------------------------
def assert_valid(document: dict, schema: dict, instance) -> None:
    """`instance` against `schema`, whose $refs point into `document`."""
    rooted = {**schema, "components": document["components"]}
    errors = sorted(Draft202012Validator(rooted).iter_errors(instance), key=str)
    assert not errors, [error.message for error in errors]


def check_answer(document: dict, path: str, method: str, response) -> None:
    """The status is documented for the operation, with its JSON schema and headers."""
    operation = document["paths"][path][method]
    answer = operation["responses"].get(str(response.status_code))
    assert answer is not None, (path, method, response.status_code, response.data)
    answer = ref_target(document, answer)
    for name, header in answer.get("headers", {}).items():
        if header.get("required"):
            assert name in response.headers, (path, response.status_code, name)
    media = response.mimetype
    assert media in answer["content"] or "*/*" in answer["content"], (path, media)
    if media == "application/json":
        assert_valid(document, answer["content"][media]["schema"], response.get_json())


PNG = None


def png() -> str:
    global PNG
    if PNG is None:
        from samples import documents as samples

        PNG = b64(samples.to_png(samples.text_image(["openapi"], size=20)))
    return PNG


@pytest.mark.parametrize("name", ["gateway", "worker"])
@pytest.mark.parametrize("method, path, kwargs", [
    ("post", "/ocr", {"data": b""}),
    ("post", "/ocr", {"data": b"[" * 50}),
    ("post", "/ocr", {"json": {"file": "bm90IGEgZG9jdW1lbnQ="}}),
    ("post", "/ocr", {"json": {"file": "x", "textDetThresh": 7}}),
    ("post", "/ocr", {"data": {"visualize": "maybe"}, "content_type": "multipart/form-data"}),
    ("get", "/healthz", {}),
    ("get", "/readyz", {}),
    ("get", "/metrics", {}),
    ("get", PATH, {}),
])
def test_the_apps_answers_are_in_their_document(documents, name, method, path, kwargs):
    app = gateway() if name == "gateway" else worker()
    response = getattr(app.test_client(), method)(path, **kwargs)
    check_answer(documents[name], path, method, response)


def test_the_gateways_own_answers_are_in_its_document(documents):
    client = gateway().test_client()
    document = documents["gateway"]
    for method, path, kwargs, template in [
        ("get", "/fleet", {}, "/fleet"),
        ("get", "/", {}, "/"),
        ("get", "/ui/app.js", {}, "/ui/{filename}"),
        ("get", "/ui/no-such-file", {}, "/ui/{filename}"),
        ("post", "/ocr", {"json": {"file": png()}, "headers": {"Accept": "image/gif"}}, "/ocr"),
        ("post", "/ocr", {"json": {"file": png(), "returnPartialResults": None}}, "/ocr"),
        ("post", "/jobs", {"json": {"file": png(), "callbackUrl": 5}}, "/jobs"),
        ("get", "/jobs/" + "0" * 32, {}, "/jobs/{jobId}"),
        ("get", "/jobs/nope/result", {}, "/jobs/{jobId}/result"),
        ("delete", "/jobs/" + "f" * 32, {}, "/jobs/{jobId}"),
    ]:
        response = getattr(client, method)(path, **kwargs)
        check_answer(document, template, method, response)


def test_a_401_is_in_the_document():
    app = gateway(api_keys=(KEY,))
    document = document_of(app, {"X-API-Key": KEY})
    response = app.test_client().post("/ocr", json={"file": png()})
    assert response.status_code == 401
    check_answer(document, "/ocr", "post", response)


# ---- docs/api.md and the documents cannot drift ------------------------------------------------
# Names docs/api.md shows in code that are no field, header or status of an endpoint
NOT_IN_THE_API = {
    "X-OCRFleet-Signature", "X-OCRFleet-Job-Id",  # sent to a callback receiver, not answered
    "ocr_page", "ocr_line", "ocrx_word", "x_wconf", "ocrfleet_error",  # hOCR's vocabulary
}
CODE_SPAN = re.compile(r"```.*?```|`[^`]+`", re.S)  # inline code may span lines
FIELD = re.compile(r"\b[a-z]+(?:[A-Z][a-z0-9]*)+\b|\b[a-z]+_[a-z_]+\b")  # camelCase, snake_case
HEADER = re.compile(r"\b(?:X(?:-[A-Za-z0-9]+)+|Retry-After|WWW-Authenticate|Location|"
                    r"Cache-Control|Allow)\b")
STATUS_ROW = re.compile(r"^\|\s*([0-9][0-9, ]*)", re.M)


def code_text() -> str:
    """docs/api.md's code, less what names a file or a function (`services/ocr_api/x.py`)."""
    spans = CODE_SPAN.findall(API_MD.read_text())
    return "\n".join(span for span in spans if span.startswith("```")
                     or not re.search(r"\w[./]\w", span))


def property_names(node, values: bool = False) -> set[str]:
    """Every property name of every schema in a document (`values`: and every string its
    schemas enumerate)."""
    found: set[str] = set()
    if isinstance(node, dict):
        if isinstance(node.get("properties"), dict):
            found |= set(node["properties"])
        if values and isinstance(node.get("enum"), list):
            found |= {value for value in node["enum"] if isinstance(value, str)}
        for value in node.values():
            found |= property_names(value, values)
    elif isinstance(node, list):
        for value in node:
            found |= property_names(value, values)
    return found


def header_names(document: dict) -> set[str]:
    names = {parameter["name"] for item in document["paths"].values()
             for operation in item.values() for parameter in operation.get("parameters", [])
             if parameter["in"] == "header"}

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("headers"), dict):
                names.update(node["headers"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(document)
    schemes = document["components"]["securitySchemes"].values()
    return names | {s["name"] for s in schemes if s["type"] == "apiKey"} | {"Authorization"}


def statuses(document: dict) -> set[int]:
    found = {int(status) for item in document["paths"].values() for operation in item.values()
             for status in operation["responses"] if int(status) >= 400}
    return found | set(ERROR_REASONS)


def test_api_md_names_every_field_header_and_status_of_the_documents(documents):
    text, markdown = code_text(), API_MD.read_text()
    tables = {int(code) for cells in STATUS_ROW.findall(markdown)
              for code in re.findall(r"\d{3}", cells)}
    for name, document in documents.items():
        missing = {field for field in property_names(document)
                   if not re.search(rf"(?<![\w-]){re.escape(field)}(?![\w-])", text)}
        assert not missing, f"{name}: fields docs/api.md does not name: {sorted(missing)}"
        missing = {header for header in header_names(document) if header not in markdown}
        assert not missing, f"{name}: headers docs/api.md does not name: {sorted(missing)}"
        missing = statuses(document) - tables
        assert not missing, f"{name}: statuses not in docs/api.md's tables: {sorted(missing)}"


def test_the_documents_have_every_field_header_and_status_api_md_names(documents):
    markdown = API_MD.read_text()
    fields = set().union(*(property_names(d, values=True) for d in documents.values()))
    headers = set().union(*(header_names(d) for d in documents.values()))
    known = {*fields, *headers, *NOT_IN_THE_API}
    named = set(FIELD.findall(code_text())) | set(HEADER.findall(markdown))
    unknown = {name for name in named if name not in known}
    assert not unknown, f"docs/api.md names what no document has: {sorted(unknown)}"
    tables = {int(code) for cells in STATUS_ROW.findall(markdown)
              for code in re.findall(r"\d{3}", cells)}
    assert tables <= set().union(*(statuses(d) for d in documents.values()))
