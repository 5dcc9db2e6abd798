"""One replica as this gateway process sees it, and the replicas with room, ranked."""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from services.ocr_api.fleet_board import slots_of


class NoReplicas(RuntimeError):
    """No replica is known at all (DNS returned nothing, or the list is empty)."""


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
        """The hard cap of pages in flight here: its target in whole pages, never more than
        the worker's admission slots; one while on probation."""
        if self.probation:
            return 1
        slots = slots_of(self.target)
        return min(slots, self.capacity) if self.capacity else slots

    def has_room(self, now: float) -> bool:
        return self.eligible(now) and self.busy_until <= now and self.inflight < self.slots

    def staleness(self) -> float:
        """The tie-break between replicas that look equally loaded. An empty one heard from
        last is the surest to be empty still. A busy one heard from first is likely the one
        whose running page started first, so the page queued behind it (an image, say)
        starts soonest; one never heard from comes last."""
        if self.load < 1:
            return -self.heard_at
        return self.heard_at if self.heard_at > float("-inf") else float("inf")


class Ranked:
    """The replicas with room, best first by a key (the placement's `_rank`): a heap whose
    entries for a replica whose key has changed, or which has no room any more, are dropped as
    they come to the top. Placing a page costs O(log n) in the replicas, not O(n): the same at
    16 replicas as at 128."""

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
