"""The job store of a fleet: Redis (one instance, or a primary with replicas; not Redis
Cluster). Each change that must be atomic is one Lua script, so two gateways can never both
take a job, and a gateway whose lease was taken over can no longer write to it.

Keys (prefix `ocrfleet:jobs:`): `job:{id}` a hash of the job's fields; `doc:{id}` the
document; `pages:{id}` a hash page index -> page JSON; `failed:{id}` the failed pages'
errors; `queue` a sorted set of due times (new jobs, lease expiries, callback retries);
`expiry` a sorted set of expiry times; `client:{client}` a hash of that client's unfinished
jobs and stored bytes (the limits)."""

from __future__ import annotations

import json
import secrets
import time
from typing import Iterator

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .model import ACTIVE_STATES, Job, StoredPage
from .store import Claim, Limits, Usage, check_limits

PREFIX = "ocrfleet:jobs:"
PAGE_BATCH = 32
ORPHAN_DOCUMENT_S = 3600  # a document whose job was never created (crash in between)
RUNNER_TIMEOUT_S = 30.0  # a runner's call waits out a stalled Redis: nobody waits on it
REQUEST_TIMEOUT_S = 2.0  # a request's call fails this soon, tried once: a 503 at once

_LEASE_IS_MINE = """
if redis.call('HGET', KEYS[1], 'lease_token') ~= ARGV[1] then return 0 end
"""
_ACTIVE = """
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'queued' and state ~= 'running' then return 0 end
"""

CREATE = """
local active = tonumber(redis.call('HGET', KEYS[3], 'active') or '0')
local stored = tonumber(redis.call('HGET', KEYS[3], 'bytes') or '0')
if active + 1 > tonumber(ARGV[1]) or stored + tonumber(ARGV[3]) > tonumber(ARGV[2]) then
  return {active, stored}
end
redis.call('PERSIST', KEYS[2])
redis.call('HSET', KEYS[1], unpack(ARGV, 6))
redis.call('HINCRBY', KEYS[3], 'active', 1)
redis.call('HINCRBY', KEYS[3], 'bytes', ARGV[3])
redis.call('ZADD', KEYS[4], ARGV[5], ARGV[4])
return 1
"""

TAKE = """
local due = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not due or tonumber(due) > tonumber(ARGV[2]) then return 0 end
local state = redis.call('HGET', KEYS[1], 'state')
if state == 'queued' then
  redis.call('HSET', KEYS[1], 'state', 'running', 'started', ARGV[2])
elseif state ~= 'running' and not ((state == 'succeeded' or state == 'failed')
    and redis.call('HGET', KEYS[1], 'callback_state') == 'pending') then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return 0
end
redis.call('HSET', KEYS[1], 'lease_owner', ARGV[4], 'lease_token', ARGV[5],
           'lease_until', ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
return 1
"""

RENEW = _LEASE_IS_MINE + """
redis.call('HSET', KEYS[1], 'lease_until', ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
return 1
"""

RELEASE = _LEASE_IS_MINE + """
redis.call('HSET', KEYS[1], 'lease_token', '', 'lease_until', 0)
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
return 1
"""

PUT_PAGE = _LEASE_IS_MINE + _ACTIVE + """
if redis.call('HSETNX', KEYS[2], ARGV[2], ARGV[3]) == 1 then
  redis.call('HINCRBY', KEYS[1], 'pages_done', 1)
  redis.call('HINCRBY', KEYS[1], 'stored_bytes', ARGV[5])
  redis.call('HINCRBY', KEYS[4], 'bytes', ARGV[5])
  if ARGV[6] == '1' then
    redis.call('HINCRBY', KEYS[1], 'pages_cached', 1)
  end
  if ARGV[4] ~= '' then
    redis.call('HSET', KEYS[3], ARGV[2], ARGV[4])
    redis.call('HINCRBY', KEYS[1], 'pages_failed', 1)
  end
end
return 1
"""

FINISH = _LEASE_IS_MINE + _ACTIVE + """
redis.call('HSET', KEYS[1], 'state', ARGV[3], 'error_code', ARGV[4], 'error_msg', ARGV[5],
           'finished', ARGV[6], 'expires_at', ARGV[7], 'lease_token', '', 'lease_until', 0)
redis.call('HINCRBY', KEYS[4], 'active', -1)
redis.call('ZADD', KEYS[3], ARGV[7], ARGV[2])
if ARGV[8] == '1' then
  redis.call('HSET', KEYS[1], 'callback_state', 'pending')
  redis.call('ZADD', KEYS[2], ARGV[6], ARGV[2])
else
  redis.call('ZREM', KEYS[2], ARGV[2])
end
return 1
"""

CALLBACK_DONE = _LEASE_IS_MINE + """
redis.call('HSET', KEYS[1], 'callback_state', ARGV[3], 'callback_attempts', ARGV[4],
           'lease_token', '', 'lease_until', 0)
if ARGV[3] == 'pending' then
  redis.call('ZADD', KEYS[2], ARGV[5], ARGV[2])
else
  redis.call('ZREM', KEYS[2], ARGV[2])
end
return 1
"""

CANCEL = _ACTIVE + """
local stored = tonumber(redis.call('HGET', KEYS[1], 'stored_bytes') or '0')
redis.call('HSET', KEYS[1], 'state', 'cancelled', 'finished', ARGV[2], 'expires_at', ARGV[3],
           'lease_token', '', 'lease_until', 0, 'stored_bytes', 0)
redis.call('HINCRBY', KEYS[4], 'active', -1)
redis.call('HINCRBY', KEYS[4], 'bytes', 0 - stored)
redis.call('DEL', KEYS[5], KEYS[6], KEYS[7])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
return 1
"""

DELETE = """
local state = redis.call('HGET', KEYS[1], 'state')
local found = 0
if state then
  found = 1
  if state == 'queued' or state == 'running' then redis.call('HINCRBY', KEYS[4], 'active', -1) end
  local stored = tonumber(redis.call('HGET', KEYS[1], 'stored_bytes') or '0')
  redis.call('HINCRBY', KEYS[4], 'bytes', 0 - stored)
  local usage = redis.call('HMGET', KEYS[4], 'active', 'bytes')
  if tonumber(usage[1]) <= 0 and tonumber(usage[2]) <= 0 then redis.call('DEL', KEYS[4]) end
end
redis.call('DEL', KEYS[1], KEYS[5], KEYS[6], KEYS[7])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
return found
"""


class RedisJobStore:
    def __init__(self, url: str, prefix: str = PREFIX, timeout_s: float = RUNNER_TIMEOUT_S,
                 retries: int | None = None):
        """`timeout_s` bounds each connect and each read of an answer; `retries`: attempts
        after a connection error or timeout (None: redis-py's default)."""
        retry = {} if retries is None else {"retry": Retry(NoBackoff(), retries)}
        self.redis = redis.Redis.from_url(url, socket_timeout=timeout_s,
                                          socket_connect_timeout=min(5.0, timeout_s),
                                          health_check_interval=30, **retry)
        self.prefix = prefix
        self.queue, self.expiry = prefix + "queue", prefix + "expiry"
        self._scripts = {name: self.redis.register_script(source) for name, source in {
            "create": CREATE, "take": TAKE, "renew": RENEW, "release": RELEASE,
            "put_page": PUT_PAGE, "finish": FINISH, "callback_done": CALLBACK_DONE,
            "cancel": CANCEL, "delete": DELETE}.items()}

    @classmethod
    def for_requests(cls, url: str, prefix: str = PREFIX) -> "RedisJobStore":
        """The store as the /jobs routes read it, on a client of its own: each call answers
        within REQUEST_TIMEOUT_S or fails, tried once, so a stalled Redis (paused, failing
        over, its network cut) is a 503 at once and not a request held past its client's
        timeout. The runners keep the patient client: their calls go on once it is back."""
        return cls(url, prefix, REQUEST_TIMEOUT_S, retries=0)

    def ping(self) -> None:
        self.redis.ping()

    def _key(self, kind: str, name: str) -> str:
        return f"{self.prefix}{kind}:{name}"

    def _run(self, script: str, keys: list[str], args: list) -> int:
        return self._scripts[script](keys=keys, args=args)

    def _all_keys(self, job_id: str, client: str) -> list[str]:
        """KEYS of the scripts that remove data: job, queue, expiry, client, doc, pages,
        failed."""
        return [self._key("job", job_id), self.queue, self.expiry, self._key("client", client),
                self._key("doc", job_id), self._key("pages", job_id),
                self._key("failed", job_id)]

    # ---- jobs --------------------------------------------------------------------------------
    def create(self, job: Job, document: bytes, limits: Limits) -> None:
        job.stored_bytes = len(document)
        doc_key = self._key("doc", job.id)
        self.redis.set(doc_key, document, ex=ORPHAN_DOCUMENT_S)
        pairs = [item for name, value in job.to_row().items() for item in (name, value)]
        answer = self._run("create", [self._key("job", job.id), doc_key,
                                      self._key("client", job.client), self.queue],
                           [limits.max_active, limits.max_stored_bytes, len(document), job.id,
                            job.created, *pairs])
        if answer != 1:  # [active, stored]: one of the limits is reached
            self.redis.delete(doc_key)
            check_limits(Usage(int(answer[0]), int(answer[1])), len(document), limits)

    def get(self, job_id: str, now: float | None = None) -> Job | None:
        row = self.redis.hgetall(self._key("job", job_id))
        if not row:
            return None
        job = Job.from_row({key.decode(): value for key, value in row.items()})
        if job.expires_at and job.expires_at <= (time.time() if now is None else now):
            return None
        return job

    def document(self, job_id: str) -> bytes | None:
        return self.redis.get(self._key("doc", job_id))

    def usage(self, client: str) -> Usage:
        active, stored = self.redis.hmget(self._key("client", client), "active", "bytes")
        return Usage(int(active or 0), int(stored or 0))

    # ---- leases ------------------------------------------------------------------------------
    def claim(self, owner: str, lease_s: float, now: float | None = None) -> Claim | None:
        now = time.time() if now is None else now
        for raw_id in self.redis.zrangebyscore(self.queue, "-inf", now, start=0, num=16):
            job_id = raw_id.decode()
            token = secrets.token_hex(16)
            if self._run("take", [self._key("job", job_id), self.queue],
                         [job_id, now, now + lease_s, owner, token]) == 1:
                job = self.get(job_id, now)
                if job is not None:
                    return Claim(job, token)
        return None

    def renew(self, job_id: str, token: str, lease_s: float, now: float | None = None) -> bool:
        until = (time.time() if now is None else now) + lease_s
        return self._run("renew", [self._key("job", job_id), self.queue],
                         [token, until, job_id]) == 1

    def release(self, job_id: str, token: str, retry_at: float) -> bool:
        return self._run("release", [self._key("job", job_id), self.queue],
                         [token, retry_at, job_id]) == 1

    # ---- pages -------------------------------------------------------------------------------
    def put_page(self, job_id: str, token: str, page: StoredPage, client: str) -> bool:
        failure = page.failure() if page.failed else ""
        return self._run("put_page", [self._key("job", job_id), self._key("pages", job_id),
                                      self._key("failed", job_id), self._key("client", client)],
                         [token, page.index, page.data, failure, page.size,
                          "1" if page.cached else "0"]) == 1

    def done_indices(self, job_id: str) -> set[int]:
        return {int(key) for key in self.redis.hkeys(self._key("pages", job_id))}

    def pages(self, job_id: str) -> Iterator[StoredPage]:
        key = self._key("pages", job_id)
        indices = sorted(self.done_indices(job_id))
        for start in range(0, len(indices), PAGE_BATCH):
            batch = indices[start:start + PAGE_BATCH]
            for index, data in zip(batch, self.redis.hmget(key, batch)):
                if data is not None:
                    yield StoredPage(index, data.decode())

    def failed_pages(self, job_id: str) -> list[dict]:
        found = self.redis.hgetall(self._key("failed", job_id))
        return [json.loads(found[key]) for key in sorted(found, key=int)]

    # ---- ends --------------------------------------------------------------------------------
    def finish(self, job_id: str, token: str, state: str, error_code: int, error_msg: str,
               expires_at: float, callback_due: bool, client: str,
               now: float | None = None) -> bool:
        now = time.time() if now is None else now
        return self._run("finish", [self._key("job", job_id), self.queue, self.expiry,
                                    self._key("client", client)],
                         [token, job_id, state, error_code, error_msg, now, expires_at,
                          "1" if callback_due else "0"]) == 1

    def callback_done(self, job_id: str, token: str, state: str, attempts: int,
                      next_at: float) -> bool:
        return self._run("callback_done", [self._key("job", job_id), self.queue],
                         [token, job_id, state, attempts, next_at]) == 1

    def cancel(self, job_id: str, expires_at: float, now: float | None = None) -> Job | None:
        job = self.get(job_id, now)
        if job is None or job.state not in ACTIVE_STATES:
            return job
        self._run("cancel", self._all_keys(job_id, job.client),
                  [job_id, time.time() if now is None else now, expires_at])
        return job

    def delete(self, job_id: str) -> bool:
        client = self.redis.hget(self._key("job", job_id), "client")
        return self._run("delete", self._all_keys(job_id, (client or b"").decode()),
                         [job_id]) == 1

    def purge_expired(self, now: float | None = None) -> int:
        now = time.time() if now is None else now
        expired = self.redis.zrangebyscore(self.expiry, "-inf", now, start=0, num=100)
        for raw_id in expired:
            self.delete(raw_id.decode())
        return len(expired)

    def close(self) -> None:
        self.redis.close()
