"""prometheus-client under gunicorn, for both services: the multiprocess directory (set up in
the master before the app imports prometheus_client, wiped at start, and removed at exit when
it is ours, not the operator's PROMETHEUS_MULTIPROC_DIR), the /metrics payload
(a fresh MultiProcessCollector registry per scrape when several processes share it), and
marking a dead process's gauges."""

from __future__ import annotations

import os
import shutil
import tempfile


def prepare_multiprocess_dir(service: str, host: str, port: int) -> str:
    """Call from gunicorn.conf.py, in the master, before the app is imported."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or _default_dir(service, host, port)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path, exist_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    return path


def remove_multiprocess_dir(service: str, host: str, port: int) -> None:
    """Call from gunicorn's on_exit, in the master: the directory prepare_multiprocess_dir
    named in the temporary directory goes (every run on a new port would leave one)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR") == _default_dir(service, host, port):
        shutil.rmtree(_default_dir(service, host, port), ignore_errors=True)


def _default_dir(service: str, host: str, port: int) -> str:
    return os.path.join(tempfile.gettempdir(), f"ocrfleet-{service}-metrics-{host}-{port}")


def mark_process_dead(pid: int) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid)


def render_metrics() -> tuple[bytes, str]:
    from prometheus_client import (CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry,
                                   generate_latest, multiprocess)

    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
