"""This gateway process's share of the fleet, from the fleet board that gateways and workers
pass each other (services/ocr_api/fleet_board.py).

- **How much.** The fleet holds the sum of its workers' targets (each worker says how many
  pages keep it busy: about one on a slow page, up to two on fast ones). Pages in flight of
  documents with nothing left to send (an image being read) come off first, each as one
  page; the rest is split equally between the documents with pages to send, over every
  gateway process heard from (water-filling). This process may keep its finishing pages plus
  its documents' quotas in flight. So equal documents get equal shares of the fleet
  whichever gateway they came through, and the limit follows the fleet as it grows or
  shrinks: nothing is configured, nothing plateaus.
- **Where** is gateway.flow.replicas' business: the balancer's (nginx `least_conn`), or the
  emptiest worker by what the workers last said.
- **Which workers exist** behind a balancer: the ones whose entries the board carries,
  heard from in its last two minutes (they answer pages and probes), and a draining worker
  says target 0 (gateway.flow.balanced probes for them).

Pure apart from a lock: the board's clock is injected."""

from __future__ import annotations

import math
import random
import secrets
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from services.ocr_api import headers
from services.ocr_api.fleet_board import CLIENT_KINDS, Board

from .lead import fleet_rate
from .reserve import others_reserve, reserve_for

MIN_SENDING = 0.25  # of the fleet's slots, left to documents with pages to send
REBALANCE_S = 0.05  # news is taken into the share, and into the header sent, at most this often;
# the documents' weights and deadlines are looked at at least this often while pages flow
# (gateway.scheduler `_tidy`)
NEWS_S = 1.5  # what a gateway process says takes about this long to reach the others (through
# the workers' answers): behind a balancer, a rise in its demand is taken this long after it
# said it


@dataclass(frozen=True)
class Share:
    """One look at the board: this process's fraction of the fleet, the fleet's slots (None:
    no worker heard of yet) and each known worker's target."""

    fraction: float
    slots: float | None
    targets: dict[str, float] = field(default_factory=dict)
    clients: int = 1
    documents: float = 1.0  # every process's documents with pages to send
    finishing: float = 0.0  # every process's finishing pages
    quota: float = 2.0  # slots per document with pages to send
    rate: float | None = None  # chunks/s the fleet's documents were sent at (gateway.flow.lead)
    reserve: int = 0  # workers kept idle for urgent pages (gateway.flow.reserve)

    def document_quota(self) -> int:
        """Chunks in flight one document with pages to send may have (at least one)."""
        return max(1, dither(self.quota))

    def limit(self, default_target: float) -> int:
        """Pages this process may keep outstanding behind one load balancer."""
        return max(1, dither(self.fraction * (self.slots or default_target)))


class FleetView:
    def __init__(self, board: Board | None = None, default_target: float = 2.0):
        self.id = secrets.token_hex(6)
        self.board = board or Board()
        self.default_target = default_target
        self._lock = threading.Lock()
        self._seq = self._estimate_seq = 0
        self._documents = 0
        self._said: deque[tuple[float, float]] = deque([(float("-inf"), 0.0)])  # (when, demand)
        self._finishing = 0
        self._finishing_seq = 0
        self._rate, self._rate_seq = 0.0, 0
        self._urgent, self._urgent_seq = 0.0, 0
        self._page_time_unknown = False
        self._told_quiet = True  # what the last `untold` news was (a new process is quiet)
        self._outgoing: tuple | None = None  # ((demand seq, busy), built at, header)
        self.balanced = True  # behind one balancer (gateway.flow.replicas says): a rise is
        # taken late (`_taken`); with a list, each worker's room (its target, which it holds
        # to) bounds what processes that have not heard of it send it

    # ---- what this process says --------------------------------------------------------------
    def set_demand(self, documents: float, finishing: int = 0) -> bool:
        """How many documents this process has with pages to send (their weights' sum,
        gateway.flow.lead), and the pages in flight of its documents with none left to send (the
        scheduler's). True when this process has just gone quiet (nothing to send, nothing
        out) or just got busy: news no page carries soon enough (see `untold`)."""
        now = self.board.clock()
        with self._lock:
            was_busy = bool(self._documents or self._finishing)
            if finishing != self._finishing:
                self._finishing, self._finishing_seq = finishing, self._finishing_seq + 1
            if documents != self._documents:
                self._documents, self._seq = documents, self._seq + 1
                self._said.append((now, documents))
                self._forget_said(now - NEWS_S)
            return was_busy != bool(documents or finishing)

    def _others(self) -> list[str]:
        """The other processes heard of in the last REMEMBER_S: those this one remembers,
        then one name for each that only a worker did (`_unheard`)."""
        seen = list(self._remember())
        return seen + [f"unheard-{k}" for k in range(self._unheard(len(seen)))]

    def _remember(self) -> dict[str, float]:
        """The other processes heard of in the last REMEMBER_S, and when each last said its
        demand (the board forgets an entry 10 s after it was said)."""
        known = self.board.known_clients()
        known.pop(self.id, None)
        return known

    def _unheard(self, remembered: int) -> int:
        """Other processes that a worker heard of in the last REMEMBER_S (its `n` entry; the
        largest said) beyond the `remembered` ones: at a fleet's start, or after a quiet
        spell, most processes have heard of few of the others."""
        said = max((e.value for e in self.board.live()["n"]), default=0.0)
        return max(0, round(said) - 1 - remembered)

    def set_rate(self, rate: float) -> None:
        """The mean rate this process's documents with pages to send were sent at
        (gateway.flow.lead)."""
        rate = round(rate, 2)  # the board's resolution
        with self._lock:
            if rate != self._rate:
                self._rate, self._rate_seq = rate, self._rate_seq + 1

    def set_urgent(self, load: float, page_time_unknown: bool = False,
                   follow: bool = False) -> None:
        """The workers this process's urgent pages keep busy on average, while pages are long
        (gateway.flow.reserve), else 0; and whether it has timed no page yet behind a balancer
        (its documents then leave the most workers idle, gateway.flow.reserve). `follow`: this
        process has no documents and has timed no page (it sends images only), so whether
        pages are long is known to the processes with documents: its load is said only while
        one of them says one. Said regardless, it would keep a reserve (and each worker's
        second page out of the documents' share) on a fleet of short pages for as long as
        the documents all came through other processes."""
        if follow and load and not others_reserve(self.board.live(), self.id):
            load = 0.0
        load = round(load, 2)  # the board's resolution
        with self._lock:
            self._page_time_unknown = page_time_unknown
            if load != self._urgent:
                self._urgent, self._urgent_seq = load, self._urgent_seq + 1

    def demand(self) -> tuple[float, int]:
        """(documents with pages to send, finishing pages), as last set."""
        with self._lock:
            return self._documents, self._finishing

    def untold(self) -> bool:
        """This process went quiet or got busy since it last told so, and other gateway
        processes are on the board. When it goes quiet, they keep a share for it until its
        last entries expire (`client_ttl_s`), and a lone document elsewhere crawls; when it
        gets busy, what it knows of them is as old as its quiet spell. So both are told (and
        heard) by probes at once (gateway.flow.health `tell`); a blink (quiet and busy again
        before the probes go) is not news. Busy with documents behind a balancer, it tells
        also when the others' entries have expired but it (or a worker) heard of them in the
        last REMEMBER_S: they may be busy again too."""
        clients = self.board.clients()
        seen = self._others()
        with self._lock:
            quiet = not (self._documents or self._finishing)
            if quiet == self._told_quiet:
                return False
            self._told_quiet = quiet
            if self._documents and seen and self.balanced:
                return True
        return any(entry.id != self.id for entry in clients)

    def outgoing(self) -> dict[str, str]:
        """The header every page and probe carries: this process's entries and what it
        knows. Built at most every REBALANCE_S unless this process's demand changed or it went
        quiet (a page is sent far more often than the board changes, and its finishing pages
        and rate change with nearly every page: news a few round trips carry on anyway)."""
        now = self.board.clock()
        with self._lock:
            demand, seq = self._documents, self._seq
            finishing, finishing_seq = self._finishing, self._finishing_seq
            rate, rate_seq = self._rate, self._rate_seq
            urgent, urgent_seq = self._urgent, self._urgent_seq
            key = (seq, bool(demand or finishing))
            cached = self._outgoing
            if cached is not None and cached[0] == key and now - cached[1] < REBALANCE_S:
                return cached[2]
            self._estimate_seq += 1
            estimate_seq = self._estimate_seq
        own_slots = sum(w.value for w in self.board.workers())
        self.board.say("c", self.id, seq, demand)
        self.board.say("h", self.id, finishing_seq, finishing)
        self.board.say("f", self.id, estimate_seq, own_slots)
        self.board.say("s", self.id, rate_seq, rate)
        self.board.say("u", self.id, urgent_seq, urgent)
        header = {headers.BOARD: self.board.header(
            [(kind, self.id) for kind in CLIENT_KINDS], sent_within_s=REBALANCE_S)}
        with self._lock:
            self._outgoing = (key, now, header)
        return header

    def heard(self, board_header: str | None) -> None:
        self.board.merge(board_header)

    # ---- what it may take ----------------------------------------------------------------------
    def share(self, replica_slots: float | None = None) -> Share:
        """This process's part of the fleet now: its finishing pages plus an equal quota for
        each of its documents with pages to send, out of the fleet's slots less every
        process's finishing pages. A process with nothing queued is counted as one document,
        so its first page finds room. The fleet's slots: the sum of the targets of the workers this
        process has heard of, or a larger estimate another gateway process has (one that has
        already met the new workers of a scale-up). With a replica list or DNS name, the
        gateway knows the replicas itself: `replica_slots`, the sum of their targets. While
        the fleet keeps workers idle for urgent pages (gateway.flow.reserve), behind a balancer
        the documents share the workers less those, not the slots: a worker's target beyond
        its one page (a page queued) would fill them (nginx sends each page to the emptiest).
        With a list, every process leaves the same workers idle (gateway.flow.replicas
        `_reserved`): the documents share the slots less those workers' part, and the
        others keep their page queued (it hides the gap before their next)."""
        with self._lock:
            mine, my_finishing = self._documents or 1, self._finishing
            taken = self._taken() or 1
            my_rate = self._rate if self._documents else None
            my_urgent, page_time_unknown = self._urgent, self._page_time_unknown
        live = self.board.live()
        demands = {c.id: c.value for c in live["c"] if c.id != self.id}
        demands[self.id] = mine
        finishing = {e.id: e.value for e in live["h"]}
        finishing[self.id] = my_finishing
        targets = {w.id: w.value for w in live["w"]}
        slots = replica_slots or max(
            [sum(targets.values())] + [e.value for e in live["f"] if e.id != self.id])
        total = slots or self.default_target
        urgent = {e.id: e.value for e in live["u"]}
        urgent[self.id] = my_urgent
        workers = sum(1 for target in targets.values() if target > 0)
        reserve = reserve_for(sum(urgent.values()), workers, page_time_unknown)
        usable, kept = total, reserve * total / max(workers, 1)  # with a list (above)
        if self.balanced and reserve and workers:
            usable, kept = min(total, workers), reserve
        # finishing pages come off, but never more than 3/4 of the fleet: entries of a gateway
        # that died with pages in flight linger until they expire, and must not starve the rest
        free = max(usable - sum(finishing.values()) - kept, MIN_SENDING * total)
        others = sum(demands.values()) - mine
        quota = free / (others + mine)
        part = mine * quota
        if reserve:  # pages are long (or not timed yet): a rise waits for the news (`_taken`)
            part = min(part, taken * free / (others + taken))
        fraction = min(1.0, (my_finishing + part) / total)
        return Share(fraction, slots or None, targets, len(demands), sum(demands.values()),
                     sum(finishing.values()), quota,
                     fleet_rate(live["s"], demands, my_rate, self.id), reserve)

    def _taken(self) -> float:
        """Under the lock: the demand this process takes its share by while the fleet keeps
        workers idle for images (pages long: `share`). Behind a balancer, a
        rise is taken NEWS_S after it was said (a fall at once): its news reaches the
        other processes through the workers' answers, a second or so later behind nginx with
        long pages, and taken at once, a rise (a document's weight back up as its lead
        shrinks, gateway.flow.lead; a new document) would add to the shares the others still take
        by its old demand: the fleet's images would wait behind the pages over. The least it
        said since then (a dip and a rise within it: the others may have taken the dip's
        room)."""
        now = self.board.clock()
        if not self.balanced or not self._documents:
            return self._documents
        self._forget_said(now - NEWS_S)
        return min(documents for _, documents in self._said if documents)

    def _forget_said(self, since: float) -> None:
        """Under the lock: the demands said before `since`, but the one in force then."""
        while len(self._said) > 1 and self._said[1][0] <= since:
            self._said.popleft()

    def status(self) -> dict:
        """This process's place in the fleet, for /fleet."""
        share = self.share()
        return {"client": self.id, "fraction": round(share.fraction, 4),
                "gatewayProcesses": share.clients,
                "gatewayProcessesLastMinute": 1 + len(self._others()),
                "workers": len(share.targets), "fleetSlots": round(share.slots or 0, 2),
                "limit": share.limit(self.default_target), "documents": self._documents,
                "rate": share.rate,
                "finishing": self._finishing, "fleetDocuments": share.documents,
                "fleetFinishing": share.finishing, "urgentLoad": self._urgent,
                "reserve": share.reserve}


def dither(share: float, draw: Callable[[], float] = random.random) -> int:
    """A share of the fleet in whole pages: its whole part, and one more with the chance of
    its fraction. Drawn again at every rebalance, a document's pages in flight average its
    exact quota: rounded, a quota of 8.49 in one gateway process and 8.51 in another (views of
    the board a moment apart) would give their documents 8 and 9 pages, 12 % apart, for as
    long as the views stay so."""
    share = round(share, 9)  # a whole number computed a hair off stays whole
    whole = math.floor(share)
    return whole + (draw() < share - whole)

