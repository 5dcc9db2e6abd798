"""Traces across the tiers (services/ocr_api/tracing.py), without the real engine: a worker app
on the `sim` engine served on 127.0.0.1 and the gateway app in front of it, both in this
process, so that the SDK's in-memory exporter sees the spans of both. One multi-page PDF is one
trace: admission, queue wait and one attempt per page under the document's span, each worker's
request span under its attempt (through `traceparent`), decode / render / engine / encode under
that, the logId on every span. With no OTEL_* variables a process installs no SDK and exports
nothing; with an OTLP endpoint its spans reach that endpoint as OTLP http/protobuf."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from werkzeug.serving import make_server

from gateway.app import create_app as create_gateway
from gateway.config import GatewayConfig, JobsConfig
from samples import documents
from services.ocr_api import tracing
from services.ocr_worker.app import create_app as create_worker
from services.ocr_worker.config import WorkerConfig
from tests.conftest import REPO_ROOT

PAGES = 3


@pytest.fixture(scope="module")
def exporter():
    """The SDK in this process, exporting to memory (the API lets a process install one
    provider: it stays, with nothing to export to, after this module)."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    trace.set_tracer_provider(provider)
    assert trace.get_tracer_provider() is provider, "another test installed a tracer provider"
    yield memory
    provider.shutdown()


@pytest.fixture(scope="module")
def worker_url(exporter):
    """One sim worker on a loopback port."""
    worker = create_worker(WorkerConfig(engine="sim", sim_page_ms=5, warmup=False,
                                        queue_size=16))
    assert worker.extensions["ocr_service"].batcher.ready.wait(30)
    server = make_server("127.0.0.1", 0, worker, threaded=True)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
    worker.extensions["ocr_service"].shutdown(5)


@pytest.fixture(scope="module")
def gateway(worker_url, tmp_path_factory):
    """A gateway test client in front of it."""
    jobs = JobsConfig(db_path=str(tmp_path_factory.mktemp("jobs") / "jobs.sqlite3"))
    app = create_gateway(GatewayConfig(replicas=(worker_url,), jobs=jobs), start=False)
    yield app.test_client()
    app.extensions["gateway_service"].shutdown()


def ocr(client, log_id: str, headers=None):
    pdf = documents.labelled_pdf(PAGES, lines_per_page=1)
    response = client.post("/ocr", json={"file": base64.b64encode(pdf).decode(),
                                         "logId": log_id, "visualize": False},
                           headers=headers or {})
    body = response.get_data()
    response.close()  # the document's span ends once the answer has gone
    return response, body


def spans_of(exporter, log_id: str):
    return [s for s in exporter.get_finished_spans()
            if s.attributes.get(tracing.LOG_ID) == log_id]


def children(spans, parent, name: str):
    return [s for s in spans if s.name == name and s.parent is not None
            and s.parent.span_id == parent.context.span_id]


def test_one_document_is_one_trace_with_every_page_and_worker_stage_under_it(gateway, exporter):
    exporter.clear()
    response, body = ocr(gateway, "trace-one")
    assert response.status_code == 200, body[:300]
    spans = spans_of(exporter, "trace-one")
    unlabelled = [s.name for s in exporter.get_finished_spans()
                  if tracing.LOG_ID not in s.attributes]
    assert not unlabelled, f"spans without a logId: {unlabelled}"
    assert len({s.context.trace_id for s in spans}) == 1, "one document, one trace"

    (document,) = [s for s in spans if s.parent is None]
    assert document.name == "document" and document.kind is SpanKind.SERVER
    assert document.attributes["ocrfleet.pages"] == PAGES
    assert len(children(spans, document, "admission")) == 1
    assert len(children(spans, document, "queue wait")) == 1
    attempts = children(spans, document, "attempt")
    # a worker that already holds its target refuses a page at once ("later": sent elsewhere)
    refused = [a for a in attempts if a.attributes["ocrfleet.outcome"] == "later"]
    attempts = [a for a in attempts if a not in refused]
    assert all(a.attributes["ocrfleet.status"] == 503 for a in refused)
    assert sorted(tuple(a.attributes["ocrfleet.pages"]) for a in attempts) == \
        [(n,) for n in range(1, PAGES + 1)]
    for attempt in attempts:
        assert attempt.kind is SpanKind.CLIENT
        assert attempt.attributes["ocrfleet.outcome"] == "ok"
        assert attempt.attributes["ocrfleet.status"] == 200
        assert attempt.attributes["ocrfleet.replica"].startswith("http://127.0.0.1:")
        # the worker's request continues the attempt (traceparent), its stages under it
        (request,) = children(spans, attempt, "ocr request")
        assert request.kind is SpanKind.SERVER
        stages = Counter(s.name for s in spans
                         if s.parent is not None and s.parent.span_id == request.context.span_id)
        assert stages == {"decode": 1, "render": 1, "engine": 1, "encode": 1}, stages
        (engine,) = children(spans, request, "engine")
        assert engine.attributes["ocrfleet.batch"] >= 1
        assert engine.start_time <= engine.end_time
    # every span lies within the document's
    assert all(document.start_time <= s.start_time and s.end_time <= document.end_time
               for s in spans)


def test_documents_are_separate_traces_and_a_caller_trace_is_continued(gateway, exporter):
    exporter.clear()
    caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    ocr(gateway, "trace-a")
    ocr(gateway, "trace-b", headers={"traceparent": f"00-{caller_trace}-00f067aa0ba902b7-01"})
    first, second = spans_of(exporter, "trace-a"), spans_of(exporter, "trace-b")
    assert len({s.context.trace_id for s in first}) == 1
    assert {s.context.trace_id for s in second} == {int(caller_trace, 16)}
    assert first[0].context.trace_id != second[0].context.trace_id


def test_a_job_run_is_one_trace_with_its_pages_under_it(worker_url, exporter, tmp_path):
    jobs = JobsConfig(db_path=str(tmp_path / "jobs.sqlite3"), runners=1)
    app = create_gateway(GatewayConfig(replicas=(worker_url,), jobs=jobs))
    try:
        client = app.test_client()
        pdf = documents.labelled_pdf(PAGES, lines_per_page=1)
        created = client.post("/jobs", json={"file": base64.b64encode(pdf).decode(),
                                             "logId": "trace-job", "visualize": False})
        assert created.status_code == 202, created.get_data()[:300]
        job_id = created.get_json()["result"]["jobId"]
        for _ in range(60):
            state = client.get(f"/jobs/{job_id}", query_string={"wait": 1}).get_json()
            if state["result"]["state"] not in ("queued", "running"):
                break
        assert state["result"]["state"] == "succeeded", state
    finally:
        app.extensions["gateway_jobs"].stop()  # its runner done: the job's span has ended
        app.extensions["gateway_service"].shutdown()
    spans = spans_of(exporter, "trace-job")
    (job,) = [s for s in spans if s.name == "job"]
    assert job.parent is None and job.attributes["ocrfleet.job"] == job_id
    assert {s.context.trace_id for s in spans} == {job.context.trace_id}
    assert len(children(spans, job, "admission")) == len(children(spans, job, "queue wait")) == 1
    attempts = children(spans, job, "attempt")
    assert len(attempts) == PAGES
    assert all(len(children(spans, a, "ocr request")) == 1 for a in attempts)


def test_a_refused_document_has_error_spans(exporter):
    """No replica can take pages: the admission span and the document's say why (503)."""
    app = create_gateway(GatewayConfig(replicas=("http://127.0.0.1:9",)), start=False)
    service = app.extensions["gateway_service"]
    for replica in service.replicas.replicas():
        replica.ready = False  # known down
    try:
        response, _ = ocr(app.test_client(), "trace-refused")
    finally:
        service.shutdown()
    assert response.status_code == 503
    spans = {s.name: s for s in spans_of(exporter, "trace-refused")}
    assert set(spans) == {"document", "admission"}
    assert spans["admission"].parent.span_id == spans["document"].context.span_id
    for span in spans.values():
        assert span.status.status_code is trace.StatusCode.ERROR
        assert "No OCR replica is ready" in span.status.description


@pytest.mark.parametrize("environ, exporters", [
    ({}, []),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ["otlp"]),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, ["otlp"]),
    ({"OTEL_TRACES_EXPORTER": "otlp,console"}, ["otlp", "console"]),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, []),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, []),
])
def test_the_standard_variables_turn_traces_on(environ, exporters):
    assert tracing.wanted_exporters(environ) == exporters


# ---- a fresh process: off by default, OTLP when asked ------------------------------------------
APPS = """
import json, sys
from opentelemetry import trace
from gateway.app import create_app as gateway
from gateway.config import GatewayConfig, JobsConfig
from services.ocr_api import tracing
from services.ocr_worker.app import create_app as worker
from services.ocr_worker.config import WorkerConfig
gateway(GatewayConfig(replicas=("http://127.0.0.1:9",)), start=False)
worker(WorkerConfig(engine="sim", warmup=False), start=False)
with tracing.span("probe", "log-probe") as span:
    recording, headers = span.is_recording(), tracing.outgoing()
provider = trace.get_tracer_provider()
if hasattr(provider, "shutdown"):
    provider.shutdown()  # flushes the batch
print(json.dumps({"recording": recording, "headers": headers,
                  "provider": type(provider).__name__,
                  "sdk": sorted(m for m in sys.modules
                                if m.startswith(("opentelemetry.sdk.trace",
                                                 "opentelemetry.exporter")))}))
"""


def run_apps(**variables) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | variables
    done = subprocess.run([sys.executable, "-c", APPS], cwd=REPO_ROOT, env=env, timeout=120,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # a fresh Python process importing both services
def test_without_otel_variables_no_sdk_is_installed_and_nothing_is_recorded():
    """Neither the tracing SDK nor the exporter is imported (redis-py imports the SDK's
    metrics part whenever the SDK is installed: not ours to keep out)."""
    seen = run_apps()
    assert seen == {"recording": False, "headers": {}, "provider": "ProxyTracerProvider",
                    "sdk": []}


class Collector(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver on loopback: keeps each POST's path, type and body."""

    received: list = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.path, self.headers["Content-Type"], body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.slow  # a fresh Python process importing both services
def test_an_otlp_endpoint_gets_the_spans_as_http_protobuf():
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import \
        ExportTraceServiceRequest

    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        seen = run_apps(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
        server.server_close()
    assert seen["recording"] and seen["provider"] == "TracerProvider"
    assert seen["headers"]["traceparent"].startswith("00-")
    ((path, content_type, body),) = Collector.received
    assert path == "/v1/traces" and content_type == "application/x-protobuf"
    request = ExportTraceServiceRequest.FromString(body)
    (resource_spans,) = request.resource_spans
    resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
    assert resource["service.name"] == "ocrfleet-gateway"  # the first app of the process
    (span,) = [s for scope in resource_spans.scope_spans for s in scope.spans]
    attributes = {a.key: a.value.string_value for a in span.attributes}
    assert span.name == "probe" and attributes[tracing.LOG_ID] == "log-probe"
