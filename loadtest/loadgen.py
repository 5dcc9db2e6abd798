"""The benchmarks' load, every answer checked: a closed loop (threads, a keep-alive session
each) for a time or a number of requests, single requests, documents sent at once beside images
on a schedule, workers' own rates (http_rate) and one worker's RSS over a run (worker_rss), and
the rates and percentiles made of them."""

from __future__ import annotations

import contextlib
import itertools
import math
import statistics
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import requests

from loadtest import local_fleet, procstats, report
from loadtest.checks import answer_problem
from loadtest.figures import rate_from_completions, windowed_rate
from loadtest.payloads import JSON_HEADERS, Payload, dense_page_payloads, small_image_payloads


@dataclass
class Completion:
    started: float
    finished: float
    pages: int
    ok: bool
    replica: str | None = None


@dataclass
class LoadResult:
    completions: list[Completion] = field(default_factory=list)
    failures: Counter = field(default_factory=Counter)  # message -> count
    window: tuple[float, float] = (0.0, 0.0)
    client_cpu_s: float = 0.0
    wall_s: float = 0.0

    def in_window(self) -> list[Completion]:
        """Right answers that came back inside the window (in a steady closed loop, counting
        by finish time is what measures the rate)."""
        start, end = self.window
        return [c for c in self.completions if c.ok and start <= c.finished <= end]

    @property
    def ok_count(self) -> int:
        return sum(c.ok for c in self.completions)

    @property
    def failure_count(self) -> int:
        return sum(self.failures.values())

    def pages_per_s(self) -> float:
        """Pages/s of right answers in the window (figures.windowed_rate, ramp <= 2 s)."""
        (start, end), done = self.window, self.in_window()
        return windowed_rate([c.finished for c in done], [c.pages for c in done], start, end,
                             min(2.0, (end - start) / 10))

    def latencies(self) -> list[float]:
        start, end = self.window
        return sorted(c.finished - c.started for c in self.completions
                      if c.ok and c.started >= start and c.finished <= end)


def send(url: str, payload: Payload, timeout: float = 600,
         session: requests.Session | None = None) -> tuple[int, float, str | None]:
    """(status, seconds, what was wrong or None) of one checked request to this /ocr URL."""
    started = time.perf_counter()
    try:
        response = (session or requests).post(url, data=payload.body, headers=JSON_HEADERS,
                                              timeout=timeout)
    except requests.RequestException as exc:
        return 0, time.perf_counter() - started, type(exc).__name__
    problem = answer_problem(response.status_code, response.json, payload.expected)
    return response.status_code, time.perf_counter() - started, problem and problem[:160]


def post_checked(session: requests.Session, url: str, payload: Payload,
                 timeout: float) -> tuple[bool, str | None]:
    """(True, None) for a right answer, else (False, what was wrong)."""
    problem = send(url, payload, timeout, session)[2]
    return problem is None, problem


def run_closed_loop(urls: str | list[str], payloads: list[Payload], concurrency: int, *,
                    duration_s: float | None = None, warmup_s: float = 0.0,
                    total_requests: int | None = None, timeout: float = 120.0,
                    on_complete: Callable[[int, Completion], None] | None = None) -> LoadResult:
    """Keep `concurrency` requests in flight, threads bound round-robin to `urls`: for warmup_s
    + duration_s (the window: the duration after the warm-up), or until total_requests are
    answered (the window: the whole run). on_complete(n, completion) follows the n-th answer."""
    if (duration_s is None) == (total_requests is None):
        raise ValueError("give exactly one of duration_s and total_requests")
    urls = [urls] if isinstance(urls, str) else list(urls)
    result, lock, stop = LoadResult(), threading.Lock(), threading.Event()
    claimed, done_count = itertools.count(), itertools.count(1)

    def loop(index: int) -> None:
        url = urls[index % len(urls)].rstrip("/") + "/ocr"
        with requests.Session() as session:
            for turn in itertools.count():
                if stop.is_set() or (total_requests is not None
                                     and next(claimed) >= total_requests):
                    return
                payload = payloads[(index + turn * concurrency) % len(payloads)]
                started = time.perf_counter()
                ok, why = post_checked(session, url, payload, timeout)
                done = Completion(started, time.perf_counter(), payload.expected.pages, ok, url)
                with lock:
                    result.completions.append(done)
                    result.failures.update([why] if why else [])
                    number = next(done_count)
                if on_complete:
                    on_complete(number, done)

    cpu_before, began = time.process_time(), time.perf_counter()
    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    if duration_s is not None:
        stop.wait(max(0.0, began + warmup_s + duration_s - time.perf_counter()))
        result.window = (began + warmup_s, time.perf_counter())
        stop.set()
    for thread in threads:
        thread.join(timeout + 5)
    if total_requests is not None:
        result.window = (began, time.perf_counter())
    result.wall_s = time.perf_counter() - began
    result.client_cpu_s = time.process_time() - cpu_before
    return result


def images_every(url: str, every_s: float,
                 stop: threading.Event) -> list[tuple[float, bool, float]]:
    """Single images on a fixed schedule until `stop`: (latency, right, sent at) each."""
    images, results = small_image_payloads(4), []

    def one(payload: Payload) -> None:
        started = time.perf_counter()
        ok = send(url, payload, 60)[2] is None
        results.append((time.perf_counter() - started, ok, started))  # atomic append

    with ThreadPoolExecutor(32) as pool:
        next_at = time.perf_counter()
        for turn in itertools.count():
            if stop.is_set():
                break
            pool.submit(one, images[turn % len(images)])
            next_at += every_s
            stop.wait(max(0.0, next_at - time.perf_counter()))
    return results


def documents_with_images(urls: list[str], pdfs: list[Payload], count: int, every_s: float,
                          watch: Callable | None = None, meter=None):
    """`count` documents sent at once, round-robin over these /ocr URLs, each URL given each
    of `pdfs` in turn (document i: `pdfs[(i // len(urls)) % len(pdfs)]`), while each URL
    gets an image every `every_s`, inside `meter` (a context manager), after a warm-up image
    per URL; watch(urls, stop) runs alongside. Per document (status, seconds, problem, finished
    since the start), the images' (latency, right, sent at), the makespan and the start."""
    for url in urls:
        send(url, small_image_payloads(1)[0])  # warm connections
    stop = threading.Event()
    with meter or contextlib.nullcontext(), ThreadPoolExecutor(len(urls) + 1) as side:
        images = [side.submit(images_every, url, every_s, stop) for url in urls]
        if watch:
            side.submit(watch, urls, stop)
        started = time.perf_counter()
        docs = at_once(lambda i: (*send(urls[i % len(urls)], pdfs[(i // len(urls)) % len(pdfs)]),
                                  time.perf_counter() - started), range(count))
        makespan = time.perf_counter() - started
        stop.set()
        image_results = [r for future in images for r in future.result()]
    return docs, image_results, makespan, started


def http_rate(workers: list, pages_per_worker: int, payloads: list | None = None,
              in_flight: int = 2) -> dict:
    """Pages/s of these worker processes, each sent pages (default: dense pages) directly,
    `in_flight` at a time after one untimed; median latency, other processes' load."""
    urls, payloads = [local_fleet.url_of(w) for w in workers], payloads or dense_page_payloads(2)
    warm = run_closed_loop(urls, payloads, len(urls), total_requests=len(urls), timeout=300)
    with procstats.ForeignLoad(workers) as foreign:
        load = run_closed_loop(urls, payloads, in_flight * len(urls),
                               total_requests=pages_per_worker * len(urls), timeout=300)
    done, finished = [c for c in load.completions if c.ok], defaultdict(list)
    for completion in done:  # a rate per worker, first to last answer: no pipeline filling
        finished[completion.replica].append(completion.finished)
    return {"workers": len(urls), "pages": len(done),
            "pages_per_s": sum(rate_from_completions(t) for t in finished.values()),
            "latency_p50_s": statistics.median(c.finished - c.started for c in done),
            "failures": load.failure_count + warm.failure_count,
            "failure_kinds": dict(load.failures.most_common(3)),
            "other_load_cores": round(foreign.cores, 2)}


def worker_rss(env: dict[str, str], payloads: list[Payload], total: int, in_flight: int,
               timeout: float, log_dir: Path, name: str,
               sample: Callable[[int, int, Completion], None]) -> dict[str, Any]:
    """One worker answers `total` requests, `in_flight` at a time; sample(pid, n, completion)
    after the n-th, pid its forked gunicorn worker (which holds the model): idle at the start,
    its RSS then (its peak reset), the master's at the end, the load, the engines."""
    with local_fleet.workers(1, env, log_dir, name=name) as (worker,):
        url, child = local_fleet.url_of(worker), procstats.gunicorn_worker_pid(worker.pid)
        procstats.wait_idle(child)
        procstats.reset_peak_rss(child)
        start_kib, engines = procstats.rss_kib(child), report.engine_info([url])
        load = run_closed_loop(url, payloads, in_flight, total_requests=total, timeout=timeout,
                               on_complete=lambda number, done: sample(child, number, done))
        return {"start_kib": start_kib, "master_kib": procstats.rss_kib(worker.pid),
                "load": load, "engines": engines}


def at_once(call: Callable, items) -> list:
    """call(item) for every item, all at the same time (a thread each)."""
    items = list(items)
    with ThreadPoolExecutor(max(1, len(items))) as pool:
        return list(pool.map(call, items))


def p95(values: list[float]) -> float | None:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)] if values else None
