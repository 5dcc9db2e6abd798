"""GatewayConfig: every setting of the gateway, read once from the environment and validated
(the README's configuration table lists the same variables)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from services.ocr_api.settings import ConfigError, Env

# Searchable-PDF text layer fonts, tried in order (see gateway/outputs/fonts.py)
DEFAULT_PDF_FONTS = ("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
                     "/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc")


@dataclass(frozen=True)
class GatewayConfig:
    # upstreams: exactly one of these three
    upstream_url: str | None = None  # one load balancer (nginx, a ClusterIP Service)
    replicas: tuple[str, ...] = ()  # a fixed list of worker URLs
    replica_dns: str | None = None  # "name:port", re-resolved (a k8s headless Service)
    dns_refresh_s: float = 5.0
    health_interval_s: float = 2.0
    eject_s: float = 10.0

    pages_per_chunk: int = 1
    max_inflight_per_request: int = 32
    max_inflight: int = 256
    page_timeout_s: float = 300.0
    request_timeout_s: float = 900.0
    connect_timeout_s: float = 2.0
    max_attempts: int = 4
    backoff_s: float = 0.2

    max_bytes: int = 200 * 1024 * 1024
    max_pages: int = 2000
    allow_url_input: bool = False
    url_timeout_s: float = 20.0
    log_level: str = "INFO"
    pdf_fonts: tuple[str, ...] = DEFAULT_PDF_FONTS

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "GatewayConfig":
        env = Env(environ)
        d = cls()
        config = cls(
            upstream_url=env.optional_str("GATEWAY_UPSTREAM_URL"),
            replicas=tuple(url.rstrip("/") for url in env.list("GATEWAY_REPLICAS")),
            replica_dns=env.optional_str("GATEWAY_REPLICA_DNS"),
            dns_refresh_s=env.float("GATEWAY_DNS_REFRESH_S", d.dns_refresh_s, 0.1),
            health_interval_s=env.float("GATEWAY_HEALTH_INTERVAL_S", d.health_interval_s, 0.1),
            eject_s=env.float("GATEWAY_EJECT_S", d.eject_s, 0),
            pages_per_chunk=env.int("GATEWAY_PAGES_PER_CHUNK", d.pages_per_chunk, 1, 1000),
            max_inflight_per_request=env.int("GATEWAY_MAX_INFLIGHT_PER_REQUEST",
                                             d.max_inflight_per_request, 1, 4096),
            max_inflight=env.int("GATEWAY_MAX_INFLIGHT", d.max_inflight, 1, 65536),
            page_timeout_s=env.float("GATEWAY_PAGE_TIMEOUT_S", d.page_timeout_s, 1),
            request_timeout_s=env.float("GATEWAY_REQUEST_TIMEOUT_S", d.request_timeout_s, 1),
            connect_timeout_s=env.float("GATEWAY_CONNECT_TIMEOUT_S", d.connect_timeout_s, 0.1),
            max_attempts=env.int("GATEWAY_MAX_ATTEMPTS", d.max_attempts, 1, 20),
            backoff_s=env.float("GATEWAY_BACKOFF_S", d.backoff_s, 0),
            max_bytes=env.int("GATEWAY_MAX_BYTES", d.max_bytes, 1024),
            max_pages=env.int("GATEWAY_MAX_PAGES", d.max_pages, 1),
            allow_url_input=env.bool("GATEWAY_ALLOW_URL_INPUT", d.allow_url_input),
            url_timeout_s=env.float("GATEWAY_URL_TIMEOUT_S", d.url_timeout_s, 1),
            log_level=env.choice("GATEWAY_LOG_LEVEL", d.log_level,
                                 ("DEBUG", "INFO", "WARNING", "ERROR")),
            pdf_fonts=tuple(env.list("GATEWAY_PDF_FONTS")) or d.pdf_fonts,
        )
        config.validate()
        return config

    def validate(self) -> None:
        modes = [bool(self.upstream_url), bool(self.replicas), bool(self.replica_dns)]
        if sum(modes) != 1:
            raise ConfigError("set exactly one of GATEWAY_UPSTREAM_URL (one load balancer), "
                              "GATEWAY_REPLICAS (comma-separated worker URLs) or "
                              "GATEWAY_REPLICA_DNS (name:port of a headless Service)")
        if self.replica_dns and ":" not in self.replica_dns:
            raise ConfigError(f"GATEWAY_REPLICA_DNS={self.replica_dns!r}: expected name:port")
        for url in (self.upstream_url, *self.replicas):
            if url and not url.startswith(("http://", "https://")):
                raise ConfigError(f"upstream {url!r}: expected an http:// or https:// URL")


@dataclass(frozen=True)
class GatewayServerSettings:
    """gunicorn's side of the gateway (read by gunicorn.conf.py)."""

    host: str = "127.0.0.1"
    port: int = 8080
    processes: int = 2
    http_threads: int = 64
    heartbeat_timeout_s: int = 120
    graceful_timeout_s: int = 300
    keepalive_s: int = 75

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "GatewayServerSettings":
        env = Env(environ)
        d = cls()
        return cls(
            host=env.str("HOST", d.host),
            port=env.int("PORT", d.port, 1, 65535),
            processes=env.int("GATEWAY_PROCESSES", d.processes, 1, 64),
            http_threads=env.int("GATEWAY_HTTP_THREADS", d.http_threads, 2, 4096),
            heartbeat_timeout_s=env.int("GUNICORN_TIMEOUT_S", d.heartbeat_timeout_s, 10),
            graceful_timeout_s=env.int("GATEWAY_GRACEFUL_TIMEOUT_S", d.graceful_timeout_s, 1),
            keepalive_s=env.int("HTTP_KEEPALIVE_S", d.keepalive_s, 1),
        )
