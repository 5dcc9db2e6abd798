"""The gateway's Prometheus metrics (served by services.flask_common's /metrics, aggregated
over gunicorn processes as in the worker)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256, 600)

DOCUMENTS = Counter("ocr_gateway_documents_total", "Documents (requests) by outcome",
                    ["outcome", "code"])
PAGES = Counter("ocr_gateway_pages_total", "Pages by outcome", ["outcome"])
RETRIES = Counter("ocr_gateway_retries_total", "Chunk attempts retried, by reason", ["reason"])
REPLICA_INFLIGHT = Gauge("ocr_gateway_replica_inflight", "Requests outstanding per replica",
                         ["replica"], multiprocess_mode="livesum")
REPLICAS = Gauge("ocr_gateway_replicas", "Known replicas by state", ["state"],
                 multiprocess_mode="livemax")
REQUEST_SECONDS = Histogram("ocr_gateway_request_seconds", "End-to-end /ocr latency",
                            buckets=LATENCY_BUCKETS)
PAGE_SECONDS = Histogram("ocr_gateway_page_seconds",
                         "Latency of one attempt to a replica (one chunk, usually one page)",
                         buckets=LATENCY_BUCKETS)


def record_replicas(replicas, now: float) -> None:
    ready = sum(1 for r in replicas if r.ready and r.ejected_until <= now)
    ejected = sum(1 for r in replicas if r.ejected_until > now)
    REPLICAS.labels("ready").set(ready)
    REPLICAS.labels("ejected").set(ejected)
    REPLICAS.labels("known").set(len(replicas))
    for replica in replicas:
        REPLICA_LIMIT.labels(replica.url).set(replica.slots)

ATTEMPTS = Counter("ocr_gateway_attempts_total",
                   "Chunk attempts to replicas by outcome (busy = backpressure, not failure)",
                   ["outcome"])
RETRIES_DENIED = Counter("ocr_gateway_retries_denied_total",
                         "Failed chunks not retried because the fleet-wide retry budget was spent")
EXPIRED = Counter("ocr_gateway_deadline_expired_total",
                  "Documents whose deadline passed with pages still queued (those are not sent)")
REFUSED = Counter("ocr_gateway_refused_total", "Documents refused at the front door",
                  ["reason"])
QUEUED_PAGES = Gauge("ocr_gateway_queued_pages", "Pages admitted and not yet done",
                     multiprocess_mode="livesum")
REPLICA_LIMIT = Gauge("ocr_gateway_replica_limit",
                      "Pages the gateway may keep outstanding per replica (behind one load "
                      "balancer: its share of the whole fleet)", ["replica"],
                      multiprocess_mode="livesum")
