"""Placing pages behind one load balancer (nginx `least_conn`, a ClusterIP Service): the
balancer picks the worker, and this process only keeps its share of the fleet out.

The one URL holds the whole share. A worker refuses a page beyond its target, and one that
cannot start an urgent page soon refuses it at once; nginx's answer when every worker
refused is a refusal too (services/ocr_worker, deploy/nginx): the next try goes out at once
and the balancer rotates. Connection errors only pause the URL: nginx ejects its own
workers.

Which workers exist is learnt from the board: the workers' entries that probes through the
balancer bring back. Probes go in rounds, each twice as large as the last while it meets new
workers (a scale-up is found within a few rounds), else PROBE_ROUND."""

from __future__ import annotations

import threading
from typing import Mapping

from services.ocr_api import headers as h

from .replica import Replica
from .replicas import PROBES_PER_ROUND, ReplicaSet
from .share import Share

PROBE_ROUND = 4  # probes in the first round through the balancer
MAX_PROBE_ROUND = 256


class BalancedReplicas(ReplicaSet):
    mode = "load_balancer"
    balanced = True

    def __init__(self, **options):
        self._round = PROBE_ROUND
        self._round_lock = threading.Lock()
        super().__init__(**options)

    def _add(self, url: str, ready: bool | None = None) -> None:
        super()._add(url, ready=True)  # nginx knows its workers' health

    def _take_share(self, now: float) -> tuple[Share, int]:
        share = self.fleet.share()
        limit = share.limit(self.fleet.default_target)
        for replica in self._replicas.values():
            replica.target = limit
        return share, limit

    def _rank(self, replica: Replica, urgent: bool) -> tuple[float, float]:
        return replica.load, replica.staleness()

    def _open(self, replica: Replica, now: float, urgent: bool) -> bool:
        """An urgent page is counted in this process's share from the moment it comes (a
        finishing page, gateway.flow.share), so it does not wait for its documents' pages to come
        back when the share shrinks under them: only a pause stops it."""
        if urgent:
            return replica.eligible(now) and replica.busy_until <= now
        return replica.has_room(now)

    def _heard(self, replica: Replica, said: Mapping[str, int | str | None], finished: int,
               now: float) -> None:
        """Each answer is from some worker behind the balancer: one page fewer out for each
        of ours that came back."""
        replica.load = max(0.0, replica.load - finished)

    def _down(self, replica: Replica, now: float) -> None:
        replica.busy_until = now + 0.5  # nginx ejects its own workers: just pause

    def probe_all(self, every: bool = False) -> None:
        """Rounds of probes through the balancer that meet the workers behind it (each brings
        a worker's entry back), while they meet new ones. `every`: at least as many probes
        as workers are known, up to PROBES_PER_ROUND (to tell this process's news; the
        workers pass it on to the other gateways with their answers)."""
        url = next(iter(self._replicas), None)
        at_least = min(len(self.fleet.board.workers()), PROBES_PER_ROUND) if every else 0
        while url is not None and not self.stopped.is_set():
            known = {w.id for w in self.fleet.board.workers()}
            met = self._probe_round(url, max(at_least, self._round_size(len(known))))
            self.heard_news()
            at_least = 0
            if not self._after_round(bool(met - known)):
                break

    def _probe_round(self, url: str, size: int) -> set[str]:
        """`size` probes through the balancer: the workers they met."""
        met: set[str] = set()
        for _ in range(min(MAX_PROBE_ROUND, size)):
            if self.stopped.is_set():
                break
            _, answer = self.probe(url, self.fleet.outgoing())
            self.fleet.heard(answer.get(h.BOARD))
            if answer.get(h.WORKER):
                met.add(answer[h.WORKER])
        return met

    def _round_size(self, known: int) -> int:
        """At least an eighth of the workers known, so that a run of idle workers already
        met does not end the search early."""
        with self._round_lock:
            return min(MAX_PROBE_ROUND, max(self._round, known // 8))

    def _after_round(self, met_new: bool) -> bool:
        """True when the next round should follow at once (this one met new workers)."""
        with self._round_lock:
            self._round = min(MAX_PROBE_ROUND, self._round * 2) if met_new else PROBE_ROUND
            return met_new
