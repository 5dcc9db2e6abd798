"""Which replica gets the next page, and how many pages each may have outstanding.

The replica set is one load-balancer URL (nginx, a ClusterIP Service), a fixed list of worker
URLs, or a DNS name re-resolved periodically (a k8s headless Service). Each replica has an
adaptive limit on the pages this gateway process keeps outstanding on it:

- it grows (by 1/limit per answer, so by about one per round trip) while the worker behind it
  reports spare room under `target` admitted requests (`X-Ocr-Capacity` / `X-Ocr-Free` on
  every answer), or, for a worker that reports nothing, on every answer;
- it holds once the worker has about `target` requests admitted, and shrinks by one step when
  it has more (other gateway processes share it);
- it halves on a 503/429 (busy: backpressure, never a failure) and the replica gets a short,
  growing pause; a busy answer never ejects.

So a replica is kept just busy (a page running and one waiting), and everything beyond that
waits in the gateway's fair queue, where a 1-page request can overtake a 300-page one.
Behind one load balancer the same limit becomes the fleet-wide limit: it grows until the
workers report that they are full, so `kubectl scale` shows up as room without configuration.

Only connection errors and timeouts eject a replica (not in load-balancer mode: nginx does its
own passive health checks). An ejected replica is on probation: after `eject_s` it gets one
trial page at a time, and only a real answer ends probation; a readiness probe alone does not
re-admit a replica that timed out. Thread-safe; the network calls (probe, resolve) and the
clock are injected so all of this is tested without a network."""

from __future__ import annotations

import itertools
import logging
import random
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable

from .outcome import Outcome

log = logging.getLogger("gateway.upstreams")

MODE_LOAD_BALANCER = "load_balancer"
MODE_LIST = "list"
MODE_DNS = "dns"


class NoReplicas(RuntimeError):
    """No replica is known at all (DNS returned nothing, or the list is empty)."""


@dataclass(frozen=True)
class LimitSettings:
    target: int = 2          # requests admitted at one worker that keep it busy
    max_limit: int = 64      # ceiling of one replica's limit (a load balancer's: the fleet's)
    busy_pause_s: float = 0.05  # first pause after a busy answer; doubles, capped at 1 s


@dataclass
class Replica:
    url: str
    limit: float = 2.0
    max_limit: int = 64
    inflight: int = 0
    ready: bool | None = None  # None: not probed yet
    ejected_until: float = 0.0
    probation: bool = False  # one trial page at a time until a real answer comes back
    busy_until: float = 0.0
    busy_streak: int = 0
    last_cut: float = float("-inf")
    removed: bool = False
    served: int = 0

    def eligible(self, now: float) -> bool:
        return not self.removed and self.ejected_until <= now and self.ready is not False

    @property
    def slots(self) -> int:
        return 1 if self.probation else max(1, int(self.limit))

    def has_room(self, now: float) -> bool:
        return self.eligible(now) and self.busy_until <= now and self.inflight < self.slots


def resolve_host(host: str, port: int) -> list[str]:
    """Every address `host` resolves to, as worker base URLs (the k8s headless-Service way)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    urls = []
    for family, _, _, _, sockaddr in infos:
        address = sockaddr[0]
        netloc = f"[{address}]:{port}" if family == socket.AF_INET6 else f"{address}:{port}"
        urls.append(f"http://{netloc}")
    return sorted(set(urls))


class ReplicaSet:
    def __init__(self, *, mode: str, urls: list[str] | None = None, dns: str | None = None,
                 probe: Callable[[str], bool], resolver: Callable[[str, int], list[str]] =
                 resolve_host, eject_s: float = 10.0, limits: LimitSettings = LimitSettings(),
                 clock: Callable[[], float] = time.monotonic):
        self.mode = mode
        self.dns = dns
        self.eject_s = eject_s
        self.limits = limits
        self._probe = probe
        self._resolver = resolver
        self._clock = clock
        self._lock = threading.Lock()
        self._replicas: dict[str, Replica] = {}
        self._rotation = itertools.count()
        self._stop = threading.Event()
        self._listeners: list[Callable[[], None]] = []
        for url in urls or []:
            self._add(url, ready=True if mode == MODE_LOAD_BALANCER else None)

    def _add(self, url: str, ready: bool | None = None) -> None:
        self._replicas[url] = Replica(url, limit=float(self.limits.target),
                                      max_limit=self.limits.max_limit, ready=ready)

    def on_change(self, listener: Callable[[], None]) -> None:
        """`listener()` is called (outside the lock) whenever a replica may have gained room:
        the scheduler waits on it instead of polling."""
        self._listeners.append(listener)

    def _notify(self) -> None:
        for listener in self._listeners:
            listener()

    # ---- selection ---------------------------------------------------------------------------
    def acquire(self, exclude: set[str] = frozenset()) -> Replica | None:
        """A replica with room for one more page, its in-flight count already raised, or None
        when none has room now. Least outstanding first, ties in rotation; replicas in
        `exclude` (this page already failed there) only when no other has room."""
        with self._lock:
            now = self._clock()
            live = [r for r in self._replicas.values() if not r.removed]
            if not live:
                raise NoReplicas("no OCR replica is known"
                                 + (f" (DNS name {self.dns} has no addresses)" if self.dns else ""))
            roomy = [r for r in live if r.has_room(now)]
            candidates = [r for r in roomy if r.url not in exclude] or roomy
            if not candidates:
                return None
            turn = next(self._rotation)
            count = len(candidates)
            chosen = min(enumerate(candidates),
                         key=lambda item: (item[1].inflight, (item[0] - turn) % count))[1]
            chosen.inflight += 1
            return chosen

    def has_room(self) -> bool:
        with self._lock:
            now = self._clock()
            return any(r.has_room(now) for r in self._replicas.values())

    def next_change(self) -> float | None:
        """When a paused or ejected replica gets room back by itself (for the scheduler's
        wait), or None."""
        with self._lock:
            now = self._clock()
            times = [t for r in self._replicas.values() if not r.removed
                     for t in (r.busy_until, r.ejected_until) if t > now]
            return min(times) if times else None

    def give_back(self, replica: Replica) -> None:
        """An acquired slot that was not used after all."""
        with self._lock:
            replica.inflight -= 1
        self._notify()

    def release(self, replica: Replica, outcome: Outcome, capacity: int | None = None,
                free: int | None = None, retry_after_s: float | None = None) -> None:
        """Book the answer of one attempt; `capacity`/`free` are the worker's X-Ocr-Capacity
        and X-Ocr-Free headers when it sent them."""
        with self._lock:
            replica.inflight -= 1
            now = self._clock()
            if capacity and self.mode != MODE_LOAD_BALANCER:
                replica.max_limit = min(capacity, self.limits.max_limit)
            if outcome is Outcome.BUSY:
                self._busy(replica, now, retry_after_s)
            elif outcome is Outcome.DOWN:
                self._down(replica, now)
            else:  # OK, REJECTED, FAILED: the replica is alive and answering
                replica.served += 1
                replica.probation = False
                replica.busy_streak = 0
                if self.mode != MODE_LOAD_BALANCER:
                    replica.ready = True
                if outcome is Outcome.OK:
                    self._adapt(replica, capacity, free)
            if replica.removed and replica.inflight == 0:
                self._replicas.pop(replica.url, None)
        self._notify()

    def _adapt(self, replica: Replica, capacity: int | None, free: int | None) -> None:
        target = self.limits.target
        if capacity is not None and free is not None:
            admitted = capacity - free
            if admitted > target + 1:
                replica.limit = max(1.0, replica.limit - 1.0 / replica.limit)
                return
            if admitted >= target:
                return
        replica.limit = min(float(replica.max_limit), replica.limit + 1.0 / replica.limit)

    def _busy(self, replica: Replica, now: float, retry_after_s: float | None) -> None:
        if now - replica.last_cut > 0.1:  # one cut per burst of busy answers
            replica.limit = max(1.0, replica.limit / 2)
            replica.last_cut = now
        replica.busy_streak += 1
        pause = min(1.0, self.limits.busy_pause_s * 2 ** (replica.busy_streak - 1))
        if retry_after_s is not None:
            pause = min(pause, retry_after_s)
        replica.busy_until = now + pause * random.uniform(0.5, 1.0)

    def _down(self, replica: Replica, now: float) -> None:
        if self.mode == MODE_LOAD_BALANCER:  # nginx ejects its own workers; just pause
            replica.busy_until = now + 0.5
            return
        replica.ejected_until = now + self.eject_s
        replica.probation = True
        log.warning("replica ejected", extra={"replica": replica.url, "seconds": self.eject_s})

    # ---- discovery and health ----------------------------------------------------------------
    def refresh(self) -> None:
        """Re-resolve the DNS name: new addresses join (after a readiness probe), vanished
        ones leave once their in-flight pages are done."""
        if self.mode != MODE_DNS:
            return
        host, port = self.dns.rsplit(":", 1)
        try:
            urls = set(self._resolver(host, int(port)))
        except OSError as exc:
            log.warning("DNS refresh failed; keeping the last replica set",
                        extra={"dns": self.dns, "error": str(exc)})
            return
        with self._lock:
            for url in urls:
                replica = self._replicas.get(url)
                if replica is None:
                    self._add(url)
                    log.info("replica discovered", extra={"replica": url})
                else:
                    replica.removed = False
            for url, replica in list(self._replicas.items()):
                if url not in urls and not replica.removed:
                    replica.removed = True
                    log.info("replica gone from DNS", extra={"replica": url})
                    if replica.inflight == 0:
                        del self._replicas[url]
        self._notify()

    def probe_all(self) -> None:
        """Readiness of every replica. A probe never ends an ejection or a probation: only a
        real answer does (a replica that timed out may answer /readyz and still hang on OCR)."""
        if self.mode == MODE_LOAD_BALANCER:
            return
        for replica in self.replicas():
            ready = self._probe(replica.url)
            with self._lock:
                replica.ready = ready
        self._notify()

    def replicas(self) -> list[Replica]:
        with self._lock:
            return [r for r in self._replicas.values() if not r.removed]

    def any_ready(self) -> bool:
        now = self._clock()
        return any(r.ready and r.ejected_until <= now for r in self.replicas())

    def any_not_known_down(self) -> bool:
        """Some replica may take pages (not probed yet, or ready): the front door's test."""
        return any(r.ready is not False for r in self.replicas())

    def start_background(self, refresh_s: float, health_s: float,
                         after_probe: Callable[[list[Replica]], None] = lambda _: None) -> None:
        """Re-resolve (DNS mode) and probe every replica's readiness in a daemon thread;
        `after_probe` sees the replica list after each round (for metrics)."""
        def loop():
            next_refresh = 0.0
            while not self._stop.is_set():
                if self._clock() >= next_refresh:
                    self.refresh()
                    next_refresh = self._clock() + refresh_s
                try:
                    self.probe_all()
                    after_probe(self.replicas())
                except Exception:
                    log.exception("health probe failed")
                self._stop.wait(min(health_s, refresh_s) if self.mode == MODE_DNS else health_s)

        self.refresh()
        self.probe_all()
        threading.Thread(target=loop, name="replica-health", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
