"""Which replica gets the next page, and how many pages this process keeps out.

The replica set is one load-balancer URL (nginx, a ClusterIP Service), a fixed list of worker
URLs, or a DNS name re-resolved periodically (a k8s headless Service). How many pages this
gateway process keeps outstanding follows the fleet (gateway.flow.share): its share of the sum of
the workers' targets (each worker says how many pages keep it busy), shared between gateway
processes by their documents. So workers are kept just busy (about one page running,
sometimes one waiting), everything beyond waits in the gateway's fair queue, where a 1-page
request can overtake a 300-page one, and `kubectl scale` is room without configuration.

Behind one load balancer, the balancer spreads the pages (nginx `least_conn`). With a list
or DNS name the gateway picks: the replica whose worker had the fewest pages when it last
answered (X-Ocr-Held: its pages but images, on every answer and probe), counting what this
process sent it since, never more of its own there than the worker's target; among equals,
`_staleness`. The replicas with room are kept ranked as answers come (`Ranked`), so placing
a page costs about the same at 16 replicas as at 128. A ready replica that answered a page
within three health intervals is not probed (its room is known).

What a worker said is a while old, and several placing processes (gateways, and the gunicorn
processes in each) act on it at once: all would see the same worker as the emptiest and
queue a page each there while others idle. So each document page asks the worker to
refuse it beyond its target (`X-Ocr-Within-Target`, services/ocr_worker/service.py
`_admit`): a refusal is Outcome.LATER (no pause, no attempt spent, the next try goes
elsewhere), it says the worker's room now, and when its page under way ends, until which
this process sends it no document page (`_full_until`).

An urgent page (an image: one page, interactive) goes out at once, asking to start soon
(gateway.scheduler, START_WITHIN_S): an idle worker takes it (nginx `least_conn` and the
emptiest-first pick above find one if there is one); a busy worker whose page under way ends
later refuses it at once (Outcome.LATER: no pause, no attempt spent), and the next try goes
to another (the balancer rotates; with a list, one not tried yet). Sent into a full fleet
without asking, it would wait behind a whole page at whichever worker it met. With a list,
an image goes first to an idle worker kept for urgent pages (`_reserve`: the same ones in
every process, while the fleet keeps some, gateway.flow.reserve), else to one idle, else to the
one where this process's oldest page out was sent (`_rank`).

Busy is not down: a 503/429 (not a LATER) pauses the replica briefly (a short, growing
pause) and never ejects it. Only connection errors and timeouts eject a replica (not in
load-balancer mode: nginx does its own passive health checks). An ejected replica is on
probation: after `eject_s` it gets one trial page at a time, and only a real answer ends
probation; a readiness probe alone does not re-admit a replica that timed out.

Probes (and pages) carry this process's entry on the fleet board and bring back the workers'
boards. Behind a balancer, probes also find the workers not met yet: rounds through the
balancer, each twice as large as the last while it meets new workers. Thread-safe; the
network calls (probe, resolve) and the clock are injected so all of this is tested without a
network."""

from __future__ import annotations

import heapq
import logging
import random
import socket
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Mapping

from services.ocr_api import headers as h
from services.ocr_api.fleet_board import slots_of

from ..backoff import Backoff
from .share import MAX_PROBE_ROUND, FleetView, Share, dither
from ..outcome import Attempt, Outcome

log = logging.getLogger("gateway.flow.replicas")

MODE_LOAD_BALANCER = "load_balancer"
MODE_LIST = "list"
MODE_DNS = "dns"
REBALANCE_S = 0.05  # the share follows news (demand, boards) at most this often...
REBALANCE_IDLE_S = 1.0  # ...and at least this often (board entries age out)
TELL_GAP_S = 0.5  # "this process went quiet / woke" is told by probes at most this often
SETTLE_PROBES = 4  # after waking, probes that hear who else woke (each worker tells all)
FULL_FOR_S = 1.0  # a worker that said it holds its target, without when (`_full_until`)
REFUSED_FOR_S = 0.05  # ...and at least this long after it refused a page (`release`)
WORKER_ID_TTL_S = 120.0  # a worker process not heard behind a URL this long is forgotten
PROBES_PER_ROUND = 16  # ready replicas a health round probes at most (the longest unheard)

# probe(url, headers) -> (ready, the answer's headers)
Probe = Callable[[str, Mapping[str, str]], "tuple[bool, Mapping[str, str]]"]


class NoReplicas(RuntimeError):
    """No replica is known at all (DNS returned nothing, or the list is empty)."""


@dataclass(frozen=True)
class LimitSettings:
    busy_pause_s: float = 0.05  # first pause after a busy answer; doubles, capped at 1 s


@dataclass
class Replica:
    url: str
    target: float = 2.0  # pages its worker(s) hold to stay busy; behind a balancer: our share
    load: float = 0.0  # pages its worker had at its last answer or probe, plus ours sent since
    heard_at: float = float("-inf")  # when it last said so
    inflight: int = 0
    ready: bool | None = None  # None: not probed yet
    ejected_until: float = 0.0
    probation: bool = False  # one trial page at a time until a real answer comes back
    busy_until: float = 0.0
    busy_streak: int = 0
    removed: bool = False
    served: int = 0
    capacity: int | None = None  # the worker's admission slots (X-Ocr-Capacity)
    room_at: float = float("-inf")  # when its page under way ends, as it last refused one
    sent: deque[float] = field(default_factory=deque)  # when each of ours out there was sent
    workers: dict[str, float] = field(default_factory=dict)  # worker process id -> heard at

    def eligible(self, now: float) -> bool:
        return not self.removed and self.ejected_until <= now and self.ready is not False

    @property
    def slots(self) -> int:
        if self.probation:
            return 1
        slots = slots_of(self.target)
        return min(slots, self.capacity) if self.capacity else slots

    def has_room(self, now: float) -> bool:
        return self.eligible(now) and self.busy_until <= now and self.inflight < self.slots


def _staleness(replica: Replica) -> float:
    """The tie-break between replicas that look equally loaded. An empty one heard from
    last is the surest to be empty still. A busy one heard from first is likely the one
    whose running page started first, so the page queued behind it (an image, say) starts
    soonest; one never heard from comes last."""
    if replica.load < 1:
        return -replica.heard_at
    return replica.heard_at if replica.heard_at > float("-inf") else float("inf")


def resolve_host(host: str, port: int) -> list[str]:
    """Every address `host` resolves to, as worker base URLs (the k8s headless-Service way)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    urls = []
    for family, _, _, _, sockaddr in infos:
        address = sockaddr[0]
        netloc = f"[{address}]:{port}" if family == socket.AF_INET6 else f"{address}:{port}"
        urls.append(f"http://{netloc}")
    return sorted(set(urls))


class Ranked:
    """The replicas with room, best first by a key (`ReplicaSet._rank`): a heap whose entries
    for a replica whose key has changed, or which has no room any more, are dropped as they
    come to the top. Placing a page costs O(log n) in the replicas, not O(n): the same at 16
    replicas as at 128."""

    def __init__(self):
        self._heap: list[tuple[tuple, str]] = []
        self._keys: dict[str, tuple] = {}  # url -> its key now (absent: no room)

    def __len__(self) -> int:
        return len(self._keys)

    def set(self, url: str, key: tuple) -> None:
        if self._keys.get(url) != key:
            self._keys[url] = key
            heapq.heappush(self._heap, (key, url))
            if len(self._heap) > 4 * len(self._keys) + 64:  # stale entries: start afresh
                self._heap = [(k, u) for u, k in self._keys.items()]
                heapq.heapify(self._heap)

    def discard(self, url: str) -> None:
        self._keys.pop(url, None)

    def best(self, avoid: set[str] = frozenset()) -> str | None:
        """The best replica not in `avoid`, else the best of those; None when none has room."""
        skipped, found = [], None
        while self._heap:
            key, url = self._heap[0]
            if self._keys.get(url) != key:
                heapq.heappop(self._heap)  # stale
            elif url in avoid:
                skipped.append(heapq.heappop(self._heap))
            else:
                found = url
                break
        for item in skipped:
            heapq.heappush(self._heap, item)
        return found if found is not None or not skipped else skipped[0][1]


class ReplicaSet:
    def __init__(self, *, mode: str, urls: list[str] | None = None, dns: str | None = None,
                 probe: Probe, resolver: Callable[[str, int], list[str]] = resolve_host,
                 eject_s: float = 10.0, limits: LimitSettings = LimitSettings(),
                 fleet: FleetView | None = None, clock: Callable[[], float] = time.monotonic):
        self.mode = mode
        self.dns = dns
        self.eject_s = eject_s
        self.limits = limits
        self.fleet = fleet or FleetView()
        self.fleet.balanced = mode == MODE_LOAD_BALANCER
        self._probe = probe
        self._resolver = resolver
        self._clock = clock
        self._lock = threading.Lock()
        self._replicas: dict[str, Replica] = {}
        self._room = {False: Ranked(), True: Ranked()}  # urgent? -> replicas with room
        self._changes: list[tuple[float, str]] = []  # (when, url): its room may change then
        self._due: dict[str, float] = {}  # url -> the soonest such time queued for it
        self._out = 0  # pages this process has out, at every replica
        self._removed = 0  # replicas gone from DNS with pages still out there
        self._balanced_at = float("-inf")
        self._news = True  # demand or a board changed since the last rebalance
        self._limit = 1  # pages this process may keep out in all (its share of the fleet)
        self._quota: int | None = None  # chunks in flight per document (gateway.flow.share)
        self._share: Share | None = None  # the board as last read (`_rebalance`)
        self._reserved: frozenset[str] = frozenset()  # with a list: kept for urgent pages
        self._probe_skip_s = 0.0  # the health interval, once probing runs
        self._stop = threading.Event()
        self._wake = threading.Event()  # the health thread: stop, or tell the fleet news
        self._listeners: list[Callable[[], None]] = []
        for url in urls or []:
            self._add(url, ready=True if mode == MODE_LOAD_BALANCER else None)

    def _add(self, url: str, ready: bool | None = None) -> None:
        self._replicas[url] = replica = Replica(url, target=self.fleet.default_target,
                                                ready=ready)
        self._news = True
        self._place(replica, self._clock())

    def _place(self, replica: Replica, now: float) -> None:
        """Under the lock, after anything about `replica` changed: whether it has room now for
        a document page and for an urgent one (the ranked replicas `acquire` takes from), and
        when that may change by itself (a pause or an ejection ends, `_full_until`)."""
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
        """Under the lock: the replicas whose room changed by itself since (`_place`)."""
        while self._changes and self._changes[0][0] <= now:
            when, url = heapq.heappop(self._changes)
            if self._due.get(url) != when:
                continue  # a sooner time for it came and went: it was placed again then
            del self._due[url]
            replica = self._replicas.get(url)
            if replica is not None:
                self._place(replica, now)

    def on_change(self, listener: Callable[[], None]) -> None:
        """`listener()` is called (outside the lock) whenever a replica may have gained room:
        the scheduler waits on it instead of polling."""
        self._listeners.append(listener)

    def _notify(self) -> None:
        for listener in self._listeners:
            listener()

    def set_demand(self, documents: float, held: int = 0) -> None:
        """The scheduler's documents with pages to send, and the pages in flight of those
        with none left: this process's weight in the fleet (gateway.flow.share)."""
        before = self.fleet.demand()
        if (documents, held) == before:  # told on every page's events: mostly no news
            return
        if self.fleet.set_demand(documents, held):
            self._wake.set()  # the health thread tells the other gateways (`tell`)
        with self._lock:
            self._news = True
            if documents > before[0] or held > before[1]:  # taken into the limit before
                # the next page goes out: a new image's room must not go to a long document
                # in the meantime (less demand, room given back, waits for the next
                # rebalance, REBALANCE_S)
                self._balanced_at = float("-inf")

    # ---- the share -----------------------------------------------------------------------------
    def _rebalance(self, now: float) -> None:
        """Under the lock: this process's limit (its share of the fleet, gateway.flow.share) and
        each replica's target, recomputed when there is news, at most every REBALANCE_S."""
        if now < self._rebalance_due():
            return
        self._balanced_at, self._news = now, False
        before = {url: replica.target for url, replica in self._replicas.items()}
        reserved = self._reserved
        if self.mode == MODE_LOAD_BALANCER:
            share = self.fleet.share()
            self._limit = share.limit(self.fleet.default_target)
            for replica in self._replicas.values():
                replica.target = self._limit
        else:
            known = self.fleet.share()
            for replica in self._replicas.values():
                replica.target = known.target_of(replica.workers, self.fleet.default_target)
            fleet = sum(r.target for r in self._replicas.values() if r.eligible(now))
            share = self.fleet.share(replica_slots=fleet or None)
            self._limit = max(1, dither(share.fraction * fleet))
            self._reserved = self._reserve(share.reserve, now)
        self._quota = share.document_quota()
        self._share = share
        changed = reserved ^ self._reserved  # a replica's room follows its target and whether
        changed |= {url for url, replica in self._replicas.items()  # it is kept for images
                    if replica.target != before[url]}
        for url in changed & self._replicas.keys():  # (one kept before may be gone)
            self._place(self._replicas[url], now)

    def _reserve(self, count: int, now: float) -> frozenset[str]:
        """With a list: the replicas kept idle for urgent pages while the fleet keeps
        `count` workers so (gateway.flow.reserve), the same in every gateway process (the first by
        a hash of their URLs: each has the same list). Each process knows which workers its
        own pages fill, and of the others only what their answers told it a while ago: idle
        workers left by the arithmetic alone would be anywhere, and an image would look for
        one among scores that only look idle."""
        ranked = sorted((r.url for r in self._replicas.values() if r.eligible(now)),
                        key=lambda url: (zlib.crc32(url.encode()), url))
        return frozenset(ranked[:count])

    def share(self) -> Share | None:
        """The fleet board as last read: quota and rate (gateway.flow.lead); None before any."""
        with self._lock:
            self._rebalance(self._clock())
            return self._share

    def document_quota(self) -> int | None:
        """Chunks in flight one document may have: its equal part of the fleet."""
        with self._lock:
            self._rebalance(self._clock())
            return self._quota

    # ---- selection ---------------------------------------------------------------------------
    def acquire(self, exclude: set[str] = frozenset(), urgent: bool = False) -> Replica | None:
        """A replica with room for one more page, its in-flight count already raised, or None
        when this process's share is taken or no replica has room now. The best by `_rank`
        (the emptiest first), kept ranked as answers come (`Ranked`); replicas in `exclude`
        (this page already failed there) only when no other has room. An `urgent` page (an
        image) is within this process's share whatever its documents have out (`_open`)."""
        with self._lock:
            now = self._clock()
            if len(self._replicas) == self._removed:
                raise NoReplicas("no OCR replica is known"
                                 + (f" (DNS name {self.dns} has no addresses)" if self.dns else ""))
            self._catch_up(now)
            self._rebalance(now)
            if not urgent and self._out >= self._limit:
                return None  # this process's share of the fleet is out
            url = self._room[urgent].best(exclude)
            if url is None:
                return None
            chosen = self._replicas[url]
            chosen.inflight += 1
            chosen.load += 1
            chosen.sent.append(now)
            self._out += 1
            self._place(chosen, now)
            return chosen

    def _rank(self, replica: Replica, urgent: bool) -> tuple[float, float]:
        """The emptiest first; among equals, `_staleness`. An urgent page with a list: an
        idle one first, else the one where this process's oldest page out was sent first.
        The urgent page is read before the pages queued there (X-Ocr-Priority: high), so
        only the page under way delays it; where every worker holds its target (a full
        fleet of equal pages), which one the worker's answers said least of is no guide to
        which ends soonest, and this process's own pages out are the best it has."""
        if not urgent or self.mode == MODE_LOAD_BALANCER:
            return replica.load, _staleness(replica)
        if replica.load < 1:  # idle: one kept for urgent pages first (`_reserve`)
            return float(replica.url not in self._reserved), _staleness(replica)
        return 2.0, replica.sent[0] if replica.sent else _staleness(replica)

    def has_room(self, urgent: bool = False) -> bool:
        with self._lock:
            now = self._clock()
            self._catch_up(now)
            self._rebalance(now)
            return (urgent or self._out < self._limit) and len(self._room[urgent]) > 0

    def _open(self, replica: Replica, now: float, urgent: bool) -> bool:
        """Room for one more page at `replica`. An urgent page is counted in this process's
        share from the moment it comes (a held page, gateway.flow.share), so it does not wait for
        its documents' pages to come back when the share shrinks under them (a document
        that got ahead is slowed, gateway.flow.lead): behind a balancer, whose one URL holds the
        whole share, only a pause stops it; with a list, a worker it fits at."""
        if urgent and self.mode == MODE_LOAD_BALANCER:
            return replica.eligible(now) and replica.busy_until <= now
        if not urgent and (now < self._full_until(replica) or replica.url in self._reserved):
            return False  # it would be refused there (`_full_until`), or kept for an image
        return replica.has_room(now)

    def _full_until(self, replica: Replica) -> float:
        """With a list, until when a worker that said it holds its target's pages (each
        document page asks it to refuse one beyond, services/ocr_worker/service.py `_admit`)
        gets no document page from this process: until its page under way ends, as it said
        when it last refused one, else FULL_FOR_S after it said so. Gateway processes each
        place pages by what a worker last told them, and a worker tells each only now and
        then: sent to at once, it would refuse again; tried again a fixed time later whatever
        it said, it would either refuse again and again (refusals cost the gateways' CPU) or
        idle after its page while every process still counted it full."""
        if self.mode == MODE_LOAD_BALANCER or replica.load < replica.slots:
            return float("-inf")
        if replica.room_at >= replica.heard_at:
            return replica.room_at
        return replica.heard_at + FULL_FOR_S

    def _rebalance_due(self) -> float:
        return self._balanced_at + (REBALANCE_S if self._news else REBALANCE_IDLE_S)

    def next_change(self) -> float | None:
        """When a paused or ejected replica gets room back by itself, or news is next taken
        into the share (for the scheduler's wait), or None."""
        with self._lock:
            now = self._clock()
            self._catch_up(now)
            times = [self._changes[0][0]] if self._changes else []
            if self._news:
                times.append(self._rebalance_due())
            return min(times) if times else None

    def give_back(self, replica: Replica) -> None:
        """An acquired slot that was not used after all."""
        with self._lock:
            replica.inflight -= 1
            self._out -= 1
            if replica.sent:
                replica.sent.pop()
            self._place(replica, self._clock())
        self._notify()

    def release(self, replica: Replica, attempt: Attempt) -> None:
        """Book the answer of one attempt: its outcome, and what the worker said (its room,
        its id, the fleet board)."""
        self.fleet.heard(attempt.board)
        with self._lock:
            self._news = self._news or bool(attempt.board)
            replica.inflight -= 1
            self._out -= 1
            if replica.sent:  # a worker answers in the order they were sent (about)
                replica.sent.popleft()
            now = self._clock()
            self._heard_worker(replica, attempt.worker, now)
            self._heard_load(replica, attempt.capacity, attempt.free, finished=1, now=now,
                             held=attempt.held)
            outcome = attempt.outcome
            if outcome is Outcome.BUSY:
                self._busy(replica, now, attempt.retry_after_s)
            elif outcome is Outcome.DOWN:
                self._down(replica, now)
            elif outcome is Outcome.LATER:  # busy with a long page, not full: no pause
                replica.busy_streak = 0
                if attempt.starts_in_s is not None:  # (at least REFUSED_FOR_S: sent to at
                    # once, it would refuse again)
                    replica.room_at = now + max(attempt.starts_in_s, REFUSED_FOR_S)
            else:  # OK, REJECTED, FAILED: the replica is alive and answering
                replica.served += 1
                replica.probation = False
                replica.busy_streak = 0
                if self.mode != MODE_LOAD_BALANCER:
                    replica.ready = True
            if replica.removed and replica.inflight == 0:
                self._forget(replica)
            self._place(replica, now)
        self._notify()

    def _forget(self, replica: Replica) -> None:
        """Under the lock: a replica gone from DNS, with nothing out there any more."""
        if self._replicas.pop(replica.url, None) is not None:
            self._removed -= 1

    def _heard_worker(self, replica: Replica, worker: str | None, now: float) -> None:
        if worker and self.mode != MODE_LOAD_BALANCER:
            replica.workers[worker] = now
            for stale in [w for w, t in replica.workers.items() if now - t > WORKER_ID_TTL_S]:
                del replica.workers[stale]

    def _heard_load(self, replica: Replica, capacity: int | None, free: int | None,
                    finished: int, now: float, held: int | None = None) -> None:
        """What a worker said of its room: the pages it holds now (our own still there
        included; X-Ocr-Held, else all it admitted), or, without the headers (or behind a
        balancer, where each answer is from some worker), one page fewer for each of ours
        that came back. Held leaves out images: one admitted as the page under way ends is
        read in a moment, and counted, the worker would look full (`_full_until`) for
        FULL_FOR_S, idle after it."""
        if capacity is not None and free is not None and self.mode != MODE_LOAD_BALANCER:
            replica.capacity = capacity
            replica.load = float(capacity - free if held is None else held)
            replica.heard_at = now
        else:
            replica.load = max(0.0, replica.load - finished)

    def _busy(self, replica: Replica, now: float, retry_after_s: float | None) -> None:
        replica.busy_streak += 1
        backoff = Backoff(self.limits.busy_pause_s, 1.0, (0.5, 1.0))
        pause = backoff.delay(replica.busy_streak)
        if retry_after_s is not None:
            pause = min(pause, retry_after_s)
        replica.busy_until = now + pause

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
            now = self._clock()
            for url in urls:
                replica = self._replicas.get(url)
                if replica is None:
                    self._add(url)
                    log.info("replica discovered", extra={"replica": url})
                elif replica.removed:
                    replica.removed = False
                    self._removed -= 1
                    self._place(replica, now)
            for url, replica in list(self._replicas.items()):
                if url not in urls and not replica.removed:
                    replica.removed = True
                    self._removed += 1
                    log.info("replica gone from DNS", extra={"replica": url})
                    self._place(replica, now)
                    if replica.inflight == 0:
                        self._forget(replica)
        self._notify()

    def probe_all(self, every: bool = False) -> None:
        """Readiness of every replica, each probe carrying this process's board entry. A
        probe never ends an ejection or a probation: only a real answer does (a replica that
        timed out may answer /readyz and still hang on OCR). Behind a load balancer: rounds
        of probes through it that meet the workers behind it (gateway.flow.share). `every`: also
        the replicas heard from just now (to tell them this process's news). Otherwise every
        replica not known ready, and of the ready ones not heard from in three health
        intervals (an answer says it is alive and its room) the PROBES_PER_ROUND heard from
        longest ago: probing them all would cost a gateway in proportion to the fleet (a
        large one mostly idle but for the few workers its pages keep going to). Each round
        in a random order: among idle workers a page goes to the one heard from last, and
        processes that probed in the same order (the list's) would all send their first
        pages to the same workers, two or more at each while others idle for a page time."""
        if self.mode == MODE_LOAD_BALANCER:
            self._discover(at_least=len(self.fleet.board.workers()) if every else 0)
            return
        now = self._clock()
        replicas = self.replicas()
        if not every:
            unsure = [r for r in replicas if not r.ready]
            quiet = sorted((r for r in replicas if r.ready
                            and now - r.heard_at >= 3 * self._probe_skip_s),
                           key=lambda r: r.heard_at)
            replicas = unsure + quiet[:PROBES_PER_ROUND]
        random.shuffle(replicas)  # an order of its own (above)
        for replica in replicas:
            self.probe_one(replica)
        self._notify()

    def probe_one(self, replica: Replica) -> None:
        """One /readyz probe carrying this process's board entry, and what it brings back:
        the replica's readiness (not behind a balancer: nginx's business), its worker, its
        room and the fleet board."""
        ready, headers = self._probe(replica.url, self.fleet.outgoing())
        self.fleet.heard(headers.get(h.BOARD))
        with self._lock:
            now = self._clock()
            if self.mode != MODE_LOAD_BALANCER:
                replica.ready = ready
            self._heard_worker(replica, headers.get(h.WORKER), now)
            self._heard_load(replica, h.int_header(headers, h.CAPACITY),
                             h.int_header(headers, h.FREE), finished=0, now=now,
                             held=h.int_header(headers, h.HELD))
            self._news = True
            self._place(replica, now)

    def tell(self) -> None:
        """This process went quiet or woke up, and other gateways are on the board: probe
        every worker (behind a balancer, as many probes as workers are known). The other
        gateways hear at their next answers that its share is free or taken, and it hears
        what they hold now, not what they held when it last sent a page."""
        if self.fleet.untold():
            self.probe_all(every=True)

    def settle(self) -> bool:
        """Just woken, with other gateways heard from (FleetView.unsure): a few probes hear
        those that woke meanwhile (documents sent at once wake several, and each tells every
        worker as it wakes), so its share follows their news. The health thread calls it
        every TELL_GAP_S after `tell` while it returns True; once the process is sure again,
        its share is taken afresh."""
        unsure = self.fleet.unsure()
        live = self.replicas() if unsure else []
        start = random.randrange(len(live)) if live else 0
        for index in range(SETTLE_PROBES if live else 0):
            self.probe_one(live[(start + index) % len(live)])
        with self._lock:
            self._news = True
        self._notify()
        return unsure

    def _discover(self, at_least: int = 0) -> None:
        url = next(iter(self._replicas), None)
        while url is not None:
            known = {w.id for w in self.fleet.board.workers()}
            met: set[str] = set()
            for _ in range(min(MAX_PROBE_ROUND, max(at_least, self.fleet.probe_round()))):
                if self._stop.is_set():
                    return
                _, headers = self._probe(url, self.fleet.outgoing())
                self.fleet.heard(headers.get(h.BOARD))
                if headers.get(h.WORKER):
                    met.add(headers[h.WORKER])
            with self._lock:
                self._news = True
            at_least = 0
            if not self.fleet.after_probe_round(bool(met - known)):
                break
            self._notify()
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
        `after_probe` sees the replica list after each round (for metrics). Woken between
        rounds when this process goes quiet or wakes, to `tell` (at most every TELL_GAP_S)."""
        self._probe_skip_s = health_s
        interval = min(health_s, refresh_s) if self.mode == MODE_DNS else health_s

        def loop():
            next_refresh = 0.0
            next_probe = self._clock() + interval
            while not self._stop.is_set():
                now = self._clock()
                try:
                    if now >= next_refresh:
                        self.refresh()
                        next_refresh = now + refresh_s
                    if now >= next_probe:
                        self.probe_all()
                        after_probe(self.replicas())
                        next_probe = now + interval
                    elif self._wake.is_set():
                        self._wake.clear()
                        self.tell()
                        while not self._stop.wait(TELL_GAP_S) and self.settle():
                            pass
                        continue
                except Exception:
                    log.exception("health probe failed")
                self._wake.wait(max(0.0, min(next_probe, next_refresh) - self._clock()))

        self.refresh()
        self.probe_all()
        threading.Thread(target=loop, name="replica-health", daemon=True).start()

    def stop(self) -> None:
        """No more probes; and a last one that says this process holds nothing now, so the
        other gateways take its share at once rather than when its entries expire."""
        self._stop.set()
        self._wake.set()
        self.fleet.set_demand(0, 0)
        url = next(iter(self._replicas), None)
        if url is not None:
            try:
                self._probe(url, self.fleet.outgoing())
            except Exception:  # best effort: the entries expire anyway
                pass
