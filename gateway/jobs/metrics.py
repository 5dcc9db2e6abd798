"""The job runner's Prometheus metrics (served by the gateway's /metrics beside its own)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

JOBS_ENDED = Counter("ocr_gateway_jobs_total", "Jobs ended, by final state", ["state"])
JOB_PAGES = Counter("ocr_gateway_job_pages_total", "Job pages stored, by outcome", ["outcome"])
JOB_RESUMES = Counter("ocr_gateway_job_resumes_total",
                      "Jobs taken over with pages already done (their runner died or stalled)")
CALLBACKS = Counter("ocr_gateway_job_callbacks_total", "Callback attempts, by outcome",
                    ["outcome"])
JOBS_RUNNING = Gauge("ocr_gateway_jobs_running", "Jobs this gateway is running now",
                     multiprocess_mode="livesum")
