"""The fleet board: what the gateway processes and the workers of one fleet know of each
other, passed on by gossip in one header (`X-Ocr-Board`) on every page and every answer.

Seven kinds of entries, each stamped by its owner with a sequence number (the newest wins,
so no clock is shared) and carried with its age (seconds since its owner last said it):

- `c`, a **client** (one gateway process): how many documents it has with pages to send
  (its demand). Every gateway's share of the fleet is its demand over the sum of the
  demands of the clients heard from in the last `client_ttl_s`, so equal documents get
  equal shares of the fleet whichever gateway they came through.
- `w`, a **worker** (one worker process): how many pages it should hold to stay busy (its
  target; 0 once it drains). The fleet's slots are the sum of the targets of the workers
  heard from in the last `worker_ttl_s`: behind one load balancer this is how a gateway
  learns how many workers there are, without being told.
- `h`, a client's **finishing pages**: pages in flight of its documents that have nothing left to
  send (an image being read, a document's last pages). They come off the fleet's slots
  before the rest is split by documents, so a gateway busy with images does not take more
  than its documents' share for its long ones.
- `f`, a client's **fleet estimate**: the slots it counts. Every gateway takes the largest
  live estimate, so one that has met the new workers of a scale-up tells the others at once.
- `s`, a client's **send rate**: the chunks per second its documents with pages to send were
  sent at since they came (gateway.flow.lead), so that a document that got ahead in one gateway gives
  the lead back to those in the others.
- `n`, a worker's **gateway processes**: how many clients it has heard of in the last
  REMEMBER_S. A gateway process that gets busy after a quiet spell has often not heard of
  every other one yet (entries expire in seconds, and idle processes meet few workers); the
  workers, which every process probes, have. A process counts them for /fleet, and to know
  that telling the workers it is busy again has someone to reach (gateway.flow.share
  `untold`).
- `u`, a client's **urgent load**: how many workers its interactive pages keep busy on
  average, said while pages are long enough that waiting for one to end would make them late
  (0 otherwise). The fleet keeps that many workers idle for them, and a margin
  (gateway.flow.reserve).

A gateway sends its own entry and everything it knows on each page; a worker merges what it
is sent and answers with its own entry and its board. An entry thus reaches every gateway
within a few round trips, through whichever workers they share. Workers are many, so a
message carries at most `max_workers` worker entries, chosen in turn; and the other clients'
entries that fit in MAX_SENT_CHARS (about 13 gateway processes' worth), in turn too. Pure:
the clock is injected, and nothing here does I/O. Malformed entries, and values or sequence
numbers no real fleet sends, are ignored; a worker takes a board in only from its gateways
(services/ocr_worker/app.py)."""

from __future__ import annotations

import itertools
import math
import re
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from services.ocr_api.headers import BOARD as BOARD_HEADER  # noqa: F401 (re-exported)
MAX_SENT_CHARS = 2048  # nginx's default proxy_buffer_size (4 KiB) holds every answer's headers
MAX_HEADER_CHARS = 2 * MAX_SENT_CHARS  # a longer header is ignored (no fleet's sends one)
KINDS = ("c", "h", "f", "s", "u", "w", "n")
CLIENT_KINDS = ("c", "h", "f", "s", "u")
WORKER_KINDS = ("w", "n")  # only the own are sent: a worker passes on other workers' `w`
REMEMBER_S = 60.0  # a gateway process heard of this recently may still be there
# An owner counts its statements from 1, one at a time: a sequence number past MAX_SEQ, or
# more than MAX_SEQ_STEP ahead of a live entry's, is no owner's and is ignored (it would
# otherwise beat every later true statement)
MAX_SEQ, MAX_SEQ_STEP = 10**9, 10_000
MAX_VALUE = 100_000  # documents, pages or pages per second: more is no real fleet's
_ITEM = re.compile(r"\s*([%s]):([0-9a-z]{1,16}):([0-9]{1,10}):([0-9]{1,10}):([0-9]{1,6})\s*"
                   % "".join(KINDS))  # kind:id:seq:value*100:age*10


@dataclass
class Entry:
    kind: str  # "c": a client's documents, "h": its finishing pages, "f": its fleet estimate,
    # "s": its send rate, "u": its urgent load, "w": a worker's target, "n": the clients a
    # worker heard of (REMEMBER_S)
    id: str
    seq: int
    value: float  # a client's demand (documents), a worker's target (pages)
    heard: float  # local clock time its owner last said it


class Board:
    def __init__(self, *, client_ttl_s: float = 5.0, worker_ttl_s: float = 120.0,
                 max_entries: int = 512, max_workers: int = 8,
                 clock: Callable[[], float] = time.monotonic):
        self.client_ttl_s = client_ttl_s
        self.worker_ttl_s = worker_ttl_s
        self.max_entries = max_entries
        self.max_workers = max_workers
        self.clock = clock
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str], Entry] = {}
        self._turn = itertools.count()
        self._next_client = 0  # the other client whose entries the next header starts with
        self._known: dict[str, float] = {}  # client -> when it last said its demand

    # ---- writing -----------------------------------------------------------------------------
    def say(self, kind: str, id: str, seq: int, value: float) -> None:
        """The owner's own entry, fresh."""
        entry = Entry(kind, id, seq, value, self.clock())
        with self._lock:
            self._note(entry)

    def merge(self, header: str | None) -> None:
        """Take in what another party sent (its `X-Ocr-Board` header)."""
        if not header or len(header) > MAX_HEADER_CHARS:
            return
        now = self.clock()
        entries = [entry for entry in (_parse(item, now) for item in header.split(","))
                   if entry is not None]
        with self._lock:
            for entry in entries:
                self._note(entry)

    def _note(self, entry: Entry) -> None:
        """Under the lock."""
        key = (entry.kind, entry.id)
        old = self._entries.get(key)
        if old is not None and (old.seq, old.heard) >= (entry.seq, entry.heard):
            return  # an older statement, or the same one heard less recently
        if old is not None and entry.seq > old.seq + MAX_SEQ_STEP and self._live(old):
            return  # no owner's next statement
        self._entries[key] = entry
        if entry.kind == "c":
            self._known[entry.id] = max(entry.heard, self._known.get(entry.id, entry.heard))
            if len(self._known) > self.max_entries:
                del self._known[min(self._known, key=self._known.__getitem__)]
        if len(self._entries) > self.max_entries:
            stalest = min(self._entries, key=lambda k: self._entries[k].heard)
            del self._entries[stalest]

    def _ttl(self, kind: str) -> float:
        return self.worker_ttl_s if kind in WORKER_KINDS else self.client_ttl_s

    def _live(self, entry: Entry) -> bool:
        return self.clock() - entry.heard <= self._ttl(entry.kind)

    # ---- reading -----------------------------------------------------------------------------
    def live(self) -> dict[str, list[Entry]]:
        """The entries heard from recently, by kind (KINDS); draining workers are included,
        with target 0."""
        now = self.clock()
        out: dict[str, list[Entry]] = {kind: [] for kind in KINDS}
        ttls = {kind: self._ttl(kind) for kind in KINDS}  # (a gateway reads the board many
        with self._lock:  # times a second, and every worker's entry is on it)
            stale = []
            for key, entry in self._entries.items():
                age, ttl = now - entry.heard, ttls[entry.kind]
                if age <= ttl:
                    out[entry.kind].append(entry)
                elif age > 2 * ttl:
                    stale.append(key)
            for key in stale:
                del self._entries[key]
        return out

    def clients(self) -> list[Entry]:
        return self.live()["c"]

    def workers(self) -> list[Entry]:
        return self.live()["w"]

    def known_clients(self) -> dict[str, float]:
        """The clients heard of in the last REMEMBER_S (live entries or not), and when each
        last said its demand (local clock)."""
        now = self.clock()
        with self._lock:
            for gone in [i for i, heard in self._known.items() if now - heard > REMEMBER_S]:
                del self._known[gone]
            return dict(self._known)

    def header(self, first: Iterable[tuple[str, str]] = (), sent_within_s: float = 0.0) -> str:
        """What to send, at most MAX_SENT_CHARS: the entries keyed in `first` (the sender's
        own), up to `max_workers` other workers, then the other clients' entries (each
        client's together) as many as fit; workers and clients both chosen in turn, so that
        past about 13 other gateway processes every one is still passed on within a few
        messages. `sent_within_s`: the header may go out that long after it is built (a
        gateway reuses its own for gateway.flow.share REBALANCE_S); its ages are told as of then."""
        now = self.clock() + sent_within_s
        wanted = set(first)
        live = self.live()
        own = [e for kind in KINDS for e in live[kind] if (e.kind, e.id) in wanted]
        workers = sorted((e for e in live["w"] if (e.kind, e.id) not in wanted),
                         key=lambda e: e.id)  # ids are random: new and old ones mixed
        by_client: dict[str, list[Entry]] = {}
        for entry in (e for kind in CLIENT_KINDS for e in live[kind]):
            if (entry.kind, entry.id) not in wanted:
                by_client.setdefault(entry.id, []).append(entry)
        clients = [by_client[id] for id in sorted(by_client)]
        with self._lock:
            turn, start = next(self._turn), self._next_client
        workers = _in_turn(workers, turn * self.max_workers)[:self.max_workers]
        text, _ = _fit("", [own, *([e] for e in workers)], now)
        text, sent = _fit(text, _in_turn(clients, start), now)
        with self._lock:
            self._next_client = start + sent
        return text


def _in_turn(items: list, start: int) -> list:
    """The items from the `start`-th on (modulo their number), then the ones before."""
    start = start % len(items) if items else 0
    return items[start:] + items[:start]


def _fit(text: str, groups: Iterable[list[Entry]], now: float) -> tuple[str, int]:
    """`text` with whole groups of entries added, in order, while it stays within
    MAX_SENT_CHARS; and how many groups were added."""
    added = 0
    for group in groups:
        longer = ",".join(filter(None, [text, *(_format(e, now) for e in group)]))
        if len(longer) > MAX_SENT_CHARS:
            break
        text, added = longer, added + 1
    return text, added


def _format(entry: Entry, now: float) -> str:
    """An entry as sent. Its age is rounded up, never down: passed back and forth between
    gateways and workers many times a second, an entry whose age was rounded to the nearest
    (and told by a header built a moment before it went) came back fresher than its owner
    said it each time, since a fresher copy wins; an old `c` entry of a process stayed
    seconds younger than it was: news older than a fresher statement passed for it."""
    age = max(0, math.ceil((now - entry.heard) * 10 - 0.01))  # (a millisecond is none)
    return f"{entry.kind}:{entry.id}:{entry.seq}:{round(entry.value * 100)}:{age}"


def _parse(item: str, now: float) -> Entry | None:
    """`kind:id:seq:value*100:age*10`, or None when anything is off."""
    match = _ITEM.fullmatch(item)
    if match is None:
        return None
    kind, id, seq, value, age = match.groups()
    if int(value) > MAX_VALUE * 100 or int(seq) > MAX_SEQ:
        return None
    return Entry(kind, id, int(seq), int(value) / 100.0, now - int(age) / 10.0)


def slots_of(target: float) -> int:
    """Whole pages for a target (a worker's `w`): a sliver (under 5 %) is none."""
    return max(0, math.ceil(target - 0.05))
