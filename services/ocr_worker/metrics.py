"""The worker's Prometheus metrics (served by services.flask_common's /metrics, aggregated
over gunicorn processes through PROMETHEUS_MULTIPROC_DIR, which gunicorn.conf.py sets before
this module is imported)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

STAGE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64)
REQUEST_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256, 600)

REQUESTS = Counter("ocr_worker_requests_total", "OCR requests by outcome",
                   ["outcome", "code"])
PAGES = Counter("ocr_worker_pages_total", "Pages by outcome", ["outcome"])
QUEUE_DEPTH = Gauge("ocr_worker_queue_depth", "Pages waiting for the inference thread",
                    multiprocess_mode="livesum")
INFLIGHT = Gauge("ocr_worker_inflight_requests", "Requests admitted and not yet answered",
                 multiprocess_mode="livesum")
QUEUE_CAPACITY = Gauge("ocr_worker_queue_capacity", "Admission capacity (requests)",
                       multiprocess_mode="livesum")
READY = Gauge("ocr_worker_ready", "1 when the model is loaded and warmed up",
              multiprocess_mode="livesum")
STAGE_SECONDS = Histogram("ocr_worker_stage_seconds",
                          "Time per stage: decode, render, queue_wait, inference (per page), "
                          "encode", ["stage"], buckets=STAGE_BUCKETS)
BATCH_SIZE = Histogram("ocr_worker_batch_size", "Pages per engine call",
                       buckets=(1, 2, 4, 8, 16, 32, 64))
REQUEST_SECONDS = Histogram("ocr_worker_request_seconds", "End-to-end /ocr latency",
                            buckets=REQUEST_BUCKETS)
MODEL_LOAD_SECONDS = Gauge("ocr_worker_model_load_seconds",
                           "Seconds to load and warm up the model", multiprocess_mode="max")
RSS_BYTES = Gauge("ocr_worker_resident_memory_bytes",
                  "Resident memory after the last engine call (the steady level, not the peak)",
                  multiprocess_mode="livesum")
ENGINE_INFO = Gauge("ocr_worker_engine_info", "The engine this worker runs (value 1)",
                    ["engine", "backend", "device", "det_model", "rec_model"],
                    multiprocess_mode="max")


def observe_batcher(event: str, value) -> None:
    """Hook the batcher calls from its thread."""
    if event in ("enqueued", "dequeued"):
        QUEUE_DEPTH.set(value)
    elif event == "queue_wait":
        STAGE_SECONDS.labels("queue_wait").observe(value)
    elif event == "inference":
        seconds, pages = value
        BATCH_SIZE.observe(pages)
        for _ in range(pages):
            STAGE_SECONDS.labels("inference").observe(seconds / pages)
    elif event == "loaded":
        MODEL_LOAD_SECONDS.set(value)
        READY.set(1)


def observe_rss(rss: int) -> None:
    RSS_BYTES.set(rss)


def set_engine_info(info: dict[str, str]) -> None:
    ENGINE_INFO.labels(info.get("engine", ""), info.get("backend", ""), info.get("device", ""),
                       info.get("det_model", ""), info.get("rec_model", "")).set(1)
    MEMORY_LIMIT_BYTES.set(container_memory_limit())  # once per process, at its start


# Alert rules (deploy/monitoring/rules.yaml): RSS_BYTES against this.
MEMORY_LIMIT_BYTES = Gauge("ocr_worker_memory_limit_bytes",
                           "The container's memory limit (cgroup memory.max); 0 when unlimited",
                           multiprocess_mode="livemax")
CGROUP_LIMIT_FILES = ("/sys/fs/cgroup/memory.max",  # cgroup v2
                      "/sys/fs/cgroup/memory/memory.limit_in_bytes")  # cgroup v1


def container_memory_limit(files=CGROUP_LIMIT_FILES) -> int:
    """Bytes, or 0 when no limit is set (v2 says "max"; v1 a number near 2**63)."""
    for path in files:
        try:
            with open(path) as handle:
                text = handle.read().strip()
        except OSError:
            continue
        if not text.isdigit() or int(text) >= 2 ** 60:
            return 0
        return int(text)
    return 0
