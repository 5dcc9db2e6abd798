"""What processes cost (psutil, and /proc where psutil has no word for it): RSS and its peak,
CPU seconds, two samplers for a block (ForeignLoad: CPU, ours and everyone else's; PeakRss: a
process group's summed RSS), and `apart`, a core of its own for a service."""

from __future__ import annotations

import contextlib
import os
import resource
import threading
import time
from pathlib import Path

import psutil

from scripts.fleet import group_members


def rss_kib(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss // 1024


def peak_rss_kib(pid: int) -> int:
    """VmHWM: the most resident memory since the process started or reset_peak_rss."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return int(next(line for line in status if line.startswith("VmHWM:")).split()[1])


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


def _each(pids, read) -> list:
    """read(psutil.Process) of each process still there."""
    found = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            found.append(read(psutil.Process(pid)))
    return found


def group_cpu(processes) -> float:
    """User + system CPU seconds so far of these services (ManagedProcess), all their processes."""
    pids = [pid for process in processes for pid in group_pids(process.pid)]
    return sum(_each(pids, lambda p: sum(p.cpu_times()[:2])))


@contextlib.contextmanager
def apart(processes, others):
    """`processes` (every thread of every process of each service) on the first core, `others`
    on the rest, where they stay, and this thread (the load) on the rest while the block runs:
    the CPU time of `processes` is then their own work, not a share of contended cores. False,
    and nothing moved, with a single core."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        yield False
        return
    for group, where in ((processes, cores[:1]), (others, cores[1:])):
        pids = [pid for process in group for pid in group_pids(process.pid)]
        for thread in (t for threads in _each(pids, psutil.Process.threads) for t in threads):
            with contextlib.suppress(OSError):
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


class ForeignLoad:
    """CPU over a block: `cpu_s` of these services, `busy` (the machine's busy share of its
    cores) and `cores`: the cores other processes (not these services, this process or its
    children) kept busy per wall second. A figure measured while that is large is not
    trustworthy on a 2-core machine."""

    def __init__(self, processes=()):
        self.processes = list(processes)
        self.cores = self.cpu_s = self.busy = 0.0

    def _marks(self) -> tuple[float, ...]:
        services, times = group_cpu(self.processes), psutil.cpu_times()
        busy = sum(times) - times.idle - times.iowait
        return services, services + self_cpu(), busy, time.perf_counter()

    def __enter__(self) -> ForeignLoad:
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
        return sum(_each(group_pids(self.pgid), lambda p: p.memory_info().rss // 1024))

    def __enter__(self) -> PeakRss:
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
    """Wait until none of the process's threads runs (R) or waits on the disk (D) for 3 reads
    in a row (a worker trimming its heap after an answer, say). False if it stays busy."""
    deadline, quiet = time.monotonic() + timeout, 0
    while time.monotonic() < deadline and quiet < 3:
        quiet = 0 if {"R", "D"} & _thread_states(pid) else quiet + 1
        if quiet < 3:
            time.sleep(0.02)
    return quiet >= 3


def _thread_states(pid: int) -> set[str]:
    states = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, IndexError):
            states.add((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
    return states
