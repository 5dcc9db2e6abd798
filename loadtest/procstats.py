"""What a process costs, read from Linux's /proc: resident memory (VmRSS), CPU seconds, and the
processes of a gunicorn service (the master and its forked worker children, where the model and
the memory live)."""

from __future__ import annotations

import os
from pathlib import Path

from scripts.fleet import group_members

_TICKS = os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int:
    """VmRSS of one process in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise ProcessLookupError(f"no VmRSS for pid {pid}")


def _stat_fields(pid: int) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2:].split()  # fields from `state` on (comm may hold spaces)


def children(pid: int) -> list[int]:
    """Direct children of pid."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int(_stat_fields(int(entry.name))[1]) == pid:
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
    """How busy the machine was with processes other than ours while we measured: machine-wide
    busy CPU minus our own, per wall second (in cores). A figure measured while this is large
    (another test run, a build) is not trustworthy on a 2-core machine."""

    def __init__(self, own_cpu_seconds):
        self._own = own_cpu_seconds  # () -> CPU seconds of our processes so far
        self.cores = 0.0

    def __enter__(self) -> "ForeignLoad":
        import time

        self._start = (system_busy_seconds(), self._own(), time.perf_counter())
        return self

    def __exit__(self, *exc) -> None:
        import time

        busy, own, wall = self._start
        elapsed = time.perf_counter() - wall
        if elapsed > 0:
            self.cores = max(0.0, ((system_busy_seconds() - busy) - (self._own() - own))
                             / elapsed)


def peak_rss_kib(pid: int) -> int:
    """VmHWM: the most resident memory the process has had (since start or the last reset)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise ProcessLookupError(f"no VmHWM for pid {pid}")


def reset_peak_rss(pid: int) -> bool:
    """Start VmHWM afresh from the current RSS (Linux clear_refs "5"); False where not allowed."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def wait_idle(pid: int, timeout: float = 10.0, quiet_reads: int = 3) -> bool:
    """Wait until none of the process's threads is running (R) or in uninterruptible sleep
    (D) for `quiet_reads` reads in a row: e.g. a worker that answered and then trims its heap
    on another thread. False if it stays busy past the timeout."""
    import time

    deadline = time.monotonic() + timeout
    quiet = 0
    while time.monotonic() < deadline:
        states = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                states.append(_stat_fields_path(task / "stat")[0])
            except (OSError, IndexError):
                continue
        quiet = quiet + 1 if not any(state in ("R", "D") for state in states) else 0
        if quiet >= quiet_reads:
            return True
        time.sleep(0.02)
    return False


def _stat_fields_path(path: Path) -> list[str]:
    text = path.read_text()
    return text[text.rindex(")") + 2:].split()
