"""gunicorn's side of a service, shared by the worker and the gateway: where it listens (and
the optional second bind for /metrics), how many processes and threads, its timeouts, read
from the variables both services use (HOST, PORT, GUNICORN_TIMEOUT_S, HTTP_KEEPALIVE_S), and
the settings both gunicorn.conf.py files take from it. Each service subclasses it with its
own defaults and prefixed variables (services/ocr_worker/config.py, gateway/config.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.ocr_api.settings import ConfigError, Env


@dataclass(frozen=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8080
    processes: int = 1
    http_threads: int = 48
    heartbeat_timeout_s: int = 120
    graceful_timeout_s: int = 120
    keepalive_s: int = 75
    metrics_port: int | None = None  # a second bind, for /metrics only

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

    @classmethod
    def shared_fields(cls, env: Env) -> dict[str, Any]:
        """The fields both services read from the same unprefixed variables."""
        defaults = cls()
        return {"host": env.str("HOST", defaults.host),
                "port": env.int("PORT", defaults.port, 1, 65535),
                "heartbeat_timeout_s": env.int("GUNICORN_TIMEOUT_S",
                                               defaults.heartbeat_timeout_s, 10),
                "keepalive_s": env.int("HTTP_KEEPALIVE_S", defaults.keepalive_s, 1)}

    def checked(self, metrics_variable: str):
        if self.metrics_port is not None and self.metrics_port == self.port:
            raise ConfigError(f"{metrics_variable} must differ from PORT")
        return self
