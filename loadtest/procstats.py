"""What a process costs, read from Linux's /proc: resident memory (VmRSS, its peak VmHWM), CPU
seconds, a gunicorn service's processes, and two samplers for a block of a benchmark:
ForeignLoad (CPU: ours, the machine's, everyone else's) and PeakRss (a group's summed RSS)."""

from __future__ import annotations

import os
import resource
import threading
import time
from pathlib import Path

from scripts.fleet import group_members

_TICKS = os.sysconf("SC_CLK_TCK")


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise ProcessLookupError(f"no {field} for pid {pid}")


def rss_kib(pid: int) -> int:
    """VmRSS of one process in KiB."""
    return _status_kib(pid, "VmRSS")


def peak_rss_kib(pid: int) -> int:
    """VmHWM: the most resident memory the process has had (since start or the last reset)."""
    return _status_kib(pid, "VmHWM")


def reset_peak_rss(pid: int) -> bool:
    """Start VmHWM afresh from the current RSS (Linux clear_refs "5"); False where not allowed."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _stat_fields(path: Path | int) -> list[str]:
    text = Path(f"/proc/{path}/stat" if isinstance(path, int) else path).read_text()
    return text[text.rindex(")") + 2:].split()  # fields from `state` on (comm may hold spaces)


def children(pid: int) -> list[int]:
    """Direct children of pid."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int(_stat_fields(int(entry.name))[1]) == pid:
                found.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return sorted(found)


def group_pids(pgid: int) -> list[int]:
    """Every process in a process group (scripts/fleet.py starts each service in its own)."""
    return sorted(pid for pid, _state in group_members(pgid))


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds used so far by these processes (those still alive)."""
    total = 0
    for pid in pids:
        try:
            fields = _stat_fields(pid)
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / _TICKS


def group_cpu(processes) -> float:
    """CPU seconds of these services (ManagedProcess: each its whole process group)."""
    return cpu_seconds([pid for p in processes for pid in group_pids(p.pid)])


def self_cpu() -> float:
    """CPU seconds of this process and its finished children (the load generator, a client)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime + time.process_time()


def gunicorn_worker_pid(master_pid: int) -> int:
    """The one forked worker of a gunicorn master started with OCR_PROCESSES=1."""
    kids = children(master_pid)
    if len(kids) != 1:
        raise RuntimeError(f"gunicorn master {master_pid} has {len(kids)} children, expected 1")
    return kids[0]


def system_busy_seconds() -> float:
    """CPU seconds all cores of this machine have spent busy since boot (/proc/stat)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / _TICKS


class ForeignLoad:
    """CPU over a block: `cpu_s` of these services, `busy` (the machine's busy share of its
    cores) and `cores`: how busy the machine was with processes other than ours (these
    services, this process and its children), per wall second. A figure measured while that
    is large (another test run, a build) is not trustworthy on a 2-core machine."""

    def __init__(self, processes=()):
        self.processes = list(processes)
        self.cores = self.cpu_s = self.busy = 0.0

    def _marks(self) -> tuple[float, ...]:
        services = group_cpu(self.processes)
        return services, services + self_cpu(), system_busy_seconds(), time.perf_counter()

    def __enter__(self) -> "ForeignLoad":
        self._start = self._marks()
        return self

    def __exit__(self, *exc) -> None:
        self.cpu_s, own, busy, wall = (b - a for a, b in zip(self._start, self._marks()))
        if wall > 0:
            self.cores = max(0.0, (busy - own) / wall)
            self.busy = busy / wall / (os.cpu_count() or 1)


class PeakRss:
    """The most a process group's summed RSS reached while the block ran (KiB), sampled every
    `every_s` from a thread."""

    def __init__(self, pgid: int, every_s: float = 0.02):
        self.pgid, self.every_s, self.peak = pgid, every_s, 0
        self._stop = threading.Event()

    def now(self) -> int:
        total = 0
        for pid in group_pids(self.pgid):
            try:
                total += rss_kib(pid)
            except (OSError, ProcessLookupError):
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
    """Wait until none of the process's threads is running (R) or in uninterruptible sleep
    (D) for 3 reads in a row (e.g. a worker that answered and then trims its heap on another
    thread). False if it stays busy past the timeout."""
    deadline, quiet = time.monotonic() + timeout, 0
    while time.monotonic() < deadline:
        states = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                states.append(_stat_fields(task / "stat")[0])
            except (OSError, IndexError):
                continue
        quiet = 0 if any(state in ("R", "D") for state in states) else quiet + 1
        if quiet >= 3:
            return True
        time.sleep(0.02)
    return False
