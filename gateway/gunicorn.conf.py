"""gunicorn settings for the gateway: a few processes of many threads (it mostly waits on
replicas), long request timeouts for big PDFs, multiprocess-aware Prometheus metrics, and
/metrics on a second bind when GATEWAY_METRICS_PORT is set.

Run: gunicorn -c gateway/gunicorn.conf.py gateway.wsgi:app"""

from gateway.config import GatewayServerSettings
from services.flask_common.prometheus import mark_process_dead, prepare_multiprocess_dir

_settings = GatewayServerSettings.from_env()
_host, _port = _settings.host, _settings.port

bind = _settings.binds  # the service port, and the metrics port when one is set
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
# No control socket (gunicorn >= 25.1 opens one in $HOME/.gunicorn by default): nothing uses
# it, every master on a host would share that path, and a read-only root has no room for it.
control_socket_disable = True

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
