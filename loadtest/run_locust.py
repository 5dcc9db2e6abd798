"""`make loadtest`: Locust, headless, against a running fleet, writing Locust's CSV and HTML
reports under bench/results/.

Environment: HOST (default http://127.0.0.1:8080, the gateway), USERS (default 10),
SPAWN_RATE (users started per second, default 2), DURATION (Locust's --run-time, default 60s),
RESULTS_DIR (default bench/results), LOCUST_CLASSES (user classes to run, e.g.
MixedLoadUser; default all), plus the locustfile's LOCUST_LONG_PAGES / LOCUST_TIMEOUT_S.
Exit status: Locust's — 1 when any request failed (a wrong answer counts as a failure)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from scripts.fleet import REPO_ROOT, http_status

LOCUSTFILE = Path(__file__).resolve().with_name("locustfile.py")


def settings(environ=os.environ) -> dict[str, str]:
    host = environ.get("HOST") or "http://127.0.0.1:8080"
    if "://" not in host:
        host = f"http://{host}"
    return {
        "host": host.rstrip("/"),
        "users": environ.get("USERS") or "10",
        "spawn_rate": environ.get("SPAWN_RATE") or "2",
        "duration": environ.get("DURATION") or "60s",
        "results": environ.get("RESULTS_DIR") or str(REPO_ROOT / "bench" / "results"),
        "classes": (environ.get("LOCUST_CLASSES") or "").replace(",", " ").split(),
    }


def locust_command(config: dict[str, str]) -> list[str]:
    prefix = str(Path(config["results"]) / "locust")
    return [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
            "--host", config["host"], "--users", config["users"],
            "--spawn-rate", config["spawn_rate"], "--run-time", config["duration"],
            "--stop-timeout", "30", "--csv", prefix, "--csv-full-history",
            "--html", f"{prefix}.html", "--only-summary", *config["classes"]]


def main() -> int:
    config = settings()
    Path(config["results"]).mkdir(parents=True, exist_ok=True)
    status = http_status(f"{config['host']}/readyz", timeout=5)
    if status != 200:
        print(f"{config['host']}/readyz answered {status or 'nothing'}: start a fleet first "
              "(`make run`) or set HOST to a ready /ocr endpoint", file=sys.stderr)
        return 2
    print(f"Locust: {config['users']} users (+{config['spawn_rate']}/s) for "
          f"{config['duration']} against {config['host']}", flush=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    code = subprocess.call(locust_command(config), cwd=REPO_ROOT, env=env)
    prefix = Path(config["results"]) / "locust"
    print(f"reports: {prefix}.html, {prefix}_stats.csv, {prefix}_failures.csv, "
          f"{prefix}_stats_history.csv (exit {code}: "
          f"{'no failures' if code == 0 else 'some requests failed or Locust errored'})")
    return code


if __name__ == "__main__":
    sys.exit(main())
