"""`make bench-fleet`: does the gateway fill a large fleet, fairly, through every upstream mode?

Each shape is (mode, N replicas, G gateways): N sim workers whose page time keeps the fleet's
capacity at BENCH_FLEET_CAPACITY pages/s (32 by default, so the machine's own CPU is not the
limit: N x 1000 / page_ms), reached through one nginx (`nginx`, the one-URL mode: as a k8s
ClusterIP Service), the workers' URL list (`list`), or a DNS name whose addresses are the
workers on 127.0.0.x (`dns`, as a k8s headless Service; the gateway resolves it with its own
/etc/hosts: loadtest/hosts_file.py). G gateways (2 gunicorn processes each) share them. The
load: 8 blank PDFs of 120 pages sent at once, split evenly over the gateways, plus one small
image every 0.25 s per gateway.

Figures per shape: pages/s / capacity over the documents' makespan, the images' p95 (and its
wait beyond one page time: an image on a full fleet waits for a page to finish), the spread
of the documents' finish times (as a share of the makespan), failures, the gateways' CPU per
page and the machine's load. Then two runs of their own:
- growth: `kubectl scale` 16 -> 64 in the middle of a run (nginx re-rendered and reloaded, or
  the DNS name answering 64 addresses), then back to 32; time until pages/s reaches the new
  capacity, and no page lost;
- routing: pages/s one gateway core routes (one gateway process, many 0-ms sim workers, a
  closed loop of small images): pages / the gateway's CPU-seconds.

Writes bench/results/fleet.json and fleet.png. Knobs: BENCH_FLEET_SHAPES ("nginx:16:1,..."),
BENCH_FLEET_CAPACITY (32), BENCH_FLEET_DOCS (8), BENCH_FLEET_PAGES (120), BENCH_FLEET_GROWTH
(1), BENCH_FLEET_ROUTE (1), BENCH_QUICK=1 (a short set), RESULTS_DIR."""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from deploy.nginx import render as nginx
from loadtest import local_fleet, procstats, report
from loadtest.bench_overload import images_every, p95, send
from loadtest.hosts_file import HostsFile
from loadtest.loadgen import run_closed_loop
from loadtest.payloads import labelled_pdf_payload, small_image_payloads
from scripts.fleet import ManagedProcess, free_port, gateway_process, stop_all, worker_process

DEFAULT_SHAPES = ("nginx:16:2,nginx:64:1,nginx:64:2,nginx:64:4,nginx:128:2,"
                  "list:16:2,list:64:2,list:128:4,dns:64:2")
QUICK_SHAPES = "nginx:16:1,nginx:32:2,list:32:2"
WINDOW_S = 4.0  # growth: pages/s over the last 4 s (two page times at 64 replicas: pages
# come back in waves, and a window of one page time shows the waves' phase, not the rate)


@dataclass
class FleetSettings:
    shapes: list[tuple[str, int, int]]
    capacity: float = 32.0
    docs: int = 8
    pages: int = 120
    image_every_s: float = 0.25
    growth: bool = True
    route: bool = True

    @classmethod
    def from_env(cls) -> "FleetSettings":
        env = os.environ
        quick = env.get("BENCH_QUICK", "") not in ("", "0")
        spec = env.get("BENCH_FLEET_SHAPES") or (QUICK_SHAPES if quick else DEFAULT_SHAPES)
        shapes = [(mode, int(n), int(g)) for mode, n, g in
                  (part.split(":") for part in spec.split(",") if part)]
        return cls(shapes=shapes, capacity=float(env.get("BENCH_FLEET_CAPACITY") or 32),
                   docs=int(env.get("BENCH_FLEET_DOCS") or (4 if quick else 8)),
                   pages=int(env.get("BENCH_FLEET_PAGES") or (40 if quick else 120)),
                   growth=env.get("BENCH_FLEET_GROWTH", "1") != "0" and not quick,
                   route=env.get("BENCH_FLEET_ROUTE", "1") != "0")

    def page_ms(self, replicas: int) -> float:
        return replicas * 1000.0 / self.capacity


# ---- the fleet -----------------------------------------------------------------------------
class Fleet:
    """Sim workers on 127.0.0.x (one port each, or one address each in DNS mode), an nginx
    over them, and gateways: started, grown and shrunk here, all stopped on exit."""

    def __init__(self, log_dir: Path, page_ms: float, dns_mode: bool = False):
        self.log_dir = log_dir
        self.page_ms = page_ms
        self.dns_mode = dns_mode
        self.port = free_port()  # the one worker port of DNS mode
        self.workers: list[ManagedProcess] = []
        self.others: list[ManagedProcess] = []
        self.nginx_dir = log_dir / "nginx"
        self.nginx_port: int | None = None
        self.hosts: HostsFile | None = None
        log_dir.mkdir(parents=True, exist_ok=True)

    def addresses(self) -> list[str]:
        return [local_fleet.url_of(w).removeprefix("http://") for w in self.workers]

    def add_workers(self, count: int) -> None:
        env = local_fleet.sim_worker_env(self.page_ms)
        new = []
        for _ in range(count):
            index = len(self.workers) + len(new)
            host, port = ((f"127.0.{1 + (index + 2) // 250}.{2 + (index + 2) % 250}", self.port)
                          if self.dns_mode else ("127.0.0.1", free_port()))
            new.append(worker_process(port, env, self.log_dir / f"worker-{index}.log",
                                      host=host))
        self.workers.extend(new)  # recorded before they start: close() must see them
        for process in new:
            process.start()
        for process in new:
            process.wait_ready(300)
        self._publish()

    def remove_workers(self, count: int) -> None:
        """Scale down as k8s does: out of the balancer/DNS first, then SIGTERM (the worker
        drains what it admitted)."""
        leaving, self.workers = self.workers[-count:], self.workers[:-count]
        self._publish()
        stop_all(leaving)

    def _publish(self) -> None:
        if self.nginx_port is not None:
            config = nginx.write_config(self.addresses(), self.nginx_dir / "nginx.conf",
                                        self.nginx_dir, listen=f"127.0.0.1:{self.nginx_port}")
            nginx.reload(config, self.nginx_dir)
        if self.hosts is not None:
            self.hosts.set_addresses([a.rsplit(":", 1)[0] for a in self.addresses()])

    def upstream(self, mode: str) -> dict[str, str]:
        if mode == "nginx":
            if self.nginx_port is None:
                self.nginx_port = free_port()
                config = nginx.write_config(self.addresses(), self.nginx_dir / "nginx.conf",
                                            self.nginx_dir,
                                            listen=f"127.0.0.1:{self.nginx_port}")
                self.others.append(ManagedProcess(
                    "nginx", nginx.nginx_command(config, self.nginx_dir),
                    log_path=self.nginx_dir / "nginx.log").start())
            return {"GATEWAY_UPSTREAM_URL": f"http://127.0.0.1:{self.nginx_port}"}
        if mode == "dns":
            if self.hosts is None:
                self.hosts = HostsFile("ocr-workers.bench.internal")
                self._publish()
            return {"GATEWAY_REPLICA_DNS": f"ocr-workers.bench.internal:{self.port}",
                    "GATEWAY_DNS_REFRESH_S": "1"}
        return {"GATEWAY_REPLICAS": ",".join(f"http://{a}" for a in self.addresses())}

    @contextlib.contextmanager
    def gateways(self, mode: str, count: int, **env: str) -> Iterator[list[ManagedProcess]]:
        started = []
        try:
            for index in range(count):
                port = free_port()
                process = gateway_process(port, {
                    **self.upstream(mode), "GATEWAY_LOG_LEVEL": "WARNING",
                    "GATEWAY_JOBS_ENABLED": "false", **env},
                    self.log_dir / f"gateway-{mode}-{index}-{port}.log")
                if mode == "dns":
                    process.cmd = self.hosts.wrap(process.cmd)
                started.append(process.start())
            for process in started:
                process.wait_ready(60)
            yield started
        finally:
            stop_all(started)

    def close(self) -> None:
        stop_all(self.others + self.workers)
        if self.hosts is not None:
            self.hosts.remove()


# ---- one shape -----------------------------------------------------------------------------
@dataclass
class Sampler:
    """CPU of the gateways' process groups and of the whole machine over a run."""

    gateways: list[ManagedProcess]
    cpu: float = 0.0
    busy: float = 0.0
    wall: float = 0.0
    _marks: tuple = field(default=(), repr=False)

    def __enter__(self) -> "Sampler":
        self._marks = (self._gateway_cpu(), procstats.system_busy_seconds(), time.monotonic())
        return self

    def __exit__(self, *exc) -> None:
        cpu, busy, wall = self._marks
        self.cpu = self._gateway_cpu() - cpu
        self.busy = procstats.system_busy_seconds() - busy
        self.wall = time.monotonic() - wall

    def _gateway_cpu(self) -> float:
        return sum(procstats.cpu_seconds(procstats.group_pids(g.pid)) for g in self.gateways)


def run_shape(fleet: Fleet, mode: str, replicas: int, count: int,
              settings: FleetSettings) -> dict[str, Any]:
    pdf = labelled_pdf_payload(settings.pages, seed=replicas)
    with fleet.gateways(mode, count) as gateways:
        urls = [local_fleet.url_of(g) + "/ocr" for g in gateways]
        for url in urls:
            send(url, small_image_payloads(1)[0])  # warm connections
        stop = threading.Event()
        counter = PageCounter()
        with Sampler(gateways) as sampler, ThreadPoolExecutor(len(urls) + 1) as side:
            images = [side.submit(images_every, url, settings.image_every_s, stop)
                      for url in urls]
            side.submit(counter.watch, urls, stop)
            started = time.perf_counter()
            with ThreadPoolExecutor(settings.docs) as pool:
                docs = list(pool.map(lambda i: (*send(urls[i % len(urls)], pdf),
                                                time.perf_counter() - started),
                                     range(settings.docs)))
            makespan = time.perf_counter() - started
            stop.set()
            image_results = [r for future in images for r in future.result()]
    ok_docs = [d for d in docs if d[0] == 200 and not d[2]]
    image_pages = sum(1 for latency, ok in image_results if ok)
    pages = len(ok_docs) * settings.pages + image_pages
    finishes = [d[3] for d in docs]
    latencies = [latency for latency, ok in image_results if ok]
    page_s = settings.page_ms(replicas) / 1000.0
    image_p95 = p95(latencies)
    # while every document still runs: whole page times back from the first document's end
    # (pages come back in waves one page time apart, so a window of whole waves counts
    # each once), not before the first pages are back. After that end the last round of
    # pages cannot fill the fleet: at most one page time, a few % of a run this short at
    # 4 s a page; efficiency_makespan includes it.
    end = started + min(finishes)
    waves = int((end - started - page_s) // page_s)
    steady = counter.rate(end - waves * page_s, end) if waves >= 1 else None
    return {
        "mode": mode, "replicas": replicas, "gateways": count,
        "page_ms": settings.page_ms(replicas), "capacity_pages_per_s": settings.capacity,
        "makespan_s": round(makespan, 2),
        "efficiency": round(steady / settings.capacity, 3) if steady else None,
        "efficiency_makespan": round(pages / makespan / settings.capacity, 3),
        "documents": len(docs), "documents_ok": len(ok_docs),
        "document_errors": [d[2] or d[0] for d in docs if d not in ok_docs][:4],
        "finish_first_s": round(min(finishes), 2), "finish_last_s": round(max(finishes), 2),
        "finish_spread": round((max(finishes) - min(finishes)) / makespan, 3),
        "finishes_s": [[i % len(urls), round(f, 2)] for i, f in enumerate(finishes)],
        "images": len(image_results), "images_ok": image_pages,
        "image_p95_s": round(image_p95, 3) if image_p95 else None,
        "image_p95_wait_s": round(image_p95 - page_s, 3) if image_p95 else None,
        "image_median_s": round(statistics.median(latencies), 3) if latencies else None,
        "gateway_cpu_ms_per_page": round(1000 * sampler.cpu / max(1, pages), 2),
        "machine_busy": round(sampler.busy / sampler.wall / (os.cpu_count() or 1), 3),
    }


# ---- growth mid-load ---------------------------------------------------------------------
def run_growth(settings: FleetSettings, log_dir: Path, mode: str = "nginx") -> dict[str, Any]:
    """16 replicas, then 64 mid-run, then 32: pages/s per second against capacity."""
    page_ms = settings.page_ms(64)
    per_replica = 1000.0 / page_ms
    fleet = Fleet(log_dir / f"growth-{mode}", page_ms, dns_mode=mode == "dns")
    try:
        fleet.add_workers(16)
        pdf = labelled_pdf_payload(settings.pages, seed=3)
        with fleet.gateways(mode, 2) as gateways:
            urls = [local_fleet.url_of(g) + "/ocr" for g in gateways]
            counter = PageCounter()
            stop = threading.Event()
            with ThreadPoolExecutor(len(urls) + 1) as side:
                side.submit(counter.watch, urls, stop)
                started = time.perf_counter()
                docs = [side.submit(send_many, urls, pdf, settings.docs, counter)]
                time.sleep(15)
                grown_at = time.perf_counter() - started
                fleet.add_workers(48)
                ready_at = time.perf_counter() - started
                time.sleep(25)
                shrunk_at = time.perf_counter() - started
                fleet.remove_workers(32)
                results = docs[0].result()
                stop.set()
    finally:
        fleet.close()
    rates = counter.rates(started)
    reach = next((t for t, rate in rates if t >= ready_at and rate >= 0.95 * 64 * per_replica),
                 None)
    return {"mode": mode, "page_ms": page_ms, "grown_at_s": round(grown_at, 1),
            "new_replicas_ready_at_s": round(ready_at, 1),
            "reached_new_capacity_at_s": reach,
            "seconds_to_new_capacity": round(reach - ready_at, 1) if reach else None,
            "shrunk_at_s": round(shrunk_at, 1),
            "documents": len(results), "documents_ok": sum(1 for r in results if r[0] == 200
                                                           and not r[2]),
            "document_errors": [r[2] or r[0] for r in results if r[0] != 200 or r[2]][:4],
            "pages_per_s_by_second": rates}


class PageCounter:
    """Pages answered over time, from the gateways' own metrics (their ok attempts)."""

    def __init__(self):
        self.samples: list[tuple[float, float]] = []  # (perf_counter, pages so far)

    def watch(self, urls: list[str], stop: threading.Event) -> None:
        import requests
        while not stop.wait(0.25):
            total = 0.0
            for url in urls:
                text = requests.get(url.removesuffix("/ocr") + "/metrics", timeout=5).text
                total += sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                             if line.startswith('ocr_gateway_attempts_total{outcome="ok"}'))
            self.samples.append((time.perf_counter(), total))

    def rate(self, start: float, end: float) -> float | None:
        """Pages/s between the samples nearest after `start` and before `end`."""
        inside = [(t, n) for t, n in self.samples if start <= t <= end]
        if len(inside) < 2 or inside[-1][0] - inside[0][0] < 1.0:
            return None
        (t0, n0), (t1, n1) = inside[0], inside[-1]
        return (n1 - n0) / (t1 - t0)

    def rates(self, started: float, window_s: float = WINDOW_S) -> list[tuple[float, float]]:
        """(seconds since `started`, pages/s over the `window_s` before): pages come back in
        waves a page time apart, so a shorter window would show the waves, not the rate."""
        out = []
        for index, (t1, b) in enumerate(self.samples):
            earlier = [(t, n) for t, n in self.samples[:index] if t <= t1 - window_s]
            if earlier:
                t0, a = earlier[-1]
                out.append((round(t1 - started, 1), round((b - a) / (t1 - t0), 2)))
        return out


def send_many(urls: list[str], payload, count: int, counter) -> list:
    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(lambda i: send(urls[i % len(urls)], payload), range(count)))


# ---- routing cost ----------------------------------------------------------------------------
def run_route(log_dir: Path, workers: int = 16, seconds: float = 10.0) -> dict[str, Any]:
    """One gateway process, 0-ms sim workers, a closed loop of small images: pages per
    CPU-second of the gateway process (what one gateway core can route)."""
    fleet = Fleet(log_dir / "route", page_ms=0.0)
    try:
        fleet.add_workers(workers)
        with fleet.gateways("list", 1, GATEWAY_PROCESSES="1") as (gateway,):
            url = local_fleet.url_of(gateway)
            with Sampler([gateway]) as sampler:
                result = run_closed_loop(url, small_image_payloads(8), 32,
                                         duration_s=seconds, warmup_s=1.0)
    finally:
        fleet.close()
    pages = len(result.completions)
    return {"workers": workers, "concurrency": 32, "pages": pages,
            "failures": result.failure_count,
            "pages_per_s": round(result.pages_per_s(), 1),
            "gateway_cpu_s": round(sampler.cpu, 2),
            "pages_per_gateway_core_s": round(pages / sampler.cpu, 1) if sampler.cpu else None,
            "machine_busy": round(sampler.busy / sampler.wall / (os.cpu_count() or 1), 3)}


# ---- all of it -------------------------------------------------------------------------------
def run(settings: FleetSettings) -> dict[str, Any]:
    log_dir = report.results_dir() / "logs" / "fleet"
    shapes = []
    by_replicas: dict[tuple[int, bool], list[tuple[str, int]]] = {}
    for mode, replicas, count in settings.shapes:
        by_replicas.setdefault((replicas, mode == "dns"), []).append((mode, count))
    for (replicas, dns_mode), runs in by_replicas.items():
        fleet = Fleet(log_dir / f"n{replicas}{'-dns' if dns_mode else ''}",
                      settings.page_ms(replicas), dns_mode=dns_mode)
        try:
            fleet.add_workers(replicas)
            for mode, count in runs:
                if mode == "nginx" and nginx.find_nginx() is None:
                    print("skipping nginx shapes: nginx is not installed", file=sys.stderr)
                    continue
                shapes.append(run_shape(fleet, mode, replicas, count, settings))
                print(f"fleet {mode} N={replicas} G={count}: {shapes[-1]}", file=sys.stderr,
                      flush=True)
        finally:
            fleet.close()
    result: dict[str, Any] = {"engine": "sim", "capacity_pages_per_s": settings.capacity,
                              "documents": settings.docs, "pages": settings.pages,
                              "image_every_s": settings.image_every_s, "shapes": shapes}
    if settings.growth:
        result["growth"] = [run_growth(settings, log_dir, mode) for mode in ("nginx", "dns")]
    if settings.route:
        result["route"] = run_route(log_dir)
    return {**result, **report.stamp()}


def goals(result: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for s in result["shapes"]:
        name = f"{s['mode']} N={s['replicas']} G={s['gateways']}"
        ok = s["documents_ok"] == s["documents"] and s["images_ok"] == s["images"]
        rows.append([name, s["efficiency"], s["image_p95_s"], s["image_p95_wait_s"],
                     s["finish_spread"], f"{s['documents_ok']}/{s['documents']} "
                     f"{s['images_ok']}/{s['images']}", s["gateway_cpu_ms_per_page"],
                     s["machine_busy"],
                     "PASS" if ok and s["efficiency"] >= 0.95 and s["finish_spread"] <= 0.15
                     and (s["image_p95_wait_s"] or 99) <= 2.0 else "FAIL"])
    return rows


def table(result: dict[str, Any]) -> str:
    lines = [report.table(["shape", "eff", "img p95", "p95 wait", "spread", "docs/images ok",
                           "gw ms/page", "busy", "verdict"], goals(result))]
    for g in result.get("growth", []):
        lines.append(f"growth 16->64 ({g['mode']}): new capacity reached "
                     f"{g['seconds_to_new_capacity']} s after the replicas were ready; "
                     f"documents {g['documents_ok']}/{g['documents']}")
    route = result.get("route")
    if route:
        lines.append(f"routing: {route['pages_per_gateway_core_s']} small pages per gateway "
                     f"CPU-second ({route['pages_per_s']} pages/s, {route['failures']} failed)")
    return "\n".join(lines)


def main() -> int:
    result = run(FleetSettings.from_env())
    report.write_json("fleet.json", result)
    report.plot_fleet(result, report.results_dir() / "fleet.png")
    print(table(result))
    return 1 if any(row[-1] == "FAIL" for row in goals(result)) else 0


if __name__ == "__main__":
    sys.exit(main())
