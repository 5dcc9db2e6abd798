"""The background half of a replica set: DNS refreshed, readiness probed, and the fleet told
at once when this process goes quiet or wakes.

Probes (and pages) carry this process's entry on the fleet board and bring back the workers'
boards. When this process goes quiet, the other gateways would keep a share for it until its
entries expire; when it wakes, what it knows of them is as old as its quiet spell. So both
are told (and heard) by probes at once (`tell`), at most every TELL_GAP_S. Thread: one daemon per
process; the clock and the probes are the replica set's, so `tell` is tested
without the thread."""

from __future__ import annotations

import logging
import threading
from typing import Callable

from .replica import Replica
from .replicas import ReplicaSet

log = logging.getLogger("gateway.flow.health")

TELL_GAP_S = 0.5  # "this process went quiet / got busy" is told by probes at most this often


class HealthLoop:
    def __init__(self, replicas: ReplicaSet):
        self.replicas = replicas

    def tell(self) -> None:
        """This process went quiet or got busy, and other gateways are on the board: probe
        PROBES_PER_ROUND workers (the longest unheard; behind a balancer, as many probes).
        The other gateways hear at their next answers from those workers that its share is
        free or taken, and it hears what they hold now, not what they held when it last sent
        a page. Not every worker: a process serving only images goes busy and quiet with
        each, and probing the whole fleet each time would cost it in proportion to the
        fleet's size."""
        if self.replicas.fleet.untold():
            self.replicas.probe_all(every=True)

    def start(self, refresh_s: float, health_s: float,
              after_probe: Callable[[list[Replica]], None] = lambda _: None) -> None:
        """Re-resolve (DNS) every `refresh_s` and probe every `health_s` in a daemon thread;
        `after_probe` sees the replica list after each round (for metrics). Woken between
        rounds when this process goes quiet or gets busy, to `tell`."""
        replicas = self.replicas
        replicas.health_s = health_s
        interval = min(health_s, refresh_s) if replicas.resolves else health_s

        def loop():
            next_refresh = 0.0
            next_probe = replicas.clock() + interval
            while not replicas.stopped.is_set():
                now = replicas.clock()
                try:
                    if now >= next_refresh:
                        replicas.refresh()
                        next_refresh = now + refresh_s
                    if now >= next_probe:
                        replicas.probe_all()
                        after_probe(replicas.replicas())
                        next_probe = now + interval
                    elif replicas.news.is_set():
                        replicas.news.clear()
                        self.tell()
                        replicas.stopped.wait(TELL_GAP_S)
                        continue
                except Exception:
                    log.exception("health probe failed")
                replicas.news.wait(max(0.0, min(next_probe, next_refresh) - replicas.clock()))

        replicas.refresh()
        replicas.probe_all()
        threading.Thread(target=loop, name="replica-health", daemon=True).start()

    def stop(self) -> None:
        """No more probes; and a last one that says this process holds nothing now, so the
        other gateways take its share at once rather than when its entries expire."""
        replicas = self.replicas
        replicas.stopped.set()
        replicas.news.set()
        replicas.fleet.set_demand(0, 0)
        url = next(iter(r.url for r in replicas.replicas()), None)
        if url is not None:
            try:
                replicas.probe(url, replicas.fleet.outgoing())
            except Exception:  # best effort: the entries expire anyway
                pass
