"""The arithmetic of the benchmarks and the goals they are held to, pure so tests can check it."""

from __future__ import annotations

EFFICIENCY_GOALS = {8: 0.95, 16: 0.90}  # at least this efficiency up to this many replicas
PDF_LATENCY_SLACK = 1.15                # a PDF on N replicas within 1.15 x (pages/N) page times
ENGINE_SCALING_GOAL = 1.8               # 2 workers x 1 thread vs 1 worker x 1 thread
SERVING_OVERHEAD_GOAL = 0.97            # HTTP pages/s / in-process pages/s
RSS_GROWTH_GOAL = 0.05                  # worker RSS growth over the soak


def rate_from_completions(times: list[float], weights: list[int] | None = None) -> float:
    """Work completed after the first completion over the time to the last: right for one
    server (N servers finishing in step would count N - 1 extra: see windowed_rate)."""
    if len(times) < 2:
        raise ValueError("need at least two completions to measure a rate")
    order = sorted(range(len(times)), key=times.__getitem__)
    weights = weights or [1] * len(times)
    span = times[order[-1]] - times[order[0]]
    if span <= 0:
        raise ValueError("completions span no time")
    return sum(weights[i] for i in order[1:]) / span


def windowed_rate(times: list[float], weights: list[int] | None, start: float, end: float,
                  ramp: float) -> float:
    """Work completed per second in [start, end] with a trapezoidal window: the mean of plain
    counts over [start + d, end - ramp + d] for d in [0, ramp]. A plain window miscounts by up
    to one completion per server at each edge when servers finish in step; this does not."""
    length = end - ramp - start
    if ramp <= 0 or length <= ramp:
        raise ValueError("need end - start > 2 x ramp > 0")
    weights = weights or [1] * len(times)
    return sum(w * min(1.0, (t - start) / ramp, (end - t) / ramp)
               for t, w in zip(times, weights) if start <= t <= end) / length


def efficiency(replicas: list[int], pages_per_s: list[float]) -> list[float]:
    """pages/s(N) / (N x pages/s(1)); the one-replica figure is the base."""
    if 1 not in replicas:
        raise ValueError("efficiency needs the one-replica measurement as its base")
    base = pages_per_s[replicas.index(1)]
    return [pps / (n * base) for n, pps in zip(replicas, pages_per_s)]


def ideal_pdf_latency(pages: int, replicas: int, page_s: float) -> float:
    """A document of `pages` pages spread perfectly over `replicas` servers of `page_s` each."""
    return pages / replicas * page_s


def pdf_latency_goal(pages: int, replicas: int, page_s: float) -> float:
    return PDF_LATENCY_SLACK * ideal_pdf_latency(pages, replicas, page_s)


def efficiency_goal(replicas: int) -> float | None:
    """0.95 up to 8 replicas, 0.90 beyond; None for one replica (the base)."""
    if replicas <= 1:
        return None
    return EFFICIENCY_GOALS[8] if replicas <= 8 else EFFICIENCY_GOALS[16]


def growth(before: float, after: float) -> float:
    """Relative growth from before to after (0.03 = 3 % more)."""
    return (after - before) / before


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "FAIL")
