"""`make run`: the whole local fleet on one machine — `--workers N` OCR workers (`make run
WORKERS=N`) on 8101.., each one gunicorn process (OCR_PROCESSES=1) with the machine's cores
shared out as engine threads (CUDA_VISIBLE_DEVICES=i when GPUs exist), nginx in front of them
on 8090, the gateway on 8080. Without nginx the gateway balances over the worker list itself.

Ctrl-C, SIGTERM or SIGHUP (to this process or its whole group), or the death of the process
that started it, stops everything: see scripts/lifecycle.py."""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

from deploy.nginx import render as nginx
from scripts.fleet import (REPO_ROOT, Interrupted, ManagedProcess, gateway_process,
                           port_is_taken, redis_process, stop_all, worker_process)
from scripts.lifecycle import StopRequest, die_with_parent, parent_alive, signals_blocked

RUN_DIR = REPO_ROOT / "run"


def gpu_count() -> int:
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in listing.stdout.splitlines() if line.startswith("GPU "))


def cuda_inference_available() -> bool:
    """onnxruntime-gpu (CUDAExecutionProvider) or paddlepaddle-gpu is installed."""
    try:
        import onnxruntime

        if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
            return True
    except ImportError:
        pass
    try:
        import paddle

        return bool(paddle.device.is_compiled_with_cuda())
    except ImportError:
        return False


def fleet_credential(environ) -> tuple[dict[str, str], dict[str, str]]:
    """(the workers' env, the gateway's env) for the internal credential: a new random token
    for this fleet unless OCR_API_TOKEN or GATEWAY_WORKER_TOKEN (or their _FILE forms) is set
    already. With it, the workers answer only the gateway, and take the fleet board only from
    it (services/ocr_worker/app.py): nothing else on the machine can steer the fleet."""
    names = ("OCR_API_TOKEN", "OCR_API_TOKEN_FILE", "GATEWAY_WORKER_TOKEN",
             "GATEWAY_WORKER_TOKEN_FILE")
    if any(environ.get(name) for name in names):
        return {}, {}
    token = secrets.token_urlsafe(32)
    return {"OCR_API_TOKEN": token}, {"GATEWAY_WORKER_TOKEN": token}


def jobs_store(args, start, cancelled) -> dict[str, str]:
    """The gateway's job store: a redis-server of our own (--redis, `make run REDIS=1`), the
    one GATEWAY_REDIS_URL names, or else an SQLite file in the run directory. `start`
    launches (and records) a process the way the rest of the fleet is launched."""
    if args.redis:
        redis = start(redis_process(args.redis_port, args.run_dir / "redis",
                                    args.run_dir / "redis.log"))
        redis.wait_ready(30, cancelled)
        print(f"redis-server on 127.0.0.1:{args.redis_port} stores the jobs "
              f"({args.run_dir / 'redis'})")
        return {"GATEWAY_REDIS_URL": f"redis://127.0.0.1:{args.redis_port}/0"}
    if os.environ.get("GATEWAY_REDIS_URL"):
        return {}
    return {"GATEWAY_JOBS_DB": os.environ.get("GATEWAY_JOBS_DB")
            or str(args.run_dir / "jobs.sqlite3")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2,
                        help="fleet size: worker servers, one process each (make run WORKERS=N)")
    parser.add_argument("--worker-port", type=int, default=8101)
    parser.add_argument("--nginx-port", type=int, default=8090)
    parser.add_argument("--gateway-port", type=int, default=8080)
    parser.add_argument("--no-nginx", action="store_true")
    parser.add_argument("--redis", action="store_true",
                        help="job store in a redis-server started here (else SQLite in run/)")
    parser.add_argument("--redis-port", type=int, default=6380)
    parser.add_argument("--run-dir", type=Path, default=RUN_DIR,
                        help="logs, nginx config and the jobs file (default: run/)")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")

    worker_ports = [args.worker_port + i for i in range(args.workers)]
    use_nginx = not args.no_nginx and nginx.find_nginx() is not None
    ports = worker_ports + [args.gateway_port] + ([args.nginx_port] if use_nginx else []) \
        + ([args.redis_port] if args.redis else [])
    taken = [port for port in ports if port_is_taken(port)]
    if taken:
        print(f"error: port(s) {', '.join(map(str, taken))} on 127.0.0.1 are already in use. "
              "Stop what holds them (`ss -ltnp`) or choose others, e.g. "
              "`make run WORKERS=2` after stopping an earlier fleet.", file=sys.stderr)
        return 2

    run_dir = args.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    gpus = gpu_count()
    if gpus and not cuda_inference_available():
        print(f"note: {gpus} GPU(s) found, but this venv has the CPU build of onnxruntime; "
              "running on the CPU (install onnxruntime-gpu instead of onnxruntime to use "
              "them, see docs/operations.md: GPUs)")
        gpus = 0
    # the machine's cores shared out between the workers (1 each on a 2-core box)
    threads = os.environ.get("OCR_THREADS") or str(max(1, (os.cpu_count() or 1) // args.workers))
    worker_credential, gateway_credential = fleet_credential(os.environ)
    processes: list[ManagedProcess] = []
    stop = StopRequest().install()
    parent = os.getppid()
    die_with_parent()  # SIGTERM when `make` (or whoever started us) dies

    def cancelled() -> bool:
        if not parent_alive(parent):
            stop.request("the parent process exited")
        return stop.is_set()

    def start(process: ManagedProcess) -> ManagedProcess:
        process.die_with_parent = True
        processes.append(process)  # recorded before it starts: stop_all must see it
        return process.start()

    try:
        for index, port in enumerate(worker_ports):
            if cancelled():
                raise Interrupted
            # one process per worker, whatever OCR_PROCESSES (or make's WORKERS) says
            env = {"OCR_THREADS": threads, "OCR_PROCESSES": "1", **worker_credential}
            if gpus:
                env.update(CUDA_VISIBLE_DEVICES=str(index % gpus),
                           OCR_DEVICE=os.environ.get("OCR_DEVICE", "gpu:0"))
            start(worker_process(port, env, run_dir / f"worker-{port}.log"))
        print(f"starting {args.workers} worker(s) on ports {worker_ports[0]}-{worker_ports[-1]}"
              f" ({str(gpus) + ' GPU(s)' if gpus else 'CPU'}, {threads} engine thread(s) "
              f"each); logs in {run_dir}/", flush=True)
        for process in processes:
            process.wait_ready(300, cancelled)

        addresses = [f"127.0.0.1:{port}" for port in worker_ports]
        if use_nginx:
            nginx_dir = run_dir / "nginx"
            config = nginx.write_config(addresses, nginx_dir / "nginx.conf", nginx_dir,
                                        listen=f"127.0.0.1:{args.nginx_port}")
            nginx.check_config(config, nginx_dir)
            start(ManagedProcess("nginx", nginx.nginx_command(config, nginx_dir),
                                 ready_url=None, log_path=run_dir / "nginx.log"))
            upstream = {"GATEWAY_UPSTREAM_URL": f"http://127.0.0.1:{args.nginx_port}"}
            print(f"nginx on 127.0.0.1:{args.nginx_port} (least_conn over the workers)")
        else:
            upstream = {"GATEWAY_REPLICAS": ",".join(f"http://{a}" for a in addresses)}
            print("nginx is not installed (or --no-nginx): the gateway balances over the "
                  "worker list itself")
        if cancelled():
            raise Interrupted
        upstream.update(jobs_store(args, start, cancelled), **gateway_credential)
        start(gateway_process(args.gateway_port, upstream, run_dir / "gateway.log"))
        processes[-1].wait_ready(60, cancelled)
        print(f"ready: POST http://127.0.0.1:{args.gateway_port}/ocr  (Ctrl-C stops the fleet)",
              flush=True)
        print(f"web page: http://127.0.0.1:{args.gateway_port}/", flush=True)
        while all(process.alive() for process in processes):
            if cancelled():
                raise Interrupted
            stop.wait(0.5)
        dead = [process.name for process in processes if not process.alive()]
        print(f"error: {', '.join(dead)} exited; stopping the fleet (see {run_dir}/*.log)",
              file=sys.stderr)
        return 1
    except Interrupted:
        print(f"\nstopping the fleet ({stop.reason})", flush=True)
        return 0
    except (RuntimeError, TimeoutError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        with signals_blocked():  # a second Ctrl-C or SIGTERM waits until all are stopped
            stop_all(processes)
            stop.ignore_further()


if __name__ == "__main__":
    sys.exit(main())
