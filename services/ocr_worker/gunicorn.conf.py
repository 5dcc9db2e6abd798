"""gunicorn settings for the OCR worker: one process per device (OCR_PROCESSES, default 1),
HTTP threads enough for the admission queue plus spares, so a full queue is answered 503 at
once, graceful SIGTERM (refuse new work, finish what was admitted), multiprocess-aware
Prometheus metrics, /metrics on a second bind when OCR_METRICS_PORT is set, and the
replacement of a process over its memory ceiling (services/ocr_worker/recycle.py).

Run: gunicorn -c services/ocr_worker/gunicorn.conf.py services.ocr_worker.wsgi:app"""

import os
import signal
from collections import Counter
from dataclasses import replace

from services.flask_common.prometheus import (mark_process_dead, prepare_multiprocess_dir,
                                              remove_multiprocess_dir)
from services.ocr_api.settings import ConfigError
from services.ocr_worker import recycle
from services.ocr_worker.config import WorkerConfig

# Every setting, read once, here in the master: a bad one stops the worker now, with its
# message, and the processes forked from here take this object (services/ocr_worker/wsgi.py).
try:
    _settings = WorkerConfig.from_env()
except ConfigError as exc:
    raise SystemExit(f"ocr-worker: {exc}") from None
_host, _port = _settings.host, _settings.port

# bind (the service port, and the metrics port when one is set), workers, threads, timeouts;
# the gthread timeout is a heartbeat, so a slow page (OCR_REQUEST_TIMEOUT_S bounds it) never
# gets the process killed; no preload: the engine is created after fork, in each process
globals().update(_settings.gunicorn_settings("ocr-worker"))
# OCR_INSTANCES_PER_DEVICE=K: K engine processes share each device (a GPU, or the cores given
# to this worker) behind this one port; OCR_THREADS is the device's threads, split between them:
# the processes run with their share (handed over, not exported, so that a reload, which runs
# this file again, splits the device's threads, not a share once more).
replace(_settings, threads=_settings.instance_threads).hand_over()

# Prometheus multiprocess mode: set before prometheus_client is imported by the app (wiped here
# in the master at start).
prepare_multiprocess_dir("worker", _host, _port)
# Where a process over OCR_MEMORY_CEILING_MB asks to be replaced (wiped here at start).
recycle.prepare_dir(_host, _port)

# One device per process: with CUDA_VISIBLE_DEVICES_LIST="0,1", worker i sees card i only
# (as gpu:0 inside). Without it, CUDA_VISIBLE_DEVICES from the environment applies to all.
_devices = _settings.devices


def pre_fork(server, worker):
    """Runs in the master just before fork: give the new worker a card that fewer than
    OCR_INSTANCES_PER_DEVICE live workers hold."""
    if not _devices:
        return
    leaving = recycle.requested_pids()  # a replacement takes the card of the one it replaces
    taken = Counter(getattr(w, "ocr_device", None) for pid, w in server.WORKERS.items()
                    if pid not in leaving)
    device = next((d for d in _devices if taken[d] < _settings.instances_per_device),
                  _devices[0])
    worker.ocr_device = device
    os.environ["CUDA_VISIBLE_DEVICES"] = device


def post_fork(server, worker):
    """In the new worker: is it the replacement of a process over its memory ceiling?"""
    worker.ocr_replacement = recycle.is_replacement(server)


def nworkers_changed(server, new_value, old_value):
    """Before gunicorn adds or stops processes: those that asked to be replaced go first."""
    recycle.mark_oldest(server)


def post_worker_init(worker):
    original = worker.handle_exit

    def drain_then_exit(sig, frame):
        service = worker.wsgi.extensions.get("ocr_service") if worker.wsgi else None
        # Replaced for memory: a ready replacement takes the new connections, so this process
        # serves everything it has accepted. Otherwise (shutdown) it refuses new work with 503.
        if service is not None and os.getpid() not in recycle.requested_pids():
            service.admission.draining = True
        original(sig, frame)

    signal.signal(signal.SIGTERM, drain_then_exit)
    service = worker.wsgi.extensions.get("ocr_service") if worker.wsgi else None
    if getattr(worker, "ocr_replacement", False) and service is not None:
        # accept nothing until the model is warm, then have the old process stopped
        recycle.become_ready_then_take_over(
            ready=service.batcher.ready.wait, failed=lambda: bool(service.batcher.load_error),
            heartbeat=worker.notify, alive=lambda: worker.alive)


def worker_exit(server, worker):
    service = worker.wsgi.extensions.get("ocr_service") if getattr(worker, "wsgi", None) else None
    if service is not None:
        service.shutdown(timeout=_settings.graceful_timeout_s)


def child_exit(server, worker):
    mark_process_dead(worker.pid)
    recycle.forget(worker.pid)


def on_exit(server):
    remove_multiprocess_dir("worker", _host, _port)
    recycle.remove_dir()
