"""How a launcher (`make run`) learns that it must stop, so that it always stops its children.

- Stop signals (SIGINT from Ctrl-C, SIGTERM, SIGHUP) only set an Event: the handler never
  raises, so a second signal (SIGTERM to the whole process group reaches both `make` and us,
  and `make` forwards another) cannot re-enter the code that is stopping the children, and no
  exception can land between a child's fork and its being recorded.
- The parent's death (`make` or a shell killed with SIGKILL) arrives as SIGTERM through Linux's
  PR_SET_PDEATHSIG; a parent-pid check in the launcher's main loop backs it up elsewhere.
- Children started with `parent_death_preexec()` get SIGTERM when the launcher itself dies,
  even by SIGKILL, so nothing outlives it."""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import threading
from typing import Callable, Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1


class StopRequest:
    """Set by the first stop signal (later ones change nothing); `reason` names it.

    The handler takes no lock: it sets a flag and writes a byte to a pipe that `wait` selects
    on. (A threading.Event deadlocks here: a second signal landing while the first handler's
    `set()`, or the main thread's `wait()`, holds the Event's lock runs a handler that waits
    for that lock in the same thread forever. SIGTERM to `make run`'s process group does just
    that: make dies of it and the parent-death SIGTERM follows at once.)"""

    def __init__(self) -> None:
        self.reason: str | None = None
        self._set = False
        self._read, self._write = os.pipe()  # not inherited by children (PEP 446)
        os.set_blocking(self._write, False)

    def install(self, signals=STOP_SIGNALS) -> "StopRequest":
        """Handle `signals`, except those ignored when we started (`nohup` ignores SIGHUP, a
        shell ignores SIGINT for background jobs): that choice was the caller's."""
        for signum in signals:
            if signal.getsignal(signum) is not signal.SIG_IGN:
                signal.signal(signum, self._on_signal)
        return self

    def ignore_further(self, signals=STOP_SIGNALS) -> None:
        """Once everything is stopped, later stop signals (pending ones too: POSIX discards a
        pending signal set to SIG_IGN) cannot end the process by their default action while
        it exits (the interpreter puts the defaults back as it shuts down)."""
        for signum in signals:
            signal.signal(signum, signal.SIG_IGN)

    def _on_signal(self, signum, frame) -> None:
        self.request(signal.Signals(signum).name)

    def request(self, reason: str) -> None:
        if not self._set:
            self.reason, self._set = reason, True
        try:
            os.write(self._write, b"!")
        except BlockingIOError:  # the pipe is full of earlier requests: wait wakes anyway
            pass

    def is_set(self) -> bool:
        return self._set

    def wait(self, seconds: float) -> bool:
        """Until a stop is requested or `seconds` have passed; whether one was."""
        if not self._set:
            select.select([self._read], [], [], seconds)
        return self._set


@contextlib.contextmanager
def signals_blocked(signals=STOP_SIGNALS) -> Iterator[None]:
    """Hold stop signals back while the children are being stopped (they stay pending)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_parent(signum: int = signal.SIGTERM) -> bool:
    """Ask Linux to send `signum` to this process when its parent exits. False where that is
    not available (or the parent is already gone); callers then poll `parent_alive`."""
    prctl = _prctl()
    parent = os.getppid()
    if prctl is None or prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
        return False
    return os.getppid() == parent  # it died before prctl: no signal will come


def parent_alive(parent_pid: int) -> bool:
    """The process that started us is still our parent (an orphan is re-parented)."""
    return os.getppid() == parent_pid


def parent_death_preexec(signum: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A Popen `preexec_fn` giving the child `signum` when this thread's process dies. Only
    for single-threaded launchers: Linux ties the signal to the *thread* that forked the
    child, and code after fork in a multi-threaded parent is unsafe."""
    prctl = _prctl()
    if prctl is None or threading.current_thread() is not threading.main_thread():
        return None
    launcher = os.getpid()

    def setup() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
        if os.getppid() != launcher:  # the launcher died between fork and prctl
            os._exit(1)

    return setup
