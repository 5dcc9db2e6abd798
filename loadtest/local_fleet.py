"""Fleets on loopback for the benchmarks: sets of workers (sim or real engine) and a gateway in
front of some of them, started with scripts/fleet.py on free ports and always stopped again
(each process in its own process group)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

from scripts.fleet import (ManagedProcess, free_port, gateway_process, stop_all,
                           worker_process)


def sim_worker_env(page_ms: float, jitter_ms: float = 0.0, **extra: str) -> dict[str, str]:
    """A sim worker: one process, one engine thread, a fixed service time per page."""
    return {"OCR_ENGINE": "sim", "OCR_SIM_PAGE_MS": f"{page_ms:g}",
            "OCR_SIM_JITTER_MS": f"{jitter_ms:g}", "OCR_PROCESSES": "1", "OCR_THREADS": "1",
            "OCR_LOG_LEVEL": "WARNING", **extra}


def real_worker_env(threads: int = 1, **extra: str) -> dict[str, str]:
    """A real-engine worker (PP-OCRv6 tiny on onnxruntime, CPU) with `threads` engine threads."""
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


@contextlib.contextmanager
def workers(count: int, env: dict[str, str], log_dir: Path, name: str = "worker",
            timeout: float = 180.0) -> Iterator[list[ManagedProcess]]:
    log_dir.mkdir(parents=True, exist_ok=True)
    processes = []
    for index in range(count):
        port = free_port()
        processes.append(worker_process(port, env, log_dir / f"{name}-{index + 1}-{port}.log"))
    with running(processes, timeout) as started:
        yield started


@contextlib.contextmanager
def gateway(replica_urls: list[str], log_dir: Path, env: dict[str, str] | None = None,
            timeout: float = 60.0) -> Iterator[ManagedProcess]:
    """A gateway balancing over these worker URLs itself (GATEWAY_REPLICAS)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    process = gateway_process(port, {"GATEWAY_REPLICAS": ",".join(replica_urls),
                                     "GATEWAY_LOG_LEVEL": "WARNING", **(env or {})},
                              log_dir / f"gateway-{len(replica_urls)}-{port}.log")
    with running([process], timeout) as (started,):
        yield started
