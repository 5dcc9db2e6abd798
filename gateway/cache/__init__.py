"""The content-addressed page cache with in-flight dedup (docs/cache.md): a page's answer is
kept under a key of everything that decides it (gateway.cache.key), in one SQLite file per
machine or in Redis for a fleet (gateway.cache.store, .redis_store), and looked up by the
scheduler once a chunk is cut (gateway.cache.pages); a store that fails or is slow is skipped
until it answers again (gateway.cache.guard)."""

from __future__ import annotations

import logging

from .pages import ENGINE_WINDOW_S, DocumentCache, Entry, PageCache, Policy, policy_for
from .store import CacheStore, SqliteCacheStore

__all__ = ["CacheStore", "DocumentCache", "Entry", "PageCache", "Policy", "SqliteCacheStore",
           "build_cache", "policy_for"]

log = logging.getLogger("gateway.cache")
ENGINE_PROBES = 5  # a replica not heard from in this many health checks has left


def build_cache(config) -> PageCache | None:
    """The gateway's cache from its CacheConfig (and the jobs' Redis URL), or None when off."""
    cache_config = config.cache
    if not cache_config.enabled:
        return None
    redis_url = cache_config.redis_url or config.jobs.redis_url
    if cache_config.backend == "redis" or (cache_config.backend == "auto" and redis_url):
        if not redis_url:
            from services.ocr_api.settings import ConfigError
            raise ConfigError("GATEWAY_CACHE_BACKEND=redis needs GATEWAY_CACHE_REDIS_URL or "
                              "GATEWAY_REDIS_URL")
        if not cache_config.redis_url:
            log.info("page cache: in the jobs' Redis, filling it to %g of its maxmemory at "
                     "most (GATEWAY_CACHE_REDIS_URL gives the cache a server of its own)",
                     cache_config.redis_max_fill)
        from .redis_store import RedisCacheStore
        store: CacheStore = RedisCacheStore(redis_url, cache_config.max_bytes,
                                            cache_config.ttl_s, prefix=cache_config.prefix,
                                            timeout_s=cache_config.timeout_s,
                                            max_fill=cache_config.redis_max_fill)
    else:
        store = SqliteCacheStore(cache_config.path, cache_config.max_bytes, cache_config.ttl_s,
                                 timeout_s=cache_config.timeout_s)
    window_s = max(ENGINE_WINDOW_S, ENGINE_PROBES * config.health_interval_s)
    return PageCache(store, inflight_s=cache_config.inflight_s,
                     global_scope=cache_config.global_scope, timeout_s=cache_config.timeout_s,
                     engine_window_s=window_s)
