"""`make fuzz` (and tests/test_schemathesis.py, with fewer examples): Schemathesis, driven by
the OpenAPI documents the services serve, against a live sim fleet (`make run`'s launcher,
scripts/run_fleet.py, on free loopback ports, stopped whatever happens) with API keys on at
both tiers: the gateway's document with its job links (submit, status, result, cancel),
then a worker's. Every check
Schemathesis has is on but `positive_data_acceptance` (a generated body is schema-valid yet
rarely a document; tests/schemathesis_hooks.py puts real ones in), with
`--max-response-time` at the fleet's own request deadline. Prints the figures docs/openapi.md
quotes; exit status 0 when neither run found a failure.

    python -m scripts.fuzz_api --examples 300 --seed 1"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from scripts.fleet import REPO_ROOT, free_port, free_port_block, http_status

REQUEST_TIMEOUT_S = 10  # the fleet's own deadline for a request (gateway and workers)
# A short page, no pictures, a short long-poll: the fuzzer's answers come back in milliseconds
FLEET_ENV = {"OCR_ENGINE": "sim", "OCR_SIM_PAGE_MS": "5", "OCR_WARMUP": "false",
             "OCR_VISUALIZE": "false", "GATEWAY_HEALTH_INTERVAL_S": "0.2",
             "GATEWAY_PROCESSES": "1", "GATEWAY_JOBS_MAX_WAIT_S": "2",
             "GATEWAY_REQUEST_TIMEOUT_S": str(REQUEST_TIMEOUT_S),
             "OCR_REQUEST_TIMEOUT_S": str(REQUEST_TIMEOUT_S)}
SLACK_S = 2  # past its deadline, an answer still has to be written and sent


@dataclass(frozen=True)
class Fleet:
    gateway: str
    worker: str
    token: str  # the workers' OCR_API_TOKEN, and the gateway's one API key
    run_dir: Path

    def auth(self) -> tuple[str, ...]:
        # Bearer, not X-API-Key: Schemathesis's ignored_auth check sends a wrong Bearer
        # next to the headers given here, and a valid X-API-Key beside an empty Bearer is
        # (rightly) accepted
        return (f"Authorization: Bearer {self.token}",)


@contextmanager
def sim_fleet(run_dir: Path, ready_s: float = 120) -> Iterator[Fleet]:
    """Two sim workers and a gateway from scripts/run_fleet.py; SIGTERM to the launcher
    (which stops them all) on the way out, SIGKILL to its group if it does not stop."""
    token = "fuzz-" + secrets.token_hex(16)
    worker, gateway = free_port_block(2), free_port()
    log = open(run_dir / "launcher.log", "wb")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "scripts.run_fleet", "--run-dir", str(run_dir), "--no-nginx",
         "--workers", "2", "--worker-port", str(worker), "--gateway-port", str(gateway)],
        cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **FLEET_ENV,
             "OCR_API_TOKEN": token, "GATEWAY_WORKER_TOKEN": token, "GATEWAY_API_KEYS": token})
    try:
        fleet = Fleet(f"http://127.0.0.1:{gateway}", f"http://127.0.0.1:{worker}", token,
                      run_dir)
        deadline = time.monotonic() + ready_s
        while http_status(f"{fleet.gateway}/readyz") != 200:
            if launcher.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the sim fleet did not come up: "
                                   + (run_dir / "launcher.log").read_text(errors="replace"))
            time.sleep(0.1)
        yield fleet
    finally:
        stop(launcher)
        log.close()


def stop(launcher: subprocess.Popen) -> None:
    if launcher.poll() is None:
        launcher.send_signal(signal.SIGTERM)
        try:
            launcher.wait(60)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(launcher.pid, signal.SIGKILL)  # anything of its group left behind
    except (ProcessLookupError, PermissionError):
        pass
    launcher.wait()


def schemathesis(url: str, report: Path, examples: int, seed: int,
                 headers: tuple[str, ...] = (), extra: tuple[str, ...] = ()) -> dict:
    """One `st run` against `url`/openapi.json; its JSON report, with its output."""
    command = [str(Path(sys.executable).with_name("st")), "run", f"{url}/openapi.json",
               "--checks", "all", "--exclude-checks", "positive_data_acceptance",
               "--max-examples", str(examples), "--seed", str(seed),
               "--max-response-time", str(REQUEST_TIMEOUT_S + SLACK_S),
               "--request-timeout", str(REQUEST_TIMEOUT_S * 3), "--warnings", "off",
               "--report", "json", "--report-json-path", str(report), *extra]
    for header in headers:
        command += ["--header", header]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT),
           "SCHEMATHESIS_HOOKS": "tests.schemathesis_hooks", "NO_COLOR": "1"}
    # in the report's folder: Schemathesis keeps its own state (.schemathesis/) where it runs
    done = subprocess.run(command, cwd=report.parent, env=env, capture_output=True, text=True)
    result = json.loads(report.read_text()) if report.exists() else {}
    result["output"] = done.stdout + done.stderr
    result["returncode"] = done.returncode
    return result


def fuzz(run_dir: Path, examples: int, seed: int, extra: tuple[str, ...] = ()) -> dict:
    """The gateway's document and a worker's, against one fleet: {"gateway": report,
    "worker": report}."""
    with sim_fleet(run_dir) as fleet:
        return {
            "gateway": schemathesis(fleet.gateway, run_dir / "gateway.json", examples, seed,
                                    fleet.auth(), extra),
            "worker": schemathesis(fleet.worker, run_dir / "worker.json", examples, seed,
                                   fleet.auth(), extra),
        }


def summary(name: str, report: dict) -> str:
    cases = report.get("test_cases", {})
    operations = report.get("operations", {})
    phases = ", ".join(f"{phase} {state['status']}"
                       for phase, state in report.get("phases", {}).items())
    return (f"{name}: {operations.get('tested', 0)} operations, "
            f"{cases.get('generated', 0)} test cases, "
            f"{cases.get('unique_failures', 0)} unique failures, "
            f"{report.get('filtered', 0)} asked-for refusals set aside, "
            f"{report.get('running_time', 0):.0f} s ({phases})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=300,
                        help="at most this many test cases per operation and phase")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--run-dir", type=Path, help="logs and reports (default: a temp dir)")
    args = parser.parse_args(argv)
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="ocrfleet-fuzz-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    reports = fuzz(run_dir, args.examples, args.seed)
    failed = False
    for name, report in reports.items():
        if report["returncode"] != 0:
            failed = True
            print(report["output"])
        print(summary(name, report))
    print(f"reports and logs: {run_dir}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
