"""The fleet board and the shares it gives, without a server: the board's newest-wins merge,
a worker's target (Pace), each gateway process's fraction and slice, and two gateways
sharing 64 simulated workers behind one load balancer (services/ocr_api/fleet_board.py,
services/ocr_worker/capacity.py, gateway/flow/share.py, gateway/flow/replicas.py)."""

from __future__ import annotations

import random

import pytest

from gateway.flow import lead
from gateway.outcome import Attempt
from gateway.flow.share import NEWS_S, REBALANCE_S, FleetView, dither
from gateway.outcome import Outcome
from gateway.flow import BalancedReplicas, HealthLoop, ListedReplicas, ReplicaSet
from gateway.flow.replicas import PROBES_PER_ROUND
from services.ocr_api import headers
from services.ocr_api.fleet_board import MAX_SENT_CHARS, Board, slots_of
from services.ocr_worker.capacity import Pace, Presence


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


# ---- the board -----------------------------------------------------------------------------
def test_the_newest_statement_wins_and_ages_travel_with_entries():
    clock = Clock()
    board = Board(clock=clock)
    board.merge("c:aaaa:5:300:0")
    board.merge("c:aaaa:4:900:0")  # an older statement, heard later: ignored
    assert [(c.id, c.value) for c in board.clients()] == [("aaaa", 3.0)]
    board.merge("c:aaaa:6:0:20")  # newer (demand 0), said 2 s ago
    [entry] = board.clients()
    assert entry.value == 0 and entry.heard == pytest.approx(clock.now - 2)
    clock.now += 3
    other = Board(clock=clock)
    other.merge(board.header())  # passed on: its age is now 5 s
    assert other.clients()[0].heard == pytest.approx(clock.now - 5)


def test_an_entry_passed_back_and_forth_is_never_younger_than_when_its_owner_said_it():
    """Ages are rounded up, and a header reused for a while (a gateway's, REBALANCE_S) tells
    them as of when it may go: bounced between a gateway and a worker many times a second, an
    entry rounded to the nearest came back fresher each time (a fresher copy wins), and an
    old statement passed for news."""
    clock = Clock()
    gateway, worker = Board(clock=clock), Board(clock=clock)
    gateway.merge("c:aaaa:1:0:3")  # another process's entry, said 0.3 s ago
    said = clock.now - 0.3
    for _ in range(40):
        header = gateway.header(sent_within_s=REBALANCE_S)
        clock.now += 0.03  # sent a moment after it was built
        worker.merge(header)
        clock.now += 0.01
        gateway.merge(worker.header())
    for board in (gateway, worker):
        [entry] = board.clients()
        assert entry.heard <= said + 1e-9


def test_entries_expire_and_malformed_ones_are_ignored():
    clock = Clock()
    board = Board(clock=clock, client_ttl_s=10, worker_ttl_s=120)
    board.merge("c:aaaa:1:100:0,w:bbbb:1:105:0,junk,c:AAAA:1:1:0,w:cccc:x:1:0,"
                "c:dddd:1:-5:0,w:eeee:1:100:0:9,c:" + "f" * 17 + ":1:1:0,x:ffff:1:1:0,"
                "w:gggg:1:\uff11\uff10\uff15:0,w:hhhh:1:1:" + "9" * 13)  # (fullwidth digits)
    assert [c.id for c in board.clients()] == ["aaaa"]
    assert [w.id for w in board.workers()] == ["bbbb"]
    clock.now += 11
    assert board.clients() == [] and [w.id for w in board.workers()] == ["bbbb"]
    clock.now += 110
    assert board.workers() == []
    board.merge("c:aaaa:1:100:0," * 2000)  # over the size limit: ignored whole
    assert board.clients() == []


def test_a_header_carries_the_senders_own_entry_and_workers_in_turn_within_its_size():
    clock = Clock()
    board = Board(clock=clock, max_workers=8)
    for i in range(100):
        board.say("w", f"{i:04x}", 1, 1.5)
    board.say("c", "me00", 3, 2)
    seen = set()
    for _ in range(20):
        text = board.header([("c", "me00")])
        assert text.startswith("c:me00:3:200:0") and len(text) <= MAX_SENT_CHARS
        seen |= {item.split(":")[1] for item in text.split(",") if item.startswith("w:")}
    assert len(seen) == 100  # every worker passed on within a few messages
    for i in range(200):
        board.say("c", f"c{i:03d}", 1, 1)
    assert len(board.header()) <= MAX_SENT_CHARS


def test_past_16_gateway_processes_every_one_is_passed_on_within_a_few_messages():
    """Each process says five kinds of entries: 40 processes' are 5 KB, more than a message
    carries. Those that fit go in turn, each process's together, after the sender's own and
    its share of the workers."""
    board = Board(clock=Clock(), max_workers=8)
    for i in range(16):
        board.say("w", f"w{i:03d}", 1, 1.5)
    for i in range(40):
        for kind in ("c", "h", "f", "s", "u"):
            board.say(kind, f"g{i:03d}", 1, 1)
    relayed: dict[str, set[str]] = {}
    for _ in range(4):
        items = [item.split(":") for item in board.header([("c", "g000"), ("h", "g000")])
                 .split(",")]
        assert [item[:2] for item in items[:2]] == [["c", "g000"], ["h", "g000"]]
        assert sum(kind == "w" for kind, *_ in items) == 8
        for kind, id, *_ in items[2:]:
            relayed.setdefault(id, set()).add(kind)
    others = {f"g{i:03d}" for i in range(1, 40)}
    assert others <= relayed.keys()  # every other process within four messages
    assert all(relayed[id] == {"c", "h", "f", "s", "u"} for id in others)  # all its entries


# ---- a worker's target ---------------------------------------------------------------------
def test_a_worker_holds_about_one_page_when_pages_are_long_next_to_the_gap():
    pace = Pace(batch=1)
    assert pace.target() == pytest.approx(1.05)  # nothing measured yet: the least headroom
    for _ in range(50):
        pace.observe("inference", (2.0, 1))
        pace.observe("idle", 0.01)
    assert pace.target() == pytest.approx(1.05)
    pace.observe("idle", 30.0)  # nobody had work: not a gap
    assert pace.target() == pytest.approx(1.05)


def test_a_worker_holds_two_pages_when_the_gap_is_a_large_part_of_a_page():
    pace = Pace(batch=4)
    for _ in range(50):
        pace.observe("inference", (0.05, 4))
        pace.observe("idle", 0.02)
    assert 7.5 < pace.target() < 8.0


def test_a_draining_worker_says_target_zero():
    draining = [False]
    presence = Presence(Pace(), draining=lambda: draining[0])
    answer = presence.answer_headers({headers.BOARD: "c:aaaa:1:100:0"})
    assert answer[headers.WORKER] == presence.id
    # its own entry: target 1.05, said just now (age 0, or 0.1 s: ages are rounded up)
    assert answer[headers.BOARD].startswith(f"w:{presence.id}:1:105:")
    assert "c:aaaa:1:100:" in answer[headers.BOARD]  # what callers said is passed on
    draining[0] = True
    assert presence.answer_headers({})[headers.BOARD].startswith(f"w:{presence.id}:2:0:")


# ---- shares and slices ---------------------------------------------------------------------
def test_a_gateways_fraction_is_its_documents_over_all_documents():
    clock = Clock()
    board = Board(clock=clock)
    view = FleetView(board)
    view.id = "m"
    view.set_demand(2)
    assert view.share().fraction == 1.0
    board.merge("c:a:1:100:0,c:z:1:500:0")
    assert view.share().fraction == pytest.approx(2 / 8)
    view.set_demand(0)  # nothing queued counts as one document, so a new one finds room
    assert view.share().fraction == pytest.approx(1 / 7)


def test_pages_held_by_images_come_off_first_and_documents_share_the_rest_equally():
    """One process has 1 long document and 8 images being read; another has 3 long
    documents and none: each long document gets the same quota of the fleet's 48 slots."""
    clock = Clock()
    board = Board(clock=clock)
    board.say("w", "w1", 1, 48.0)
    view = FleetView(board)
    view.id = "a"
    view.set_demand(1, finishing=8)
    board.merge("c:b:1:300:0,h:b:1:0:0")
    quota = (48 - 8) / 4  # 10 slots per long document
    assert view.share().fraction * 48 == pytest.approx(8 + 1 * quota)
    assert view.share().limit(2.0) == 18


def test_the_fleets_rate_is_every_processs_rate_by_its_demand():
    clock = Clock()
    board = Board(clock=clock)
    view = FleetView(board)
    view.id = "m"
    view.set_rate(9.0)  # a process without documents: its rate is not the fleet's
    assert view.share().rate is None
    board.merge("c:a:1:300:0,s:a:1:400:0")  # three documents sent 4 chunks/s each
    assert view.share().rate == pytest.approx(4.0)
    view.set_demand(1)
    assert view.share().rate == pytest.approx((3 * 4.0 + 9.0) / 4)
    assert "s:m:" in view.outgoing()[headers.BOARD]  # told with the demand
    clock.now += board.client_ttl_s + 1  # the other process's entries expire
    assert view.share().rate == pytest.approx(9.0)


# ---- shares that remember (gateway.flow.lead) ---------------------------------------------------
def test_a_documents_rate_counts_its_first_page_time_so_a_fair_start_is_its_shares_rate():
    quota, page_s = 8, 2.0  # a share of 8 chunks in flight, 2 s each: 4 chunks/s
    assert lead.rate(quota, 0.0, page_s) == pytest.approx(4.0)  # the first round at once
    assert lead.rate(quota + 4 * 10, 10.0, page_s) == pytest.approx(4.0)
    assert lead.rate(quota + 4 * 10 + 32, 10.0, page_s) > 6.0  # a head start shows long


def test_a_document_ahead_of_the_fleet_steps_down_and_comes_back_once_caught_up():
    weight = lead.Weight()
    assert weight.follow(lead=4, quota=8, now=0.0) == 1.0  # half a quota: left alone
    assert weight.follow(lead=16, quota=8, now=0.0) == 0.75  # one step towards 0.25...
    assert weight.follow(lead=16, quota=8, now=0.1) == 0.75  # ...at most every HOLD_S
    assert weight.follow(lead=16, quota=8, now=0.6) == 0.5
    assert weight.follow(lead=80, quota=8, now=1.2) == 0.25  # never below one STEP
    assert weight.follow(lead=80, quota=8, now=1.8) == lead.STEP
    assert weight.follow(lead=12, quota=8, now=1.9) == 0.5  # the lead shrinks: at once
    assert weight.follow(lead=5, quota=8, now=2.0) == 1.0  # caught up (within a step)
    assert weight.follow(lead=-80, quota=8, now=2.1) == 1.0  # behind: not raised (the
    # share a slowed document leaves goes to the others)


def test_a_wave_leaves_the_weight_alone_and_a_lead_that_lasts_a_page_time_does_not():
    """Pages come back in waves: a document's lead jumps half a quota over its mean at each
    refill and falls to half a quota under it by the next. A document on the fleet's rate
    keeps its share; one a quota ahead for a page time counts three quarters of one."""
    page_s, quota = 4.0, 8

    def run(true_lead: float) -> float:
        weight = lead.Weight()
        for step in range(121):  # three page times, a lead said every 0.1 s
            now = step * 0.1
            sawtooth = 0.5 - (now % page_s) / page_s
            weight.follow((true_lead + sawtooth) * quota, quota, now, window_s=page_s)
        return weight.value

    assert run(0.0) == 1.0
    assert run(0.5) == 1.0  # within the band
    assert run(1.0) == 0.75
    assert run(1.5) == 0.5


def test_the_weight_follows_the_mean_lead_of_the_window_each_held_until_the_next():
    """Pages come back in waves: a document's lead jumps a quota at each refill and shrinks
    back over the page time. Its mean over the window (or as much of it as was said), each
    lead held until the next was said, is what a brute sum over the window gives."""
    rng = random.Random(7)
    weight, said, now = lead.Weight(), [], 0.0
    for _ in range(500):
        now += rng.choice([0.05, 0.1, 0.3])
        quotas = rng.uniform(-1.0, 3.0)
        said.append((now, quotas))
        weight.follow(quotas * 8, quota=8, now=now, window_s=2.0)
        start = max(said[0][0], now - 2.0)
        held = [(max(t, start), min(later, now), q)
                for (t, q), (later, _) in zip(said, said[1:] + [(now, None)])]
        if now > start:
            mean = sum(q * (hi - lo) for lo, hi, q in held if hi > lo) / (now - start)
            assert weight.mean(now, 2.0) == pytest.approx(mean)


def test_share_moves_within_a_process_from_the_document_ahead_to_those_behind():
    """The first document of a process sent its process's whole first part while the other
    three were being split: 12 chunks ahead of the process's rate, they 4 behind each (a
    quota is 16). What moves sums to nothing: the process's demand stays as it is."""
    moved = lead.moves([12.0, -4.0, -4.0, -4.0], quota=16)
    assert moved[0] < 0 < moved[1] == moved[2] == moved[3]
    assert sum(moved) == pytest.approx(0.0)
    assert lead.moves([3.0, -1.0, -1.0, -1.0], quota=16) == [0.0] * 4  # within the band
    assert lead.moves([80.0, -80.0], quota=16) == [-lead.MOST_MOVED, lead.MOST_MOVED]
    assert lead.moves([], quota=16) == []


def test_new_demand_and_going_quiet_are_told_at_once_held_pages_within_a_rebuild():
    clock = Clock()
    view = FleetView(board=Board(clock=clock))

    def said(kind: str) -> float:
        item = next(i for i in view.outgoing()[headers.BOARD].split(",")
                    if i.startswith(f"{kind}:{view.id}:"))
        return int(item.split(":")[3]) / 100

    view.set_demand(2, 1)
    assert (said("c"), said("h")) == (2, 1)
    view.set_demand(2, 3)  # held pages change with nearly every page: the header is kept
    assert said("h") == 1
    clock.now += REBALANCE_S * 1.01
    assert said("h") == 3
    view.set_demand(3, 3)
    assert said("c") == 3  # a new document: at once
    view.set_demand(0, 0)
    assert (said("c"), said("h")) == (0, 0)  # quiet: at once


def test_a_share_in_whole_pages_averages_the_exact_share():
    assert dither(8.25, draw=lambda: 0.2) == 9 and dither(8.25, draw=lambda: 0.3) == 8
    assert dither(18.000000000001, draw=lambda: 0.0) == 18  # whole stays whole
    draws = iter((i + 0.5) / 1000 for i in range(1000))
    assert sum(dither(8.49, draw=lambda: next(draws)) for _ in range(1000)) == 8490


def test_a_target_is_whole_pages_and_a_sliver_is_none():
    assert slots_of(1.04) == 1 and slots_of(1.06) == 2 and slots_of(0.04) == 0


# ---- 64 workers behind one balancer, two gateway processes ----------------------------------
class SimulatedFleet:
    """Workers with real Presences and measured Paces behind a least-connections balancer;
    gateway processes as real ReplicaSets in load-balancer mode. Pages finish in turn."""

    def __init__(self, clock: Clock, workers: int):
        self.clock = clock
        self.draw = random.Random(7)
        self.workers: list[list] = []  # [presence, pages held]
        self.add(workers)

    def add(self, count: int) -> None:
        for _ in range(count):
            pace = Pace()
            for _ in range(20):
                pace.observe("inference", (2.0, 1))
                pace.observe("idle", 0.02)
            self.workers.append([Presence(pace, draining=lambda: False,
                                          clock=self.clock), 0])

    def route(self, request_headers) -> tuple[list, dict]:
        """nginx least_conn: the fewest pages, ties in turn from a place drawn at random
        (seeded): nginx's round-robin among equals starts wherever its last request left it,
        and no two gateways' requests line up with each other's."""
        self.turn = self.draw.randrange(len(self.workers))
        count = len(self.workers)
        index = min(range(count), key=lambda i: (self.workers[i][1], (i - self.turn) % count))
        worker = self.workers[index]
        return worker, worker[0].answer_headers(request_headers)

    def gateway(self, demand: int) -> ReplicaSet:
        replicas = BalancedReplicas(urls=["http://balancer"],
                              probe=lambda url, h: (True, self.route(h)[1]),
                              fleet=FleetView(Board(clock=self.clock)), clock=self.clock)
        replicas.set_demand(demand)
        return replicas

    def step(self, gateways: list[ReplicaSet]) -> None:
        """Every gateway fills its allowance and probes (its health round, while its pages
        run); then every page finishes and is answered."""
        held = []
        for replicas in gateways:
            while (replica := replicas.acquire()) is not None:
                worker, _ = self.route({})
                worker[1] += 1
                held.append((replicas, replica, worker))
        for replicas in gateways:
            replicas.probe_all()
        for replicas, replica, worker in held:
            worker[1] -= 1
            answer = worker[0].answer_headers(replicas.fleet.outgoing())
            replicas.release(replica, Attempt(Outcome.OK, 200, {}, "",
                                              worker=answer[headers.WORKER],
                                              board=answer[headers.BOARD]))
        self.clock.now += 2.0


def test_two_gateways_behind_one_balancer_fill_64_workers_in_proportion_to_their_documents():
    clock = Clock()
    fleet = SimulatedFleet(clock, 64)
    a, b = fleet.gateway(demand=3), fleet.gateway(demand=1)
    for replicas in (a, b):
        replicas.probe_all()  # probe rounds through the balancer meet the workers
    for _ in range(3):
        fleet.step([a, b])
    limits = [r.replicas()[0].slots for r in (a, b)]
    assert sum(limits) == pytest.approx(64 * 1.05, abs=2)  # every card busy, few waiting
    # per document, not per gateway: 3/4 and 1/4 of the 67.2 slots, each in whole pages
    # (dithered: the whole part, or one more)
    assert abs(limits[0] - 67.2 * 3 / 4) < 1 and abs(limits[1] - 67.2 / 4) < 1
    # kubectl scale 64 -> 128: probes and pages meet the new workers, the limits follow
    fleet.add(64)
    for _ in range(4):  # probes and pages meet the new workers: in one round trip for most
        fleet.step([a, b])  # orders of the workers' (random) ids, in at most four for all
    for replicas in (a, b):
        replicas.look().documents  # the limits as the next page sees them
    limits = [r.replicas()[0].slots for r in (a, b)]
    assert 128 <= sum(limits) <= 128 * 1.05 + 2  # every card busy, few waiting


def test_an_image_goes_out_when_its_processs_share_shrinks_under_its_documents_pages():
    """A document that got ahead is slowed (gateway.flow.lead): its process's share shrinks under
    the pages it has out. An image there is within the share from the moment it comes."""
    clock = Clock()
    fleet = SimulatedFleet(clock, 64)
    a, b = fleet.gateway(demand=1), fleet.gateway(demand=3)
    for replicas in (a, b):
        replicas.probe_all()
    fleet.step([a, b])
    taken = []
    while (replica := a.acquire()) is not None:
        taken.append(replica)  # its one document's share is out
    a.set_demand(0.25, finishing=1)  # slowed to a quarter, and an image came
    clock.now += 1.0  # the next rebalance
    assert not a.look().documents and a.acquire() is None  # its document's pages: over the share
    assert a.look().urgent
    assert a.acquire(urgent=True) is not None  # the image goes all the same


def test_a_gateway_that_goes_quiet_says_so_and_the_other_takes_the_fleet_at_once():
    """No page carries "I am done": without the probes of `tell`, the other gateway would keep
    a quarter of the fleet for 5 s (the entries' lifetime) and a lone PDF would crawl. The
    probes reach PROBES_PER_ROUND of the 64 workers, who pass the news on."""
    clock = Clock()
    fleet = SimulatedFleet(clock, 64)
    a, b = fleet.gateway(demand=3), fleet.gateway(demand=1)
    for replicas in (a, b):
        HealthLoop(replicas).tell()  # busy (what the health thread does when set_demand says so)
        replicas.probe_all()
    for _ in range(3):
        fleet.step([a, b])
    assert b.replicas()[0].slots <= 20
    assert a.fleet.set_demand(0, 0)  # its documents are done: news for the other gateway
    HealthLoop(a).tell()
    assert not a.fleet.untold()  # told once: no second round of probes for the same news
    fleet.step([b])  # its next pages' answers bring that news from the PROBES_PER_ROUND
    # workers told (well within 5 s, the entries' life)
    b.look().documents
    assert b.replicas()[0].slots >= 60
    assert b.fleet.set_demand(0, 0) and b.fleet.set_demand(2, 0)  # quiet, then busy: news
    assert not b.fleet.set_demand(3, 1)  # busier: its pages carry that


def test_gateways_with_a_replica_list_fill_the_emptiest_workers_within_their_shares():
    """Three gateway processes (1, 1 and 2 documents) over 8 workers that each hold one page:
    every worker gets exactly one, in proportion 2:2:4, because each process takes the
    emptiest worker by what the workers last said and stops at its share."""
    clock = Clock()
    urls = [f"http://10.0.0.{i}:8101" for i in range(1, 9)]
    held = {url: 0 for url in urls}  # pages at each worker, all gateways together

    def probe(url, request_headers):
        return True, {headers.CAPACITY: "32", headers.FREE: str(32 - held[url])}

    shared = Board(clock=clock)
    gateways = []
    for demand in (1, 1, 2):
        replicas = ListedReplicas(urls=urls, probe=probe, clock=clock,
                              fleet=FleetView(Board(clock=clock), default_target=1.0))
        replicas.set_demand(demand)
        shared.merge(replicas.fleet.outgoing()[headers.BOARD])
        gateways.append(replicas)
    taken = []
    for replicas in gateways:
        replicas.fleet.heard(shared.header())
        replicas.probe_all()  # what each worker holds now, as the others fill them
        count = 0
        while (replica := replicas.acquire()) is not None:
            held[replica.url] += 1
            count += 1
        taken.append(count)
    assert list(held.values()) == [1] * 8  # none idle, none doubled
    assert taken == [2, 2, 4]  # each counts the others by the demand it heard


def test_a_health_round_probes_the_replicas_not_known_ready_and_a_few_quiet_ones():
    """A health round costs the same in any fleet: every replica not known ready is probed,
    and of the ready ones not heard from lately only PROBES_PER_ROUND, the longest unheard
    first, so that each is heard from in turn."""
    clock = Clock()
    probed: list[str] = []
    down = {"http://w7"}

    def probe(url, request_headers):
        probed.append(url)
        return url not in down, {headers.CAPACITY: "4", headers.FREE: "4"}

    urls = [f"http://w{i}" for i in range(64)]
    replicas = ListedReplicas(urls=urls, probe=probe, clock=clock,
                          fleet=FleetView(Board(clock=clock)))
    replicas.probe_all()
    assert sorted(probed) == sorted(urls)  # none known yet: every one
    seen: set[str] = set()
    for _ in range(4):
        probed.clear()
        clock.now += 1.0
        replicas.probe_all()
        assert "http://w7" in probed  # not ready: every round
        assert len(probed) == PROBES_PER_ROUND + 1
        seen.update(probed)
    assert seen == set(urls)  # the longest unheard first: all in turn


def test_telling_the_fleet_probes_a_few_workers_whatever_its_size():
    """A process that goes quiet or gets busy tells PROBES_PER_ROUND workers (the longest
    unheard first), not every one: one serving only images does so with each image, and at
    128 replicas probing them all was most of its time."""
    clock = Clock()
    probed: list[str] = []

    def probe(url, request_headers):
        probed.append(url)
        return True, {headers.CAPACITY: "4", headers.FREE: "4"}

    urls = [f"http://w{i}" for i in range(128)]
    replicas = ListedReplicas(urls=urls, probe=probe, clock=clock,
                              fleet=FleetView(Board(clock=clock)))
    replicas.probe_all()
    replicas.fleet.board.merge("c:other:1:1:0")  # another gateway process is on the board
    told = []
    for documents in (1, 0, 1):  # busy, quiet, busy again
        probed.clear()
        clock.now += 1.0
        replicas.fleet.set_demand(documents)
        HealthLoop(replicas).tell()
        assert len(probed) == PROBES_PER_ROUND
        told += probed
    assert len(set(told)) == 3 * PROBES_PER_ROUND  # the longest unheard first: others each time


def test_among_equally_loaded_workers_an_empty_one_heard_last_and_a_busy_one_heard_first_win():
    """Equal loads: an empty worker heard from last is the surest to be empty still; when all
    are busy, the one heard from first most likely finishes its running page first, so the
    page that waits behind it (an image, say) starts soonest."""
    clock = Clock()
    urls = [f"http://10.0.0.{i}:8101" for i in range(1, 4)]
    held = {url: 1 for url in urls}  # another gateway's page running at each

    def probe(url, request_headers):
        return True, {headers.CAPACITY: "4", headers.FREE: str(4 - held[url])}

    def heard_in_turn(replicas, order):
        for url in order:  # one probe per worker, a second apart
            clock.now += 1.0
            replicas.probe_one(next(r for r in replicas.replicas() if r.url == url))

    replicas = ListedReplicas(urls=urls, probe=probe, clock=clock,
                          fleet=FleetView(Board(clock=clock), default_target=2.0))
    replicas.set_demand(1)
    replicas.probe_all()
    heard_in_turn(replicas, [urls[1], urls[0], urls[2]])
    assert replicas.acquire().url == urls[1]  # busy: heard from first
    held.update({url: 0 for url in urls})
    heard_in_turn(replicas, [urls[2], urls[0], urls[1]])
    first = replicas.acquire()
    assert first.url == urls[1]  # empty: heard from last


def test_behind_a_balancer_a_rise_in_demand_is_taken_once_the_others_may_have_heard_it():
    """While the fleet keeps workers idle for images (long pages), a process's own demand is
    news to the others a second or so later (their next answers from workers it told). A
    fall is taken at once (the others' shares grow only as they hear it: the fleet is
    under-filled meanwhile, never over), a rise NEWS_S later (taken at once, it would
    add to the shares the others still take by its old demand, and fill the idle workers).
    Its documents' quota follows at once either way."""
    clock = Clock()
    board = Board(clock=clock)
    for i in range(40):
        board.say("w", f"w{i:03d}", 1, 1.0)  # 40 workers
    view = FleetView(board)
    view.set_demand(2)
    view.set_urgent(1.0)  # images keep a worker busy: 2 kept idle, 38 for the documents
    clock.now += 2.0  # (and it is sure of the others: `unsure`)
    board.merge("c:bbbb:2:200:0")  # another process, 2 documents
    assert view.share().reserve == 2
    assert view.share().fraction * 40 == pytest.approx(19)
    view.set_demand(1)  # a document's weight down (gateway.flow.lead): at once
    assert view.share().fraction * 40 == pytest.approx(38 / 3)
    clock.now += 0.5
    view.set_demand(2)  # back up: said at once, taken later
    assert view.outgoing()[headers.BOARD].startswith(f"c:{view.id}:3:200:")
    share = view.share()
    assert share.fraction * 40 == pytest.approx(38 / 3) and share.quota == pytest.approx(9.5)
    clock.now += NEWS_S
    board.merge("c:bbbb:2:200:0")
    assert view.share().fraction * 40 == pytest.approx(19)
    view.set_demand(1)
    view.set_urgent(0.0)  # pages short: no worker kept idle, the news is fresh enough
    view.set_demand(2)
    assert view.share().fraction == pytest.approx(0.5)


def test_a_new_document_is_taken_into_the_limit_at_once_a_finished_one_at_the_next_rebalance():
    """More demand shrinks this process's per-document quota before the next page goes out;
    less demand (a document done), or an image's page finishing, waits for the next
    rebalance: not one per page event (taking the share costs in proportion to the fleet)."""
    clock = Clock()
    board = Board(clock=clock)
    board.merge("w:aaaa:1:800:0,c:bbbb:1:100:0")  # 8 slots, another gateway with 1 document
    replicas = BalancedReplicas(urls=["http://balancer"],
                          probe=lambda url, h: (True, {}), clock=clock,
                          fleet=FleetView(board))
    replicas.set_demand(1)
    assert replicas.look().quota == 4  # 8 slots over 2 documents
    replicas.set_demand(3)
    assert replicas.look().quota == 2  # at once: 8 over 4
    clock.now += 0.01
    replicas.set_demand(1)
    assert replicas.look().quota == 2  # still: less demand waits for the rebalance
    clock.now += 0.05
    assert replicas.look().quota == 4
    taken = replicas.share()
    replicas.set_demand(1, finishing=1)  # an image came
    replicas.look()
    assert replicas.share() is taken
    clock.now += 0.05
    replicas.look()
    assert replicas.share() is not taken
