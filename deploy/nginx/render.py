"""Render deploy/nginx/nginx.conf.template for a list of worker addresses, check it with
`nginx -t`, and run nginx unprivileged on loopback (used by `make run` and the tests).

    python -m deploy.nginx.render --workers 127.0.0.1:8101,127.0.0.1:8102 --out run/nginx.conf
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

TEMPLATE = Path(__file__).with_name("nginx.conf.template")
BALANCE = {"least_conn": "least_conn;", "round_robin": "# round-robin (nginx's default)"}


def find_nginx() -> str | None:
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if Path(p).exists()), None)


def render(workers: list[str], *, listen: str = "127.0.0.1:8090", run_dir: str | Path,
           balance: str = "least_conn", max_fails: int = 3, fail_timeout_s: int = 10,
           tries: int = 3, read_timeout_s: int = 600, max_body: str = "300m",
           worker_processes: int = 1, daemon: bool = False) -> str:
    if not workers:
        raise ValueError("nginx needs at least one worker address")
    if balance not in BALANCE:
        raise ValueError(f"balance must be one of {', '.join(BALANCE)}")
    servers = "\n".join(f"        server {address} max_fails={max_fails} "
                        f"fail_timeout={fail_timeout_s}s;" for address in workers)
    values = {
        "@WORKER_PROCESSES@": str(worker_processes),
        "@RUN_DIR@": str(Path(run_dir).resolve()),
        "@DAEMON@": "on" if daemon else "off",
        "@BALANCE@": BALANCE[balance],
        "@SERVERS@": servers,
        "@LISTEN@": listen,
        "@MAX_BODY@": max_body,
        "@READ_TIMEOUT@": f"{read_timeout_s}s",
        "@TRIES@": str(tries),
        "@KEEPALIVE@": str(keepalive_for(len(workers))),
        "@ZONE_SIZE@": f"{64 + len(workers) // 64 * 64}k",
    }
    text = TEMPLATE.read_text()
    for placeholder, value in values.items():
        text = text.replace(placeholder, value)
    return text


def keepalive_for(workers: int) -> int:
    """Idle connections each nginx process keeps to the workers: two per worker, at least 64
    (docs/capacity.md)."""
    return max(64, 2 * workers)


def write_config(workers: list[str], out: Path, run_dir: Path, **options) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    for sub in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (run_dir / sub).mkdir(exist_ok=True)
    out.write_text(render(workers, run_dir=run_dir, **options))
    return out


def nginx_command(config: Path, run_dir: Path, *extra: str) -> list[str]:
    nginx = find_nginx()
    if nginx is None:
        raise FileNotFoundError("nginx is not installed (Debian: apt-get install nginx)")
    return [nginx, "-p", str(run_dir.resolve()), "-c", str(config.resolve()), *extra]


def check_config(config: Path, run_dir: Path) -> str:
    """`nginx -t` on the rendered file; returns its report, raises on an invalid config."""
    result = subprocess.run(nginx_command(config, run_dir, "-t"), capture_output=True,
                            text=True)
    if result.returncode != 0:
        raise RuntimeError(f"nginx -t failed:\n{result.stderr}")
    return result.stderr


def reload(config: Path, run_dir: Path) -> None:
    subprocess.run(nginx_command(config, run_dir, "-s", "reload"), check=True,
                   capture_output=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", required=True, help="comma-separated host:port list")
    parser.add_argument("--listen", default="127.0.0.1:8090")
    parser.add_argument("--balance", default="least_conn", choices=sorted(BALANCE))
    parser.add_argument("--out", default="run/nginx/nginx.conf")
    parser.add_argument("--run-dir", default="run/nginx")
    parser.add_argument("--check", action="store_true", help="run nginx -t on the result")
    args = parser.parse_args(argv)
    out = write_config(args.workers.split(","), Path(args.out), Path(args.run_dir),
                       listen=args.listen, balance=args.balance)
    print(f"wrote {out}")
    if args.check:
        print(check_config(out, Path(args.run_dir)).strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
