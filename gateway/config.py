"""GatewayConfig: every setting of the gateway, read once from the environment and validated
(docs/configuration.md lists the same variables)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from services.ocr_api.server_settings import ServerSettings
from services.ocr_api.settings import ConfigError, Env

# Searchable-PDF text layer fonts, tried in order (see gateway/outputs/fonts.py)
DEFAULT_PDF_FONTS = ("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
                     "/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc")


ENV_PREFIX = "GATEWAY_"
# Variables with the gateway's prefix that GatewayConfig does not read but are legitimately
# set: read by GatewayServerSettings (gunicorn's side) below. Any other GATEWAY_* is a typo.
OTHER_GATEWAY_VARIABLES = frozenset({"GATEWAY_PROCESSES", "GATEWAY_HTTP_THREADS",
                                     "GATEWAY_GRACEFUL_TIMEOUT_S"})


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
    max_inflight: int = 256
    queue_pages: int = 1000  # pages admitted and not yet done, per gateway process
    queue_bytes: int = 512 * 1024 * 1024  # document bytes held for admitted documents
    replica_target: float = 2.0  # pages a worker holds when it does not say (gateway.fleet)
    retry_budget_ratio: float = 0.2
    retry_budget_min: int = 10
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
    output_memory_mb: int = 512  # one searchable-PDF builder process (gateway/outputs/sandbox)
    output_timeout_s: float = 60.0
    output_processes: int = 2
    answer_memory_mb: int = 8  # finished pages of one answer held in memory, then on disk
    answer_disk_mb: int = 4096  # the most one answer may spool to disk (gateway/outputs/spool)
    jobs: "JobsConfig" = field(default_factory=lambda: JobsConfig())
    cache: "CacheConfig" = field(default_factory=lambda: CacheConfig())

    # Access (see services/flask_common/access.py); secrets never in repr (logs).
    api_keys: tuple[str, ...] = field(default=(), repr=False)  # none: no authentication
    worker_token: str | None = field(default=None, repr=False)  # sent to every worker
    metrics_port: int | None = None  # /metrics on this port only

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
            max_inflight=env.int("GATEWAY_MAX_INFLIGHT", d.max_inflight, 1, 65536),
            queue_pages=env.int("GATEWAY_QUEUE_PAGES", d.queue_pages, 1),
            queue_bytes=env.int("GATEWAY_QUEUE_BYTES", d.queue_bytes, 1024),
            replica_target=env.float("GATEWAY_REPLICA_TARGET", d.replica_target, 1, 1024),
            retry_budget_ratio=env.float("GATEWAY_RETRY_BUDGET_RATIO", d.retry_budget_ratio, 0),
            retry_budget_min=env.int("GATEWAY_RETRY_BUDGET_MIN", d.retry_budget_min, 0),
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
            output_memory_mb=env.int("GATEWAY_OUTPUT_MEMORY_MB", d.output_memory_mb, 64),
            output_timeout_s=env.float("GATEWAY_OUTPUT_TIMEOUT_S", d.output_timeout_s, 1),
            output_processes=env.int("GATEWAY_OUTPUT_PROCESSES", d.output_processes, 1, 64),
            answer_memory_mb=env.int("GATEWAY_ANSWER_MEMORY_MB", d.answer_memory_mb, 1, 4096),
            answer_disk_mb=env.int("GATEWAY_ANSWER_DISK_MB", d.answer_disk_mb, 1),
            api_keys=env.secrets("GATEWAY_API_KEYS", "GATEWAY_API_KEYS_FILE"),
            worker_token=_first(env.secrets("GATEWAY_WORKER_TOKEN",
                                            "GATEWAY_WORKER_TOKEN_FILE")),
            metrics_port=env.int("GATEWAY_METRICS_PORT", None, 1, 65535),
            jobs=JobsConfig.from_env(env=env),
            cache=CacheConfig.from_env(env=env),
        )
        env.check_prefix(ENV_PREFIX, OTHER_GATEWAY_VARIABLES)  # a typo first: it explains more
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


def _first(tokens: tuple[str, ...]) -> str | None:
    """The token the gateway sends: the first. One Secret value "NEW,OLD" serves both sides
    during a rotation (the workers accept every token listed)."""
    return tokens[0] if tokens else None


@dataclass(frozen=True)
class JobsConfig:
    """Async jobs (/jobs, gateway/jobs/): where they are stored, how they are run and limited,
    and how callbacks are sent."""

    enabled: bool = True
    redis_url: str | None = field(default=None, repr=False)  # may hold a password
    db_path: str = "~/.local/state/ocrfleet/gateway-jobs.sqlite3"
    runners: int = 2  # jobs run at once per gateway process
    lease_s: float = 15.0
    timeout_s: float = 86400.0
    result_ttl_s: float = 86400.0
    max_active: int = 10  # per client (API key, else address)
    max_stored_bytes: int = 2 * 1024 ** 3  # per client
    max_wait_s: float = 60.0
    public_url: str | None = None
    callback_secret: str | None = field(default=None, repr=False)  # never in logs
    callback_attempts: int = 8
    callback_backoff_s: float = 2.0
    callback_timeout_s: float = 10.0  # one attempt, whole (connect, send, the answer's head)
    callback_concurrency: int = 4  # attempts under way at once per gateway process
    callback_allow_private: bool = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *,
                 env: Env | None = None) -> "JobsConfig":
        """`env`: the gateway's own Env, so that its prefix check knows these names too."""
        env = env or Env(environ)
        d = cls()
        config = cls(
            enabled=env.bool("GATEWAY_JOBS_ENABLED", d.enabled),
            redis_url=env.optional_str("GATEWAY_REDIS_URL"),
            db_path=env.str("GATEWAY_JOBS_DB", d.db_path),
            runners=env.int("GATEWAY_JOBS_RUNNERS", d.runners, 0, 64),
            lease_s=env.float("GATEWAY_JOBS_LEASE_S", d.lease_s, 1),
            timeout_s=env.float("GATEWAY_JOBS_TIMEOUT_S", d.timeout_s, 1),
            result_ttl_s=env.float("GATEWAY_JOBS_RESULT_TTL_S", d.result_ttl_s, 1),
            max_active=env.int("GATEWAY_JOBS_MAX_ACTIVE", d.max_active, 1),
            max_stored_bytes=env.int("GATEWAY_JOBS_MAX_STORED_BYTES", d.max_stored_bytes, 1024),
            max_wait_s=env.float("GATEWAY_JOBS_MAX_WAIT_S", d.max_wait_s, 0, 3600),
            public_url=env.optional_str("GATEWAY_JOBS_PUBLIC_URL"),
            callback_secret=env.optional_str("GATEWAY_JOBS_CALLBACK_SECRET"),
            callback_attempts=env.int("GATEWAY_JOBS_CALLBACK_ATTEMPTS", d.callback_attempts,
                                      1, 100),
            callback_backoff_s=env.float("GATEWAY_JOBS_CALLBACK_BACKOFF_S",
                                         d.callback_backoff_s, 0.01),
            callback_timeout_s=env.float("GATEWAY_JOBS_CALLBACK_TIMEOUT_S",
                                         d.callback_timeout_s, 0.1),
            callback_concurrency=env.int("GATEWAY_JOBS_CALLBACK_CONCURRENCY",
                                         d.callback_concurrency, 1, 256),
            callback_allow_private=env.bool("GATEWAY_JOBS_CALLBACK_ALLOW_PRIVATE",
                                            d.callback_allow_private),
        )
        config.validate()
        return config

    def validate(self) -> None:
        if self.redis_url and not self.redis_url.startswith(("redis://", "rediss://",
                                                             "unix://")):
            raise ConfigError(f"GATEWAY_REDIS_URL={self.redis_url!r}: expected redis://host:"
                              "port/db, rediss:// (TLS) or unix:///path")
        if self.public_url and not self.public_url.startswith(("http://", "https://")):
            raise ConfigError(f"GATEWAY_JOBS_PUBLIC_URL={self.public_url!r}: expected an "
                              "http:// or https:// URL")
        if self.callback_secret is not None and len(self.callback_secret) < 16:
            raise ConfigError("GATEWAY_JOBS_CALLBACK_SECRET: use at least 16 characters (for "
                              "example `openssl rand -hex 32`)")


@dataclass(frozen=True)
class CacheConfig:
    """The page cache (gateway/cache/, docs/cache.md): off unless enabled; in the jobs'
    Redis (GATEWAY_REDIS_URL) when there is one, else one SQLite file on this machine."""

    enabled: bool = False
    backend: str = "auto"  # auto: redis when GATEWAY_REDIS_URL is set, else disk
    path: str = "~/.local/state/ocrfleet/gateway-cache.sqlite3"
    max_bytes: int = 1024 ** 3
    ttl_s: float = 7 * 86400.0  # an entry unused this long is gone
    inflight_s: float = 120.0  # a page in flight holds its claim at most this long
    global_scope: bool = False  # True: one scope for every API key (docs/cache.md)
    prefix: str = "ocrfleet:cache:"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *,
                 env: Env | None = None) -> "CacheConfig":
        env = env or Env(environ)
        d = cls()
        return cls(
            enabled=env.bool("GATEWAY_CACHE_ENABLED", d.enabled),
            backend=env.choice("GATEWAY_CACHE_BACKEND", d.backend, ("auto", "disk", "redis")),
            path=env.str("GATEWAY_CACHE_PATH", d.path),
            max_bytes=env.int("GATEWAY_CACHE_MAX_BYTES", d.max_bytes, 1024 * 1024),
            ttl_s=env.float("GATEWAY_CACHE_TTL_S", d.ttl_s, 1),
            inflight_s=env.float("GATEWAY_CACHE_INFLIGHT_S", d.inflight_s, 1),
            global_scope=env.bool("GATEWAY_CACHE_GLOBAL_SCOPE", d.global_scope),
            prefix=env.str("GATEWAY_CACHE_PREFIX", d.prefix),
        )


@dataclass(frozen=True)
class GatewayServerSettings(ServerSettings):
    """gunicorn's side of the gateway (read by gunicorn.conf.py): a few processes of many
    threads (it mostly waits on replicas), and long graceful stops for big PDFs."""

    port: int = 8080
    processes: int = 2
    http_threads: int = 64
    graceful_timeout_s: int = 300

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "GatewayServerSettings":
        env = Env(environ)
        d = cls()
        return cls(
            **cls.shared_fields(env),
            graceful_timeout_s=env.int("GATEWAY_GRACEFUL_TIMEOUT_S", d.graceful_timeout_s, 1),
            processes=env.int("GATEWAY_PROCESSES", d.processes, 1, 64),
            http_threads=env.int("GATEWAY_HTTP_THREADS", d.http_threads, 2, 4096),
            # read here too: GatewayConfig cannot be built without an upstream
            metrics_port=env.int("GATEWAY_METRICS_PORT", None, 1, 65535),
        ).checked("GATEWAY_METRICS_PORT")
