"""Starting and stopping the fleet's processes on one machine (workers, gateway, nginx): used by
`make run`, the tests and the benchmarks. Each process runs in its own session (so a Ctrl-C at
the terminal reaches only the launcher, which stops them in order), is waited for until its
readiness URL answers 200, and is stopped with SIGTERM (then SIGKILL) to its whole process
group: a gunicorn master and the processes it forked, an nginx master and its workers."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from scripts import warmstart
from scripts.lifecycle import parent_death_preexec

REPO_ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


_handed_out: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now and that this process has not handed out before (the
    kernel may offer a just-closed port twice, and two workers must not get the same one)."""
    while True:
        with socket.socket() as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def free_port_block(count: int, host: str = "127.0.0.1") -> int:
    """The first of `count` consecutive free ports, all marked as handed out."""
    while True:
        base = free_port(host)
        block = range(base, base + count)
        if base + count <= 65535 and not any(p in _handed_out for p in block[1:]) \
                and not any(port_is_taken(p, host) for p in block[1:]):
            _handed_out.update(block)
            return base


def port_is_taken(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def http_status(url: str, timeout: float = 2.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, urllib.error.URLError):
        return None


@dataclass
class ManagedProcess:
    name: str
    cmd: list[str]
    env: dict[str, str] = field(default_factory=dict)
    ready_url: str | None = None
    log_path: Path | None = None
    process: subprocess.Popen | warmstart.WarmProcess | None = None
    # SIGTERM to the child when the launcher dies, even by SIGKILL (`make run`; see lifecycle)
    die_with_parent: bool = False
    ready_probe: Callable[[], bool] | None = None  # instead of ready_url (not HTTP)

    def start(self) -> "ManagedProcess":
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **self.env}
        if warmstart.enabled() and self.cmd[0] == str(BIN / "gunicorn") \
                and not self.die_with_parent:
            self.process = warmstart.start(self.cmd, env, REPO_ROOT, self.log_path)
            return self
        stdout = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        preexec = parent_death_preexec() if self.die_with_parent else None
        self.process = subprocess.Popen(self.cmd, cwd=REPO_ROOT, env=env, stdout=stdout,
                                        stderr=subprocess.STDOUT, start_new_session=True,
                                        preexec_fn=preexec)
        if self.log_path:
            stdout.close()
        return self

    def wait_ready(self, timeout: float = 120.0,
                   cancelled: Callable[[], bool] = lambda: False) -> "ManagedProcess":
        """Until the readiness URL answers 200; Interrupted as soon as `cancelled()`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cancelled():
                raise Interrupted(f"stopped while waiting for {self.name}")
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with code {self.process.returncode}"
                                   + (f"; see {self.log_path}" if self.log_path else ""))
            if self.ready_probe is not None:
                if self.ready_probe():
                    return self
            elif self.ready_url is None or http_status(self.ready_url) == 200:
                return self
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} not ready at {self.ready_url} within {timeout:.0f} s")

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal_group(self, sig: int) -> bool:
        """Signal every process of the child's group, also when its leader has already exited
        (a crashed gunicorn master can leave workers behind). False: the group is empty."""
        if self.process is None:
            return False
        try:
            os.killpg(self.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def group_alive(self) -> bool:
        """Some process of the group still runs (signal 0 only checks; a zombie does not
        count)."""
        if self.process is not None:
            self.process.poll()  # reap the leader, so a zombie leader does not count
        return self.signal_group(0) and _runs_in_group(self.process.pid)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM to the group; SIGKILL to whatever is left after `timeout`; returns when the
        whole group is gone (or 5 s after SIGKILL at most)."""
        if self.process is None:
            return None
        self.signal_group(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        if not _wait_until(lambda: not self.group_alive(), 2.0):
            self.signal_group(signal.SIGKILL)
            _wait_until(lambda: not self.group_alive(), 5.0)
        try:
            return self.process.wait(1)
        except subprocess.TimeoutExpired:
            return None


def group_members(pgid: int) -> list[tuple[int, str]]:
    """(pid, state) of every process in group `pgid`, read from /proc (state "Z": a zombie).
    OSError where there is no /proc."""
    members = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
        except OSError:  # gone meanwhile
            continue
        state, _ppid, group = stat[stat.rindex(")") + 2:].split()[:3]
        if int(group) == pgid:
            members.append((int(entry), state))
    return members


def _runs_in_group(pgid: int) -> bool:
    """A process of the group that is not a zombie exists. Processes whose leader was killed
    are reaped by init, which in some containers does it only every second or two: signal 0
    still reaches their zombies, and a stop would wait for them."""
    try:
        return any(state != "Z" for _, state in group_members(pgid))
    except OSError:
        return True


class Interrupted(Exception):
    """A wait was cut short because the launcher is stopping."""


def _wait_until(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def worker_process(port: int, env: dict[str, str] | None = None,
                   log_path: Path | None = None, host: str = "127.0.0.1") -> ManagedProcess:
    return ManagedProcess(
        name=f"worker:{host}:{port}",
        cmd=[str(BIN / "gunicorn"), "-c", "services/ocr_worker/gunicorn.conf.py",
             "services.ocr_worker.wsgi:app"],
        env={"PORT": str(port), "HOST": host, **(env or {})},
        ready_url=f"http://{host}:{port}/readyz",
        log_path=log_path,
    )


def gateway_process(port: int, env: dict[str, str] | None = None,
                    log_path: Path | None = None) -> ManagedProcess:
    return ManagedProcess(
        name=f"gateway:{port}",
        cmd=[str(BIN / "gunicorn"), "-c", "gateway/gunicorn.conf.py", "gateway.wsgi:app"],
        env={"PORT": str(port), "HOST": "127.0.0.1", **(env or {})},
        ready_url=f"http://127.0.0.1:{port}/readyz",
        log_path=log_path,
    )


def redis_answers(port: int, host: str = "127.0.0.1") -> bool:
    """Redis answers PING (and has loaded its data: it answers -LOADING until then)."""
    try:
        with socket.create_connection((host, port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def redis_process(port: int, data_dir: Path, log_path: Path | None = None) -> ManagedProcess:
    """Debian's redis-server on loopback, its append-only file in `data_dir` (jobs survive a
    restart of Redis too), refusing writes rather than evicting keys when memory is full."""
    server = shutil.which("redis-server") or "/usr/bin/redis-server"
    data_dir.mkdir(parents=True, exist_ok=True)
    return ManagedProcess(
        name=f"redis:{port}",
        cmd=[server, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data_dir),
             "--appendonly", "yes", "--save", "", "--maxmemory-policy", "noeviction",
             "--daemonize", "no", "--logfile", ""],
        log_path=log_path,
        ready_probe=lambda: redis_answers(port),
    )


def stop_all(processes: list[ManagedProcess]) -> None:
    for process in reversed(processes):
        process.signal_group(signal.SIGTERM)
    for process in reversed(processes):
        process.stop()
