"""gunicorn settings for the gateway: a few processes of many threads (it mostly waits on
replicas), long request timeouts for big PDFs, multiprocess-aware Prometheus metrics.

Run: gunicorn -c gateway/gunicorn.conf.py gateway.wsgi:app"""

import os
import shutil
import tempfile

from gateway.config import GatewayServerSettings

_settings = GatewayServerSettings.from_env()
_host, _port = _settings.host, _settings.port

bind = f"{_host}:{_port}"
workers = _settings.processes
worker_class = "gthread"
threads = _settings.http_threads
timeout = _settings.heartbeat_timeout_s  # heartbeat, not a per-request limit
graceful_timeout = _settings.graceful_timeout_s
keepalive = _settings.keepalive_s
preload_app = False
accesslog = None
errorlog = "-"
loglevel = "warning"
proc_name = f"ocr-gateway-{_port}"

_metrics_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or os.path.join(
    tempfile.gettempdir(), f"ocrfleet-gateway-metrics-{_host}-{_port}")
shutil.rmtree(_metrics_dir, ignore_errors=True)
os.makedirs(_metrics_dir, exist_ok=True)
os.environ["PROMETHEUS_MULTIPROC_DIR"] = _metrics_dir


def worker_exit(server, worker):
    service = worker.wsgi.extensions.get("gateway_service") if getattr(worker, "wsgi", None) \
        else None
    if service is not None:
        service.shutdown()


def child_exit(server, worker):
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)
