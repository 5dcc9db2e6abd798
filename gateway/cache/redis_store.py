"""The page cache of a fleet: the jobs' Redis server (GATEWAY_REDIS_URL; one instance, not
Redis Cluster), its own key prefix, a TTL of idle time, and a byte budget over its own keys
only: every value's size in one hash, their total in one counter, their last use in a sorted
set; a put past the budget evicts the least recently used of these entries, in the same Lua
script, and nothing else on the server is touched.

Keys (prefix `ocrfleet:cache:`): `v:{key}` an entry (PX = the TTL, renewed on use),
`c:{key}` a claim (a page in flight: its holder's token, PX = the claim's TTL), `lru` the
sorted set key -> last use (ms), `sizes` the hash key -> bytes, `bytes` their sum."""

from __future__ import annotations

import time

import redis

PREFIX = "ocrfleet:cache:"

_FORGET = """
local function forget(prefix, key)
  local size = tonumber(redis.call('HGET', prefix .. 'sizes', key) or '0')
  redis.call('HDEL', prefix .. 'sizes', key)
  redis.call('ZREM', prefix .. 'lru', key)
  redis.call('DECRBY', prefix .. 'bytes', size)
  redis.call('DEL', prefix .. 'v:' .. key)
end
"""

# ARGV: prefix, key, value, ttl ms, now ms, max bytes
PUT = _FORGET + """
local prefix, key = ARGV[1], ARGV[2]
local size = string.len(ARGV[3])
local old = tonumber(redis.call('HGET', prefix .. 'sizes', key) or '0')
redis.call('SET', prefix .. 'v:' .. key, ARGV[3], 'PX', ARGV[4])
redis.call('HSET', prefix .. 'sizes', key, size)
redis.call('INCRBY', prefix .. 'bytes', size - old)
redis.call('ZADD', prefix .. 'lru', ARGV[5], key)
local stale = redis.call('ZRANGEBYSCORE', prefix .. 'lru', '-inf',
                         tonumber(ARGV[5]) - tonumber(ARGV[4]), 'LIMIT', 0, 64)
for _, old_key in ipairs(stale) do forget(prefix, old_key) end
local evicted = 0
while tonumber(redis.call('GET', prefix .. 'bytes') or '0') > tonumber(ARGV[6]) do
  local oldest = redis.call('ZRANGE', prefix .. 'lru', 0, 0)
  if #oldest == 0 then break end
  forget(prefix, oldest[1])
  evicted = evicted + 1
end
return evicted
"""

# ARGV: prefix, key, ttl ms, now ms
GET = """
local value = redis.call('GET', ARGV[1] .. 'v:' .. ARGV[2])
if value then
  redis.call('PEXPIRE', ARGV[1] .. 'v:' .. ARGV[2], ARGV[3])
  redis.call('ZADD', ARGV[1] .. 'lru', 'XX', ARGV[4], ARGV[2])
end
return value
"""

RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisCacheStore:
    def __init__(self, url: str, max_bytes: int, ttl_s: float, prefix: str = PREFIX,
                 clock=time.time):
        self.redis = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=2,
                                          health_check_interval=30)
        self.prefix = prefix
        self.max_bytes = max_bytes
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.clock = clock
        self._put = self.redis.register_script(PUT)
        self._get = self.redis.register_script(GET)
        self._release = self.redis.register_script(RELEASE)

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def get(self, key: str) -> bytes | None:
        return self._get(args=[self.prefix, key, self.ttl_ms, self._now_ms()])

    def put(self, key: str, value: bytes) -> None:
        if len(value) > self.max_bytes // 4:
            return
        self._put(args=[self.prefix, key, value, self.ttl_ms, self._now_ms(), self.max_bytes])

    def claim(self, key: str, token: str, ttl_s: float) -> bool:
        return bool(self.redis.set(f"{self.prefix}c:{key}", token, nx=True,
                                   px=max(1, int(ttl_s * 1000))))

    def release(self, key: str, token: str) -> None:
        self._release(keys=[f"{self.prefix}c:{key}"], args=[token])

    def claimed(self, key: str) -> bool:
        return bool(self.redis.exists(f"{self.prefix}c:{key}"))

    def size_bytes(self) -> int:
        return int(self.redis.get(f"{self.prefix}bytes") or 0)

    def close(self) -> None:
        self.redis.close()
