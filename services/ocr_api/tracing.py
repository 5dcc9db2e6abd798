"""OpenTelemetry traces across the tiers: one trace per document, from the gateway's admission
and queue to each chunk's attempt on a replica and that worker's decode, render, engine and
encode stages, every span carrying the document's logId (`ocrfleet.log_id`) so that logs and
traces join. The gateway sends the W3C `traceparent` with each chunk; the worker continues it.

Off by default: until `configure` installs the SDK, `tracer` is the API's no-op tracer (each
span a few microseconds, nothing recorded, the SDK never imported). `configure` turns traces on
when the standard variables ask for them: OTEL_TRACES_EXPORTER (`otlp`, `console`, a comma
list; `none`: off) or, without it, an OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT); OTEL_SDK_DISABLED=true keeps them off. The SDK reads the
rest itself: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, OTEL_EXPORTER_OTLP_* (endpoint,
headers, timeout, compression, certificates), OTEL_TRACES_SAMPLER(_ARG), OTEL_BSP_*,
OTEL_PROPAGATORS. OTLP goes over http/protobuf (no grpc here).

Spans started on another thread than their parent's (the gateway's send threads, the worker's
inference thread) take the parent's context explicitly (`capture`), and those whose times are
only known afterwards (a document's queue wait, a page's share of a batch in the engine) are
recorded with their monotonic start and end (`record`)."""

from __future__ import annotations

import logging
import os
import time
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, StatusCode

from .logs import current_log_id

log = logging.getLogger("tracing")

LOG_ID = "ocrfleet.log_id"  # on every span: the logId of the logs' lines (services/ocr_api/logs.py)
PREFIX = "ocrfleet."  # the other attributes: ocrfleet.replica, ocrfleet.pages, ...
SERVER, CLIENT, INTERNAL = SpanKind.SERVER, SpanKind.CLIENT, SpanKind.INTERNAL
EXPORTERS = ("otlp", "console")

tracer = trace.get_tracer("ocrfleet")  # the API's proxy: no-op until a provider is installed
_configured: str | None = None  # the service name this process's traces were set up for


# ---- set-up -------------------------------------------------------------------------------------
def wanted_exporters(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The span exporters the standard OTEL_* variables ask for; empty: traces are off."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    names = [name.strip().lower() for name in environ.get("OTEL_TRACES_EXPORTER", "").split(",")
             if name.strip()]
    if names:
        return [] if "none" in names else names
    endpoint = (environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))
    return ["otlp"] if endpoint else []


def configure(service_name: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Once per process, after fork (each service's create_app): the SDK's tracer provider with
    a batching exporter when the OTEL_* variables ask for traces. True when traces are on.
    OTEL_SERVICE_NAME (or service.name in OTEL_RESOURCE_ATTRIBUTES) overrides `service_name`."""
    global _configured
    if _configured is not None:
        return True
    names = wanted_exporters(environ)
    unknown = [name for name in names if name not in EXPORTERS]
    if unknown:
        log.warning("OTEL_TRACES_EXPORTER names exporter(s) this service does not have: %s "
                    "(it has: %s)", ", ".join(unknown), ", ".join(EXPORTERS))
    names = [name for name in names if name in EXPORTERS]
    if not names:
        return False
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource  # only when traces are on
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service_name}))
    provider = TracerProvider(resource=resource)  # reads OTEL_TRACES_SAMPLER itself
    for name in names:
        provider.add_span_processor(BatchSpanProcessor(_exporter(name, environ)))
    trace.set_tracer_provider(provider)
    _configured = service_name
    log.info("traces on", extra={"exporters": names,
                                 "serviceName": resource.attributes.get(SERVICE_NAME)})
    return True


def _exporter(name: str, environ: Mapping[str, str]):
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    protocol = (environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf")
    if protocol != "http/protobuf":
        log.warning("OTLP protocol %r is not available here: traces go over http/protobuf "
                    "(a collector's port 4318)", protocol)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()  # endpoint, headers, timeout, compression: OTEL_EXPORTER_OTLP_*


# ---- spans --------------------------------------------------------------------------------------
def _attributes(log_id: str | None, attributes: Mapping[str, Any]) -> dict[str, Any]:
    found = {LOG_ID: log_id or current_log_id.get()}
    found.update((PREFIX + key, value) for key, value in attributes.items())
    return {key: value for key, value in found.items() if value is not None}


@contextmanager
def span(name: str, log_id: str | None = None, parent: otel_context.Context | None = None,
         kind: SpanKind = INTERNAL, **attributes: Any) -> Iterator[Span]:
    """A span, current while the block runs, under `parent` (a captured context) or the
    current span; an exception leaving the block is recorded on it. `log_id`: the current
    one when not given."""
    with tracer.start_as_current_span(name, context=parent, kind=kind,
                                      attributes=_attributes(log_id, attributes)) as current:
        yield current


def begin(name: str, log_id: str | None = None, parent: otel_context.Context | None = None,
          kind: SpanKind = INTERNAL, **attributes: Any) -> Span:
    """A span that outlives the block that starts it (a streamed answer's): made current with
    `active`, ended by its owner."""
    return tracer.start_span(name, context=parent, kind=kind,
                             attributes=_attributes(log_id, attributes))


def active(span_: Span):
    """Make a `begin` span current for a block, recording an exception leaving it."""
    return trace.use_span(span_, end_on_exit=False)


def record(name: str, started: float, ended: float, parent: otel_context.Context | None = None,
           log_id: str | None = None, **attributes: Any) -> None:
    """A span already over, from its time.monotonic() start and end."""
    current = tracer.start_span(name, context=parent, start_time=_wall_ns(started),
                                attributes=_attributes(log_id, attributes))
    current.end(end_time=_wall_ns(ended))


def tag(span_: Span | None = None, **attributes: Any) -> None:
    """Attributes found out after the span began (the current span unless given)."""
    target = span_ or trace.get_current_span()
    if target.is_recording():
        log_id = attributes.pop("log_id", None)
        target.set_attributes({PREFIX + key: value for key, value in attributes.items()
                               if value is not None} | ({LOG_ID: log_id} if log_id else {}))


def settle(span_: Span, error: str | None = None, **attributes: Any) -> None:
    """How the span's work ended: attributes, and the error that failed it, if one did."""
    tag(span_, **attributes)
    if error is not None:
        span_.set_status(StatusCode.ERROR, error)


def _wall_ns(monotonic_s: float) -> int:
    return time.time_ns() - int((time.monotonic() - monotonic_s) * 1e9)


# ---- across threads and tiers -------------------------------------------------------------------
def capture() -> otel_context.Context:
    """The current trace context, for spans that another thread starts under it."""
    return otel_context.get_current()


def outgoing() -> dict[str, str]:
    """The headers that carry the current span to the next tier (W3C traceparent; none when
    traces are off)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def incoming(headers: Mapping[str, str]) -> otel_context.Context:
    """The trace context a request's headers carry (an empty one without a traceparent)."""
    return propagate.extract(headers)
