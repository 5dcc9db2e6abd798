"""Replacing a worker process whose resident memory passed OCR_MEMORY_CEILING_MB, with no gap
in service, using gunicorn's own master (its TTIN/TTOU signals and hooks; gunicorn.conf.py
wires these functions in):

1. The process over its ceiling (W) writes `<dir>/recycle-<pid>` and sends SIGTTIN to the
   master, which starts one more process (R). W keeps serving meanwhile.
2. R was started while the master runs more processes than configured, so it is a
   replacement: it loads and warms up its model before it accepts a single connection
   (`post_worker_init` waits), so no request ever meets a loading model and `/readyz` never
   answers 503 on its account.
3. R, ready, sends SIGTTOU. The master's `nworkers_changed` hook makes every process with a
   recycle file the oldest (gunicorn stops the oldest when it has too many), and the master
   sends W SIGTERM: W stops accepting, answers 503 to what reaches it from then on, finishes
   every request it admitted (OCR_GRACEFUL_TIMEOUT_S) and exits.

If R cannot load its model it puts its own file in place of W's before SIGTTOU, so R is the
one stopped, and W asks again later. Both processes exist for the model's load time: memory
limits must leave room for a second baseline (docs/operations.md "Memory")."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger("ocr_worker.recycle")

DIR_VARIABLE = "OCRFLEET_RECYCLE_DIR"  # set by gunicorn.conf.py in the master
_PREFIX = "recycle-"


def prepare_dir(host: str, port: int) -> str:
    """In the master, before any worker is forked: an empty directory for recycle requests,
    named in the environment the workers inherit."""
    path = os.path.join(tempfile.gettempdir(), f"ocrfleet-recycle-{host}-{port}")
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path, exist_ok=True)
    os.environ[DIR_VARIABLE] = path
    return path


def remove_dir() -> None:
    """In the master, at exit: the directory goes with the fleet of processes it served."""
    directory = _dir()
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


def _dir() -> Path | None:
    path = os.environ.get(DIR_VARIABLE)
    return Path(path) if path else None


def _marker(pid: int) -> Path | None:
    directory = _dir()
    return directory / f"{_PREFIX}{pid}" if directory else None


def requested_pids() -> set[int]:
    directory = _dir()
    if directory is None or not directory.is_dir():
        return set()
    return {int(p.name[len(_PREFIX):]) for p in directory.iterdir()
            if p.name.startswith(_PREFIX) and p.name[len(_PREFIX):].isdigit()}


def request_replacement(_rss: int = 0) -> bool:
    """In a worker over its ceiling: ask the master for a replacement (False when not under a
    gunicorn master that set up recycling, e.g. in tests with Flask's client)."""
    marker = _marker(os.getpid())
    if marker is None:
        log.warning("no gunicorn master to replace this process: it keeps running")
        return False
    marker.touch()
    os.kill(os.getppid(), signal.SIGTTIN)
    return True


# ---- master side (gunicorn hooks) --------------------------------------------------------------
def mark_oldest(server: Any) -> None:
    """`nworkers_changed` hook: processes that asked to be replaced become the oldest (age -1),
    the ones gunicorn stops first when it has more than it needs; others keep their age."""
    wanted = requested_pids()
    for pid, worker in list(server.WORKERS.items()):
        if pid in wanted:
            if not hasattr(worker, "ocr_age"):
                worker.ocr_age = worker.age
                worker.age = -1
        elif hasattr(worker, "ocr_age"):
            worker.age = worker.ocr_age
            del worker.ocr_age


def forget(pid: int) -> None:
    """`child_exit` hook: a process that is gone needs no replacement."""
    marker = _marker(pid)
    if marker is not None:
        marker.unlink(missing_ok=True)


def is_replacement(server: Any) -> bool:
    """In a freshly forked worker (`post_fork`): started while the master runs more processes
    than configured, i.e. in answer to a recycle request."""
    return server.num_workers > server.cfg.workers


# ---- replacement side ---------------------------------------------------------------------------
def become_ready_then_take_over(ready: Callable[[float], bool], failed: Callable[[], bool],
                                heartbeat: Callable[[], None], alive: Callable[[], bool],
                                timeout_s: float = 600.0) -> bool:
    """In R's `post_worker_init`, before it accepts connections: wait until the model is
    loaded and warm (keeping gunicorn's heartbeat), then tell the master to stop the process
    R replaces. On failure R offers itself instead. Returns whether R took over."""
    deadline = time.monotonic() + timeout_s
    while alive() and not failed() and time.monotonic() < deadline:
        heartbeat()
        if ready(1.0):
            os.kill(os.getppid(), signal.SIGTTOU)
            log.info("replacement process ready: the process over its memory ceiling stops")
            return True
    if not alive():
        return False
    directory = _dir()
    if directory is not None:
        for pid in requested_pids():
            forget(pid)
        (directory / f"{_PREFIX}{os.getpid()}").touch()
    log.error("replacement process could not load its model: it stops instead")
    os.kill(os.getppid(), signal.SIGTTOU)
    return False
