"""The page cache of a fleet in Redis (one instance, not Redis Cluster): its own server
(GATEWAY_CACHE_REDIS_URL, recommended) or the jobs' (GATEWAY_REDIS_URL), its own key prefix,
a TTL of idle time on every key it writes, and a byte budget over its own keys only: every
value's size in one hash, their total in one counter, their last use in a sorted set; a put
past the budget evicts the least recently used of these entries, in the same Lua script, and
nothing else on the server is touched.

The server's memory comes first: jobs must never be refused because the cache filled it. The
cache writes only while the server's used memory is under `max_fill` of its maxmemory, and
above that each put (or a look every second) gives back its own least recently used entries
until it is under again, so the cache never holds the memory the jobs need (docs/cache.md).

Keys (prefix `ocrfleet:cache:`): `v:{key}` an entry (PX = the TTL, renewed on use),
`c:{key}` a claim (a page in flight: its holder's token, PX = the claim's TTL), `lru` the
sorted set key -> last use (ms), `sizes` the hash key -> bytes, `bytes` their sum (these three
renewed to the TTL on every put). Under an evicting maxmemory-policy Redis may drop any of
them: a dropped entry is a miss, and a dropped `bytes` or `sizes` is rebuilt from the other."""

from __future__ import annotations

import logging
import threading
import time

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

log = logging.getLogger("gateway.cache")

PREFIX = "ocrfleet:cache:"
MEMORY_LOOK_S = 1.0  # how often the server's memory is read

# Entries are forgotten with commands a full server still allows (HDEL, ZREM, DEL): the
# cache gives memory back to the jobs also when they have filled the server. The counter's
# DECRBY is refused then: the counter is dropped instead, and rebuilt by the next put.
_FORGET = """
local function held(prefix)
  local raw = redis.call('GET', prefix .. 'bytes')
  if raw and redis.call('EXISTS', prefix .. 'sizes') == 1 then return tonumber(raw) end
  local total = 0
  for _, size in ipairs(redis.call('HVALS', prefix .. 'sizes')) do
    total = total + tonumber(size)
  end
  redis.pcall('SET', prefix .. 'bytes', total)
  return total
end
local function forget(prefix, key)
  local size = tonumber(redis.call('HGET', prefix .. 'sizes', key) or '0')
  redis.call('HDEL', prefix .. 'sizes', key)
  redis.call('ZREM', prefix .. 'lru', key)
  redis.call('DEL', prefix .. 'v:' .. key)
  if redis.call('EXISTS', prefix .. 'bytes') == 1 and
      type(redis.pcall('DECRBY', prefix .. 'bytes', size)) == 'table' then
    redis.call('DEL', prefix .. 'bytes')
  end
  return size
end
local function evict(prefix, limit)
  local total, evicted = held(prefix), 0
  while total > limit do
    local oldest = redis.call('ZRANGE', prefix .. 'lru', 0, 0)
    if #oldest == 0 then break end
    total = total - forget(prefix, oldest[1])
    evicted = evicted + 1
  end
  return evicted
end
"""

# ARGV: prefix, key, value, ttl ms, now ms, the most bytes the cache may hold (its budget,
# or less where the server's memory says so); an empty key only trims to that
PUT = _FORGET + """
local prefix, key, value = ARGV[1], ARGV[2], ARGV[3]
local ttl, now = tonumber(ARGV[4]), tonumber(ARGV[5])
local limit = tonumber(ARGV[6])
local stale = redis.call('ZRANGEBYSCORE', prefix .. 'lru', '-inf', now - ttl, 'LIMIT', 0, 64)
for _, old_key in ipairs(stale) do forget(prefix, old_key) end
local size = string.len(value)
local kept = key ~= '' and size <= limit
if kept then forget(prefix, key) end
local evicted = evict(prefix, limit - (kept and size or 0))
if kept then
  redis.call('SET', prefix .. 'v:' .. key, value, 'PX', ttl)
  redis.call('HSET', prefix .. 'sizes', key, size)
  if redis.call('EXISTS', prefix .. 'bytes') == 1 then
    redis.call('INCRBY', prefix .. 'bytes', size)
  end
  redis.call('ZADD', prefix .. 'lru', now, key)
end
for _, name in ipairs({'lru', 'sizes', 'bytes'}) do
  redis.call('PEXPIRE', prefix .. name, ttl)
end
return evicted
"""

# ARGV: prefix
SIZE = _FORGET + """
return held(ARGV[1])
"""

# ARGV: prefix, key, ttl ms, now ms
GET = """
local value = redis.call('GET', ARGV[1] .. 'v:' .. ARGV[2])
if value then
  redis.call('PEXPIRE', ARGV[1] .. 'v:' .. ARGV[2], ARGV[3])
  redis.pcall('ZADD', ARGV[1] .. 'lru', 'XX', ARGV[4], ARGV[2])  -- refused when full
end
return value
"""

RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisCacheStore:
    """Every call one round trip (two for a put, a second apart: the server's memory), each
    given up after `timeout_s`, never retried (gateway.cache.guard skips a store that fails).
    `max_fill`: the share of the server's maxmemory the cache may fill up to (1: no mark)."""

    def __init__(self, url: str, max_bytes: int, ttl_s: float, prefix: str = PREFIX,
                 clock=time.time, timeout_s: float = 0.5, max_fill: float = 0.8):
        self.redis = redis.Redis.from_url(url, socket_timeout=timeout_s,
                                          socket_connect_timeout=timeout_s,
                                          retry=Retry(NoBackoff(), 0),
                                          health_check_interval=30)
        self.prefix = prefix
        self.max_bytes = max_bytes
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.clock = clock
        self.max_fill = max_fill
        self._put = self.redis.register_script(PUT)
        self._get = self.redis.register_script(GET)
        self._release = self.redis.register_script(RELEASE)
        self._size = self.redis.register_script(SIZE)
        self._cap = max_bytes  # what the cache may hold now: its budget or less
        self._cap_at = float("-inf")
        self._room = 0  # the room under the fill mark at that reading
        self._put_since = 0  # bytes this process has put since
        self._cap_lock = threading.Lock()

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def cap(self) -> int:
        """The most bytes the cache may hold now: its budget, or less where that would take
        the server past `max_fill` of its maxmemory (the cache's bytes then, plus the room
        left, less when past the mark). Read at most every MEMORY_LOOK_S; a cap under what
        the cache holds trims it at once. Read again sooner once this process has put a
        quarter of the room there was (an entry takes more memory than its bytes)."""
        now = time.monotonic()
        with self._cap_lock:
            if now - self._cap_at < MEMORY_LOOK_S and self._put_since * 4 <= self._room:
                return self._cap
            self._cap_at, self._put_since = now, 0
        cap, self._room = self._read_cap()
        self._cap = cap
        if cap < self.max_bytes:
            self._put(args=[self.prefix, "", b"", self.ttl_ms, self._now_ms(), cap])
        return cap

    def _read_cap(self) -> tuple[int, int]:
        """(the cap, the room under the fill mark)."""
        unbounded = (self.max_bytes, self.max_bytes)
        if self.max_fill >= 1:
            return unbounded
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.info("memory")
            pipe.get(f"{self.prefix}bytes")
            memory, held = pipe.execute()
        except redis.ResponseError as exc:  # INFO not allowed to this user: no mark
            log.warning("page cache: the Redis server's memory cannot be read (%s): the "
                        "cache is bounded by its byte budget alone", exc)
            self.max_fill = 1.0
            return unbounded
        maxmemory = int(memory.get("maxmemory") or 0)
        if not maxmemory:
            return unbounded
        used = int(memory["used_memory"]) - int(memory.get("mem_not_counted_for_evict") or 0)
        room = int(maxmemory * self.max_fill) - used  # (as Redis counts: AOF buffers aside)
        return max(0, min(self.max_bytes, int(held or 0) + room)), room

    def get(self, key: str) -> bytes | None:
        self.cap()
        return self._get(args=[self.prefix, key, self.ttl_ms, self._now_ms()])

    def put(self, key: str, value: bytes) -> None:
        if len(value) > self.max_bytes // 4:
            return
        self._put(args=[self.prefix, key, value, self.ttl_ms, self._now_ms(), self.cap()])
        with self._cap_lock:
            self._put_since += len(value)

    def claim(self, key: str, token: str, ttl_s: float) -> bool:
        return bool(self.redis.set(f"{self.prefix}c:{key}", token, nx=True,
                                   px=max(1, int(ttl_s * 1000))))

    def release(self, key: str, token: str) -> None:
        self._release(keys=[f"{self.prefix}c:{key}"], args=[token])

    def claimed(self, key: str) -> bool:
        return bool(self.redis.exists(f"{self.prefix}c:{key}"))

    def size_bytes(self) -> int:
        return int(self._size(args=[self.prefix]))

    def ping(self) -> None:
        """PING, and a look at the server's memory now (trimming the cache when past its
        mark: a store marked down because the jobs filled the server gives memory back)."""
        self.redis.ping()
        with self._cap_lock:
            self._cap_at = float("-inf")
        self.cap()

    def close(self) -> None:
        self.redis.close()
