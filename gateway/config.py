"""GatewayConfig: every setting of the gateway, gunicorn's side included, each declared once as
a field (variable, default, bounds; services/ocr_api/settings.py reads them all), read once by
gunicorn's master and validated (docs/configuration.md lists the same variables)."""

from __future__ import annotations

from dataclasses import dataclass

from services.ocr_api.server_settings import ServerSettings
from services.ocr_api.settings import ConfigError, Settings, group, setting, shown_url

# Searchable-PDF text layer fonts, tried in order (see gateway/outputs/fonts.py)
DEFAULT_PDF_FONTS = ("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
                     "/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _first(tokens: tuple[str, ...]) -> str | None:
    """The token the gateway sends: the first. One Secret value "NEW,OLD" serves both sides
    during a rotation (the workers accept every token listed)."""
    return tokens[0] if tokens else None


def _without_trailing_slash(urls: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(url.rstrip("/") for url in urls)


@dataclass(frozen=True)
class JobsConfig(Settings):
    """Async jobs (/jobs, gateway/jobs/): where they are stored, how they are run and limited,
    and how callbacks are sent."""

    enabled: bool = setting("GATEWAY_JOBS_ENABLED", True)
    # may hold a password: or from a file (a mounted Secret)
    redis_url: str | None = setting("GATEWAY_REDIS_URL", file="GATEWAY_REDIS_URL_FILE",
                                    single=True)
    db_path: str = setting("GATEWAY_JOBS_DB", "~/.local/state/ocrfleet/gateway-jobs.sqlite3")
    runners: int = setting("GATEWAY_JOBS_RUNNERS", 2, 0, 64)  # jobs at once per process
    lease_s: float = setting("GATEWAY_JOBS_LEASE_S", 15.0, 1)
    timeout_s: float = setting("GATEWAY_JOBS_TIMEOUT_S", 86400.0, 1)
    result_ttl_s: float = setting("GATEWAY_JOBS_RESULT_TTL_S", 86400.0, 1)
    max_active: int = setting("GATEWAY_JOBS_MAX_ACTIVE", 10, 1)  # per client (key, else address)
    max_stored_bytes: int = setting("GATEWAY_JOBS_MAX_STORED_BYTES", 2 * 1024 ** 3, 1024)
    max_wait_s: float = setting("GATEWAY_JOBS_MAX_WAIT_S", 60.0, 0, 3600)
    public_url: str | None = setting("GATEWAY_JOBS_PUBLIC_URL")
    callback_secret: str | None = setting("GATEWAY_JOBS_CALLBACK_SECRET", single=True,
                                          file="GATEWAY_JOBS_CALLBACK_SECRET_FILE")
    callback_attempts: int = setting("GATEWAY_JOBS_CALLBACK_ATTEMPTS", 8, 1, 100)
    callback_backoff_s: float = setting("GATEWAY_JOBS_CALLBACK_BACKOFF_S", 2.0, 0.01)
    # one attempt, whole (connect, send, the answer's head)
    callback_timeout_s: float = setting("GATEWAY_JOBS_CALLBACK_TIMEOUT_S", 10.0, 0.1)
    # attempts under way at once per gateway process
    callback_concurrency: int = setting("GATEWAY_JOBS_CALLBACK_CONCURRENCY", 4, 1, 256)
    callback_allow_private: bool = setting("GATEWAY_JOBS_CALLBACK_ALLOW_PRIVATE", False)

    def validate(self) -> None:
        super().validate()
        if self.redis_url and not self.redis_url.startswith(("redis://", "rediss://",
                                                             "unix://")):
            raise ConfigError(f"GATEWAY_REDIS_URL(_FILE): {shown_url(self.redis_url)}; "
                              "expected redis://host:port/db, rediss:// (TLS) or unix:///path")
        if self.public_url and not self.public_url.startswith(("http://", "https://")):
            raise ConfigError(f"GATEWAY_JOBS_PUBLIC_URL: {shown_url(self.public_url)}; "
                              "expected an http:// or https:// URL")
        if self.callback_secret is not None and len(self.callback_secret) < 16:
            raise ConfigError("GATEWAY_JOBS_CALLBACK_SECRET(_FILE): use at least 16 characters "
                              "(for example `openssl rand -hex 32`)")


@dataclass(frozen=True)
class CacheConfig(Settings):
    """The page cache (gateway/cache/, docs/cache.md): off unless enabled; in the jobs'
    Redis (GATEWAY_REDIS_URL) when there is one, else one SQLite file on this machine."""

    enabled: bool = setting("GATEWAY_CACHE_ENABLED", False)
    # auto: redis when GATEWAY_REDIS_URL is set, else disk
    backend: str = setting("GATEWAY_CACHE_BACKEND", "auto", choices=("auto", "disk", "redis"))
    path: str = setting("GATEWAY_CACHE_PATH", "~/.local/state/ocrfleet/gateway-cache.sqlite3")
    max_bytes: int = setting("GATEWAY_CACHE_MAX_BYTES", 1024 ** 3, 1024 * 1024)
    ttl_s: float = setting("GATEWAY_CACHE_TTL_S", 7 * 86400.0, 1)  # unused this long: gone
    # a page in flight holds its claim at most this long
    inflight_s: float = setting("GATEWAY_CACHE_INFLIGHT_S", 120.0, 1)
    # True: one scope for every API key (docs/cache.md)
    global_scope: bool = setting("GATEWAY_CACHE_GLOBAL_SCOPE", False)
    prefix: str = setting("GATEWAY_CACHE_PREFIX", "ocrfleet:cache:")
    # the cache's own Redis (recommended: a full cache then never refuses a job); may hold a
    # password: or from a file. Unset: the jobs' server (GATEWAY_REDIS_URL)
    redis_url: str | None = setting("GATEWAY_CACHE_REDIS_URL", single=True,
                                    file="GATEWAY_CACHE_REDIS_URL_FILE")
    # the cache writes into a Redis server only below this share of its maxmemory
    redis_max_fill: float = setting("GATEWAY_CACHE_REDIS_MAX_FILL", 0.8, 0.05, 1)
    # a store call slower than this marks the store down: pages are read through meanwhile
    timeout_s: float = setting("GATEWAY_CACHE_TIMEOUT_S", 0.5, 0.01, 10)

    def validate(self) -> None:
        super().validate()
        if self.redis_url and not self.redis_url.startswith(("redis://", "rediss://",
                                                             "unix://")):
            raise ConfigError(f"GATEWAY_CACHE_REDIS_URL(_FILE): {shown_url(self.redis_url)}; "
                              "expected redis://host:port/db, rediss:// (TLS) or unix:///path")


@dataclass(frozen=True)
class GatewayConfig(ServerSettings):
    env_prefix = "GATEWAY_"

    # gunicorn's side (gunicorn.conf.py; HOST and the timeouts in ServerSettings): a few
    # processes of many threads (it mostly waits on replicas), long graceful stops for big PDFs
    port: int = setting("PORT", 8080, 1, 65535)
    processes: int = setting("GATEWAY_PROCESSES", 2, 1, 64)
    http_threads: int = setting("GATEWAY_HTTP_THREADS", 64, 2, 4096)
    graceful_timeout_s: int = setting("GATEWAY_GRACEFUL_TIMEOUT_S", 300, 1)

    # upstreams: exactly one of these three
    upstream_url: str | None = setting("GATEWAY_UPSTREAM_URL")  # one load balancer
    replicas: tuple[str, ...] = setting("GATEWAY_REPLICAS", (),  # a fixed list of worker URLs
                                        convert=_without_trailing_slash)
    # "name:port", re-resolved (a k8s headless Service)
    replica_dns: str | None = setting("GATEWAY_REPLICA_DNS")
    dns_refresh_s: float = setting("GATEWAY_DNS_REFRESH_S", 5.0, 0.1)
    health_interval_s: float = setting("GATEWAY_HEALTH_INTERVAL_S", 2.0, 0.1)
    eject_s: float = setting("GATEWAY_EJECT_S", 10.0, 0)

    pages_per_chunk: int = setting("GATEWAY_PAGES_PER_CHUNK", 1, 1, 1000)
    max_inflight: int = setting("GATEWAY_MAX_INFLIGHT", 256, 1, 65536)
    # pages admitted and not yet done, per gateway process
    queue_pages: int = setting("GATEWAY_QUEUE_PAGES", 1000, 1)
    # the memory budget of requests: bodies being read, documents, answers not yet sent
    queue_bytes: int = setting("GATEWAY_QUEUE_BYTES", 512 * 1024 * 1024, 1024)
    # pages a worker holds when it does not say (gateway.flow.share)
    replica_target: float = setting("GATEWAY_REPLICA_TARGET", 2.0, 1, 1024)
    retry_budget_ratio: float = setting("GATEWAY_RETRY_BUDGET_RATIO", 0.2, 0)
    retry_budget_min: int = setting("GATEWAY_RETRY_BUDGET_MIN", 10, 0)
    page_timeout_s: float = setting("GATEWAY_PAGE_TIMEOUT_S", 300.0, 1)
    request_timeout_s: float = setting("GATEWAY_REQUEST_TIMEOUT_S", 900.0, 1)
    connect_timeout_s: float = setting("GATEWAY_CONNECT_TIMEOUT_S", 2.0, 0.1)
    max_attempts: int = setting("GATEWAY_MAX_ATTEMPTS", 4, 1, 20)
    backoff_s: float = setting("GATEWAY_BACKOFF_S", 0.2, 0)

    max_bytes: int = setting("GATEWAY_MAX_BYTES", 200 * 1024 * 1024, 1024)
    max_pages: int = setting("GATEWAY_MAX_PAGES", 2000, 1)
    allow_url_input: bool = setting("GATEWAY_ALLOW_URL_INPUT", False)
    url_timeout_s: float = setting("GATEWAY_URL_TIMEOUT_S", 20.0, 1)
    log_level: str = setting("GATEWAY_LOG_LEVEL", "INFO", choices=LOG_LEVELS)
    pdf_fonts: tuple[str, ...] = setting("GATEWAY_PDF_FONTS", DEFAULT_PDF_FONTS)
    # one searchable-PDF builder process (gateway/outputs/sandbox)
    output_memory_mb: int = setting("GATEWAY_OUTPUT_MEMORY_MB", 512, 64)
    output_timeout_s: float = setting("GATEWAY_OUTPUT_TIMEOUT_S", 60.0, 1)
    output_processes: int = setting("GATEWAY_OUTPUT_PROCESSES", 2, 1, 64)
    # finished pages of one answer held in memory, then on disk
    answer_memory_mb: int = setting("GATEWAY_ANSWER_MEMORY_MB", 8, 1, 4096)
    # the most one answer may spool to disk (gateway/outputs/spool)
    answer_disk_mb: int = setting("GATEWAY_ANSWER_DISK_MB", 4096, 1)
    # the most all answers of one gateway process may spool to disk at once (pages and ZIPs):
    # times GATEWAY_PROCESSES, within the pod's temporary disk (deploy/k8s: the /tmp emptyDir)
    temp_disk_mb: int = setting("GATEWAY_TEMP_DISK_MB", 3072, 1)
    jobs: JobsConfig = group(JobsConfig)
    cache: CacheConfig = group(CacheConfig)

    # Access (see services/flask_common/access.py); secrets never in repr (logs).
    # none: no authentication
    api_keys: tuple[str, ...] = setting("GATEWAY_API_KEYS", (), file="GATEWAY_API_KEYS_FILE")
    worker_token: str | None = setting("GATEWAY_WORKER_TOKEN", file="GATEWAY_WORKER_TOKEN_FILE",
                                       convert=_first)  # sent to every worker
    # /metrics on this port only (a second bind)
    metrics_port: int | None = setting("GATEWAY_METRICS_PORT", None, 1, 65535)

    def validate(self) -> None:
        super().validate()
        modes = [bool(self.upstream_url), bool(self.replicas), bool(self.replica_dns)]
        if sum(modes) != 1:
            raise ConfigError("set exactly one of GATEWAY_UPSTREAM_URL (one load balancer), "
                              "GATEWAY_REPLICAS (comma-separated worker URLs) or "
                              "GATEWAY_REPLICA_DNS (name:port of a headless Service)")
        if self.replica_dns and ":" not in self.replica_dns:
            raise ConfigError(f"GATEWAY_REPLICA_DNS={self.replica_dns!r}: expected name:port")
        for url in (self.upstream_url, *self.replicas):
            if url and not url.startswith(("http://", "https://")):
                raise ConfigError(f"GATEWAY_UPSTREAM_URL/GATEWAY_REPLICAS: {shown_url(url)}; "
                                  "expected an http:// or https:// URL")
