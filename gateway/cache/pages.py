"""The page cache as the scheduler sees it: one document's `DocumentCache` looks up each
chunk once it is cut (`lookup`), and the chunk's `Entry` then says what happens to it:

- a hit: the stored answer, and nothing is sent;
- own: nobody has it and nobody is reading it now; this document claims it (in flight),
  sends it, stores the answer (`Entry.finish`) and lets go of the claim (`Entry.release`);
- wait: another document, here or in another gateway process, is reading the same page: the
  `Waiters` thread watches the entry and calls back with the answer, or, when the claim is
  let go without one (that attempt failed) or lapses, or the document's deadline nears, with
  the page to send after all (one waiter takes the claim over; nobody waits forever);
- send: read through (no engine identity known yet, a mixed fleet, `Cache-Control`, or the
  store is down).

Nothing here ever fails or holds up a page: a store that fails or answers slowly is skipped
until it answers again (gateway.cache.guard), and its pages are read through.
Keys: gateway.cache.key. Storage: gateway.cache.store (SQLite), .redis_store (Redis)."""

from __future__ import annotations

import collections
import json
import logging
import secrets
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Any, Callable

from .. import metrics
from . import key as keys
from .guard import StoreGuard
from .store import CacheStore

log = logging.getLogger("gateway.cache")

GLOBAL_SCOPE = "global"
ONE_SCOPE = "gateway"  # no API keys: the whole gateway is one scope
ENGINE_WINDOW_S = 60.0  # an engine identity seen this recently is still in the fleet
STORE_TIMEOUT_S = 0.5  # a store call that takes longer marks the store down


@dataclass(frozen=True)
class Policy:
    """One request's use of the cache: whose entries (scope), whether it may be answered
    from the cache (read) and whether its answers may be kept (write)."""

    scope: str
    read: bool = True
    write: bool = True

    @property
    def used(self) -> bool:
        return self.read or self.write


def policy_for(client: str | None, cache_control: str | None, global_scope: bool) -> Policy:
    """`client`: "key:<hash>" for a request with an API key (gateway.jobs.api's
    client_identity), anything else for none. `Cache-Control: no-cache` reads nothing from
    the cache, `no-store` also keeps the answer out of it."""
    directives = {part.strip().lower().split("=")[0]
                  for part in (cache_control or "").split(",")}
    no_store = "no-store" in directives
    no_cache = no_store or "no-cache" in directives
    if global_scope:
        scope = GLOBAL_SCOPE
    elif client and client.startswith("key:"):
        scope = client
    else:
        scope = ONE_SCOPE
    return Policy(scope, read=not no_cache, write=not no_store)


class EngineView:
    """Which engine the fleet runs, as replicas say (`X-Ocr-Engine` on every /ocr and
    /readyz answer): one identity when every replica heard from in the last `window_s` says
    the same, else None (a rollout under way, or nothing heard yet): then nothing is read
    from the cache, since the replica that would answer is not known. What is stored is
    always keyed by the identity of the replica that answered.

    Replicas are probed every few seconds, so one not heard from for `window_s` has left
    (a pod replaced in a rollout, its address gone from DNS) or is not ready: it and what it
    said are forgotten, and the identities of the replicas there now decide alone."""

    def __init__(self, window_s: float = ENGINE_WINDOW_S, clock=time.monotonic):
        self.window_s = window_s
        self.clock = clock
        self._seen: dict[str, dict[str | None, float]] = {}
        self._lock = threading.Lock()
        self._pruned = clock()

    def observe(self, url: str, identity: str | None) -> None:
        now = self.clock()
        with self._lock:
            self._seen.setdefault(url, {})[identity] = now
            if now - self._pruned >= 1.0:  # replicas that left, now and then (pod churn)
                self._prune(now)

    def forget(self, url: str) -> None:
        with self._lock:
            self._seen.pop(url, None)

    def current(self) -> str | None:
        with self._lock:
            self._prune(self.clock())
            identities = {identity for seen in self._seen.values() for identity in seen}
        if len(identities) == 1:
            return next(iter(identities))  # None when replicas do not say
        return None

    def _prune(self, now: float) -> None:
        """Forget what was said `window_s` ago or longer, and replicas with nothing newer."""
        self._pruned = now
        for url, seen in list(self._seen.items()):
            for identity, at in list(seen.items()):
                if now - at >= self.window_s:
                    del seen[identity]
            if not seen:
                del self._seen[url]


def encode(result: dict[str, Any]) -> bytes:
    return zlib.compress(json.dumps(result, separators=(",", ":")).encode(), 1)


def decode(value: bytes) -> dict[str, Any] | None:
    try:
        result = json.loads(zlib.decompress(value))
    except (ValueError, zlib.error):
        return None
    return result if isinstance(result, dict) else None


class PageCache:
    """The gateway process's cache: a store, the fleet's engine identity, the waiters."""

    def __init__(self, store: CacheStore, *, inflight_s: float = 120.0,
                 global_scope: bool = False, poll_s: float = 0.05,
                 timeout_s: float = STORE_TIMEOUT_S, engine_window_s: float = ENGINE_WINDOW_S):
        self.store = store
        self.inflight_s = inflight_s
        self.global_scope = global_scope
        self.engines = EngineView(engine_window_s)
        self.guard = StoreGuard(store, timeout_s, back=self._let_go_held)
        self.waiters = Waiters(self, poll_s)
        self._puts = 0
        # claims this process let go of while the store was down: let go once it is back
        # (else pages others wait on stay claimed until the claims lapse, GATEWAY_CACHE_INFLIGHT_S)
        self._held: collections.deque[tuple[str, str]] = collections.deque(maxlen=10_000)

    @property
    def available(self) -> bool:
        """False while the store is known to be down (its calls are skipped)."""
        return self.guard.up

    def policy(self, client: str | None, cache_control: str | None) -> Policy:
        return policy_for(client, cache_control, self.global_scope)

    def document(self, policy: Policy | None, api_params: dict[str, Any],
                 visualize: bool | None, sent_whole: bool, page_range: str | None,
                 kind: str, endpoint: str = "/ocr") -> "DocumentCache | None":
        if policy is None or not policy.used:
            metrics.CACHE_LOOKUPS.labels("bypass").inc()
            return None
        return DocumentCache(self, policy, api_params, visualize, sent_whole, page_range, kind,
                             endpoint)

    # ---- the store, never failing or holding up a page ---------------------------------------
    def _safely(self, what: str, call: Callable[[], Any], default: Any = None) -> Any:
        return self.guard.call(what, call, default)

    def get(self, key: str) -> dict[str, Any] | None:
        value = self._safely("get", lambda: self.store.get(key))
        return decode(value) if value is not None else None

    def put(self, key: str, result: dict[str, Any]) -> None:
        value = encode(result)
        if self._safely("put", lambda: self.store.put(key, value) or True, False):
            metrics.CACHE_STORED_BYTES.inc(len(value))
            self._puts += 1
            if self._puts % 32 == 1:  # what the store holds, now and then (a sum in SQLite)
                metrics.CACHE_BYTES.set(self.size_bytes())

    def claim(self, key: str, token: str) -> bool | None:
        """True: ours; False: somebody else's; None: the store did not say (read through)."""
        return self._safely("claim", lambda: self.store.claim(key, token, self.inflight_s))

    def release(self, key: str, token: str) -> None:
        if not self._safely("release", lambda: self.store.release(key, token) or True, False):
            self._held.append((key, token))  # the store is down: once it is back
        self.waiters.kick()

    def _let_go_held(self) -> None:
        """The probe's thread, the store back: let go of the claims held meanwhile."""
        while self._held:
            key, token = self._held.popleft()
            self.store.release(key, token)

    def claimed(self, key: str) -> bool:
        return self._safely("claimed", lambda: self.store.claimed(key), False)

    def size_bytes(self) -> int:
        return self._safely("size", self.store.size_bytes, 0)

    def close(self) -> None:
        self.waiters.stop()
        self.guard.close()
        self.store.close()


class DocumentCache:
    """One document's view: its scope and the digest of its parameters (and endpoint), per
    kind sent."""

    def __init__(self, cache: PageCache, policy: Policy, api_params: dict[str, Any],
                 visualize: bool | None, sent_whole: bool, page_range: str | None, kind: str,
                 endpoint: str = "/ocr"):
        self.cache = cache
        self.policy = policy
        self.sent_whole = sent_whole
        self.kind = kind  # what a whole document is sent as; a chunk says its own
        self._params = (api_params, visualize, page_range if sent_whole else None, endpoint)
        self._digests: dict[str, str] = {}
        self.hits = 0  # pages answered from the cache (read by the request's answer)

    def params_digest(self, kind: str) -> str:
        if kind not in self._digests:
            api_params, visualize, page_range, endpoint = self._params
            self._digests[kind] = keys.params_digest(api_params, visualize, page_range, kind,
                                                     endpoint)
        return self._digests[kind]

    def lookup(self, data: bytes, chunk_kind: str) -> "Entry":
        kind = self.kind if self.sent_whole else chunk_kind
        # a whole file is sent as it came: only its own bytes are its content
        content = ("bytes:" + keys.sha256(data)) if self.sent_whole else \
            keys.content_digest(data, kind)
        entry = Entry(self, self.params_digest(kind), content)
        entry.look_up()
        return entry


class Entry:
    """One chunk's place in the cache (task.cache in gateway.flow.queue)."""

    def __init__(self, document: DocumentCache, params: str, content: str):
        self.document = document
        self.cache = document.cache
        self.params = params
        self.content = content
        self.key: str | None = None  # under the fleet's engine identity, when one is known
        self.token: str | None = None  # our claim on `key`, while we hold it
        self.result: dict[str, Any] | None = None  # the stored answer's `result`
        self.waiting = False
        self.done: Callable[[], None] | None = None
        self.give_up_at = 0.0
        self.waited_since = 0.0

    def key_for(self, engine: str) -> str:
        return keys.cache_key(self.document.policy.scope, engine, self.params, self.content)

    def look_up(self) -> None:
        policy = self.document.policy
        engine = self.cache.engines.current()
        if not policy.read or engine is None:
            metrics.CACHE_LOOKUPS.labels("bypass").inc()
            return
        if not self.cache.available:
            metrics.CACHE_LOOKUPS.labels("unavailable").inc()
            return
        self.key = self.key_for(engine)
        self.result = self.cache.get(self.key)
        if self.result is not None:
            metrics.CACHE_LOOKUPS.labels("hit").inc()
            return
        claimed = self._claim()
        if claimed is None:  # the store failed: the page is sent, nobody waits for it
            metrics.CACHE_LOOKUPS.labels("unavailable").inc()
        elif claimed:
            metrics.CACHE_LOOKUPS.labels("miss" if self.result is None else "hit").inc()
        else:
            self.waiting = True  # the page is being read elsewhere: wait for it
            metrics.CACHE_LOOKUPS.labels("dedup_wait").inc()

    def wait(self, deadline: float, done: Callable[[], None]) -> None:
        """Watched by the waiters' thread until `result` is set (a hit) or the page is to be
        sent after all; then `done()` is called (once) from that thread."""
        self.done = done
        self.waited_since = time.monotonic()
        self.give_up_at = min(deadline - 1.0, self.waited_since + self.cache.inflight_s)
        self.cache.waiters.add(self)

    def poll(self, now: float) -> bool:
        """The waiters' thread: True once the wait is over (`result` set, or not)."""
        result = self.cache.get(self.key)
        if result is not None:
            self.result = result
            metrics.CACHE_LOOKUPS.labels("dedup_hit").inc()
            return True
        if not self.cache.available:  # nothing to wait on: sent after all
            metrics.CACHE_TAKEOVERS.labels("unavailable").inc()
            return True
        if self.cache.claimed(self.key):
            if now < self.give_up_at:
                return False
            metrics.CACHE_TAKEOVERS.labels("deadline").inc()
            return True  # sent after all, unclaimed: the holder may still store it
        claimed = self._claim()
        if claimed is None:
            metrics.CACHE_TAKEOVERS.labels("unavailable").inc()
            return True
        if claimed:  # the first attempt failed: we take over (or it was just stored)
            if self.result is None:
                metrics.CACHE_TAKEOVERS.labels("released").inc()
            else:
                metrics.CACHE_LOOKUPS.labels("dedup_hit").inc()
            return True
        return now >= self.give_up_at  # another waiter took it over: wait for it

    def _claim(self) -> bool | None:
        """Claim the key; False when someone else holds it, None when the store did not say
        (never read as somebody else's: nobody waits on a store that failed). A holder
        stores its answer and then lets go, which can fall between our look and our claim:
        so we look once more, and with the answer there, let go again and take it."""
        token = secrets.token_hex(8)
        claimed = self.cache.claim(self.key, token)
        if not claimed:
            return claimed
        self.result = self.cache.get(self.key)
        if self.result is None:
            self.token = token
        else:
            self.cache.release(self.key, token)
        return True

    def finish(self, result: dict[str, Any], engine: str | None, url: str) -> None:
        """The replica at `url` answered this chunk with `result` (engine `engine`): stored
        under that engine's key, when the policy allows and the replica said which."""
        self.cache.engines.observe(url, engine)
        if self.document.policy.write and engine:
            self.cache.put(self.key_for(engine), result)
        self.release()

    def release(self) -> None:
        if self.token is not None and self.key is not None:
            token, self.token = self.token, None
            self.cache.release(self.key, token)


class Waiters:
    """One thread per gateway process watches every entry that waits for a page in flight
    elsewhere: at once when this process lets go of a claim, else every `poll_s` (more
    slowly the more entries wait), each until its own deadline."""

    def __init__(self, cache: PageCache, poll_s: float):
        self.cache = cache
        self.poll_s = poll_s
        self._entries: list[Entry] = []
        self._cond = threading.Condition()
        self._kicked = False
        self._thread: threading.Thread | None = None
        self._stop = False

    def add(self, entry: Entry) -> None:
        with self._cond:
            self._entries.append(entry)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="cache-waiters",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def kick(self) -> None:
        with self._cond:
            if self._entries:
                self._kicked = True
                self._cond.notify_all()

    def waiting(self) -> int:
        with self._cond:
            return len(self._entries)

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._entries and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                if not self._kicked:
                    interval = min(1.0, self.poll_s * (1 + len(self._entries) / 100))
                    self._cond.wait(timeout=interval)
                self._kicked = False
                entries = list(self._entries)
            now = time.monotonic()
            finished = []
            for entry in entries:
                try:
                    over = entry.poll(now)
                except Exception:  # never strand a page: it is sent after all
                    log.exception("watching a page in flight failed")
                    over = True
                if over:
                    finished.append(entry)
            if finished:
                with self._cond:
                    self._entries = [e for e in self._entries if e not in finished]
                for entry in finished:
                    metrics.CACHE_WAIT_SECONDS.observe(now - entry.waited_since)
                    try:
                        entry.done()
                    except Exception:
                        log.exception("handing back a page that waited failed")
