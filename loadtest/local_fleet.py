"""The benchmarks' fleets on loopback, started with scripts/fleet.py on free ports and always
stopped (each process in its own process group): `workers()` and `gateway()` for a fixed set;
`Fleet` for sim workers behind nginx, a URL list or a DNS name, grown and shrunk mid-run."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from deploy.nginx import render as nginx
from scripts.fleet import (ManagedProcess, free_port, gateway_process, stop_all,
                           worker_process)


def sim_worker_env(page_ms: float, **extra: str) -> dict[str, str]:
    """A sim worker: one process, one engine thread, a fixed service time per page."""
    return {"OCR_ENGINE": "sim", "OCR_SIM_PAGE_MS": f"{page_ms:g}", "OCR_SIM_JITTER_MS": "0",
            "OCR_PROCESSES": "1", "OCR_THREADS": "1", "OCR_LOG_LEVEL": "WARNING", **extra}


def real_worker_env(threads: int = 1, **extra: str) -> dict[str, str]:
    """A real-engine worker (its default backend: `auto`) with `threads` engine threads."""
    return {"OCR_ENGINE": "paddleocr", "OCR_PROCESSES": "1", "OCR_THREADS": str(threads),
            "OMP_NUM_THREADS": str(threads), "OCR_LOG_LEVEL": "WARNING", **extra}


@contextlib.contextmanager
def running(processes: list[ManagedProcess], timeout: float = 180.0
            ) -> Iterator[list[ManagedProcess]]:
    """Start all (so they load in parallel), wait until each is ready, stop all on exit."""
    try:
        for process in processes:
            process.start()
        for process in processes:
            process.wait_ready(timeout)
        yield processes
    finally:
        stop_all(processes)


def url_of(process: ManagedProcess) -> str:
    return process.ready_url.rsplit("/", 1)[0]


def workers(count: int, env: dict[str, str], log_dir: Path, name: str = "worker",
            timeout: float = 180.0) -> contextlib.AbstractContextManager[list[ManagedProcess]]:
    log_dir.mkdir(parents=True, exist_ok=True)
    return running([worker_process(port, env, log_dir / f"{name}-{index + 1}-{port}.log")
                    for index, port in enumerate(free_port() for _ in range(count))], timeout)


@contextlib.contextmanager
def gateway(replica_urls: list[str], log_dir: Path,
            env: dict[str, str] | None = None) -> Iterator[ManagedProcess]:
    """A gateway balancing over these worker URLs itself (GATEWAY_REPLICAS)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    process = gateway_process(port, {"GATEWAY_REPLICAS": ",".join(replica_urls),
                                     "GATEWAY_LOG_LEVEL": "WARNING", **(env or {})},
                              log_dir / f"gateway-{len(replica_urls)}-{port}.log")
    with running([process], 60.0):
        yield process


def nginx_config(addresses: list[str], run_dir: Path, port: int) -> Path:
    return nginx.write_config(addresses, run_dir / "nginx.conf", run_dir,
                              listen=f"127.0.0.1:{port}")


def nginx_process(addresses: list[str], run_dir: Path, port: int,
                  ready_path: str | None = None) -> ManagedProcess:
    """nginx on 127.0.0.1:`port` balancing over these host:port addresses (deploy/nginx)."""
    config = nginx_config(addresses, run_dir, port)
    return ManagedProcess("nginx", nginx.nginx_command(config, run_dir),
                          ready_url=ready_path and f"http://127.0.0.1:{port}{ready_path}",
                          log_path=run_dir / "nginx.log")


class HostsFile:
    """A DNS name of our own (a k8s headless Service on loopback): a gateway run by wrap() sees
    this file as its /etc/hosts (a mount namespace of its own: `unshare -m`, root or userns),
    so its real resolver sees the name's addresses change when set_addresses rewrites it."""

    def __init__(self, name: str):
        self.name = name
        self.path = Path(tempfile.mkdtemp(prefix="ocrfleet-hosts-")) / "hosts"
        self.path.write_text("127.0.0.1 localhost\n")

    def set_addresses(self, addresses: list[str]) -> None:
        with open(self.path, "r+") as f:  # in place: the bind mount follows the inode
            f.truncate(0)
            f.write("127.0.0.1 localhost\n" + "".join(f"{a} {self.name}\n" for a in addresses))

    def wrap(self, cmd: list[str]) -> list[str]:
        return ["unshare", "-m", "sh", "-c", f'mount --bind "{self.path}" /etc/hosts && '
                'exec "$@"', "sh", *cmd]

    def remove(self) -> None:
        shutil.rmtree(self.path.parent, ignore_errors=True)


class Fleet:
    """Sim workers on 127.0.0.1 (a port each), or on 127.0.x.y (an address each, one port) in
    DNS mode; nginx over them and gateways on demand; all stopped on exit."""

    DNS_NAME = "ocr-workers.bench.internal"

    def __init__(self, log_dir: Path, page_ms: float, replicas: int = 0,
                 dns_mode: bool = False, worker_env: dict[str, str] | None = None):
        self.log_dir, self.dns_mode = log_dir, dns_mode
        self.env = sim_worker_env(page_ms, **(worker_env or {}))
        self.port = free_port()  # the one worker port of DNS mode
        self.workers: list[ManagedProcess] = []
        self.nginx: ManagedProcess | None = None  # on `nginx_port`, started on first use
        self.nginx_dir, self.nginx_port = log_dir / "nginx", 0
        self.hosts: HostsFile | None = None
        log_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.add_workers(replicas)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "Fleet":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def addresses(self) -> list[str]:
        return [url_of(w).removeprefix("http://") for w in self.workers]

    def add_workers(self, count: int) -> None:
        new = []
        for index in range(len(self.workers), len(self.workers) + count):
            host, port = ((f"127.0.{1 + (index + 2) // 250}.{2 + (index + 2) % 250}", self.port)
                          if self.dns_mode else ("127.0.0.1", free_port()))
            new.append(worker_process(port, self.env, self.log_dir / f"worker-{index}.log",
                                      host=host))
        self.workers.extend(new)  # recorded before they start: close() must see them
        for process in new:
            process.start()
        for process in new:
            process.wait_ready(300)
        self._publish()

    def remove_workers(self, count: int) -> None:
        """Scale down as k8s does: out of the balancer or the DNS name first, then SIGTERM (a
        worker drains what it admitted)."""
        leaving, self.workers = self.workers[-count:], self.workers[:-count]
        self._publish()
        stop_all(leaving)

    def _publish(self) -> None:
        if self.nginx is not None:
            nginx.reload(nginx_config(self.addresses(), self.nginx_dir, self.nginx_port),
                         self.nginx_dir)
        if self.hosts is not None:
            self.hosts.set_addresses([a.rsplit(":", 1)[0] for a in self.addresses()])

    def upstream(self, mode: str) -> dict[str, str]:
        """The gateway settings that reach the workers in this mode (nginx, dns or list)."""
        if mode == "nginx":
            if self.nginx is None:
                self.nginx_port = free_port()
                self.nginx = nginx_process(self.addresses(), self.nginx_dir,
                                           self.nginx_port).start()
            return {"GATEWAY_UPSTREAM_URL": f"http://127.0.0.1:{self.nginx_port}"}
        if mode == "dns":
            if self.hosts is None:
                self.hosts = HostsFile(self.DNS_NAME)
                self._publish()
            return {"GATEWAY_REPLICA_DNS": f"{self.DNS_NAME}:{self.port}",
                    "GATEWAY_DNS_REFRESH_S": "1"}
        return {"GATEWAY_REPLICAS": ",".join(f"http://{a}" for a in self.addresses())}

    def gateways(self, mode: str, count: int = 1,
                 **env: str) -> contextlib.AbstractContextManager[list[ManagedProcess]]:
        made = []
        for index in range(count):
            port = free_port()
            made.append(gateway_process(port, {**self.upstream(mode), "GATEWAY_LOG_LEVEL":
                                               "WARNING", **env},
                                        self.log_dir / f"gateway-{mode}-{index}-{port}.log"))
            if mode == "dns":
                made[-1].cmd = self.hosts.wrap(made[-1].cmd)
        return running(made, 60.0)

    def close(self) -> None:
        stop_all(([self.nginx] if self.nginx else []) + self.workers)
        if self.hosts is not None:
            self.hosts.remove()
