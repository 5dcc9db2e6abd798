"""Async jobs: `POST /jobs` stores a validated document and answers 202 at once; runners in
every gateway process (of every replica sharing the store) work through the pages at batch
priority, store each page as it finishes, and resume a job whose gateway died from its last
finished page; callbacks tell the caller when it is done.

    api.py        the /jobs routes               runner.py   leases, pages, callbacks
    store*.py     Redis (fleet) or SQLite (one machine) behind one contract
    callbacks.py  signing, one delivery attempt (through services/ocr_api/url_input's client)
    results.py    the stored pages as an answer for gateway/outputs/  model.py  the job record
"""

from __future__ import annotations

import atexit
import logging
import threading

from flask import Flask

from services.ocr_api.logs import redact_url
from services.ocr_api.url_input import SafeHttpClient

from ..config import GatewayConfig
from .api import create_blueprint
from .callbacks import CallbackSender, callback_client
from .runner import JobRunner
from .store import JobStore, Limits

log = logging.getLogger("gateway.jobs")


def open_store(redis_url: str | None, sqlite_path: str, for_requests: bool = False) -> JobStore:
    """Redis when a URL is configured (`for_requests`: on a client that fails fast,
    `RedisJobStore.for_requests`), else the embedded SQLite file."""
    if redis_url:
        from .store_redis import RedisJobStore

        return RedisJobStore.for_requests(redis_url) if for_requests else \
            RedisJobStore(redis_url)
    from .store_sqlite import SqliteJobStore

    return SqliteJobStore(sqlite_path)


class Jobs:
    """What the routes and the runner share in one gateway process. The store is opened on
    first use, so an app built without starting (tests, manifest checks) touches nothing."""

    def __init__(self, config: GatewayConfig, service, client: SafeHttpClient | None = None):
        self.config = config.jobs
        self.service = service
        self.pdf_fonts = config.pdf_fonts
        self.client = client or callback_client(self.config.callback_timeout_s,
                                                self.config.callback_allow_private)
        self.limits = Limits(self.config.max_active, self.config.max_stored_bytes)
        self.runner: JobRunner | None = None
        self._store: JobStore | None = None
        self._request_store: JobStore | None = None
        self._lock = threading.Lock()

    @property
    def store(self) -> JobStore:
        """The store as the runners use it (and the routes' writes: a write that timed out
        might still be done later, so it waits for its answer)."""
        with self._lock:
            if self._store is None:
                self._store = open_store(self.config.redis_url, self.config.db_path)
            return self._store

    @property
    def request_store(self) -> JobStore:
        """The store as the routes read it before they answer: with Redis, a client whose
        calls fail fast (a 503 at once while Redis stalls); the same store with SQLite."""
        if not self.config.redis_url:
            return self.store
        with self._lock:
            if self._request_store is None:
                self._request_store = open_store(self.config.redis_url, self.config.db_path,
                                                 for_requests=True)
            return self._request_store

    def start(self) -> None:
        sender = (CallbackSender(self.config.callback_secret, self.client)
                  if self.config.callback_secret else None)
        try:
            store = self.store
        except Exception as exc:  # /jobs answers 503 saying so; /ocr is not affected
            self.log_store_error(exc)
            return
        self.runner = JobRunner(store, self.service, self.config, sender)
        self.runner.start()
        atexit.register(self.runner.stop)

    def stop(self) -> None:
        if self.runner is not None:
            self.runner.stop()

    def wake(self) -> None:
        if self.runner is not None:
            self.runner.wake()

    def cancelled(self, job_id: str) -> None:
        if self.runner is not None:
            self.runner.cancelled(job_id)

    def log_store_error(self, exc: Exception) -> None:
        where = redact_url(self.config.redis_url) if self.config.redis_url else \
            self.config.db_path
        log.error("job store unavailable",
                  extra={"store": where, "error": redact_url(repr(exc))
                         if self.config.redis_url else repr(exc)})


def install_jobs(app: Flask, config: GatewayConfig, service, start: bool = True) -> Jobs | None:
    """Register /jobs on the gateway app and start this process's runner (one call from
    create_app). GATEWAY_JOBS_ENABLED=false leaves /jobs out."""
    if not config.jobs.enabled:
        return None
    jobs = Jobs(config, service)
    app.register_blueprint(create_blueprint(jobs))
    app.extensions["gateway_jobs"] = jobs
    if start:
        jobs.start()
    return jobs
