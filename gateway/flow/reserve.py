"""Workers kept idle for urgent pages, when pages are long.

An urgent page (a one-page interactive request: an image) asks the worker it goes to to start
it soon (START_WITHIN_S, a little longer at each try), and a worker whose page under way ends
later refuses it at once. Where a page takes a couple of seconds, a few tries find a worker
that ends its page soon enough. Where pages take longer than the last try waits
(LONG_PAGE_S), few do; and equal pages
sent together end together, in waves a page time apart, between which no worker would start an
image. So the fleet keeps workers idle for them. Each gateway process measures how many workers
its urgent pages keep busy on average (UrgentLoad: their rate over the last WINDOW_S times
their median time, Little's law) and says it on the board (`u`, while its pages are long);
every process keeps `reserve_for(the fleet's sum)` workers out of its documents' share
(gateway.flow.share): the load and a standard deviation of it (arrivals at random), at most one
worker in 16. Until it knows how long pages take (PageTime), a process with documents keeps the
most (and says its urgent load): documents sent at once would otherwise fill every worker for
the first page time. The documents lose what the images leave of it unused, and the pages a
worker holds beyond the one under way (its target's headroom, which hides the gap before its
next page); what that cost and gave, measured, is in docs/design.md ("What the flow-control
figures showed").

Behind a balancer, nginx sends each page to the emptiest worker, so the documents share the
workers less the reserve and no worker holds a page queued. With a list, every process keeps
the same workers idle (gateway.flow.replicas `_reserve`) and the others keep their page queued:
without, the gap before each worker's next page cost more than the reserve gave. Pure apart
from a lock: the caller gives the time."""

from __future__ import annotations

import itertools
import math
import statistics
import threading
from collections import deque

# an urgent page asks to start within these, one per try (X-Ocr-Start-Within-Ms): a worker
# whose page under way ends later refuses it at once (Outcome.LATER) and the next try goes to
# another; after the last, to whichever worker comes (gateway.scheduler)
START_WITHIN_S = (0.25, 0.35, 0.5, 0.7, 1.0, 1.4, 2.0, 2.8)
LONG_PAGE_S = START_WITHIN_S[-1]  # pages longer (PageTime): workers kept idle for urgent pages
RECENT_PAGES = 32  # the latest pages whose times count (PageTime; UrgentLoad for images)
MAX_SHARE = 1 / 16  # of the workers, at most: a small fleet keeps its throughput
WINDOW_S = 10.0


class UrgentLoad:
    def __init__(self, window_s: float = WINDOW_S):
        self.window_s = window_s
        self._lock = threading.Lock()
        self._done: deque[tuple[float, float]] = deque()  # (answered at, seconds)
        self._since: float | None = None  # the first of the answers in the window was sent

    def record(self, seconds: float, now: float) -> None:
        """An urgent page's attempt that a worker answered, sent `seconds` before `now`."""
        with self._lock:
            if not self._done:
                self._since = now - seconds
            self._done.append((now, seconds))

    def load(self, now: float) -> float:
        """Workers busy with urgent pages, on average over the window (or since the first
        answer in it, when that is more recent): their rate times the median time of the
        last RECENT_PAGES of them; 0 with none. The median, not the mean: an image that
        waited behind a page at a busy worker (the fleet full, at a wave) kept no worker of
        the reserve busy, and counted in, a few such would double the reserve for a whole
        window. Of the last few only: the scheduler asks before each wait, and a median of
        a window's every answer would cost a gateway in proportion to its rate."""
        with self._lock:
            while self._done and self._done[0][0] <= now - self.window_s:
                self._done.popleft()
            if not self._done or self._since is None:
                return 0.0
            span = min(self.window_s, now - self._since)
            recent = itertools.islice(reversed(self._done), RECENT_PAGES)
            own = statistics.median(seconds for _, seconds in recent)
            return len(self._done) * own / max(span, 1e-3)


class PageTime:
    """How long pages take: the median of what the workers that answered the last
    RECENT_PAGES document pages said (X-Ocr-Page-Ms: their engine's moving mean per batch).
    Not the attempts' own times: on a fleet whose workers hold a page in hand most pages wait
    behind another, up to twice their time (their median would call 2 s pages long), and the
    shortest of them is no guide where page times vary (around 4 s ± 75 %, the shortest of 32
    is about a second, and the workers would never be kept idle where it matters most). An
    attempt's time stands in where its worker said nothing (it had read no page before).

    Known only LONG_PAGE_S after the first page was timed: pages sent together come back
    shortest first, so the first to come back say pages are short while the long ones are
    still under way (at 128 replicas of 4 s ± 75 % pages, for about two seconds, in which no
    worker was kept idle for images and they waited behind pages). By then, any page still
    under way is long."""

    def __init__(self, recent: int = RECENT_PAGES):
        self._lock = threading.Lock()
        self._times: deque[float] = deque(maxlen=recent)
        self._first: float | None = None  # when the first page was timed

    def record(self, seconds: float, now: float) -> None:
        with self._lock:
            if self._first is None:
                self._first = now
            self._times.append(seconds)

    def known(self, now: float) -> bool:
        """Pages have been timed for LONG_PAGE_S."""
        with self._lock:
            return self._first is not None and now - self._first >= LONG_PAGE_S

    def long(self) -> bool:
        """Pages are longer than LONG_PAGE_S (False before any is timed)."""
        with self._lock:
            return bool(self._times) and statistics.median(self._times) > LONG_PAGE_S


def reserve_for(load: float, workers: int, page_time_unknown: bool = False) -> int:
    """Workers to keep idle for an urgent load (its mean, in workers): the mean and one of
    its standard deviations (Poisson), in whole workers, and at most MAX_SHARE of the
    `workers`; none for none. While no page has been timed yet (`page_time_unknown`), the most:
    documents sent at once would otherwise fill every worker for a whole page time."""
    most = int(workers * MAX_SHARE)
    if page_time_unknown:
        return most
    if load <= 0:
        return 0
    return min(math.ceil(load + math.sqrt(load)), most)


def others_reserve(live: dict, own_id: str) -> bool:
    """Another process with documents to send says an urgent load (its pages are long, or
    it has timed none yet): `live` is the board's live entries by kind."""
    documents = {e.id for e in live["c"] if e.value > 0 and e.id != own_id}
    return any(e.value > 0 and e.id in documents for e in live["u"])
