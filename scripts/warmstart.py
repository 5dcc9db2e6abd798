"""Warm starts for the gunicorn servers a test run starts: fork them from a process that has
already imported their libraries, instead of starting a new interpreter for each.

A gunicorn server costs about 0.7 CPU-seconds to start on a small machine, most of it importing
flask, gunicorn, numpy, OpenCV, Pillow, requests and redis; the test suite starts about a
hundred, so on 2 cores the fast subset spent more time importing than testing. With `enable()`
(the suite's conftest calls it), `ManagedProcess` starts its gunicorn servers through
multiprocessing's forkserver, preloaded with `PRELOAD`: a server then costs about 0.15 CPU-s.
The child runs the same gunicorn, config file, app and environment as `make run`; only the
imports are already done.

Not preloaded, so that each server still reads its own settings when it imports them: the
project's own modules (their settings come from the environment) and prometheus_client (its
multiprocess mode is chosen at import, after gunicorn.conf.py sets its directory). numpy and
OpenCV are: the worker imports them before it sets its thread variables in any case
(services/ocr_worker/engine.py), and nothing the tests start sets those variables itself.

`make run` and the benchmarks never call `enable()`: they start every server as a new process,
as a deployment does, and the launcher's parent-death signal needs its own children."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

PRELOAD = ("flask", "gunicorn.app.wsgiapp", "gunicorn.arbiter", "gunicorn.workers.gthread",
           "numpy", "cv2", "PIL.Image", "pypdfium2", "requests", "redis")

_context: multiprocessing.context.ForkServerContext | None = None


def enable(preload=PRELOAD) -> None:
    """Start this process's gunicorn servers warm from now on (the forkserver starts on the
    first one)."""
    global _context
    _context = multiprocessing.get_context("forkserver")
    _context.set_forkserver_preload(list(preload))


def enabled() -> bool:
    return _context is not None


def start(cmd: list[str], env: dict[str, str], cwd: Path, log_path: Path | None) -> "WarmProcess":
    """Fork `cmd` (a gunicorn command line) from the forkserver, in a session of its own, with
    exactly `env`, in `cwd`, its output appended to `log_path`."""
    assert _context is not None, "warmstart.enable() first"
    process = _context.Process(target=_run_gunicorn, daemon=True, name=cmd[-1],
                               args=(cmd, env, str(cwd), str(log_path) if log_path else None))
    process.start()
    return WarmProcess(process, cmd)


class WarmProcess:
    """What ManagedProcess and the tests use of subprocess.Popen, for a forked server."""

    def __init__(self, process: multiprocessing.Process, cmd: list[str]) -> None:
        self._process, self.args = process, cmd

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode  # negative for a signal, as subprocess reports it

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode


def _run_gunicorn(cmd: list[str], env: dict[str, str], cwd: str, log_path: str | None) -> None:
    """In the forked child: what Popen(cmd, env=env, cwd=cwd, start_new_session=True,
    stdout=log, stderr=STDOUT) would have set up, then gunicorn's own entry point."""
    os.setsid()
    # a server of its own, as if started by Popen: it may start processes (the gateway's
    # searchable-PDF builders), which multiprocessing refuses to a daemonic child
    multiprocessing.current_process()._config["daemon"] = False
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    log = os.open(log_path or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for fd in (1, 2):
        os.dup2(log, fd)
    os.close(log)
    sys.argv = list(cmd)
    from gunicorn.app.wsgiapp import run

    sys.exit(run())
