"""Flow control without a server: busy is not down, adaptive replica limits, probation after
a timeout, the fair queue's order, deadlines, the retry budget and the front door. The
scheduler itself runs against fake replicas (a client object that answers from a script)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from gateway.admission import FrontDoor
from gateway.budget import RetryBudget
from gateway.outcome import Attempt
from gateway.outcome import Outcome, classify
from gateway.flow.queue import BATCH, INTERACTIVE, Document, FairQueue
from gateway.flow.reserve import START_WITHIN_S
from gateway.scheduler import Scheduler, SchedulerSettings
from gateway.split import Chunk
from gateway.flow.share import FleetView, Share
from gateway.flow import PLACEMENTS, BalancedReplicas, LimitSettings, ListedReplicas
from gateway.flow.listed import FULL_FOR_S
from gateway.flow.replicas import REBALANCE_S
from services.ocr_api.fleet_board import Board
from services.ocr_api.errors import ApiError
from tests.conftest import wait_until


class Clock:
    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def replica_set(urls, mode="list", **kwargs):
    return PLACEMENTS[mode](urls=urls, probe=lambda url, headers: (True, {}), **kwargs)


def answer(outcome, **kwargs):
    return Attempt(outcome, None, {}, "", **kwargs)


# ---- outcomes ------------------------------------------------------------------------------
def test_busy_is_not_a_failure_and_only_no_answer_or_gateway_errors_are_down():
    assert classify(503) is Outcome.BUSY and classify(429) is Outcome.BUSY
    assert not Outcome.BUSY.is_failure
    assert classify(None) is Outcome.DOWN and classify(502) is Outcome.DOWN
    assert classify(500) is Outcome.FAILED and Outcome.FAILED.is_failure
    assert classify(422) is Outcome.REJECTED and classify(200) is Outcome.OK
    # a 503 that says when the worker would have started the page: another worker, at once
    assert classify(503, later=True) is Outcome.LATER and not Outcome.LATER.is_failure
    assert classify(429, later=True) is Outcome.BUSY and classify(200, later=True) is Outcome.OK


# ---- replica limits ------------------------------------------------------------------------
def test_a_503_never_ejects_it_pauses_the_replica_briefly_and_longer_each_time():
    clock = Clock()
    replicas = replica_set(["http://a"], clock=clock, fleet=FleetView(default_target=4))
    replicas.probe_all()
    for _ in range(4):
        assert replicas.acquire() is not None
    assert replicas.acquire() is None  # at its allowance: the page waits in the gateway
    a = replicas.replicas()[0]
    replicas.release(a, answer(Outcome.BUSY, retry_after_s=1))
    assert a.ejected_until == 0 and not a.probation and a.ready is not False
    first_pause = a.busy_until - clock.now
    assert 0 < first_pause <= 0.05
    assert replicas.acquire() is None  # paused: nothing goes there for a moment
    pauses = []
    for _ in range(20):  # many busy answers: longer pauses, at most 1 s, never ejected
        a.inflight += 1
        replicas.release(a, answer(Outcome.BUSY))
        pauses.append(a.busy_until - clock.now)
        clock.now += 0.2
    assert max(pauses) <= 1.0 and pauses[-1] > first_pause
    assert a.ejected_until == 0 and replicas.any_ready()
    clock.now += 1.1
    assert replicas.acquire() is a  # the pause ends by itself


def test_a_replica_holds_what_its_worker_says_keeps_it_busy():
    clock = Clock()
    board = Board(clock=clock)
    replicas = replica_set(["http://a", "http://b"], clock=clock,
                           fleet=FleetView(board, default_target=2.0))
    a, b = (replicas.replicas()[i] for i in (0, 1))
    held = [replicas.acquire() for _ in range(4)]
    assert sorted(r.url for r in held) == ["http://a", "http://a", "http://b", "http://b"]
    # the worker behind a says one page keeps it busy (a slow page, a short refill gap)
    board.say("w", "aaaa", 1, 1.05)
    replicas.release(a, answer(Outcome.OK, worker="aaaa", board="w:aaaa:1:105:0"))
    clock.now += 1
    replicas.look().documents  # allowances follow the news
    assert a.slots == 1 and b.slots == 2
    assert replicas.acquire() is None  # a holds one (its allowance), b holds two
    replicas.release(b, answer(Outcome.OK))
    assert replicas.acquire() is b


def test_with_a_list_a_worker_that_said_it_holds_its_target_gets_no_document_page_for_a_moment():
    """Each gateway process places pages by what a worker last told it, and workers tell
    each process only now and then: one that just said it holds its target's pages (another
    process filled it) gets no document page from this one for FULL_FOR_S, an image still.
    Then it is tried again: it may have emptied meanwhile, and a refusal would say if not
    (services/ocr_worker/refusal.py `Refusals.admit`)."""
    clock = Clock()
    replicas = replica_set(["http://a", "http://b"], clock=clock,
                           fleet=FleetView(default_target=2.0))
    full = replicas.acquire()
    other = next(r for r in replicas.replicas() if r is not full)
    replicas.release(full, answer(Outcome.OK, capacity=32, free=30))  # two others' pages
    assert [replicas.acquire(), replicas.acquire(), replicas.acquire()] == [other, other, None]
    assert replicas.acquire(urgent=True) is full  # an image asks to start soon there
    replicas.give_back(full)
    clock.now += FULL_FOR_S
    assert replicas.acquire() is full


def test_with_a_list_a_worker_that_holds_only_an_image_is_not_full_for_documents():
    """A worker counts what it holds without the images (X-Ocr-Held): one that answered with
    an image admitted (read in a moment, before any queued page) gets the next document page
    at once, not after FULL_FOR_S, idle meanwhile."""
    clock = Clock()
    replicas = replica_set(["http://a", "http://b"], clock=clock,
                           fleet=FleetView(default_target=1.0))
    worker = replicas.acquire()
    replicas.release(worker, answer(Outcome.OK, capacity=32, free=31, held=0))  # an image
    assert worker.load == 0 and replicas.acquire() is worker
    replicas.release(worker, answer(Outcome.OK, capacity=32, free=31))  # without the header
    assert worker.load == 1 and replicas.acquire() is not worker


def test_with_a_list_a_worker_that_refused_a_page_is_left_alone_until_its_page_under_way_ends():
    """A worker that refused a document page (it holds its target) said when its page under
    way ends: its room comes back then, not sooner (another try would be refused again) and
    not later (it would idle); the scheduler's wait wakes then."""
    clock = Clock()
    replicas = replica_set(["http://a", "http://b"], clock=clock,
                           fleet=FleetView(default_target=2.0))
    full = replicas.acquire()
    other = next(r for r in replicas.replicas() if r is not full)
    replicas.release(full, answer(Outcome.LATER, capacity=32, free=30, starts_in_s=2.5))
    assert [replicas.acquire(), replicas.acquire(), replicas.acquire()] == [other, other, None]
    assert replicas.look().next_change == pytest.approx(clock.now + 2.5)
    clock.now += FULL_FOR_S
    assert replicas.acquire() is None
    clock.now += 1.5
    assert replicas.acquire() is full
    # a worker that has timed no page cannot tell when its page ends (it says 0 ms): not
    # asked again at once, which would make a loop of refusals for its whole first page
    replicas.release(full, answer(Outcome.LATER, capacity=32, free=30, starts_in_s=0.0))
    assert replicas.acquire() is None  # (the other holds its two)
    clock.now += REBALANCE_S
    assert replicas.acquire() is full


def test_with_a_list_every_process_keeps_the_same_workers_idle_for_images():
    """While the fleet keeps workers idle for urgent pages (pages long, or none timed yet,
    gateway.flow.reserve), every process leaves the same ones (the first by a hash of their URLs)
    out of its documents' pages and sends its images there first. Left by the arithmetic
    alone, the idle workers would be wherever the others' pages were not, and each process
    knows of those only what their answers told it a while ago."""
    urls = [f"http://10.0.0.{i}:8101" for i in range(32)]
    placed, images = [], []
    for order in (urls, urls[::-1]):  # two processes, each its own list order
        board = Board()
        for i in range(32):
            board.say("w", f"w{i:02d}", 1, 1.0)
        replicas = ListedReplicas(urls=order, probe=lambda url, h: (True, {}),
                              fleet=FleetView(board, default_target=1.0))
        replicas.set_demand(1)
        replicas.fleet.set_urgent(0.0, page_time_unknown=True)  # (the scheduler's)
        taken = set()
        while (replica := replicas.acquire()) is not None:
            taken.add(replica.url)
        placed.append(set(urls) - taken)
        images.append(replicas.acquire(urgent=True).url)
    assert len(placed[0]) == 2 and placed[0] == placed[1]  # one in 16, the same two
    assert images[0] in placed[0] and images[1] in placed[0]


def test_the_workers_kept_idle_follow_the_replicas_that_can_take_pages():
    """The replicas kept idle for images are the first by a hash of their URLs among those
    that can take pages: one that is not ready is passed over, and when DNS changes the
    replica set the choice is made afresh from the new set."""
    import zlib

    from gateway.flow import DnsReplicas

    def first_by_hash(urls, count=2):
        return set(sorted(urls, key=lambda url: (zlib.crc32(url.encode()), url))[:count])

    def kept_idle(replicas):
        taken = set()
        while (replica := replicas.acquire()) is not None:
            taken.add(replica.url)
        for url in taken:
            replicas.give_back(next(r for r in replicas.replicas() if r.url == url))
        return {r.url for r in replicas.replicas() if r.ready} - taken

    clock = Clock()
    addresses = [[f"http://10.0.0.{i}:8101" for i in range(32)]]
    dead = sorted(first_by_hash(addresses[0], 1))[0]
    board = Board(clock=clock)
    for i in range(32):
        board.say("w", f"w{i:02d}", 1, 1.0)
    replicas = DnsReplicas(dns="workers:8101", resolver=lambda host, port: addresses[-1],
                           probe=lambda url, h: (url != dead, {}), clock=clock,
                           fleet=FleetView(board, default_target=1.0))
    replicas.refresh()
    replicas.probe_all(every=True)
    replicas.set_demand(1)
    replicas.fleet.set_urgent(0.0, page_time_unknown=True)  # (the scheduler's)
    assert kept_idle(replicas) == first_by_hash(set(addresses[0]) - {dead})
    addresses.append([f"http://10.0.1.{i}:8101" for i in range(32)])  # the pods moved
    replicas.refresh()
    replicas.probe_all(every=True)
    clock.now += 1.0
    assert kept_idle(replicas) == first_by_hash(addresses[1])


def test_with_a_list_an_image_in_a_full_fleet_goes_where_this_processs_oldest_page_is():
    """Every worker holds a page: an image (read before the pages queued there) waits for the
    page under way, so it goes where this process's oldest page out was sent, not to the
    busy worker heard from first (what the workers say is older news)."""
    clock = Clock()
    replicas = ListedReplicas(urls=["http://a", "http://b", "http://c"],
                          clock=clock, fleet=FleetView(default_target=2.0),
                          probe=lambda url, h: (True, {"X-Ocr-Capacity": "32",
                                                       "X-Ocr-Free": "31"}))
    order = []
    for _ in range(3):
        order.append(replicas.acquire())
        clock.now += 1.0
    assert len({r.url for r in order}) == 3
    for replica in reversed(order):  # each says it holds one page: the last heard first
        replicas.probe_one(replica)
        clock.now += 1.0
    assert replicas.acquire(urgent=True) is order[0]
    replicas.give_back(order[0])
    replicas.release(order[0], answer(Outcome.OK))  # its page came back: now the next
    assert replicas.acquire(urgent=True) is order[1]


def test_with_a_list_document_pages_ask_the_worker_to_refuse_them_beyond_its_target():
    """X-Ocr-Within-Target: 1 on each document page sent to a worker the gateway picked (a
    list), not on images (they ask to start soon instead) nor behind a balancer (nginx
    picks the worker: a refusal would pause the whole fleet's URL)."""
    from types import SimpleNamespace

    from gateway.dispatch import DispatchSettings, ReplicaClient
    from gateway.flow import Replica

    sent = []

    class Connections:
        def request(self, method, url, path, *, headers, body, connect_s, read_s):
            sent.append(headers.get("X-Ocr-Within-Target"))
            return SimpleNamespace(status=200, data=b'{"result": {}}', headers={})

    for balanced in (False, True):
        client = ReplicaClient(Connections(), DispatchSettings(5.0, 1.0, balanced=balanced),
                               FleetView())
        for first in (False, True):
            client.post(Replica("http://w"), b"{}", log_id="t",
                        deadline=time.monotonic() + 5, first=first)
    assert sent == ["1", None, None, None]


def test_a_load_balancer_allowance_is_the_share_of_the_workers_behind_it():
    clock = Clock()
    board = Board(clock=clock)
    replicas = replica_set(["http://nginx"], mode="load_balancer", clock=clock,
                           fleet=FleetView(board, default_target=2.0))
    lb = replicas.replicas()[0]
    assert replicas.acquire() and replicas.acquire() and replicas.acquire() is None
    # 64 workers answer through the balancer, each holding 1.5 pages: the limit follows
    for i in range(64):
        lb.inflight += 1
        replicas.release(lb, answer(Outcome.OK, worker=f"w{i}",
                                    board=f"w:w{i}:1:150:0"))
    clock.now += 1
    replicas.look().documents
    assert lb.slots == 96
    # another gateway process with 3 documents to this one's 1: a quarter is ours
    replicas.set_demand(1)
    lb.inflight += 1
    replicas.release(lb, answer(Outcome.OK, board="c:zzzz:1:300:0"))
    clock.now += 1
    replicas.look().documents
    assert lb.slots == 24
    lb.inflight += 1
    replicas.release(lb, answer(Outcome.DOWN))
    assert lb.ejected_until == 0  # nginx ejects its own workers


def test_a_replica_that_timed_out_is_readmitted_only_by_a_real_answer():
    clock = Clock()
    replicas = replica_set(["http://a"], clock=clock, eject_s=10)
    a = replicas.acquire()
    replicas.release(a, answer(Outcome.DOWN))
    replicas.probe_all()  # /readyz says ready: not enough
    assert replicas.acquire() is None
    clock.now += 11
    trial = replicas.acquire()
    assert trial is not None and trial.probation
    assert replicas.acquire() is None  # one trial page at a time
    replicas.release(trial, answer(Outcome.OK))
    assert not a.probation
    assert replicas.acquire() is not None and replicas.acquire() is not None


# ---- the fair queue ------------------------------------------------------------------------
def doc(pages, priority=INTERACTIVE, deadline=1e9):
    groups = [(i,) for i in range(pages)]
    return Document(groups, PageCutter(), log_id="t", deadline=deadline,
                    kind="pdf", priority=priority)


def test_a_small_document_takes_the_next_free_slot_behind_long_ones():
    fair = FairQueue()
    long_docs = [doc(40) for _ in range(8)]
    for d in long_docs:
        fair.add(d)
    for _ in range(16):  # two rounds are in flight
        picked = fair.pick(0)
        picked.take(0)
        picked.inflight += 1
    assert [d.inflight for d in long_docs] == [2] * 8  # equal shares, in turn
    small = doc(1)
    fair.add(small)
    assert fair.pick(0) is small  # not after 320 pages, not even after one round


def test_documents_share_slots_round_robin():
    fair = FairQueue()
    docs = [doc(10) for _ in range(3)]
    for d in docs:
        fair.add(d)
    order = []
    for _ in range(6):
        picked = fair.pick(0)
        picked.take(0)
        order.append(docs.index(picked))
    assert order == [0, 1, 2, 0, 1, 2]


def test_a_document_at_its_fleet_quota_leaves_the_room_to_the_others():
    fair = FairQueue()
    long_doc, image = doc(40), doc(1)
    fair.add(long_doc)
    long_doc.inflight = 3
    assert fair.pick(0, quota=3) is None  # at its equal part of the fleet: it waits
    fair.add(image)
    assert fair.pick(0, quota=3) is image
    assert fair.pick(0, quota=4) in (long_doc, image)


def test_a_document_that_got_ahead_holds_its_weight_of_the_slots():
    fair = FairQueue()
    ahead, behind = doc(40), doc(40)
    ahead.weight.value = 0.5  # gateway.flow.lead: two quotas ahead of the fleet
    for d in (ahead, behind):
        fair.add(d)
    while (picked := fair.pick(0, quota=4)) is not None:
        picked.take(0)
        picked.inflight += 1
    assert (ahead.inflight, behind.inflight) == (2, 4)  # half a quota, and a whole one


def test_a_waves_lead_keeps_the_weight_and_one_that_lasts_a_page_time_steps_it_down():
    """Right after a wave every process sees its documents a quota ahead of the fleet's rate
    (the others' rates are a second old), and slowing them all at once idled a third of 64
    workers (gateway.flow.lead). The scheduler weighs a document by its mean lead over the last
    page time: a wave's is over in a moment."""
    scheduler = Scheduler(replica_set(["http://a"]), ScriptedClient(lambda *a: 200),
                          ThreadPoolExecutor(1), SchedulerSettings(), RetryBudget())
    scheduler.executor.shutdown()  # never started: only the weighing is looked at
    now = time.monotonic()
    d = Document([(i,) for i in range(120)], PageCutter(), log_id="t",
                 deadline=now + 60, kind="pdf")
    d.admitted_at = now - 8.0
    scheduler.fair.add(d)
    scheduler.demand.page_timed(2.0)
    scheduler.replicas.share = lambda: Share(0.5, 64.0, quota=8.0, rate=3.0)

    def weigh(at: float, ahead: float) -> float:
        d.sent = round(3.0 * (at - d.admitted_at + 2.0) + ahead)  # the fleet's rate, and more
        scheduler.reweigh(at)
        return d.weight.value

    assert weigh(now, 0) == 1.0
    assert weigh(now + 1.9, 0) == 1.0
    assert weigh(now + 2.0, 24) == 1.0  # three quotas, but only for a moment (a wave)
    assert weigh(now + 2.1, 0) == 1.0
    assert weigh(now + 4.0, 12) == 1.0
    assert weigh(now + 6.1, 12) == 0.75  # a quota and a half, for a page time: a step down
    assert weigh(now + 6.7, 12) == 0.5


def test_a_document_ahead_of_its_process_gives_room_to_the_one_behind():
    """Two documents of one process, a quota ahead of and behind their process's rate: the
    one behind may keep more chunks in flight than a quota, the one ahead fewer (and its
    lead on the fleet, a quota too, slows it as well)."""
    scheduler = Scheduler(replica_set(["http://a"]), ScriptedClient(lambda *a: 200),
                          ThreadPoolExecutor(1), SchedulerSettings(), RetryBudget())
    scheduler.executor.shutdown()  # never started: only the weighing is looked at
    now = time.monotonic()
    ahead, behind = (Document([(i,) for i in range(120)], PageCutter(), log_id=name,
                              deadline=now + 60, kind="pdf") for name in ("ahead", "behind"))
    for d, sent in ((ahead, 30 + 8), (behind, 30 - 8)):  # 3 chunks/s over 8 s and a page
        d.admitted_at, d.sent = now - 8.0, sent
        scheduler.fair.add(d)
    scheduler.demand.page_timed(2.0)
    scheduler.replicas.share = lambda: Share(0.5, 64.0, quota=8.0, rate=2.0)
    scheduler.reweigh(now)
    assert ahead.share < 1.0 < behind.share
    while (picked := scheduler.fair.pick(now, quota=8)) is not None:
        picked.take(now)
        picked.inflight += 1
    assert ahead.inflight < 8 < behind.inflight


def test_room_for_an_urgent_page_only_goes_to_an_urgent_document():
    fair = FairQueue()
    long_doc, image = doc(40), doc(1)
    fair.add(long_doc)
    assert not fair.has_urgent(0) and fair.pick(0, urgent_only=True) is None
    fair.add(image)
    assert fair.has_urgent(0) and fair.pick(0, urgent_only=True) is image


def test_a_document_past_its_deadline_is_never_picked_even_before_it_is_stopped():
    """The scheduler stops expired documents every REBALANCE_S, not on every page: until then,
    the queue itself passes them over (nothing is sent with no time left to read it)."""
    fair = FairQueue()
    late, other = doc(3, deadline=10.0), doc(3, deadline=100.0)
    fair.add(late)
    fair.add(other)
    assert fair.pick(9.0) is late
    assert not late.stopped and fair.pick(10.0) is other and fair.pick(10.0) is other
    assert fair.expire(10.0) == [late] and late.stopped


def test_interactive_documents_go_before_batch_ones():
    fair = FairQueue()
    batch = doc(10, priority=BATCH)
    interactive = doc(2)
    fair.add(batch)
    fair.add(interactive)
    picks = [fair.pick(0) for _ in range(2)]
    for picked in picks:
        picked.take(0)
    assert picks == [interactive, interactive]
    assert fair.pick(0) is batch


def test_a_put_back_chunk_goes_out_first_and_a_retry_waits_its_backoff():
    d = doc(5)
    first, second = d.take(0), d.take(0)
    d.put_back(second)
    d.put_back(first)
    assert d.take(0).position == 0
    second.not_before = 10.0
    assert d.take(0).position == 2  # the retry of position 1 is not due yet
    assert d.take(10.0).position == 1


def test_a_document_past_its_deadline_sends_nothing_more():
    fair = FairQueue()
    late = doc(5, deadline=50.0)
    fair.add(late)
    assert fair.expire(49.0) == []
    assert fair.expire(50.0) == [late]
    assert fair.pick(51.0) is None


# ---- retry budget and front door -----------------------------------------------------------
def test_the_retry_budget_bounds_retries_fleet_wide():
    clock = Clock()
    budget = RetryBudget(ratio=0.1, min_retries=2, window_s=10, clock=clock)
    for _ in range(100):
        budget.record_send()
    spent = sum(budget.try_spend() for _ in range(50))
    assert spent == 12  # 2 + 10 % of 100
    clock.now += 11
    assert budget.try_spend()  # the window moved on


def test_the_front_door_refuses_with_429_and_a_retry_after_before_anything_is_sent():
    clock = Clock()
    door = FrontDoor(max_pages=100, max_bytes=10_000, clock=clock)
    first = door.admit(80, 1000)
    with pytest.raises(ApiError) as refused:
        door.admit(40, 1000)
    assert refused.value.status == 429 and int(refused.value.headers["Retry-After"]) >= 1
    door.pages_done(first, 30)
    second = door.admit(40, 1000)
    door.reserve(0).release()  # room left: a body may be read
    door.release(first)
    door.release(second)
    assert door.queued_pages == 0 and door.queued_bytes == 0
    assert door.admit(500, 1000).pages == 500  # bigger than the queue: only when it is empty
    with pytest.raises(ApiError):
        door.reserve(0)  # the pages are full: refused before a body is read


# ---- the scheduler against scripted replicas -----------------------------------------------
class ScriptedClient:
    """Answers attempts from `script(url, page_index, attempt_number)` -> status."""

    def __init__(self, script):
        self.script = script
        self.lock = threading.Lock()
        self.calls: list[tuple[str, int]] = []
        self.first: list[bool] = []  # X-Ocr-Priority high, per call
        self.start_within: list[float | None] = []  # X-Ocr-Start-Within-Ms, per call

    def post(self, replica, body, *, log_id, deadline, first=False, start_within_s=None,
             path="/ocr"):
        page = int(body.decode())
        with self.lock:
            self.calls.append((replica.url, page))
            self.first.append(first)
            self.start_within.append(start_within_s)
            count = sum(1 for _, p in self.calls if p == page)
        status = self.script(replica.url, page, count)
        if status == "later":  # a 503 with X-Ocr-Starts-In-Ms
            return Attempt(classify(503, later=True), 503, {}, "later", capacity=4, free=3)
        if status == 200:
            payload = {"result": {"ocrResults": [{"prunedResult": {"rec_texts": [str(page)]}}],
                                  "dataInfo": {"type": "pdf", "numPages": 1,
                                               "pages": [{"width": 1, "height": 1}]}}}
            return Attempt(Outcome.OK, 200, payload, "ok", capacity=4, free=3)
        return Attempt(classify(status), status, {}, f"HTTP {status}", retry_after_s=1)


class PageCutter:
    """A document's chunks: page i is the bytes of str(i), sent as they are."""

    def cut(self, group):
        return Chunk(group, str(group[0]).encode())

    def body(self, chunk):
        return chunk.data

    def close(self):
        pass


@pytest.fixture
def run_scheduler():
    started = []

    def make(script, urls=("http://a", "http://b"), max_attempts=4, budget=None):
        replicas = replica_set(list(urls), limits=LimitSettings(busy_pause_s=0.001))
        client = ScriptedClient(script)
        executor = ThreadPoolExecutor(8)
        scheduler = Scheduler(replicas, client, executor,
                              SchedulerSettings(max_attempts=max_attempts, backoff_s=0.001),
                              budget or RetryBudget())
        scheduler.start()
        started.append((scheduler, executor))
        return scheduler, client

    yield make
    for scheduler, executor in started:
        scheduler.stop()
        executor.shutdown(wait=True)


def submit(scheduler, pages, deadline_s=30.0, priority=INTERACTIVE):
    d = Document([(i,) for i in range(pages)], PageCutter(),
                 log_id="t", deadline=time.monotonic() + deadline_s, kind="pdf",
                 priority=priority)
    return scheduler.submit(d)


def texts(document):
    return [p.ocr_result["prunedResult"]["rec_texts"][0] if not p.error_code else p.error_code
            for pages in document.in_order() for p in pages]


def test_busy_answers_are_sent_again_without_spending_attempts(run_scheduler):
    # every page is refused as busy three times before it is taken: with max_attempts=2 a
    # busy answer that counted as a failure would fail the document
    scheduler, client = run_scheduler(lambda url, page, n: 503 if n <= 3 else 200,
                                      max_attempts=2)
    document = submit(scheduler, 6)
    assert texts(document) == [str(i) for i in range(6)]
    assert len(client.calls) == 24


def test_only_a_one_page_interactive_document_asks_the_worker_to_read_it_first(run_scheduler):
    scheduler, client = run_scheduler(lambda url, page, n: 200)
    for pages, priority, first in ((1, INTERACTIVE, True), (3, INTERACTIVE, False),
                                   (1, BATCH, False)):
        client.first.clear()
        assert len(texts(submit(scheduler, pages, priority=priority))) == pages
        assert client.first == [first] * pages


def test_an_image_with_room_is_sent_by_the_thread_that_submits_it_a_documents_pages_are_not(
        run_scheduler):
    """An image a replica has room for skips the scheduler thread and the send threads: the
    request's own thread sends it before submit returns. A document's pages go through them."""
    senders = []
    scheduler, client = run_scheduler(
        lambda url, page, n: senders.append(threading.current_thread()) or 200)
    image = submit(scheduler, 1)
    assert senders == [threading.current_thread()]  # sent before submit returned
    assert texts(image) == ["0"]
    senders.clear()
    assert texts(submit(scheduler, 3)) == ["0", "1", "2"]
    assert len(senders) == 3 and threading.current_thread() not in senders


def test_an_image_a_worker_would_start_late_goes_to_another_at_once_asking_a_little_more_each_try(
        run_scheduler):
    """Each try asks the next of START_WITHIN_S; a refusal (Outcome.LATER) spends no attempt
    and pauses nothing; after the last, the image goes out asking nothing. A document's pages
    never ask."""
    refusals = len(START_WITHIN_S) + 2
    scheduler, client = run_scheduler(
        lambda url, page, n: "later" if n <= refusals else 200, max_attempts=1)
    assert texts(submit(scheduler, 1)) == ["0"]
    assert client.start_within == list(START_WITHIN_S) + [None] * 3
    assert all(later > earlier for earlier, later in zip(START_WITHIN_S, START_WITHIN_S[1:]))
    assert all(r.busy_until == 0.0 for r in scheduler.replicas.replicas())
    scheduler.client = client = ScriptedClient(lambda *a: 200)
    assert len(texts(submit(scheduler, 3))) == 3
    assert client.start_within == [None] * 3


def test_with_a_list_an_image_refused_as_late_goes_to_a_replica_not_tried_yet():
    replicas = replica_set(["http://a", "http://b", "http://c"])
    client = ScriptedClient(lambda url, page, n: "later" if url != "http://c" else 200)
    executor = ThreadPoolExecutor(4)
    scheduler = Scheduler(replicas, client, executor, SchedulerSettings(), RetryBudget())
    scheduler.start()
    try:
        assert texts(submit(scheduler, 1)) == ["0"]
        urls = [url for url, _ in client.calls]
        assert urls[-1] == "http://c" and len(urls) == len(set(urls))
    finally:
        scheduler.stop()
        executor.shutdown(wait=True)


def test_an_image_behind_a_full_fleet_goes_out_at_once_asking_to_start_soon():
    """Behind a balancer, two pages of a long document fill the fleet. The image does not
    wait in the gateway for one to come back: it goes out at once, asking to start within
    START_WITHIN_S[0] (the worker refuses it when its page under way ends later); the
    document's pages never ask."""
    gate, sent = threading.Event(), []

    class Client:
        def post(self, replica, body, *, log_id, deadline, first=False, start_within_s=None,
                 path="/ocr"):
            page = int(body.decode())
            sent.append((page, start_within_s))
            if page != 100:
                assert gate.wait(10)
            payload = {"result": {"ocrResults": [{"prunedResult": {"rec_texts": [str(page)]}}],
                                  "dataInfo": {"type": "pdf", "numPages": 1,
                                               "pages": [{"width": 1, "height": 1}]}}}
            return Attempt(Outcome.OK, 200, payload, "ok", capacity=4, free=3, seconds=2.0)

    replicas = BalancedReplicas(urls=["http://lb"],
                          probe=lambda url, headers: (True, {}),
                          fleet=FleetView(default_target=2))
    executor = ThreadPoolExecutor(8)
    scheduler = Scheduler(replicas, Client(), executor, SchedulerSettings(), RetryBudget())
    scheduler.start()
    try:
        long_doc = scheduler.submit(Document([(i,) for i in range(4)], PageCutter(),
                                             log_id="t", deadline=time.monotonic() + 30,
                                             kind="pdf"))
        assert wait_until(lambda: len(sent) == 2)  # the fleet is full
        image = scheduler.submit(Document([(100,)], PageCutter(), log_id="i",
                                          deadline=time.monotonic() + 30, kind="image"))
        assert texts(image) == ["100"]  # while the document's pages are still out
        assert sent == [(0, None), (1, None), (100, START_WITHIN_S[0])]
        gate.set()
        assert texts(long_doc) == ["0", "1", "2", "3"]
    finally:
        gate.set()
        scheduler.stop()
        executor.shutdown(wait=True)


def test_a_failed_page_waits_for_room_elsewhere_rather_than_fail_again_where_it_failed(
        run_scheduler):
    """a fails every page; b holds its pages until the gate opens, so while a page's retry is
    due only a has room. The page waits for b instead of spending its attempts on a."""
    gate = threading.Event()

    def script(url, page, attempt):
        if url == "http://a":
            return 500
        assert gate.wait(10)
        return 200

    scheduler, client = run_scheduler(script)
    document = submit(scheduler, 6)
    assert wait_until(lambda: sum(url == "http://a" for url, _ in client.calls) >= 2)
    gate.set()
    assert texts(document) == [str(i) for i in range(6)]
    on_a = [page for url, page in client.calls if url == "http://a"]
    assert len(on_a) == len(set(on_a))  # no page sent to a twice


def test_a_failed_page_is_retried_on_another_replica(run_scheduler):
    scheduler, client = run_scheduler(lambda url, page, n: 500 if url == "http://a" else 200)
    document = submit(scheduler, 6)
    assert texts(document) == [str(i) for i in range(6)]
    for page in range(6):
        assert client.calls[-1][0] == "http://b" or (
            [c for c in client.calls if c[1] == page][-1][0] == "http://b")


def test_a_poison_page_fails_after_its_attempts_and_the_others_succeed(run_scheduler):
    scheduler, client = run_scheduler(lambda url, page, n: 500 if page == 3 else 200)
    document = submit(scheduler, 6)
    assert texts(document) == ["0", "1", "2", 500, "4", "5"]
    assert sum(1 for _, p in client.calls if p == 3) == 4


def test_a_spent_retry_budget_fails_instead_of_multiplying_load(run_scheduler):
    budget = RetryBudget(ratio=0.0, min_retries=1)
    scheduler, client = run_scheduler(lambda url, page, n: 500, budget=budget)
    document = submit(scheduler, 5)
    assert texts(document) == [500] * 5
    assert len(client.calls) == 6  # five first attempts and the one retry the budget allows


def test_a_cancelled_document_sends_none_of_its_queued_pages(run_scheduler):
    gate = threading.Event()

    def script(url, page, n):
        gate.wait(10)
        return 200

    scheduler, client = run_scheduler(script)
    document = submit(scheduler, 40)
    deadline = time.monotonic() + 10
    while len(client.calls) < 4 and time.monotonic() < deadline:  # both replicas full
        time.sleep(0.01)
    scheduler.finish(document)
    gate.set()
    quiet_until = time.monotonic() + 0.5
    while time.monotonic() < quiet_until:
        time.sleep(0.05)
    assert len(client.calls) == 4


def test_a_queued_page_past_its_deadline_is_not_sent(run_scheduler):
    gate = threading.Event()
    scheduler, client = run_scheduler(lambda url, page, n: 200 if gate.wait(10) else 200)
    document = submit(scheduler, 40, deadline_s=0.3)
    with pytest.raises(ApiError) as late:
        list(document.in_order(grace_s=0.2))  # the grace for pages in flight (5 s) cut short
    assert late.value.status == 504
    gate.set()
    sent = len(client.calls)
    assert sent <= 4  # only the pages that were already on replicas
    scheduler.finish(document)


# ---- faults inside the gateway ---------------------------------------------------------------
class MalformedClient(ScriptedClient):
    """200 answers the reply parser never expected, for the pages in `bad`; good ones else."""

    BODIES = [{"result": "x"}, {"result": {"ocrResults": 5, "dataInfo": []}},
              {"result": {"ocrResults": [None], "dataInfo": {"type": 7, "pages": "no"}}}]

    def __init__(self, bad):
        super().__init__(lambda url, page, n: 200)
        self.bad = set(bad)

    def post(self, replica, body, *, log_id, deadline, first=False, start_within_s=None,
             path="/ocr"):
        page = int(body.decode())
        if page not in self.bad:
            return super().post(replica, body, log_id=log_id, deadline=deadline)
        with self.lock:
            self.calls.append((replica.url, page))
            count = sum(1 for _, p in self.calls if p == page)
        return Attempt(Outcome.OK, 200, self.BODIES[count % len(self.BODIES)], "ok",
                       capacity=-3, free=10 ** 9, board="c:::", worker="\x00")


def test_an_answer_nothing_expected_fails_its_page_not_the_scheduler(run_scheduler):
    scheduler, _ = run_scheduler(lambda *a: 200)
    scheduler.client = MalformedClient(bad={1})
    document = submit(scheduler, 3)
    codes = texts(document)
    assert codes[0] == "0" and codes[2] == "2"
    assert codes[1] in (500, 502)  # tried again as a real failure, then failed
    assert scheduler.alive and scheduler.failure is None
    scheduler.client = ScriptedClient(lambda *a: 200)
    assert texts(submit(scheduler, 2)) == ["0", "1"]  # and the next document is served


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_scheduler_that_dies_says_so(run_scheduler):
    scheduler, _ = run_scheduler(lambda *a: 200)

    def broken(*args, **kwargs):
        raise SystemExit("boom")  # not an Exception: the loop itself ends

    scheduler.fair.pick = broken
    submit(scheduler, 1, deadline_s=2)
    deadline = time.monotonic() + 10
    while scheduler.alive and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not scheduler.alive and "SystemExit" in scheduler.failure
    scheduler.stop(timeout=10)  # its exception is reported while this test (and its filter)
    # still runs, not during whichever test comes next


@pytest.mark.parametrize("mode", ["load_balancer", "list"])
def test_documents_leave_workers_idle_until_a_page_is_timed(mode):
    """32 workers (behind one balancer, or a list of them), a long document and no page
    timed yet: its pages leave one worker in 16 idle (gateway.flow.reserve), so an image that
    comes during the first page time finds one; once a page is timed (a short one here),
    the reserve goes."""
    gate, sent = threading.Event(), []

    class Client:
        def post(self, replica, body, *, log_id, deadline, first=False, start_within_s=None,
                 path="/ocr"):
            page = int(body.decode())
            sent.append(page)
            assert gate.wait(10)
            payload = {"result": {"ocrResults": [{"prunedResult": {"rec_texts": [str(page)]}}],
                                  "dataInfo": {"type": "pdf", "numPages": 1,
                                               "pages": [{"width": 1, "height": 1}]}}}
            return Attempt(Outcome.OK, 200, payload, "ok", seconds=0.5)

    board = Board()
    for i in range(32):
        board.say("w", f"w{i:02d}", 1, 1.0)
    urls = ["http://lb"] if mode == "load_balancer" else [f"http://w{i}" for i in range(32)]
    replicas = PLACEMENTS[mode](urls=urls, probe=lambda url, headers: (True, {}),
                          fleet=FleetView(board, default_target=1.0))
    executor = ThreadPoolExecutor(40)
    scheduler = Scheduler(replicas, Client(), executor, SchedulerSettings(), RetryBudget())
    scheduler.start()
    try:
        doc = scheduler.submit(Document([(i,) for i in range(40)], PageCutter(), log_id="t",
                                        deadline=time.monotonic() + 30, kind="pdf"))
        assert wait_until(lambda: len(sent) == 30)
        assert replicas.fleet.share().reserve == 2  # of 32
        assert replicas.fleet.status()["limit"] == 30 and not replicas.look().documents
        assert scheduler.snapshot()["inflightChunks"] == 30
        gate.set()
        assert texts(doc) == [str(i) for i in range(40)]
        assert wait_until(lambda: replicas.fleet.share().reserve == 0)  # 0.5 s: not long
    finally:
        gate.set()
        scheduler.stop()
        executor.shutdown(wait=True)
