"""`make bench-route`: what one gateway core routes, at 16 and at 128 replicas (issue: a gateway
core routes >= 400 pages/s, <= 2.5 ms of CPU per page, whatever the fleet's size). One gateway
process in front of 0-ms sim workers, as a list (the gateway picks each replica) and behind
nginx; 10 s of a closed loop of small images; the gateway's CPU seconds over the run, health
probes and board included, with the gateway on a core of its own where the machine has two
(loadtest.procstats.apart). Then the floor under it (`http_floor`): the same loop through a
relay that only takes each request in and sends it on (loadtest/relay_app.py), what HTTP in
Python costs on this machine before the gateway does anything of its own. Then the flow objects
alone, in this process (`flow_cost`, and `share_cost` for taking the share afresh): the part
of a page's cost that could grow with the fleet, measured apart from HTTP and from other load
on the machine. Writes route.json."""

import sys
import time
from pathlib import Path
from typing import Any, Callable

from gateway.flow.share import REBALANCE_S, FleetView
from gateway.outcome import Attempt, Outcome
from gateway.flow import ListedReplicas
from loadtest import bench_fleet, local_fleet, report
from scripts.fleet import BIN, ManagedProcess, free_port
from services.ocr_api import headers
from services.ocr_api.fleet_board import Board
from services.ocr_worker.capacity import Pace, Presence

FILE = "route.json"
GOAL_PAGES_PER_CORE_S = 400.0
SHAPES = (("list", 16), ("list", 128), ("nginx", 128))


def _listed(workers: int, page_s: float, clock: Callable[[], float] = time.monotonic):
    """`workers` sim workers' boards (each answers with its own, as a real one does) and a
    list of them, probed once: (the boards by URL, the fleet view, the replica set)."""
    pace = Pace()
    pace.page_s, pace.gap_s = page_s, 0.001
    board = {f"http://w{i}": Presence(pace, lambda: False) for i in range(workers)}

    def probe(url, sent):
        return True, {**board[url].answer_headers(sent), headers.CAPACITY: "4",
                      headers.FREE: "4", headers.HELD: "0"}

    fleet = FleetView(Board(clock=clock))
    replicas = ListedReplicas(urls=list(board), probe=probe, fleet=fleet, clock=clock)
    replicas.probe_all(every=True)
    return board, fleet, replicas


def flow_cost(workers: int, urgent: bool, pages: int = 6000) -> float:
    """CPU ms per page of a gateway's flow objects with a list of `workers` replicas: place it
    (`acquire`, the board it carries) and book its answer (`release`, the worker's board
    merged), in this process, each worker answering with its own board as a real one does
    (not counted). An urgent page is an image: a document of its own, whose page is this
    process's demand while it is out (`set_demand`), as the scheduler says it."""
    board, fleet, replicas = _listed(workers, 0.01)
    replicas.set_demand(0 if urgent else 1, 1 if urgent else 0)
    spent = 0.0
    for page in range(pages + 300):  # the first 300 warm up
        began = time.process_time()
        if urgent:
            replicas.set_demand(0, 1)
        replica = replicas.acquire(urgent=urgent)
        sent = fleet.outgoing()
        placing = time.process_time() - began
        said = board[replica.url].answer_headers(sent)
        began = time.process_time()
        replicas.release(replica, Attempt(Outcome.OK, 200, {}, "", capacity=4, free=4, held=0,
                                          worker=said[headers.WORKER],
                                          board=said[headers.BOARD]))
        if urgent:
            replicas.set_demand(0, 0)
        if page >= 300:
            spent += placing + time.process_time() - began
    return round(spent / pages * 1000, 3)


def share_cost(workers: int, takes: int = 2000) -> float:
    """CPU ms of taking the share afresh once (`look` after news: each replica's target, the
    fleet's slots, the workers kept idle for images) with a list of `workers` replicas whose
    pages are long enough that some are kept idle. A gateway process takes it up to every
    REBALANCE_S while answers bring news, whatever its page rate: at few pages a second and
    many replicas, a part of its CPU per page that grows with the fleet."""
    clock = _Clock()
    _, fleet, replicas = _listed(workers, 4.0, clock)
    replicas.set_demand(1)
    fleet.set_urgent(3.0)
    spent = 0.0
    for take in range(takes + 100):  # the first 100 warm up; all within the workers' ttl
        clock.now += REBALANCE_S
        replicas.heard_news()
        began = time.process_time()
        replicas.look()
        if take >= 100:
            spent += time.process_time() - began
    return round(spent / takes * 1000, 3)


class _Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def http_floor(log_dir: Path, workers: int = 16) -> dict[str, Any]:
    """bench_fleet.route_loop through the relay instead of a gateway: its pages per
    CPU-second, on a core of its own as the gateway's."""
    with local_fleet.workers(workers, local_fleet.sim_worker_env(0.0), log_dir) as fleet:
        port = free_port()
        relay = ManagedProcess(
            f"relay:{port}", [str(BIN / "gunicorn"), "-w", "1", "-k", "gthread", "--threads",
                              "64", "-b", f"127.0.0.1:{port}", "loadtest.relay_app:wsgi_app()"],
            {"RELAY_WORKERS": ",".join(local_fleet.url_of(w) for w in fleet)},
            f"http://127.0.0.1:{port}/readyz", log_dir / f"relay-{port}.log")
        with local_fleet.running([relay], 60.0):
            loop = bench_fleet.route_loop(f"http://127.0.0.1:{port}", relay, fleet)
    return {"workers": workers, **{key: loop[key] for key in (
        "pages", "failures", "pages_per_s", "cpu_s", "pages_per_core_s", "core_to_itself")}}


def measure() -> dict[str, Any]:
    log_dir = report.log_dir("route")
    runs = [{"mode": mode, **bench_fleet.run_route(log_dir, workers, mode)}
            for mode, workers in SHAPES]
    floor = http_floor(log_dir)
    flow = [{"workers": workers, "image_ms": flow_cost(workers, True),
             "document_page_ms": flow_cost(workers, False),
             "share_taken_ms": share_cost(workers)} for workers in (16, 128)]
    return {"goal_pages_per_gateway_core_s": GOAL_PAGES_PER_CORE_S, "runs": runs,
            "http_floor": floor, "flow_objects_cpu_ms_per_page": flow,
            "failures": sum(run["failures"] for run in runs) + floor["failures"],
            **report.stamp()}


def table(result: dict[str, Any]) -> str:
    rows = [[run["mode"], run["workers"], run["pages_per_gateway_core_s"],
             round(1000 / run["pages_per_gateway_core_s"], 2)
             if run["pages_per_gateway_core_s"] else None, run["pages_per_s"],
             run["failures"], run["gateway_core_to_itself"], run["machine_busy"]]
            for run in result["runs"]]
    flow = [[f["workers"], f["image_ms"], f["document_page_ms"], f.get("share_taken_ms")]
            for f in result.get("flow_objects_cpu_ms_per_page", [])]
    floor = result.get("http_floor")
    floor_text = "" if floor is None else (
        f"\nThe floor: a relay that only takes each request in and sends it on "
        f"(loadtest/relay_app.py, gunicorn and Flask as the gateway), {floor['workers']} "
        f"replicas: {floor['pages_per_core_s']} pages per CPU-second "
        f"({round(1000 / floor['pages_per_core_s'], 2) if floor['pages_per_core_s'] else '-'} "
        f"ms a page), {floor['failures']} failed.\n")
    return "\n".join([report.markdown(
        ["mode", "replicas", "pages per gateway CPU-second", "gateway CPU ms/page",
         "pages/s through it", "failed", "gateway on a core of its own", "machine busy"], rows),
        floor_text, "\nThe flow objects alone, in-process (placing a page and booking its answer; and taking "
        "the share afresh, up to every REBALANCE_S while answers bring news):\n",
        report.markdown(["replicas", "CPU ms per image", "CPU ms per document page",
                         "CPU ms per taking of the share"], flow),
        f"\nGoal: >= {result['goal_pages_per_gateway_core_s']:g} pages per gateway CPU-second "
        f"at every size. {report.measured(result)}."])


if __name__ == "__main__":
    sys.exit(report.main(sys.modules[__name__]))
