"""`make run`'s launcher (scripts/run_fleet.py) as a user meets it: it brings up workers, nginx
(when installed) and the gateway, serves a document, and says clearly when a port is taken.
However it is stopped (Ctrl-C, SIGTERM to it or to its whole process group, `make` or the
launcher itself killed), no process of the fleet is left and every port is free; the fleet
size (`make run WORKERS=2`) does not leak into the workers' own process count. Uses the sim
engine: this tests the launcher, not OCR."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import requests

from deploy.nginx import render as nginx
from samples import documents
from scripts.fleet import REPO_ROOT, free_port, free_port_block, http_status, port_is_taken
from tests.conftest import b64

pytestmark = pytest.mark.slow  # starts servers: scheduled first (tests/conftest.py)

# A terminal's Ctrl-C reaches a foreground job whose SIGINT is at its default action. A test
# run started in the background by a shell without job control inherits SIGINT ignored, and
# the launcher rightly keeps it ignored (as for `nohup`), so the fleet is started with it reset.
AS_FOREGROUND_JOB = [sys.executable, "-c", "import os, signal, sys; "
                     "signal.signal(signal.SIGINT, signal.SIG_DFL); "
                     "os.execvp(sys.argv[1], sys.argv[1:])"]

FLEET_ENV = {"PYTHONPATH": str(REPO_ROOT), "OCR_ENGINE": "sim", "OCR_SIM_PAGE_MS": "20",
             "OCR_WARMUP": "false", "GATEWAY_HEALTH_INTERVAL_S": "0.2",
             "GATEWAY_PROCESSES": "1", "OCR_VISUALIZE": "false",
             # what `make run WORKERS=2` exports to everything it starts
             "WORKERS": "2"}


def launch(run_dir, *args, **env):
    """The launcher with its logs, nginx config and jobs file in run_dir (not the
    repository's run/, which a fleet started by hand, or another test, may be using)."""
    return subprocess.Popen(
        [sys.executable, "-m", "scripts.run_fleet", "--run-dir", str(run_dir), *args],
        cwd=REPO_ROOT,
        env={**os.environ, **FLEET_ENV, **env},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def ports_args(worker, nginx_port, gateway):
    return ["--workers", "2", "--worker-port", str(worker), "--nginx-port", str(nginx_port),
            "--gateway-port", str(gateway)]


def _taken(port):
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("with_nginx", [pytest.param(True, marks=pytest.mark.nginx), False])
def test_fleet_comes_up_serves_and_stops_on_sigterm(with_nginx, tmp_path):
    if with_nginx and nginx.find_nginx() is None:
        pytest.skip("nginx is not installed")
    worker, nginx_port, gateway = free_port_block(2), free_port(), free_port()
    args = ports_args(worker, nginx_port, gateway) + ([] if with_nginx else ["--no-nginx"])
    process = launch(tmp_path, *args)
    try:
        deadline = time.monotonic() + 90
        while http_status(f"http://127.0.0.1:{gateway}/readyz") != 200:
            assert process.poll() is None, process.stdout.read()
            assert time.monotonic() < deadline, "fleet not ready"
            time.sleep(0.2)
        pdf = b64(documents.labelled_pdf(4, lines_per_page=0))
        response = requests.post(f"http://127.0.0.1:{gateway}/ocr", json={"file": pdf},
                                 timeout=60)
        assert response.status_code == 200
        assert len(response.json()["result"]["ocrResults"]) == 4
        assert (http_status(f"http://127.0.0.1:{nginx_port}/healthz") == 200) == with_nginx
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
        assert process.returncode == 0, output
        assert ("nginx on 127.0.0.1" in output) == with_nginx
        if not with_nginx:
            assert "balances over the worker list itself" in output
        for port in (worker, worker + 1, gateway, nginx_port):
            assert not _taken(port), f"port {port} still served after stop"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


def test_a_taken_port_is_named_and_nothing_starts(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        process = launch(tmp_path, "--workers", "1", "--worker-port", str(free_port()),
                         "--nginx-port", str(free_port()), "--gateway-port", str(taken))
        output, _ = process.communicate(timeout=30)
    assert process.returncode == 2
    assert f"port(s) {taken}" in output and "already in use" in output


# ---- every way of stopping it -----------------------------------------------------------------
def proc_stat(pid) -> tuple[int, int, int, str, str] | None:
    """(ppid, pgid, session id, state, start time) of a process, None when it is gone."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[1]), int(fields[2]), int(fields[3]), fields[0], fields[19]


def all_processes() -> dict[int, tuple[int, int, int, str, str]]:
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := proc_stat(int(entry))) is not None:
            table[int(entry)] = stat
    return table


def cmdline(pid) -> str:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def children(table, pid) -> list[int]:
    return [child for child, stat in table.items() if stat[0] == pid and stat[3] != "Z"]


def descendants(table, pid) -> set[tuple[int, str]]:
    """(pid, start time) of every live descendant: the start time tells a reused pid apart."""
    found, todo = set(), [pid]
    while todo:
        for child in children(table, todo.pop()):
            found.add((child, table[child][4]))
            todo.append(child)
    return found


def live(pid, started) -> bool:
    stat = proc_stat(pid)
    return stat is not None and stat[4] == started and stat[3] != "Z"


class Fleet:
    """One `make run` (or a bare launcher) on free ports, watched from outside."""

    def __init__(self, tmp_path, via_make: bool, nginx_wanted: bool = True):
        self.worker, self.nginx_port, self.gateway = free_port_block(2), free_port(), free_port()
        self.with_nginx = nginx_wanted and nginx.find_nginx() is not None
        args = ports_args(self.worker, self.nginx_port, self.gateway) + \
            ["--run-dir", str(tmp_path / "run")] + ([] if self.with_nginx else ["--no-nginx"])
        self.ports = [self.worker, self.worker + 1, self.gateway] + \
            ([self.nginx_port] if self.with_nginx else [])
        self.log = tmp_path / "launcher.log"
        if via_make:  # the real Makefile's recipe; `-o install`: the venv is already set up
            cmd = ["make", "--no-print-directory", "-o", "install", "run", "WORKERS=2",
                   "RUN_ARGS=" + " ".join(args[2:])]
        else:
            cmd = [sys.executable, "-m", "scripts.run_fleet", *args]
        cmd = AS_FOREGROUND_JOB + cmd
        with open(self.log, "wb") as log:
            self.top = subprocess.Popen(cmd, cwd=REPO_ROOT, env={**os.environ, **FLEET_ENV},
                                        stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        self.launcher = self._find_launcher() if via_make else self.top.pid
        self.seen: set[tuple[int, str]] = set()  # every process of the fleet ever seen
        self.sessions: set[int] = set()

    def _find_launcher(self) -> int:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for pid in children(all_processes(), self.top.pid):
                if "scripts.run_fleet" in cmdline(pid):
                    return pid
            assert self.top.poll() is None, self.output()
            time.sleep(0.05)
        raise AssertionError("make did not start the launcher")

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def watch(self) -> dict:
        """Record the fleet's processes (and their sessions) as they are now."""
        table = all_processes()
        tree = descendants(table, self.launcher)
        self.seen |= tree
        own = table[self.launcher][2] if self.launcher in table else None
        # the servers' sessions (not the launcher's, where e.g. `nginx -t` runs briefly)
        self.sessions |= {table[pid][2] for pid, _ in tree if pid in table} - {own}
        return table

    def wait_until(self, condition, what: str, seconds: float = 90):
        deadline = time.monotonic() + seconds
        while not condition():
            assert time.monotonic() < deadline, f"{what}\n{self.output()}"
            time.sleep(0.1)

    def wait_ready(self):
        def ready():
            self.watch()
            assert self.top.poll() is None, self.output()
            return http_status(f"http://127.0.0.1:{self.gateway}/readyz") == 200
        self.wait_until(ready, "fleet not ready")
        self.watch()

    def leftovers(self) -> list[str]:
        table = all_processes()
        left = [f"{pid} {cmdline(pid)}" for pid, started in self.seen if live(pid, started)]
        # anything else in a session the launcher created (e.g. forked after the last look)
        left += [f"{pid} {cmdline(pid)}" for pid, stat in table.items()
                 if stat[2] in self.sessions and stat[3] != "Z"
                 and not any(pid == seen for seen, _ in self.seen)]
        return left + [f"port {port} still bound" for port in self.ports if port_is_taken(port)]

    def assert_all_gone(self):
        deadline = time.monotonic() + 60
        while left := self.leftovers():
            assert time.monotonic() < deadline, f"left behind: {left}\n{self.output()}"
            time.sleep(0.1)
        self.top.wait(30)

    def kill_everything(self):
        for pid, started in self.seen | {(self.launcher, "")}:
            if started == "" or live(pid, started):
                for sender in (os.killpg, os.kill):
                    try:
                        sender(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
        self.top.kill()
        self.top.wait(10)


def ctrl_c(fleet):  # the terminal sends SIGINT to the foreground group: make and the launcher
    os.killpg(fleet.top.pid, signal.SIGINT)


def sigterm_to_group(fleet):  # `timeout make run`, a supervisor, `kill -- -PGID`
    os.killpg(fleet.top.pid, signal.SIGTERM)


def make_killed(fleet):  # the parent dies without a word
    os.kill(fleet.top.pid, signal.SIGKILL)


def launcher_killed(fleet):  # nothing runs in the launcher: the children must notice alone
    os.kill(fleet.launcher, signal.SIGKILL)


@pytest.mark.parametrize("stop, via_make", [(ctrl_c, True), (sigterm_to_group, True),
                                            (make_killed, True), (launcher_killed, False)],
                         ids=["ctrl-c", "sigterm-to-group", "make-killed", "launcher-killed"])
def test_any_way_of_stopping_leaves_nothing_behind(tmp_path, stop, via_make):
    fleet = Fleet(tmp_path, via_make)
    try:
        fleet.wait_ready()
        table = fleet.watch()
        if via_make:
            assert table[fleet.launcher][0] == fleet.top.pid, "make runs the launcher itself"
        masters = [pid for pid in children(table, fleet.launcher)
                   if "services.ocr_worker.wsgi" in cmdline(pid)]
        assert len(masters) == 2, fleet.output()
        # WORKERS=2 is the fleet size, not each worker's process count
        assert [len(children(table, master)) for master in masters] == [1, 1]
        assert len(fleet.sessions) == 3 + fleet.with_nginx  # one per server: killed by group
        stop(fleet)
        fleet.assert_all_gone()
        assert "Traceback" not in fleet.output(), fleet.output()
        if stop is not launcher_killed and stop is not make_killed:
            assert "stopping the fleet" in fleet.output()
    finally:
        fleet.kill_everything()


def test_a_stop_while_starting_stops_what_was_started(tmp_path):
    fleet = Fleet(tmp_path, via_make=False, nginx_wanted=False)
    try:
        fleet.wait_until(lambda: fleet.watch() and fleet.sessions, "no worker started", 30)
        fleet.top.send_signal(signal.SIGTERM)
        fleet.top.send_signal(signal.SIGTERM)  # a second one must not re-enter the stop
        while fleet.top.poll() is None:
            fleet.watch()
            time.sleep(0.02)
        assert fleet.top.returncode == 0, fleet.output()
        fleet.assert_all_gone()
        assert "stopping the fleet (SIGTERM)" in fleet.output()
        assert "Traceback" not in fleet.output()
    finally:
        fleet.kill_everything()
