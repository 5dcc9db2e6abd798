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
    record_ejections(replicas, now)


_out_since: dict[str, float] = {}  # replica URL -> when it was first seen out of service


def record_ejections(replicas, now: float) -> None:
    """REPLICA_EJECTED_SECONDS: how long each replica has been out of service without a break:
    ejected, or on probation (gateway.flow.replicas) while its trial page is out or its readiness
    probe fails. A probation with no traffic and a ready probe does not count (a replica that
    came back at night stays on probation until the first page, and that is no alarm)."""
    seen = set()
    for replica in replicas:
        seen.add(replica.url)
        out = replica.ejected_until > now or (
            replica.probation and (replica.ready is not True or replica.inflight > 0))
        if out:
            since = _out_since.setdefault(replica.url, now)
            REPLICA_EJECTED_SECONDS.labels(replica.url).set(now - since)
        else:
            _out_since.pop(replica.url, None)
            REPLICA_EJECTED_SECONDS.labels(replica.url).set(0)
    for url in [u for u in _out_since if u not in seen]:  # gone from the replica set
        del _out_since[url]
        REPLICA_EJECTED_SECONDS.labels(url).set(0)


def observe_queue_wait(waited_s: float, deadline_s: float) -> None:
    """A chunk leaves the gateway's queue for its first attempt after `waited_s`; its document
    was admitted with `deadline_s` to go (GATEWAY_REQUEST_TIMEOUT_S less the planning)."""
    QUEUE_WAIT_SECONDS.observe(max(0.0, waited_s))
    DEADLINE_SECONDS.set(deadline_s)

ATTEMPTS = Counter("ocr_gateway_attempts_total",
                   "Chunk attempts to replicas by outcome (busy = backpressure, later = an "
                   "image refused by a worker that would start it too late; neither fails)",
                   ["outcome"])
RETRIES_DENIED = Counter("ocr_gateway_retries_denied_total",
                         "Failed chunks not retried because the fleet-wide retry budget was spent")
EXPIRED = Counter("ocr_gateway_deadline_expired_total",
                  "Documents whose deadline passed with pages still queued (those are not sent)")
REFUSED = Counter("ocr_gateway_refused_total", "Documents refused at the front door",
                  ["reason"])
QUEUED_PAGES = Gauge("ocr_gateway_queued_pages", "Pages admitted and not yet done",
                     multiprocess_mode="livesum")
HELD_BYTES = Gauge("ocr_gateway_held_bytes", "Bytes of the memory budget (GATEWAY_QUEUE_BYTES) "
                   "held by requests: bodies being read, documents, answers not yet sent",
                   multiprocess_mode="livesum")
REPLICA_LIMIT = Gauge("ocr_gateway_replica_limit",
                      "Pages the gateway may keep outstanding per replica (behind one load "
                      "balancer: its share of the whole fleet)", ["replica"],
                      multiprocess_mode="livesum")
# Alert rules (deploy/monitoring/rules.yaml) and the dashboard read these three.
REPLICA_EJECTED_SECONDS = Gauge("ocr_gateway_replica_ejected_seconds",
                                "Seconds this replica has been out of service without a break "
                                "(ejected, or on probation and not answering); 0 in service",
                                ["replica"], multiprocess_mode="livemax")
QUEUE_WAIT_SECONDS = Histogram("ocr_gateway_queue_wait_seconds",
                               "Time a chunk waited in the gateway's queue before its first "
                               "attempt", buckets=LATENCY_BUCKETS)
DEADLINE_SECONDS = Gauge("ocr_gateway_deadline_seconds",
                         "The time a document had to go when it was admitted (the last one)",
                         multiprocess_mode="livemax")
# The page cache (gateway/cache/, docs/cache.md)
CACHE_LOOKUPS = Counter("ocr_gateway_cache_lookups_total",
                        "Chunks looked up in the page cache, by result: hit, miss (sent and "
                        "stored), dedup_wait (the page was in flight elsewhere), dedup_hit "
                        "(answered once that finished), bypass (not read: Cache-Control, no "
                        "engine identity known yet, a mixed fleet, or the cache off for it)",
                        ["result"])
CACHE_PAGES = Counter("ocr_gateway_cache_pages_total", "Pages answered from the page cache")
CACHE_TAKEOVERS = Counter("ocr_gateway_cache_takeovers_total",
                          "Waiting chunks sent after all: the first attempt let go without an "
                          "answer (released) or the wait reached its limit (deadline)",
                          ["reason"])
CACHE_STORED_BYTES = Counter("ocr_gateway_cache_stored_bytes_total",
                             "Bytes written to the page cache (compressed answers)")
CACHE_BYTES = Gauge("ocr_gateway_cache_bytes", "Bytes the page cache's store holds (last read)",
                    multiprocess_mode="livemax")
CACHE_ERRORS = Counter("ocr_gateway_cache_errors_total",
                       "Page cache store calls that failed (read through)", ["call"])
CACHE_WAIT_SECONDS = Histogram("ocr_gateway_cache_wait_seconds",
                               "How long a chunk waited for the same page in flight elsewhere",
                               buckets=LATENCY_BUCKETS)
