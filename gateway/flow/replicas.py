"""The replicas this gateway process places pages on, and how many pages it keeps out.

Like Ray Serve's request router: a hard cap per replica (its target: the pages its worker
holds to stay busy, `Replica.slots`), a cached queue length (what the worker said it holds at
its last answer or probe, plus what this process sent it since), and a cheap refusal that
sends the page elsewhere (a worker refuses a page beyond its target, Outcome.LATER: no pause,
no attempt spent). How many pages this process keeps out in all is its share of the fleet
(gateway.flow.share), decided there with each document's quota and each replica's target.
So workers are kept just busy, everything beyond waits in the gateway's fair queue (where a
1-page request overtakes a 300-page one), and `kubectl scale` is room without configuration.

Two ways to place, one class each:
- behind one load balancer (nginx, a ClusterIP Service) the balancer picks the worker
  (gateway.flow.balanced);
- with a list of workers or a DNS name (a headless Service), this process picks the emptiest
  (gateway.flow.listed).

Busy is not down: a 503/429 (not a LATER) pauses the replica briefly (a short, growing pause)
and never ejects it. Only connection errors and timeouts eject one (with a list: nginx does
its own passive checks). The background probes are gateway.flow.health's. Thread-safe; the
network calls and the clock are injected, so all of this is tested without a network."""

from __future__ import annotations

import heapq
import threading
import time
from dataclasses import dataclass
from typing import Callable, Mapping

from services.ocr_api import headers as h

from ..backoff import Backoff
from ..outcome import Attempt, Outcome
from .replica import NoReplicas, Ranked, Replica
from .share import REBALANCE_S, FleetView, Share

__all__ = ["LimitSettings", "NoReplicas", "Probe", "Replica", "ReplicaSet", "Room"]

REBALANCE_IDLE_S = 1.0  # the share is taken afresh at least this often (board entries age out)

# probe(url, headers) -> (ready, the answer's headers)
Probe = Callable[[str, Mapping[str, str]], "tuple[bool, Mapping[str, str]]"]

# ready replicas a health round or a tell probes at most: probing them all would cost a
# gateway in proportion to the fleet (gateway.flow.listed, gateway.flow.balanced)
PROBES_PER_ROUND = 16


@dataclass(frozen=True)
class Room:
    """One look at the replicas (`ReplicaSet.look`): whether a document page and an urgent
    one would be placed now, the chunks in flight one document may have (its equal part of
    the fleet; None before the share was first taken), and when that may change by itself."""

    documents: bool
    urgent: bool
    quota: int | None
    next_change: float | None


@dataclass(frozen=True)
class LimitSettings:
    busy_pause_s: float = 0.05  # first pause after a busy answer; doubles, capped at 1 s


class ReplicaSet:
    """What both ways of placing share: the replicas with room ranked (`Ranked`, so placing
    a page does not look at every replica), the pages out, pauses and ejections, and the share
    taken afresh when there is news. A subclass says how a replica ranks (`_rank`), when it
    has room (`_open`), what an answer says of it (`_heard`) and how the fleet is probed."""

    mode = ""  # its name, for /fleet
    resolves = False  # its replicas come from a name re-resolved (`refresh`)
    balanced = False  # behind one balancer (gateway.flow.share's rules for it)

    def __init__(self, *, urls: list[str] | None = None, probe: Probe, eject_s: float = 10.0,
                 limits: LimitSettings = LimitSettings(), fleet: FleetView | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.eject_s = eject_s
        self.limits = limits
        self.fleet = fleet or FleetView()
        self.fleet.balanced = self.balanced
        self.probe = probe
        self.clock = clock
        self.health_s = 0.0  # the health interval, once probing runs (gateway.flow.health)
        self.stopped = threading.Event()
        self.news = threading.Event()  # this process went quiet or got busy: tell the fleet
        self._lock = threading.Lock()
        self._replicas: dict[str, Replica] = {}
        self._room = {False: Ranked(), True: Ranked()}  # urgent? -> replicas with room
        self._changes: list[tuple[float, str]] = []  # (when, url): its room may change then
        self._due: dict[str, float] = {}  # url -> the soonest such time queued for it
        self._out = 0  # pages this process has out, at every replica
        self._removed = 0  # replicas gone from DNS with pages still out there
        self._balanced_at = float("-inf")
        self._fresh = True  # demand or a board changed since the share was last taken
        self._limit = 1  # pages this process may keep out in all (its share of the fleet)
        self._share: Share | None = None  # the board as last read (`_rebalance`)
        self._quota: int | None = None  # chunks in flight per document, drawn with the share
        self._listeners: list[Callable[[], None]] = []
        for url in urls or []:
            self._add(url)

    # ---- what a placement says -------------------------------------------------------------
    def _take_share(self, now: float) -> tuple[Share, int]:
        """Under the lock: the share now, the pages this process may keep out, and each
        replica's target set."""
        raise NotImplementedError

    def _rank(self, replica: Replica, urgent: bool) -> tuple:
        raise NotImplementedError

    def _open(self, replica: Replica, now: float, urgent: bool) -> bool:
        raise NotImplementedError

    def _heard(self, replica: Replica, said: Mapping[str, int | str | None], finished: int,
               now: float) -> None:
        """Under the lock: what an answer or a probe said of the replica's worker."""
        raise NotImplementedError

    def _answered(self, replica: Replica, ready: bool | None) -> None:
        """Under the lock: it answered (a page: `ready` None; a probe: its readiness)."""

    def _down(self, replica: Replica, now: float) -> None:
        raise NotImplementedError

    def _full_until(self, replica: Replica) -> float:
        """Until when `replica` gets no document page (it said it holds its target)."""
        return float("-inf")

    def probe_all(self, every: bool = False) -> None:
        raise NotImplementedError

    def refresh(self) -> None:
        """Re-resolve the replicas' name (DNS only)."""

    def _unknown(self) -> str:
        return "no OCR replica is known"

    # ---- room ----------------------------------------------------------------------------
    def _add(self, url: str, ready: bool | None = None) -> None:
        self._replicas[url] = replica = Replica(url, target=self.fleet.default_target,
                                                ready=ready)
        self._fresh = True
        self._place(replica, self.clock())

    def _place(self, replica: Replica, now: float) -> None:
        """Under the lock, after anything about `replica` changed: whether it has room now for
        a document page and for an urgent one, and when that may change by itself (a pause
        or an ejection ends, `_full_until`)."""
        for urgent, ranked in self._room.items():
            if self._open(replica, now, urgent):
                ranked.set(replica.url, self._rank(replica, urgent))
            else:
                ranked.discard(replica.url)
        later = [t for t in (replica.busy_until, replica.ejected_until,
                             self._full_until(replica)) if t > now]
        if later and not replica.removed:
            when = min(later)
            if when < self._due.get(replica.url, float("inf")):  # (a sooner one placed it
                self._due[replica.url] = when  # again, and queues what comes after)
                heapq.heappush(self._changes, (when, replica.url))

    def _catch_up(self, now: float) -> None:
        """Under the lock: the replicas whose room changed by itself since (`_place`), and
        the share taken afresh when due."""
        while self._changes and self._changes[0][0] <= now:
            when, url = heapq.heappop(self._changes)
            if self._due.get(url) != when:
                continue  # a sooner time for it came and went: it was placed again then
            del self._due[url]
            replica = self._replicas.get(url)
            if replica is not None:
                self._place(replica, now)
        self._rebalance(now)

    def on_change(self, listener: Callable[[], None]) -> None:
        """`listener()` is called (outside the lock) whenever a replica may have gained room:
        the scheduler waits on it instead of polling."""
        self._listeners.append(listener)

    def _notify(self) -> None:
        for listener in self._listeners:
            listener()

    # ---- the share -----------------------------------------------------------------------
    def set_demand(self, documents: float, finishing: int = 0) -> None:
        """The scheduler's documents with pages to send, and the pages in flight of those
        with none left: this process's weight in the fleet (gateway.flow.share)."""
        before = self.fleet.demand()
        if (documents, finishing) == before:  # told on every page's events: mostly no news
            return
        if self.fleet.set_demand(documents, finishing):
            self.news.set()  # the health thread tells the other gateways
        with self._lock:
            self._fresh = True
            if documents > before[0]:  # a new document: taken into the limit before the next
                # page goes out. Not a page more finishing (an image, each time one comes):
                # taking the share costs in proportion to the fleet, and an image's room
                # never depends on the limit (`acquire`)
                self._balanced_at = float("-inf")

    def _rebalance(self, now: float) -> None:
        """Under the lock: the share taken afresh when there is news, at most every
        REBALANCE_S (and every REBALANCE_IDLE_S without: board entries age out); only the
        replicas whose target changed are placed again."""
        if now < self._rebalance_due():
            return
        self._balanced_at, self._fresh = now, False
        before = {url: replica.target for url, replica in self._replicas.items()}
        self._share, self._limit = self._take_share(now)
        self._quota = self._share.document_quota()  # (drawn afresh with the share, `dither`)
        for url, replica in self._replicas.items():
            if replica.target != before.get(url):
                self._place(replica, now)

    def _rebalance_due(self) -> float:
        return self._balanced_at + (REBALANCE_S if self._fresh else REBALANCE_IDLE_S)

    def share(self) -> Share | None:
        """The share as last taken (`look`, `acquire`): quota and rate (gateway.flow.lead);
        None before any."""
        with self._lock:
            return self._share

    # ---- placing -------------------------------------------------------------------------
    def acquire(self, exclude: set[str] = frozenset(), urgent: bool = False,
                failed: set[str] = frozenset()) -> Replica | None:
        """A replica with room for one more page, its in-flight count already raised, or None
        when this process's share is taken or no replica has room now. The best by `_rank`;
        replicas in `exclude` only when no other has room, and those in `failed` (this page
        failed there: a subset of `exclude`) only when no other can take pages at all: the
        page waits for room elsewhere rather than spend its attempts where it failed. An
        `urgent` page (an image) is within this process's share whatever its documents have
        out (`_open`)."""
        with self._lock:
            now = self.clock()
            if len(self._replicas) == self._removed:
                raise NoReplicas(self._unknown())
            self._catch_up(now)
            if not urgent and self._out >= self._limit:
                return None  # this process's share of the fleet is out
            url = self._room[urgent].best(exclude)
            if url is None or (url in failed and self._elsewhere(failed, now)):
                return None
            chosen = self._replicas[url]
            chosen.inflight += 1
            chosen.load += 1
            chosen.sent.append(now)
            self._out += 1
            self._place(chosen, now)
            return chosen

    def _elsewhere(self, failed: set[str], now: float) -> bool:
        """Whether a replica outside `failed` can take pages, if not now (on the path of a
        retry that found room only where it failed)."""
        return any(r.eligible(now) for url, r in self._replicas.items() if url not in failed)

    def look(self) -> Room:
        """Where a page would go now, the share taken afresh first when due (the one call
        besides `acquire` that does): the scheduler's look before it picks a page or waits.
        `next_change`: when a paused or ejected replica gets room back by itself, or news is
        next taken into the share."""
        with self._lock:
            self._catch_up(self.clock())
            times = [self._changes[0][0]] if self._changes else []
            if self._fresh:
                times.append(self._rebalance_due())
            return Room(self._out < self._limit and len(self._room[False]) > 0,
                        len(self._room[True]) > 0, self._quota, min(times, default=None))

    def give_back(self, replica: Replica) -> None:
        """An acquired slot that was not used after all."""
        with self._lock:
            replica.inflight -= 1
            self._out -= 1
            if replica.sent:
                replica.sent.pop()
            self._place(replica, self.clock())
        self._notify()

    def release(self, replica: Replica, attempt: Attempt) -> None:
        """Book the answer of one attempt: its outcome, and what the worker said (its room,
        its id, the fleet board)."""
        self.fleet.heard(attempt.board)
        with self._lock:
            self._fresh = self._fresh or bool(attempt.board)
            replica.inflight -= 1
            self._out -= 1
            if replica.sent:  # a worker answers in the order they were sent (about)
                replica.sent.popleft()
            now = self.clock()
            self._heard(replica, {h.WORKER: attempt.worker, h.CAPACITY: attempt.capacity,
                                  h.FREE: attempt.free, h.HELD: attempt.held}, 1, now)
            self._book(replica, attempt, now)
            if replica.removed and replica.inflight == 0:
                self._forget(replica)
            self._place(replica, now)
        self._notify()

    def _book(self, replica: Replica, attempt: Attempt, now: float) -> None:
        """Under the lock: what the outcome says of the replica."""
        outcome = attempt.outcome
        if outcome is Outcome.BUSY:
            replica.busy_streak += 1
            pause = Backoff(self.limits.busy_pause_s, 1.0, (0.5, 1.0)).delay(replica.busy_streak)
            if attempt.retry_after_s is not None:
                pause = min(pause, attempt.retry_after_s)
            replica.busy_until = now + pause
        elif outcome is Outcome.DOWN:
            self._down(replica, now)
        elif outcome is Outcome.LATER:  # busy with a long page, not full: no pause
            replica.busy_streak = 0
            if attempt.starts_in_s is not None:  # sent to at once, it would refuse again
                replica.room_at = now + max(attempt.starts_in_s, REBALANCE_S)
        else:  # OK, REJECTED, FAILED: the replica is alive and answering
            replica.served += 1
            replica.probation = False
            replica.busy_streak = 0
            self._answered(replica, None)

    def _forget(self, replica: Replica) -> None:
        """Under the lock: a replica gone from DNS, with nothing out there any more."""
        if self._replicas.pop(replica.url, None) is not None:
            self._removed -= 1

    # ---- probes --------------------------------------------------------------------------
    def probe_one(self, replica: Replica) -> None:
        """One /readyz probe carrying this process's board entry, and what it brings back:
        the replica's readiness, its worker, its room and the fleet board."""
        ready, answer = self.probe(replica.url, self.fleet.outgoing())
        self.fleet.heard(answer.get(h.BOARD))
        with self._lock:
            now = self.clock()
            self._answered(replica, ready)
            self._heard(replica, {h.WORKER: answer.get(h.WORKER),
                                  **{k: h.int_header(answer, k)
                                     for k in (h.CAPACITY, h.FREE, h.HELD)}}, 0, now)
            self._fresh = True
            self._place(replica, now)

    def heard_news(self) -> None:
        """Probes brought boards: the share is taken afresh at the next look."""
        with self._lock:
            self._fresh = True
        self._notify()

    def replicas(self) -> list[Replica]:
        with self._lock:
            return [r for r in self._replicas.values() if not r.removed]

    def any_ready(self) -> bool:
        now = self.clock()
        return any(r.ready and r.ejected_until <= now for r in self.replicas())

    def any_not_known_down(self) -> bool:
        """Some replica may take pages (not probed yet, or ready): the front door's test."""
        return any(r.ready is not False for r in self.replicas())
