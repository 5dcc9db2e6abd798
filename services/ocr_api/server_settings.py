"""gunicorn's side of a service, shared by the worker and the gateway: where it listens (and
the optional second bind for /metrics), its timeouts, read from the variables both services
use (HOST, GUNICORN_TIMEOUT_S, HTTP_KEEPALIVE_S), and the settings both gunicorn.conf.py
files take from it. Each service's one settings class (services/ocr_worker/config.py,
gateway/config.py) derives from it and declares the rest: `port` (PORT, with the service's
default), and with its prefix `processes`, `http_threads`, `graceful_timeout_s` and
`metrics_port`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.ocr_api.settings import ConfigError, Settings, setting


@dataclass(frozen=True)
class ServerSettings(Settings):
    host: str = setting("HOST", "127.0.0.1")
    heartbeat_timeout_s: int = setting("GUNICORN_TIMEOUT_S", 120, 10)
    keepalive_s: int = setting("HTTP_KEEPALIVE_S", 75, 1)

    @property
    def binds(self) -> list[str]:
        ports = [self.port] + ([self.metrics_port] if self.metrics_port else [])
        return [f"{self.host}:{port}" for port in ports]

    @property
    def gunicorn_workers(self) -> int:
        return self.processes

    def gunicorn_settings(self, proc_name: str) -> dict[str, Any]:
        """What a gunicorn.conf.py sets: gthread processes, whose timeout is a heartbeat of
        the process's main loop, not a per-request limit (each service has its own), a
        keep-alive longer than nginx's upstream keepalive_timeout, no access log, and no
        control socket (gunicorn >= 25.1 opens one in $HOME/.gunicorn by default: nothing
        uses it, every master on a host would share that path, and a read-only root has no
        room for it)."""
        return {"bind": self.binds, "workers": self.gunicorn_workers,
                "worker_class": "gthread", "threads": self.http_threads,
                "timeout": self.heartbeat_timeout_s,
                "graceful_timeout": self.graceful_timeout_s, "keepalive": self.keepalive_s,
                "preload_app": False, "accesslog": None, "errorlog": "-",
                "loglevel": "warning", "proc_name": f"{proc_name}-{self.port}",
                "control_socket_disable": True}

    def validate(self) -> None:
        super().validate()
        if self.metrics_port is not None and self.metrics_port == self.port:
            raise ConfigError(f"{self.variable('metrics_port').name} must differ from PORT")
