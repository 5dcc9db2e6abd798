"""Workers kept idle for urgent pages when pages are long behind a balancer (gateway/flow/reserve.py,
its `u` entries on the board and the share it leaves the documents, gateway/flow/share.py). Pure:
no server, the clock given."""

from __future__ import annotations

import time

import pytest

from gateway.flow.share import FleetView
from gateway.flow.reserve import (LONG_PAGE_S, MAX_SHARE, RECENT_PAGES, PageTime, UrgentLoad,
                                  reserve_for)
from services.ocr_api.fleet_board import Board


def clock() -> float:
    return 1000.0  # the board's entries are all fresh


def test_the_urgent_load_is_the_seconds_answered_over_the_window():
    load = UrgentLoad(window_s=10.0)
    assert load.load(0.0) == 0.0
    for second in range(1, 21):  # two images a second, 0.3 s each
        load.record(0.3, second)
        load.record(0.3, second + 0.5)
    assert load.load(20.5) == pytest.approx(0.6, abs=0.05)
    assert load.load(40.0) == 0.0  # none in the window: none


def test_images_that_waited_behind_a_page_do_not_count_their_wait_as_load():
    """At a wave (the fleet full) a few images wait behind a page at busy workers: those
    workers are the documents', and the images kept none of the reserve busy meanwhile."""
    load = UrgentLoad(window_s=10.0)
    for second in range(1, 11):  # one image a second, 0.3 s each...
        load.record(0.3, second)
    for late in (10.2, 10.4, 10.6):
        load.record(3.5, late)  # ...and three that waited 3.2 s for a page to end
    assert load.load(10.6) == pytest.approx(13 * 0.3 / 10.0, rel=0.05)


def test_the_urgent_load_takes_the_time_of_the_latest_images():
    """The rate counts every answer in the window; the time is the median of the latest
    RECENT_PAGES: images that became shorter count as short at once."""
    load = UrgentLoad(window_s=10.0)
    for tenth in range(60):  # 60 images of 1 s, then RECENT_PAGES of 0.2 s, in 9 s
        load.record(1.0, 1.0 + tenth * 0.1)
    for tenth in range(RECENT_PAGES):
        load.record(0.2, 7.0 + tenth * 0.05)
    answers = 60 + RECENT_PAGES
    assert load.load(10.0) == pytest.approx(answers * 0.2 / 10.0, rel=0.05)


def test_a_new_load_is_measured_over_the_time_since_its_first_page_not_the_whole_window():
    load = UrgentLoad(window_s=10.0)
    load.record(0.5, 100.0)  # sent at 99.5
    load.record(0.5, 100.5)
    assert load.load(100.5) == pytest.approx(1.0)  # 1 s of work over 1 s, not over 10 s


def test_the_reserve_is_the_load_and_a_deviation_at_most_one_worker_in_16():
    assert reserve_for(0.0, 128) == 0
    assert reserve_for(0.01, 128) == 1
    assert reserve_for(2.4, 128) == 4  # 2.4 + 1.55
    assert reserve_for(5.5, 128) == 8
    assert reserve_for(30.0, 128) == int(128 * MAX_SHARE)
    assert reserve_for(1.0, 8) == 0  # a small fleet keeps its throughput


def test_before_any_page_is_timed_the_most_is_kept():
    """Documents sent at once would fill every worker for a whole page time, and images sent
    meanwhile would wait for it: until a page is timed, one worker in 16 stays idle."""
    assert reserve_for(0.0, 128, page_time_unknown=True) == 8
    assert reserve_for(0.0, 16, page_time_unknown=True) == 1
    assert reserve_for(0.0, 8, page_time_unknown=True) == 0


def fleet(workers: int, target: float) -> Board:
    board = Board(clock=clock)
    for i in range(workers):
        board.say("w", f"w{i:03d}", 1, target)
    return board


def test_the_documents_share_the_workers_less_the_reserve_not_the_slots():
    """128 workers that each ask for 1.5 pages: without urgent load, the documents share the
    192 slots; with the board's urgent load of 2.4 workers, they share 128 less 4, so 4
    workers are left idle (a balancer gives pages to the emptiest)."""
    board = fleet(128, 1.5)
    view = FleetView(board)
    view.id = "a"
    view.set_demand(2)
    board.merge("c:b:1:200:0")  # another process, two documents
    assert view.share().slots == pytest.approx(192)
    assert view.share().limit(2.0) == pytest.approx(96, abs=1)
    board.merge("u:b:1:140:0")  # its images keep 1.4 workers busy
    view.set_urgent(1.0)
    share = view.share()
    assert share.reserve == 4
    assert share.quota == pytest.approx((128 - 4) / 4)
    assert share.limit(2.0) == pytest.approx(61, abs=1)
    view.set_urgent(0.0, page_time_unknown=True)  # as if it had timed no page yet
    assert view.share().reserve == 8


def test_a_process_that_only_sends_images_says_its_load_as_the_processes_with_documents_do():
    """All documents came through process b, which has timed its pages: short (it says no
    urgent load). Process a sends only images and has timed no document page: its load is
    not said, so the documents share all the slots, not the workers less a reserve (a run at
    64 replicas of 2 s pages lost 5 % so). Once b says its pages are long, a says its load."""
    board = fleet(64, 1.5)
    view = FleetView(board)
    view.id = "a"
    board.merge("c:b:1:800:0,u:b:1:0:0")  # eight documents, short pages
    view.set_urgent(0.4, follow=True)
    assert view.share().reserve == 0
    assert view.share().quota == pytest.approx(96 / 9)
    board.merge("u:b:2:30:0")  # b's pages are long (or not timed yet): its images say 0.3
    view.set_urgent(0.4, follow=True)
    assert view.share().reserve == reserve_for(0.7, 64)
    board.merge("c:b:2:0:0")  # b's documents have all gone out: b no longer speaks for pages
    view.set_urgent(0.4, follow=True)
    assert view.share().reserve == reserve_for(0.3, 64)


def test_the_urgent_load_travels_on_the_board():
    view, other = FleetView(Board(clock=clock)), FleetView(Board(clock=clock))
    view.set_urgent(0.874)
    other.heard(view.outgoing()[next(iter(view.outgoing()))])
    [entry] = other.board.live()["u"]
    assert (entry.id, entry.value) == (view.id, 0.87)


def test_pages_are_long_by_what_the_workers_say_not_by_the_attempts():
    """On a fleet whose workers hold a page in hand, most 2 s pages wait behind another:
    their attempts take 2-4 s, and yet pages are not long, as their workers say
    (X-Ocr-Page-Ms), so no worker is kept idle for images. Pages of 4 s ± 75 % are long,
    though the shortest attempts take a second: the process says its images' load."""
    from gateway.flow import ListedReplicas
    from gateway.flow.demand import Demand
    from gateway.flow.queue import FairQueue

    replicas = ListedReplicas(urls=["http://a"], probe=lambda url, headers: (True, {}))
    demand = Demand(replicas, FairQueue())
    now = time.monotonic()
    for _ in range(4):
        demand.page_timed(0.5, urgent=True)
    for attempt_s in (3.5, 3.8, 2.0, 3.9, 3.6, 3.7, 3.9, 3.4):
        demand.page_timed(attempt_s, page_s=2.0)
    known = time.monotonic() + LONG_PAGE_S  # (PageTime: below)
    demand.reweigh(known)
    assert replicas.fleet.status()["urgentLoad"] == 0
    for attempt_s in (1.1, 6.0, 9.0, 4.5, 1.4, 7.2, 3.0, 5.1) * 4:
        demand.page_timed(attempt_s, page_s=4.0)
    demand.reweigh(known)
    assert replicas.fleet.status()["urgentLoad"] > 0


def test_the_first_pages_back_do_not_say_how_long_pages_take():
    """Pages sent together come back shortest first: until LONG_PAGE_S after the first came
    back, the long ones may still be under way, and the reserve stays."""
    times = PageTime()
    assert not times.known(100.0)
    times.record(1.1, now=101.0)  # the shortest of a wave of 4 s ± 75 % pages
    times.record(1.3, now=101.2)
    assert not times.known(101.2) and not times.long()  # (short so far; not to be trusted)
    assert not times.known(101.0 + LONG_PAGE_S * 0.9)
    for second in (2.9, 3.4, 4.0, 4.4, 4.9, 5.5):  # the rest come back by then
        times.record(second, now=101.1 + LONG_PAGE_S)
    assert times.known(101.1 + LONG_PAGE_S) and times.long()
