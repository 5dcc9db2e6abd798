"""Which replica gets the next page: the replica set (one load-balancer URL, a fixed list of
worker URLs, or a DNS name re-resolved periodically), least-outstanding-requests selection,
passive ejection of replicas that fail, and active readiness probes. Thread-safe; the network
calls (probe, resolve) are injected so selection can be tested without a network."""

from __future__ import annotations

import itertools
import logging
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable

log = logging.getLogger("gateway.upstreams")

MODE_LOAD_BALANCER = "load_balancer"
MODE_LIST = "list"
MODE_DNS = "dns"


class NoReplicas(RuntimeError):
    """No replica is known at all (DNS returned nothing, or the list is empty)."""


@dataclass
class Replica:
    url: str
    inflight: int = 0
    ready: bool | None = None  # None: not probed yet
    ejected_until: float = 0.0
    removed: bool = False
    served: int = 0

    def eligible(self, now: float) -> bool:
        return not self.removed and self.ejected_until <= now and self.ready is not False


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
                 resolve_host, eject_s: float = 10.0, clock: Callable[[], float] =
                 time.monotonic):
        self.mode = mode
        self.dns = dns
        self.eject_s = eject_s
        self._probe = probe
        self._resolver = resolver
        self._clock = clock
        self._lock = threading.Lock()
        self._replicas: dict[str, Replica] = {}
        self._rotation = itertools.count()
        self._stop = threading.Event()
        for url in urls or []:
            self._replicas[url] = Replica(url, ready=True if mode == MODE_LOAD_BALANCER else None)

    # ---- selection ---------------------------------------------------------------------------
    def acquire(self, exclude: set[str] = frozenset()) -> Replica:
        """The replica for the next attempt, its in-flight count already raised: the ready,
        non-ejected one with the fewest outstanding requests, avoiding `exclude` (replicas this
        page already failed on) while there is any other choice."""
        with self._lock:
            now = self._clock()
            live = [r for r in self._replicas.values() if not r.removed]
            if not live:
                raise NoReplicas("no OCR replica is known"
                                 + (f" (DNS name {self.dns} has no addresses)" if self.dns else ""))
            for candidates in (
                [r for r in live if r.eligible(now) and r.url not in exclude],
                [r for r in live if r.eligible(now)],
                [r for r in live if r.url not in exclude],
                live,
            ):
                if candidates:
                    break
            if not any(r.eligible(now) for r in candidates):
                # everyone is ejected or unready: try the one whose ejection ends first
                candidates = [min(candidates, key=lambda r: (r.ejected_until, r.inflight))]
            turn = next(self._rotation)
            count = len(candidates)
            chosen = min(enumerate(candidates),
                         key=lambda item: (item[1].inflight, (item[0] - turn) % count))[1]
            chosen.inflight += 1
            return chosen

    def release(self, replica: Replica, outcome: str) -> None:
        """outcome: "ok" (answered), "busy" (429/503), "down" (connection error or timeout)."""
        with self._lock:
            replica.inflight -= 1
            if outcome == "ok":
                replica.served += 1
                if self.mode != MODE_LOAD_BALANCER:
                    replica.ready = True
            elif outcome == "down" and self.mode != MODE_LOAD_BALANCER:
                replica.ejected_until = self._clock() + self.eject_s
                log.warning("replica ejected", extra={"replica": replica.url,
                                                      "seconds": self.eject_s})
            if replica.removed and replica.inflight == 0:
                self._replicas.pop(replica.url, None)

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
                    self._replicas[url] = Replica(url)
                    log.info("replica discovered", extra={"replica": url})
                else:
                    replica.removed = False
            for url, replica in list(self._replicas.items()):
                if url not in urls and not replica.removed:
                    replica.removed = True
                    log.info("replica gone from DNS", extra={"replica": url})
                    if replica.inflight == 0:
                        del self._replicas[url]

    def probe_all(self) -> None:
        for replica in self.replicas():
            ready = self._probe(replica.url)
            with self._lock:
                replica.ready = ready
                if ready and replica.ejected_until:
                    replica.ejected_until = 0.0  # back in service as soon as it answers ready

    def replicas(self) -> list[Replica]:
        with self._lock:
            return [r for r in self._replicas.values() if not r.removed]

    def any_ready(self) -> bool:
        now = self._clock()
        return any(r.ready and r.ejected_until <= now for r in self.replicas())

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
