"""scripts/lifecycle.py's StopRequest, the launcher's (`make run`) stop signal: it holds under
a storm of signals. Its handler used to set a threading.Event, whose lock a second signal could
find held by the same thread (a `make run` stopped with SIGTERM to its process group gets two
at once: the one sent and the parent-death one), and the launcher hung with its fleet up."""

import os
import signal
import subprocess
import sys
import time

from scripts.fleet import REPO_ROOT

CHILD = """
import signal
import time
from scripts.lifecycle import StopRequest
stop = StopRequest().install()
print("ready", flush=True)
deadline = time.monotonic() + 1.5
while time.monotonic() < deadline:
    stop.wait(0)  # the main thread in wait() as the signals land, as in the launcher's loop
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the storm outlasts us: not while exiting
print("done", stop.reason, flush=True)
"""


def test_a_storm_of_stop_signals_neither_hangs_nor_kills_the_launcher():
    child = subprocess.Popen([sys.executable, "-c", CHILD], cwd=REPO_ROOT, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == "ready"
        sent = 0
        while child.poll() is None and sent < 3000:
            os.kill(child.pid, signal.SIGTERM)
            sent += 1
            time.sleep(0.0005)
        out, err = child.communicate(timeout=30)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == 0, err[-2000:]
    assert out.strip() == "done SIGTERM" and sent > 10


def test_wait_returns_when_a_stop_is_requested_and_says_so():
    from scripts.lifecycle import StopRequest

    stop = StopRequest()
    started = time.monotonic()
    assert stop.wait(0.05) is False and time.monotonic() - started >= 0.05
    stop.request("first")
    stop.request("second")  # later requests change nothing
    assert stop.wait(30) is True and stop.is_set() and stop.reason == "first"
