"""The gateway's memory is a budget: a request reserves room for reading its body before it
is read, holds its document and its answer's pages in memory until the answer has gone, and
gives its pages back as soon as the document is finished. Finished pages past a few MB are
spooled to disk (outputs/spool.py), bounded too. Pure units; the HTTP side is in
test_flow_integration.py and the figures in `make bench-gateway-memory`."""

from __future__ import annotations

import pytest

from gateway.admission import FrontDoor
from gateway.assemble import PageOutcome
from gateway.outputs.spool import PageSpool
from services.ocr_api.errors import ApiError


def page(index: int, size: int = 1000, error: int = 0) -> PageOutcome:
    return PageOutcome(index, {"prunedResult": {"rec_texts": [str(index)]},
                               "image": "x" * size}, {"width": 10, "height": 20},
                       error_code=error, error_msg="bad" if error else "")


def test_a_body_is_refused_before_it_is_read_when_the_budget_is_held():
    door = FrontDoor(max_pages=100, max_bytes=1000)
    first = door.reserve(800)
    with pytest.raises(ApiError) as refused:
        door.reserve(300)
    assert refused.value.status == 429 and "Retry-After" in refused.value.headers
    assert "800 MB" not in refused.value.message and "MB held" in refused.value.message
    first.release()
    door.reserve(300).release()
    assert door.queued_bytes == 0


def test_one_request_larger_than_the_budget_goes_through_alone():
    door = FrontDoor(max_pages=100, max_bytes=1000)
    alone = door.reserve(5000)
    with pytest.raises(ApiError):
        door.reserve(1)
    alone.release()
    assert door.queued_bytes == 0


def test_admission_swaps_the_reading_reservation_for_what_the_document_holds():
    door = FrontDoor(max_pages=100, max_bytes=1000, clock=lambda: 50.0)
    ticket = door.reserve(900)  # reading a JSON body: about three times its length
    assert door.admit(10, 300, ticket) is ticket
    assert (door.queued_pages, door.queued_bytes) == (10, 300)
    ticket.pages_done(4)
    ticket.release_pages()  # the document is finished: its pages go back, its bytes stay
    assert (door.queued_pages, door.queued_bytes) == (0, 300)
    assert door.pages_per_second() == 4  # within its first second; cancelled pages not done
    ticket.release()  # the answer has gone
    ticket.release()
    assert (door.queued_pages, door.queued_bytes) == (0, 0)


def test_a_refused_admission_keeps_the_reservation_for_its_owner_to_release():
    door = FrontDoor(max_pages=10, max_bytes=10_000)
    door.admit(8, 0)
    ticket = door.reserve(100)
    with pytest.raises(ApiError):
        door.admit(5, 100, ticket)
    ticket.release()
    assert door.queued_bytes == 0 and door.queued_pages == 8


def test_the_spool_gives_the_pages_back_in_order_from_memory_or_disk():
    for memory in (10**7, 2000):  # all in memory; rolled over to a file after two pages
        spool = PageSpool(memory, 10**7)
        pages = [page(i, error=(422 if i == 3 else 0)) for i in range(8)]
        for p in pages:
            spool.append(p)
        assert spool.on_disk == (memory == 2000)
        assert list(spool) == pages and list(spool) == pages  # read twice (a ZIP)
        assert len(spool) == 8 and [p.error_code for p in spool.light][3] == 422
        assert all(p.ocr_result is None for p in spool.light)
        spool.close()


def test_passes_over_the_spool_may_interleave():
    spool = PageSpool(100, 10**7)
    for i in range(5):
        spool.append(page(i))
    first, second = iter(spool), iter(spool)
    assert [next(first).page_index, next(second).page_index, next(first).page_index,
            next(second).page_index] == [0, 0, 1, 1]
    spool.close()


def test_an_answer_past_the_disk_bound_is_refused_with_what_to_ask_for():
    spool = PageSpool(100, 5000)
    spool.append(page(0))
    with pytest.raises(ApiError) as refused:
        for i in range(1, 10):
            spool.append(page(i))
    assert refused.value.status == 413 and "visualize" in refused.value.message
    spool.close()
