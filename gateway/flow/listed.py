"""Placing pages with a list of workers, or a DNS name that resolves to them (a k8s headless
Service): this process picks the replica.

The choice is the worker that had the fewest pages when it last answered (X-Ocr-Held: its
pages but images, on every answer and probe), counting what this process sent it since,
never more of its own there than the worker's target; among equals, `Replica.staleness`. A
ready replica that answered a page within three health intervals is not probed: its room is
known.

What a worker said is a while old, and several placing processes act on it at once: all
would see the same worker as the emptiest and queue a page each there while others idle. So
each document page asks the worker to refuse it beyond its target (`X-Ocr-Within-Target`,
services/ocr_worker/refusal.py): the refusal says when its page under way ends, and until
then this process sends it no document page (`_full_until`).

An urgent page (an image) goes to an idle worker kept for urgent pages (`_reserve`: the same
ones in every process, while the fleet keeps some, gateway.flow.reserve), else to one idle,
else to the one where this process's oldest page out was sent (`_rank`). A worker that
cannot start it soon refuses it at once, and the next try goes to one not tried yet."""

from __future__ import annotations

import logging
import random
import socket
import zlib
from typing import Callable, Iterable, Mapping

from services.ocr_api import headers as h

from .replica import Replica
from .replicas import PROBES_PER_ROUND, ReplicaSet
from .share import Share

log = logging.getLogger("gateway.flow.listed")

FULL_FOR_S = 1.0  # a worker that said it holds its target, without when (`_full_until`)


class ListedReplicas(ReplicaSet):
    mode = "list"

    def __init__(self, **options):
        self._reserved: frozenset[str] = frozenset()  # kept for urgent pages (`_reserve`)
        self._reserve_order: tuple[frozenset[str], list[str]] = (frozenset(), [])
        super().__init__(**options)

    def _take_share(self, now: float) -> tuple[Share, int]:
        """Each replica's target from its workers' (they say it on the board), the fleet's
        slots their sum, and the replicas kept idle for urgent pages."""
        targets = {w.id: w.value for w in self.fleet.board.workers()}
        for replica in self._replicas.values():
            replica.target = _target_of(replica.workers, targets, self.fleet.default_target)
        slots = sum(r.target for r in self._replicas.values() if r.eligible(now))
        share = self.fleet.share(replica_slots=slots or None)
        reserved, self._reserved = self._reserved, self._reserve(share.reserve, now)
        for url in (reserved ^ self._reserved) & self._replicas.keys():
            self._place(self._replicas[url], now)  # (a replica kept before may be gone)
        return share, share.limit(self.fleet.default_target)

    def _reserve(self, count: int, now: float) -> frozenset[str]:
        """The replicas kept idle for urgent pages while the fleet keeps `count` workers so
        (gateway.flow.reserve), the same in every gateway process (the first by a hash of
        their URLs: each has the same list). Each process knows which workers its own pages
        fill, and of the others only what their answers told it a while ago: idle workers
        left by the arithmetic alone would be anywhere, and an image would look for one among
        scores that only look idle. The order is kept until the replicas change: the share is
        taken many times a second, and sorting them each time cost in proportion to the
        fleet."""
        if count <= 0:
            return frozenset()
        urls, order = self._reserve_order
        if self._replicas.keys() != urls:
            urls = frozenset(self._replicas)
            order = sorted(urls, key=lambda url: (zlib.crc32(url.encode()), url))
            self._reserve_order = (urls, order)
        kept: list[str] = []
        for url in order:
            if self._replicas[url].eligible(now):
                kept.append(url)
                if len(kept) == count:
                    break
        return frozenset(kept)

    def _rank(self, replica: Replica, urgent: bool) -> tuple[float, float]:
        """The emptiest first; among equals, `Replica.staleness`. An urgent page: an idle one
        first (one kept for urgent pages first), else the one where this process's oldest
        page out was sent first. The urgent page is read before the pages queued there
        (X-Ocr-Priority: high), so only the page under way delays it; where every worker
        holds its target, which one the workers' answers said least of is no guide to which
        ends soonest, and this process's own pages out are the best it has."""
        if not urgent:
            return replica.load, replica.staleness()
        if replica.load < 1:
            return float(replica.url not in self._reserved), replica.staleness()
        return 2.0, replica.sent[0] if replica.sent else replica.staleness()

    def _open(self, replica: Replica, now: float, urgent: bool) -> bool:
        """Room for one more page: within the worker's target. A document page not while
        the worker said it holds its target (`_full_until`), nor at one kept for images."""
        if not urgent and (now < self._full_until(replica) or replica.url in self._reserved):
            return False
        return replica.has_room(now)

    def _full_until(self, replica: Replica) -> float:
        """Until when a worker that said it holds its target's pages gets no document page
        from this process: until its page under way ends, as it said when it last refused
        one, else FULL_FOR_S after it said so. Sent to at once, it would refuse again; tried
        again a fixed time later whatever it said, it would either refuse again and again
        (refusals cost the gateways' CPU) or idle after its page while every process still
        counted it full."""
        if replica.load < replica.slots:
            return float("-inf")
        if replica.room_at >= replica.heard_at:
            return replica.room_at
        return replica.heard_at + FULL_FOR_S

    def _heard(self, replica: Replica, said: Mapping[str, int | str | None], finished: int,
               now: float) -> None:
        """The worker behind the replica (its target is on the board), and the pages it
        holds now (X-Ocr-Held, our own there included; else all it admitted); without the
        headers, one page fewer for each of ours that came back. Held leaves out images: one
        admitted as the page under way ends is read in a moment, and counted, the worker
        would look full (`_full_until`), idle after it."""
        worker = said.get(h.WORKER)  # forgotten when the board forgets it
        if worker:
            replica.workers[worker] = now
            for stale in [w for w, t in replica.workers.items()
                          if now - t > self.fleet.board.worker_ttl_s]:
                del replica.workers[stale]
        capacity, free, held = said.get(h.CAPACITY), said.get(h.FREE), said.get(h.HELD)
        if capacity is not None and free is not None:
            replica.capacity = capacity
            replica.load = float(capacity - free if held is None else held)
            replica.heard_at = now
        else:
            replica.load = max(0.0, replica.load - finished)

    def _answered(self, replica: Replica, ready: bool | None) -> None:
        replica.ready = True if ready is None else ready

    def _down(self, replica: Replica, now: float) -> None:
        """A connection error or timeout: ejected for `eject_s`, then on probation (one
        trial page at a time, and only a real answer ends it: a replica that timed out may
        answer /readyz and still hang on OCR)."""
        replica.ejected_until = now + self.eject_s
        replica.probation = True
        log.warning("replica ejected", extra={"replica": replica.url, "seconds": self.eject_s})

    def probe_all(self, every: bool = False) -> None:
        """Readiness of the replicas, each probe carrying this process's board entry: every
        replica not known ready, and of the ready ones not heard from in three health
        intervals (an answer says it is alive and its room) the PROBES_PER_ROUND heard from
        longest ago. `every`: of all the ready ones, heard from lately or not (to tell this
        process's news; the workers pass it on to the other gateways with their answers).
        In a random order: among idle workers a page goes to the one heard from last, and
        processes that probed in the same order would all send their first pages to the
        same workers."""
        now = self.clock()
        replicas = self.replicas()
        ready = sorted((r for r in replicas
                        if r.ready and (every or now - r.heard_at >= 3 * self.health_s)),
                       key=lambda r: r.heard_at)
        replicas = [r for r in replicas if not r.ready] + ready[:PROBES_PER_ROUND]
        random.shuffle(replicas)
        for replica in replicas:
            self.probe_one(replica)
        self._notify()


def _target_of(worker_ids: Iterable[str], targets: Mapping[str, float],
               default: float) -> float:
    """The pages one replica URL holds: the targets of the worker processes heard behind it
    (one, or OCR_INSTANCES_PER_DEVICE of them), the default when none is known."""
    known = [targets[w] for w in worker_ids if w in targets]
    return sum(known) if known else default


def resolve_host(host: str, port: int) -> list[str]:
    """Every address `host` resolves to, as worker base URLs (the k8s headless-Service way)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    urls = []
    for family, _, _, _, sockaddr in infos:
        address = sockaddr[0]
        netloc = f"[{address}]:{port}" if family == socket.AF_INET6 else f"{address}:{port}"
        urls.append(f"http://{netloc}")
    return sorted(set(urls))


class DnsReplicas(ListedReplicas):
    """A DNS name re-resolved periodically: new addresses join (after a readiness probe),
    vanished ones leave once their pages out there are done."""

    mode = "dns"
    resolves = True

    def __init__(self, *, dns: str,
                 resolver: Callable[[str, int], list[str]] = resolve_host, **options):
        self.dns = dns
        self._resolver = resolver
        super().__init__(**options)

    def _unknown(self) -> str:
        return f"no OCR replica is known (DNS name {self.dns} has no addresses)"

    def refresh(self) -> None:
        host, port = self.dns.rsplit(":", 1)
        try:
            urls = set(self._resolver(host, int(port)))
        except OSError as exc:
            log.warning("DNS refresh failed; keeping the last replica set",
                        extra={"dns": self.dns, "error": str(exc)})
            return
        with self._lock:
            now = self.clock()
            for url in urls - self._replicas.keys():
                self._add(url)
                log.info("replica discovered", extra={"replica": url})
            for url, replica in list(self._replicas.items()):
                if replica.removed == (url in urls):
                    self._mark_removed(replica, url not in urls, now)
        self._notify()

    def _mark_removed(self, replica: Replica, removed: bool, now: float) -> None:
        """Under the lock: a replica gone from DNS (forgotten once nothing of ours is out
        there), or back."""
        replica.removed = removed
        self._removed += 1 if removed else -1
        if removed:
            log.info("replica gone from DNS", extra={"replica": replica.url})
        self._place(replica, now)
        if removed and replica.inflight == 0:
            self._forget(replica)
