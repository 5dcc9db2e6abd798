"""The content-addressed page cache with in-flight dedup (docs/cache.md): a page's answer is
kept under a key of everything that decides it (gateway.cache.key), in one SQLite file per
machine or in the jobs' Redis for a fleet (gateway.cache.store, .redis_store), and looked up
by the scheduler once a chunk is cut (gateway.cache.pages)."""

from __future__ import annotations

from .pages import DocumentCache, Entry, PageCache, Policy, policy_for
from .store import CacheStore, SqliteCacheStore

__all__ = ["CacheStore", "DocumentCache", "Entry", "PageCache", "Policy", "SqliteCacheStore",
           "build_cache", "policy_for"]


def build_cache(config) -> PageCache | None:
    """The gateway's cache from its CacheConfig (and the jobs' Redis URL), or None when off."""
    cache_config = config.cache
    if not cache_config.enabled:
        return None
    redis_url = config.jobs.redis_url
    if cache_config.backend == "redis" or (cache_config.backend == "auto" and redis_url):
        if not redis_url:
            from services.ocr_api.settings import ConfigError
            raise ConfigError("GATEWAY_CACHE_BACKEND=redis needs GATEWAY_REDIS_URL")
        from .redis_store import RedisCacheStore
        store: CacheStore = RedisCacheStore(redis_url, cache_config.max_bytes,
                                            cache_config.ttl_s, prefix=cache_config.prefix)
    else:
        store = SqliteCacheStore(cache_config.path, cache_config.max_bytes, cache_config.ttl_s)
    return PageCache(store, inflight_s=cache_config.inflight_s,
                     global_scope=cache_config.global_scope)
