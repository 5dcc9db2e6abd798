"""What processes cost (psutil, and /proc where psutil has no word for it): resident memory and
its peak, CPU seconds, and two samplers for a block of a benchmark: ForeignLoad (CPU: ours, the
machine's, everyone else's) and PeakRss (a process group's summed RSS); and `apart`, a core of
its own for a service."""

from __future__ import annotations

import contextlib
import os
import resource
import threading
import time
from pathlib import Path
from typing import Iterator

import psutil

from scripts.fleet import group_members


def rss_kib(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss // 1024


def peak_rss_kib(pid: int) -> int:
    """VmHWM: the most resident memory since the process started or reset_peak_rss."""
    line = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if line.startswith("VmHWM:"))
    return int(line.split()[1])


def reset_peak_rss(pid: int) -> bool:
    """Start VmHWM afresh from the current RSS (Linux clear_refs "5"); False where not allowed."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def group_pids(pgid: int) -> list[int]:
    """Every process of a service (scripts/fleet.py starts each in a process group of its own)."""
    return sorted(pid for pid, _state in group_members(pgid))


def group_cpu(processes) -> float:
    """User + system CPU seconds so far of these services (ManagedProcess), all their processes."""
    total = 0.0
    for pid in (pid for process in processes for pid in group_pids(process.pid)):
        try:
            total += sum(psutil.Process(pid).cpu_times()[:2])
        except psutil.Error:
            continue
    return total


@contextlib.contextmanager
def apart(processes, others) -> Iterator[bool]:
    """`processes` (services: every thread of every process of each) on the first core and
    `others` on the rest, where they stay (a benchmark stops them after), and this thread (the
    load) on the rest while the block runs: so the CPU time of `processes` is their own work,
    not their share of contended cores. False, and nothing moved, with a single core. Threads
    started later run where the thread that starts them does."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        yield False
        return
    for group, where in ((processes, cores[:1]), (others, cores[1:])):
        for pid in (pid for process in group for pid in group_pids(process.pid)):
            with contextlib.suppress(psutil.Error, OSError):
                for thread in psutil.Process(pid).threads():
                    os.sched_setaffinity(thread.id, where)
    os.sched_setaffinity(0, cores[1:])
    try:
        yield True
    finally:
        os.sched_setaffinity(0, cores)


def self_cpu() -> float:
    """CPU seconds of this process and its finished children (the load generator, a client)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime + time.process_time()


def gunicorn_worker_pid(master_pid: int) -> int:
    """The one forked worker of a gunicorn master started with OCR_PROCESSES=1."""
    kids = psutil.Process(master_pid).children()
    if len(kids) != 1:
        raise RuntimeError(f"gunicorn master {master_pid} has {len(kids)} children, expected 1")
    return kids[0].pid


def _busy_seconds() -> float:
    """CPU seconds all cores of this machine have been busy since boot."""
    times = psutil.cpu_times()
    return sum(times) - times.idle - times.iowait


class ForeignLoad:
    """CPU over a block: `cpu_s` of these services, `busy` (the machine's busy share of its
    cores) and `cores`: the cores processes other than ours (these services, this process and
    its children) kept busy per wall second. A figure measured while that is large is not
    trustworthy on a 2-core machine."""

    def __init__(self, processes=()):
        self.processes = list(processes)
        self.cores = self.cpu_s = self.busy = 0.0

    def _marks(self) -> tuple[float, ...]:
        services = group_cpu(self.processes)
        return services, services + self_cpu(), _busy_seconds(), time.perf_counter()

    def __enter__(self) -> "ForeignLoad":
        self._start = self._marks()
        return self

    def __exit__(self, *exc) -> None:
        self.cpu_s, own, busy, wall = (b - a for a, b in zip(self._start, self._marks()))
        if wall > 0:
            self.cores = max(0.0, (busy - own) / wall)
            self.busy = busy / wall / psutil.cpu_count()


class PeakRss:
    """The most a process group's summed RSS (KiB) reached while the block ran, sampled every
    `every_s` from a thread."""

    def __init__(self, pgid: int, every_s: float = 0.02):
        self.pgid, self.every_s, self.peak = pgid, every_s, 0
        self._stop = threading.Event()

    def now(self) -> int:
        total = 0
        for pid in group_pids(self.pgid):
            try:
                total += rss_kib(pid)
            except psutil.Error:
                continue
        return total

    def __enter__(self) -> "PeakRss":
        self._stop.clear()
        self.peak = self.now()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.every_s):
            self.peak = max(self.peak, self.now())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.now())


def wait_idle(pid: int, timeout: float = 10.0) -> bool:
    """Wait until none of the process's threads runs (R) or waits on the disk (D) for 3 reads in
    a row (say, a worker trimming its heap after an answer). False if it stays busy."""
    deadline, quiet = time.monotonic() + timeout, 0
    while time.monotonic() < deadline:
        states = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
            except (OSError, IndexError):
                continue
        quiet = 0 if {"R", "D"} & set(states) else quiet + 1
        if quiet >= 3:
            return True
        time.sleep(0.02)
    return False
