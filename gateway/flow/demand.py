"""This process's demand, told to the fleet: what its documents ask of the fleet's workers,
and each document's weight from what the fleet says back.

The scheduler (gateway.scheduler) decides which page goes out next; what the other gateway
processes hear of this one goes through the replica set to the fleet board
(gateway.flow.share): its documents with pages to send and the pages in flight of those with
none left, finishing (`Demand.tell`), the rate its documents are sent at and the workers its
urgent pages keep busy (gateway.flow.reserve), and each document's weight by its lead on the
fleet's rate (gateway.flow.lead, `Demand.reweigh`). One owner for it, apart from the picking,
because it keeps its own state (how long pages take, whether the fleet keeps workers idle for
urgent pages) and runs on its own clock: told whenever a document's pages to send start or run
out, weighed at each of the scheduler's tidies, timed by the send threads (`page_timed`)."""

from __future__ import annotations

import time

from . import lead
from .queue import FairQueue
from .replicas import ReplicaSet
from .reserve import PageTime, UrgentLoad


class Demand:
    """What this process's documents (the scheduler's `FairQueue`) ask of the fleet. `tell`
    and `reweigh` run under the scheduler's lock; `page_timed` on the send threads."""

    def __init__(self, replicas: ReplicaSet, fair: FairQueue):
        self.replicas = replicas
        self.fair = fair
        self._page_s: float | None = None  # what a page's attempt took lately (`reweigh`)
        self._urgent = UrgentLoad()  # workers this process's urgent pages keep busy
        self._page_time = PageTime()  # whether pages are long (gateway.flow.reserve)
        self._reserving = False  # the fleet keeps workers idle for urgent pages (reserve)

    def tell(self) -> None:
        """Under the lock: this process's weight in the fleet (gateway.flow.share): its documents
        with chunks still to send, and the chunks in flight of those with none left (they
        hold a slot each, and no more). An urgent document holds its one slot from the
        start: waiting for a worker to start it, it must not take a whole document's quota
        of the fleet from the others' documents; none while the fleet keeps workers idle for
        urgent pages (gateway.flow.reserve), which it runs on (and a process serving only images
        then stays quiet, instead of telling every worker as it wakes and goes quiet with each
        one). A document with pages to send counts its weight (gateway.flow.lead)."""
        queued, finishing = 0.0, 0
        for doc in self.fair.documents():
            if doc.urgent:
                if not self._reserving:
                    finishing += 1 if doc.has_queued() else doc.inflight
            elif doc.has_queued():
                queued += doc.weight.value
            else:
                finishing += doc.inflight
        self.replicas.set_demand(queued, finishing)

    def reweigh(self, now: float) -> None:
        """Under the lock: tell the board the workers this process's urgent pages keep busy
        (`_say_urgent`) and the rate its documents were sent at, and weigh each by its lead
        on the fleet's (gateway.flow.lead). Not before a page has come back: until then no lead
        can show."""
        page_s = self._page_s
        docs = [d for d in self.fair.documents() if not d.urgent and d.has_queued()]
        self._say_urgent(now, bool(docs))
        share = self.replicas.share()
        if share is not None and self._reserving != (share.reserve > 0):
            self._reserving = share.reserve > 0
            self.tell()
        if share is None or page_s is None:
            return
        rates = [lead.rate(d.sent, now - d.admitted_at, page_s) for d in docs]
        mine = sum(rates) / len(rates) if rates else 0.0
        self.replicas.fleet.set_rate(mine)
        if share.rate is None:
            return
        weights = [doc.weight.value for doc in docs]
        spans = [now - doc.admitted_at + page_s for doc in docs]  # a lead is a rate's over these
        for doc, own, span in zip(docs, rates, spans):
            doc.weight.follow((own - share.rate) * span, share.quota, now, page_s)
        leads = [(own - mine) * span for own, span in zip(rates, spans)]  # on its process's
        for doc, moved in zip(docs, lead.moves(leads, share.quota)):
            doc.moved = moved
        if weights != [doc.weight.value for doc in docs]:
            self.tell()

    def _say_urgent(self, now: float, documents: bool) -> None:
        """Under the lock: the workers this process's urgent pages keep busy, said while pages
        are long (or may be: how long is not known yet, gateway.flow.reserve `PageTime`), and
        whether it has `documents` with pages to send while that is not known; without
        documents and with it known, as the processes with documents say (FleetView)."""
        unknown = not self._page_time.known(now)
        self.replicas.fleet.set_urgent(
            self._urgent.load(now) if unknown or self._page_time.long() else 0.0,
            page_time_unknown=documents and unknown,
            follow=unknown and not documents)

    def page_timed(self, seconds: float, urgent: bool = False,
                   page_s: float | None = None) -> None:
        """A page's attempt came back in `seconds` (the send threads book each), from a
        worker whose pages take `page_s` (X-Ocr-Page-Ms; None: it did not say): how long
        pages take (gateway.flow.reserve, the weighing's window) and, for an urgent page, the
        workers urgent pages keep busy."""
        if urgent:
            self._urgent.record(seconds, time.monotonic())
            return
        self._page_time.record(seconds if page_s is None else page_s, time.monotonic())
        mean = self._page_s  # (a lost update between send threads changes nothing much)
        self._page_s = seconds if mean is None else mean + 0.1 * (seconds - mean)
