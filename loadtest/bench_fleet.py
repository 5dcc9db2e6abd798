"""`make bench-fleet`: does the gateway fill a large fleet, fairly, through every upstream mode?
Per shape (mode, N sim replicas, G gateways; BENCH_FLEET_CAPACITY pages/s in all) long PDFs sent
at once plus an image every 0.25 s per gateway (the sim charges a page by its pixels); then
growth 16 -> 64 -> 32 replicas mid-run and the routing cost of one gateway core
(docs/capacity.md, section 8). Writes fleet.json and fleet.png; knobs in loadtest/README.md.
Its run_shapes() serves bench_overload too."""

import base64
import bisect
import io
import json
import math
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

from deploy.nginx import render as nginx
from loadtest import local_fleet, report
from loadtest.loadgen import at_once, documents_with_images, p95, run_closed_loop, send
from loadtest.payloads import labelled_pdf_payload, small_image_payloads
from loadtest.procstats import ForeignLoad, apart

FILE, PLOT = "fleet.json", "fleet.png"
NO_JOBS = {"GATEWAY_JOBS_ENABLED": "false"}
PAGE_PIXELS = 1224 * 1584  # the documents' Letter pages as the workers render them (144 DPI)
SIM_ENV = {"OCR_SIM_PAGE_PIXELS": str(PAGE_PIXELS)}
ROUTE_CLIENTS = 32  # route_loop: enough to keep one gateway core busy
WINDOW_S = 4.0  # growth: pages/s over 4 s (two page times at 64 replicas: pages come in waves)


def parse_shapes(text: str) -> list[tuple]:
    """"nginx:16:2,list:64:2" as [("nginx", 16, 2), ("list", 64, 2)]."""
    return [(mode, *map(int, numbers)) for mode, *numbers in
            (part.split(":") for part in text.split(",") if part)]


FleetSettings = report.settings("FleetSettings", {
    "shapes": (parse_shapes("nginx:16:1,nginx:16:2,list:16:2,list:16:4,nginx:64:1,nginx:64:2,"
                            "nginx:64:4,list:64:2,nginx:128:2,nginx:128:4,list:128:1,list:128:4,"
                            "dns:64:2,dns:128:4"), "BENCH_FLEET_SHAPES", parse_shapes),
    "capacity": (32.0, "BENCH_FLEET_CAPACITY"), "docs": (8, "BENCH_FLEET_DOCS"),
    "pages": (120, "BENCH_FLEET_PAGES"), "image_every_s": (0.25, None),
    "growth": (True, "BENCH_FLEET_GROWTH", lambda v: v != "0" and not report.quick()),
    "jitters": ((0.75, 0.0), "BENCH_FLEET_JITTERS",
                lambda v: tuple(float(x) for x in v.split(",") if x)),
    "lengths": ((1.0, 0.5), "BENCH_FLEET_LENGTHS",
                lambda v: tuple(float(x) for x in v.split(",") if x))},
    shapes=parse_shapes("nginx:16:1,nginx:32:2,list:32:2"), docs=4, pages=40, growth=False,
    jitters=(0.75,))


def metric_sum(text: str, prefix: str) -> float:
    """The sum of a Prometheus text exposition's samples whose line starts with `prefix` (a
    metric's name and labels); 0 when none has been observed yet."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(prefix))


class PageCounter(list):
    """(perf_counter, pages answered so far) samples, from the gateways' metrics (ok attempts)."""

    def watch(self, urls: list[str], stop: threading.Event) -> None:
        while not stop.wait(0.25):
            texts = [requests.get(url.removesuffix("/ocr") + "/metrics", timeout=5).text
                     for url in urls]
            self.append((time.perf_counter(), sum(
                metric_sum(text, 'ocr_gateway_attempts_total{outcome="ok"}') for text in texts)))

    def rate(self, start: float, end: float, ramp: float) -> float | None:
        """Pages/s from `start` to `end` with a trapezoidal window (figures.windowed_rate's):
        the mean of the counts over [start + d, end - ramp + d] for d across the `ramp`.
        Pages come back in waves a page time apart (equal pages sent together): a count
        between two samples is a wave more or less by where they fall, up to a sixth off over
        six waves; with the ramp a page time, the mean over its phases is within 2 %."""
        times = [t for t, _ in self]
        if times and times[0] > start:  # the first count came late (a busy machine, several
            start += math.ceil((times[0] - start) / ramp) * ramp  # gateways): whole ramps on
        if end - start <= 2 * ramp or not times:
            return None

        def count(at: float) -> float:
            return self[bisect.bisect_right(times, at) - 1][1]

        phases = [ramp * i / 20 for i in range(20)]
        return statistics.mean(count(end - ramp + d) - count(start + d)
                               for d in phases) / (end - ramp - start)

    def rates(self, started: float) -> list[tuple[float, float]]:
        """(seconds since `started`, pages/s over the WINDOW_S before)."""
        out = []
        for index, (t1, b) in enumerate(self):
            earlier = [(t, n) for t, n in self[:index] if t <= t1 - WINDOW_S]
            if earlier:
                t0, a = earlier[-1]
                out.append((round(t1 - started, 1), round((b - a) / (t1 - t0), 2)))
        return out


ENGINE_SECONDS = 'ocr_worker_stage_seconds_sum{stage="inference"}'


class EngineClock:
    """Each worker's engine seconds so far, read from its /metrics (the inference stage's sum)
    while the block runs: the workers in turn, each about every `every_s` (a read costs a
    worker some 2 ms of CPU; a few at once, so that slow answers on a busy machine keep the
    pace), and every worker once more at the end.

    `busy` is the share of the fleet's time its engines spent reading pages (images included,
    at their own time): how full the gateways kept the workers. Pages counted over a window
    say that too with equal pages, but with page times drawn ±75 % a fleet of 16 fits some
    480 pages in 15 s give or take 2 %, whoever placed them."""

    def __init__(self, urls: list[str], every_s: float = 1.0):
        self.samples: dict[str, list[tuple[float, float]]] = {u + "/metrics": [] for u in urls}
        self.every_s = every_s
        self._stop = threading.Event()
        self._local = threading.local()

    def __enter__(self) -> "EngineClock":
        self._readers = ThreadPoolExecutor(4)
        self._thread = threading.Thread(target=self._read_in_turn, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._readers.shutdown()
        for url in self.samples:
            self._read(url)

    def _read_in_turn(self) -> None:
        pause, due = self.every_s / max(1, len(self.samples)), time.perf_counter()
        while True:
            for url in self.samples:
                if self._stop.wait(max(0.0, due - time.perf_counter())):
                    return
                self._readers.submit(self._read, url)
                due += pause

    def _read(self, url: str) -> None:
        session = getattr(self._local, "session", None) or requests.Session()
        self._local.session = session
        asked = time.perf_counter()
        try:
            text = session.get(url, timeout=5).text
        except requests.RequestException:
            return  # a worker gone (shrunk): its last reads stand
        self.samples[url].append(((asked + time.perf_counter()) / 2,
                                  metric_sum(text, ENGINE_SECONDS)))

    def busy(self, start: float, end: float, ramp: float) -> float | None:
        """The fleet's engine seconds from `start` to `end` over its workers' time then, read
        as the mean over [start + d, end - ramp + d] for d across the `ramp` (a page time).
        A worker's count grows only as a page ends, so at a moment it is behind the engine's
        time by part of the page under way, and between two reads it is read as a straight
        line. Over a page time's phases that part is the same at both ends, and it cancels:
        with equal pages exactly; with pages that vary, once the reads around `start` came
        after each worker's first page or so (`start` two page times in, a read every page
        time: before its first page ends a worker is behind by all it has read)."""
        if end - ramp <= start or not all(self.samples.values()):
            return None
        phases = [ramp * i / 20 for i in range(20)]
        samples = [sorted(s) for s in self.samples.values()]
        spent = statistics.mean(sum(at(s, end - ramp + d) - at(s, start + d) for s in samples)
                                for d in phases)
        return spent / (len(self.samples) * (end - ramp - start))


def at(samples: list[tuple[float, float]], moment: float) -> float:
    """A growing count at `moment`, between the (time, count) samples around it."""
    index = bisect.bisect_right([t for t, _ in samples], moment)
    if index == 0:
        return samples[0][1]
    if index == len(samples):
        return samples[-1][1]
    (t0, v0), (t1, v1) = samples[index - 1], samples[index]
    return v0 + (v1 - v0) * (moment - t0) / (t1 - t0)


def image_share(fleet: local_fleet.Fleet) -> float:
    """The largest image's share of a page's time: 1 unless the sim charges pixels."""
    from PIL import Image

    sizes = [Image.open(io.BytesIO(base64.b64decode(json.loads(p.body)["file"]))).size
             for p in small_image_payloads(8)]
    share = max(w * h for w, h in sizes) / PAGE_PIXELS
    return min(1.0, share) if "OCR_SIM_PAGE_PIXELS" in fleet.env else 1.0


def whole(docs: list) -> tuple[int, list]:
    """How many of these answers (status, seconds, problem, ...) were right; the first wrong."""
    wrong = [d[2] or d[0] for d in docs if d[0] != 200 or d[2]]
    return len(docs) - len(wrong), wrong[:4]


def run_shape(fleet: local_fleet.Fleet, mode: str, count: int, settings, page_ms: float,
              capacity: float, **env: str) -> dict[str, Any]:
    """settings.docs PDFs sent at once through `count` gateways, of settings.pages pages times
    each of settings.lengths in turn (every gateway gets each length), each gateway also sent
    an image every settings.image_every_s (bench_overload's mix, too)."""
    replicas, counter, share = len(fleet.workers), PageCounter(), image_share(fleet)
    lengths = [max(1, round(settings.pages * f)) for f in getattr(settings, "lengths", (1.0,))]
    pdfs = [labelled_pdf_payload(n, seed=replicas + k) for k, n in enumerate(lengths)]
    with fleet.gateways(mode, count, **env) as gateways, \
            EngineClock([local_fleet.url_of(w) for w in fleet.workers], page_ms / 1000) as clock:
        sampler = ForeignLoad(gateways)
        docs, images, makespan, started = documents_with_images(
            [local_fleet.url_of(g) + "/ocr" for g in gateways], pdfs, settings.docs,
            settings.image_every_s, watch=counter.watch, meter=sampler)
    (ok_docs, errors), latencies = whole(docs), [t for t, ok, _ in images if ok]
    sizes = [lengths[(i // count) % len(lengths)] for i in range(len(docs))]
    pages = sum(n for n, d in zip(sizes, docs) if d[0] == 200 and not d[2]) \
        + len(latencies) * share  # in whole pages' time
    finishes, page_s = [d[3] for d in docs], page_ms / 1000.0
    spread = max((max(group) - min(group)) / makespan  # of equal documents
                 for group in ([f for f, n in zip(finishes, sizes) if n == length]
                               for length in lengths) if group)
    image_s, image_p95 = page_s * share, p95(latencies)  # the largest image's own time
    # images sent after the first page time: while every worker reads its first page (the
    # documents came at once), none starts an image before that page ends
    later = p95([t for t, ok, sent in images if ok and sent >= started + page_s])
    # while every document still runs: the workers' engines' busy share (EngineClock.busy),
    # up to a page time before the first document's end (the reads around a moment are read
    # as a straight line, and the fleet's pages thin out after it); and pages counted over
    # whole page times (pages come back in waves) back from the first document's end;
    # efficiency_makespan also counts the last, partial round
    end = started + min(finishes)
    busy = clock.busy(started + 2 * page_s, end - page_s, page_s)
    waves = int((end - started - page_s) // page_s)
    steady = counter.rate(end - waves * page_s, end, page_s)
    if steady:  # the counter counts an image as a page: it costs `share` of one
        steady -= len(images) / makespan * (1 - share)
    return {
        "mode": mode, "replicas": replicas, "gateways": count, "page_ms": page_ms,
        "capacity_pages_per_s": capacity, "makespan_s": round(makespan, 2),
        "pages_per_s": round(pages / makespan, 2),
        "efficiency": round(busy, 3) if busy else None,
        "efficiency_counted": round(steady / capacity, 3) if steady else None,
        "efficiency_makespan": round(pages / makespan / capacity, 3),
        "documents": len(docs), "documents_ok": ok_docs, "document_errors": errors,
        "finish_first_s": round(min(finishes), 2), "finish_last_s": round(max(finishes), 2),
        "finish_spread": round(spread, 3), "lengths": lengths,
        "finishes_s": [[i % count, n, round(f, 2)] for i, (n, f) in enumerate(zip(sizes,
                                                                                   finishes))],
        "images": len(images), "images_ok": len(latencies),
        "image_p95_s": round(image_p95, 3) if image_p95 else None,
        "image_own_s": round(image_s, 3),
        "image_p95_wait_s": round(image_p95 - image_s, 3) if image_p95 else None,
        "image_median_s": round(statistics.median(latencies), 3) if latencies else None,
        "image_p95_after_first_page_s": round(later, 3) if later else None,
        "gateway_cpu_ms_per_page": round(1000 * sampler.cpu_s / max(1, pages), 2),
        "machine_busy": round(sampler.busy, 3)}


def run_shapes(settings, log_dir: Path, shapes: list, timing, worker_env: dict | None = None,
               jitter: float = 0.0, **env: str) -> tuple[list, list]:
    """(engines, run_shape of each (mode, N, G) shape but nginx ones without nginx): one fleet
    for all shapes of an N (DNS ones apart); timing(N) = (its page time, its pages/s); each
    page's time drawn up to `jitter` of it either way (OCR_SIM_JITTER_MS)."""
    engines, made, by_replicas = [], [], {}  # (N, DNS?) -> [(mode, G)]
    for mode, replicas, count in shapes:
        by_replicas.setdefault((replicas, mode == "dns"), []).append((mode, count))
    for (replicas, dns_mode), runs in by_replicas.items():
        page_ms, capacity = timing(replicas)
        varied = {**(worker_env or {}), "OCR_SIM_JITTER_MS": f"{jitter * page_ms:g}"}
        with local_fleet.Fleet(log_dir / f"n{replicas}{'-dns' if dns_mode else ''}", page_ms,
                               replicas, dns_mode=dns_mode, worker_env=varied) as fleet:
            engines += report.engine_info([local_fleet.url_of(fleet.workers[0])])
            for mode, count in runs:
                if mode == "nginx" and nginx.find_nginx() is None:
                    report.say("skipping nginx shapes: nginx is not installed")
                    continue
                made.append({**run_shape(fleet, mode, count, settings, page_ms, capacity, **env),
                             "jitter": jitter})
                report.say(f"{log_dir.name} {mode} N={replicas} G={count}: {made[-1]}")
    return engines, made


def run_growth(settings, log_dir: Path, mode: str = "nginx") -> dict[str, Any]:
    """16 replicas, then 64 mid-run, then 32: pages/s per second against capacity."""
    page_ms, pdf = 64 * 1000.0 / settings.capacity, labelled_pdf_payload(settings.pages, seed=3)
    counter, stop = PageCounter(), threading.Event()
    with local_fleet.Fleet(log_dir / f"growth-{mode}", page_ms, 16, dns_mode=mode == "dns",
                           worker_env=SIM_ENV) as fleet, \
            fleet.gateways(mode, 2, **NO_JOBS) as gateways, ThreadPoolExecutor(2) as side:
        urls = [local_fleet.url_of(g) + "/ocr" for g in gateways]
        side.submit(counter.watch, urls, stop)
        started = time.perf_counter()
        docs = side.submit(at_once, lambda i: send(urls[i % len(urls)], pdf),
                           range(settings.docs))
        time.sleep(15)
        grown_at = time.perf_counter() - started
        fleet.add_workers(48)
        ready_at = time.perf_counter() - started
        time.sleep(25)
        shrunk_at = time.perf_counter() - started
        fleet.remove_workers(32)
        results = docs.result()
        stop.set()
    rates, (ok, errors) = counter.rates(started), whole(results)
    full = 0.95 * 64 * (1000.0 / page_ms)  # 95 % of 64 replicas' pages/s
    reach = next((t for t, rate in rates if t >= ready_at and rate >= full), None)
    return {"mode": mode, "page_ms": page_ms, "grown_at_s": round(grown_at, 1),
            "new_replicas_ready_at_s": round(ready_at, 1), "reached_new_capacity_at_s": reach,
            "seconds_to_new_capacity": round(reach - ready_at, 1) if reach else None,
            "shrunk_at_s": round(shrunk_at, 1), "documents": len(results), "documents_ok": ok,
            "document_errors": errors, "pages_per_s_by_second": rates}


def route_loop(url: str, server: Any, others: Any) -> dict[str, Any]:
    """10 s of a closed loop of 32 clients sending small images to `url`, after 1 s of warm-up,
    with `server` (the one process measured) on a core of its own and `others` on the rest
    (where the machine has two): its pages, failures, and pages per CPU-second of `server`.
    The gateway's figure (run_route) and its floor (loadtest.bench_route.http_floor) both
    come from here, so they stay the same measurement."""
    with apart([server], others) as alone, ForeignLoad([server]) as sampler:
        result = run_closed_loop(url, small_image_payloads(8), ROUTE_CLIENTS,
                                 duration_s=10.0, warmup_s=1.0)
    pages, cpu_s = len(result.completions), sampler.cpu_s
    return {"concurrency": ROUTE_CLIENTS, "pages": pages, "failures": result.failure_count,
            "pages_per_s": round(result.pages_per_s(), 1), "cpu_s": round(cpu_s, 2),
            "pages_per_core_s": round(pages / cpu_s, 1) if cpu_s else None,
            "core_to_itself": alone, "machine_busy": round(sampler.busy, 3)}


def run_route(log_dir: Path, workers: int = 16, mode: str = "list") -> dict[str, Any]:
    """One gateway process, 0-ms sim workers, route_loop through it: what one gateway core can
    route. loadtest.bench_route runs it at 16 and 128 replicas."""
    with local_fleet.Fleet(log_dir / f"route-{mode}-{workers}", 0.0, workers) as fleet, \
            fleet.gateways(mode, 1, GATEWAY_PROCESSES="1", **NO_JOBS) as (gateway,):
        loop = route_loop(local_fleet.url_of(gateway), gateway, fleet.workers)
    return {"workers": workers, "concurrency": loop["concurrency"], "pages": loop["pages"],
            "failures": loop["failures"], "pages_per_s": loop["pages_per_s"],
            "gateway_cpu_s": loop["cpu_s"],
            "pages_per_gateway_core_s": loop["pages_per_core_s"],
            "gateway_core_to_itself": loop["core_to_itself"],
            "machine_busy": loop["machine_busy"]}


def measure() -> dict[str, Any]:
    settings, log_dir = FleetSettings.from_env(), report.log_dir("fleet")
    engines, shapes = [], []
    for jitter in settings.jitters:  # pages that vary first: the figures that matter
        made = run_shapes(settings, log_dir / f"jitter-{jitter:g}", settings.shapes, lambda n: (
            n * 1000.0 / settings.capacity, settings.capacity), SIM_ENV, jitter, **NO_JOBS)
        engines, shapes = engines + made[0], shapes + made[1]
    result: dict[str, Any] = {"engine": report.engine_label(engines),
                              "capacity_pages_per_s": settings.capacity,
                              "jitters": list(settings.jitters),
                              "documents": settings.docs, "pages": settings.pages,
                              "lengths": list(settings.lengths),
                              "image_every_s": settings.image_every_s, "shapes": shapes}
    if settings.growth:
        result["growth"] = [run_growth(settings, log_dir, mode) for mode in ("nginx", "dns")]
    return {**result, **report.stamp(engines)}


def wrong_answers(result: dict[str, Any]) -> int:
    return sum(s["documents"] - s["documents_ok"] + s["images"] - s["images_ok"]
               for s in result["shapes"])


def efficiencies(shape: dict[str, Any]) -> tuple:
    """(the engines' busy share, pages counted ÷ capacity) while documents run; a result from
    before the EngineClock has only the count, as its "efficiency"."""
    if "efficiency_counted" in shape:
        return shape["efficiency"], shape["efficiency_counted"]
    return None, shape["efficiency"]


def table(result: dict[str, Any]) -> str:
    """One table per page-time spread (pages that vary first), then growth."""
    lines = []
    for jitter in dict.fromkeys(s.get("jitter", 0.0) for s in result["shapes"]):
        shapes = [s for s in result["shapes"] if s.get("jitter", 0.0) == jitter]
        rows = [[f"{s['mode']}, {s['replicas']} replicas, {s['gateways']} gateway(s)",
                 f"{s['page_ms'] / 1000:g} s" + (f" ± {jitter:.0%}" if jitter else ""),
                 *efficiencies(s), s["efficiency_makespan"],
                 s["finish_spread"], s["image_p95_s"], s["image_p95_wait_s"],
                 s.get("image_p95_after_first_page_s"),
                 f"{s['documents_ok']}/{s['documents']}, {s['images_ok']}/{s['images']}",
                 s["gateway_cpu_ms_per_page"], s["machine_busy"]] for s in shapes]
        lines += [f"\nEach page's time {f'± {jitter:.0%} around' if jitter else 'exactly'} "
                  "its mean:\n", report.markdown(
                      ["shape", "page time", "workers' engines busy (documents running)",
                       "pages/s ÷ capacity (documents running)",
                       "pages/s ÷ capacity over the makespan", "finish spread", "image p95 (s)",
                       "image p95 beyond its own time (s)",
                       "image p95 after the first page time (s)", "documents, images right",
                       "gateway CPU ms/page", "machine busy"], rows)]
    lines += [f"\nGrowth 16 → 64 replicas mid-run ({g['mode']}): the new capacity was reached "
              f"{g['seconds_to_new_capacity']} s after the new replicas were ready; 64 → 32 at "
              f"{g['shrunk_at_s']} s; documents {g['documents_ok']}/{g['documents']} whole."
              for g in result.get("growth", [])]
    route = result.get("route")  # results from before loadtest.bench_route
    if route:
        lines.append(f"\nRouting: {route['pages_per_gateway_core_s']} small pages per gateway "
                     f"CPU-second ({route['pages_per_s']} pages/s through one gateway process"
                     f"{', on a core of its own' if route.get('gateway_core_to_itself') else ''}, "
                     f"{route['failures']} failed).")
    return "\n".join(lines + [f"\n{report.measured(result)}."])


def plot(result: dict[str, Any], path: Path) -> Path:
    """Per shape: efficiency, image p95 and finish spread against their goals; the growth run's
    pages/s over time against the capacity of 16, 64 and 32 replicas."""
    shapes, growth, xs = result["shapes"], result.get("growth") or [], range(len(result["shapes"]))
    panels = {f"{key} (goal {sense} {goal:g})": [(xs, [s[key] for s in shapes], "o", "measured"),
                                                 (xs, [goal] * len(xs), "r:", "goal")]
              for key, sense, goal in [("efficiency", ">=", 0.95), ("image_p95_s", "<=", 2.0),
                                       ("finish_spread", "<=", 0.15)]}
    if growth:
        seconds = [0, max(t for g in growth for t, _ in g["pages_per_s_by_second"])]
        panels["pages/s over 4 s: 16 -> 64 -> 32 replicas"] = [
            *[(*zip(*g["pages_per_s_by_second"]), "-", g["mode"]) for g in growth],
            *[(seconds, [n * 1000.0 / growth[0]["page_ms"]] * 2, "r:", f"capacity, {n}")
              for n in (16, 64, 32)]]
    fig, axes = report.plot_row(f"ocrfleet at scale: {result['engine']}, capacity "
                         f"{result['capacity_pages_per_s']:g} pages/s", panels)
    for axis in axes[:3]:
        axis.set_xticks(xs, [f"{s['mode']} N={s['replicas']} G={s['gateways']}" for s in shapes],
                        fontsize=7, rotation=45, ha="right")
    return report.save(fig, path)


if __name__ == "__main__":
    sys.exit(report.main(sys.modules[__name__]))
