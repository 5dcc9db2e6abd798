"""gunicorn settings for the gateway: a few processes of many threads (it mostly waits on
replicas), long request timeouts for big PDFs, multiprocess-aware Prometheus metrics, and
/metrics on a second bind when GATEWAY_METRICS_PORT is set.

Run: gunicorn -c gateway/gunicorn.conf.py gateway.wsgi:app"""

from gateway.config import GatewayConfig
from services.flask_common.prometheus import (mark_process_dead, prepare_multiprocess_dir,
                                              remove_multiprocess_dir)
from services.ocr_api.settings import ConfigError

# Every setting, read once, here in the master: a bad one stops the gateway now, with its
# message, and the processes forked from here take this object (gateway/wsgi.py).
try:
    _config = GatewayConfig.from_env()
except ConfigError as exc:
    raise SystemExit(f"ocr-gateway: {exc}") from None
_config.hand_over()
_host, _port = _config.host, _config.port

# bind (the service port, and the metrics port when one is set), workers, threads, timeouts
globals().update(_config.gunicorn_settings("ocr-gateway"))

prepare_multiprocess_dir("gateway", _host, _port)


def worker_exit(server, worker):
    extensions = worker.wsgi.extensions if getattr(worker, "wsgi", None) else {}
    jobs = extensions.get("gateway_jobs")
    if jobs is not None:  # first: its runners store the pages in flight, give leases back
        jobs.stop()
    service = extensions.get("gateway_service")
    if service is not None:
        service.shutdown()


def child_exit(server, worker):
    mark_process_dead(worker.pid)


def on_exit(server):
    remove_multiprocess_dir("gateway", _host, _port)
