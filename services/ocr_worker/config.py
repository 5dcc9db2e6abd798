"""WorkerConfig: every setting of the OCR worker, read once from the environment and validated
(docs/configuration.md lists the same variables)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from services.ocr_api.server_settings import ServerSettings
from services.ocr_api.settings import ConfigError, Env

REPO_ROOT = Path(__file__).resolve().parents[2]

ENGINES = ("paddleocr", "sim")
BACKENDS = ("auto", "onnxruntime", "openvino", "paddle")
OV_PRECISIONS = ("fp32", "bf16", "auto")
MODEL_SIZES = ("tiny", "small")


ENV_PREFIX = "OCR_"
# Variables with the worker's prefix that WorkerConfig does not read but are legitimately set:
# read by WorkerServerSettings (gunicorn's side) below. Any other OCR_* variable is a typo.
OTHER_OCR_VARIABLES = frozenset({"OCR_GRACEFUL_TIMEOUT_S", "OCR_PROCESSES",
                                 "OCR_INSTANCES_PER_DEVICE"})


@dataclass(frozen=True)
class WorkerConfig:
    engine: str = "paddleocr"
    backend: str = "auto"
    ov_precision: str = "auto"
    rec_batch_size: int = 6
    device: str = "cpu"
    model_size: str = "tiny"
    model_dir: str = str(REPO_ROOT / "models")
    det_model_name: str | None = None
    det_model_dir: str | None = None
    rec_model_name: str | None = None
    rec_model_dir: str | None = None
    threads: int = 1
    vis_font: str | None = None
    visualize_default: bool = True
    cache_dir: str = str(Path.home() / ".cache" / "ocrfleet" / "paddlex")

    pdf_dpi: float = 144.0
    pdf_scan_dpi_max: float = 400.0  # a scanned page is rendered at its own DPI, up to this
    max_bytes: int = 64 * 1024 * 1024
    max_pages: int = 1000
    max_pixels: int = 50_000_000

    queue_size: int = 32
    page_buffer: int = 4
    max_batch: int = 1
    batch_wait_ms: float = 0.0
    retry_after_s: int = 1
    request_timeout_s: float = 600.0
    stall_timeout_s: float = 120.0  # per page in the engine; see health.py
    warmup: bool = True

    # memory (docs/operations.md "Memory")
    page_window: int = 2
    ort_cpu_arena: bool = False
    trim_min_pixels: int = 1_000_000
    det_max_side: int = 4000
    memory_budget_mb: int = 1024
    memory_ceiling_mb: int = 0

    allow_url_input: bool = False
    url_timeout_s: float = 20.0

    # tokens a caller (the gateway) must send; none: no check. Never in repr (logs).
    api_tokens: tuple[str, ...] = field(default=(), repr=False)
    metrics_port: int | None = None  # /metrics on this port only

    sim_page_ms: float = 200.0
    sim_jitter_ms: float = 0.0
    sim_load_ms: float = 0.0

    log_level: str = "INFO"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "WorkerConfig":
        env = Env(environ)
        defaults = cls()
        config = cls(
            engine=env.choice("OCR_ENGINE", defaults.engine, ENGINES),
            backend=env.choice("OCR_BACKEND", defaults.backend, BACKENDS),
            ov_precision=env.choice("OCR_OV_PRECISION", defaults.ov_precision, OV_PRECISIONS),
            rec_batch_size=env.int("OCR_REC_BATCH_SIZE", defaults.rec_batch_size, 1, 64),
            device=env.str("OCR_DEVICE", defaults.device),
            model_size=env.choice("OCR_MODEL_SIZE", defaults.model_size, MODEL_SIZES),
            model_dir=env.str("OCR_MODEL_DIR", defaults.model_dir),
            det_model_name=env.optional_str("OCR_DET_MODEL_NAME"),
            det_model_dir=env.optional_str("OCR_DET_MODEL_DIR"),
            rec_model_name=env.optional_str("OCR_REC_MODEL_NAME"),
            rec_model_dir=env.optional_str("OCR_REC_MODEL_DIR"),
            threads=env.int("OCR_THREADS", defaults.threads, 1, 256),
            vis_font=env.optional_str("OCR_VIS_FONT") or _first_existing(_VIS_FONTS),
            visualize_default=env.bool("OCR_VISUALIZE", defaults.visualize_default),
            cache_dir=env.str("OCR_CACHE_DIR", defaults.cache_dir),
            pdf_dpi=env.float("OCR_PDF_DPI", defaults.pdf_dpi, 36, 600),
            pdf_scan_dpi_max=env.float("OCR_PDF_SCAN_DPI_MAX", defaults.pdf_scan_dpi_max, 36,
                                       1200),
            max_bytes=env.int("OCR_MAX_BYTES", defaults.max_bytes, 1024),
            max_pages=env.int("OCR_MAX_PAGES", defaults.max_pages, 1),
            max_pixels=env.int("OCR_MAX_PIXELS", defaults.max_pixels, 10_000),
            queue_size=env.int("OCR_QUEUE_SIZE", defaults.queue_size, 1),
            page_buffer=env.int("OCR_PAGE_BUFFER", defaults.page_buffer, 1),
            max_batch=env.int("OCR_MAX_BATCH", defaults.max_batch, 1, 64),
            batch_wait_ms=env.float("OCR_BATCH_WAIT_MS", defaults.batch_wait_ms, 0, 1000),
            retry_after_s=env.int("OCR_RETRY_AFTER_S", defaults.retry_after_s, 1),
            request_timeout_s=env.float("OCR_REQUEST_TIMEOUT_S", defaults.request_timeout_s, 1),
            stall_timeout_s=env.float("OCR_STALL_TIMEOUT_S", defaults.stall_timeout_s, 1),
            warmup=env.bool("OCR_WARMUP", defaults.warmup),
            page_window=env.int("OCR_PAGE_WINDOW", defaults.page_window, 1, 64),
            ort_cpu_arena=env.bool("OCR_ORT_CPU_ARENA", defaults.ort_cpu_arena),
            trim_min_pixels=env.int("OCR_TRIM_MIN_PIXELS", defaults.trim_min_pixels, 0),
            det_max_side=env.int("OCR_DET_MAX_SIDE", defaults.det_max_side, 320, 16384),
            memory_budget_mb=env.int("OCR_MEMORY_BUDGET_MB", defaults.memory_budget_mb, 0),
            memory_ceiling_mb=env.int("OCR_MEMORY_CEILING_MB", defaults.memory_ceiling_mb, 0),
            allow_url_input=env.bool("OCR_ALLOW_URL_INPUT", defaults.allow_url_input),
            url_timeout_s=env.float("OCR_URL_TIMEOUT_S", defaults.url_timeout_s, 1),
            api_tokens=env.secrets("OCR_API_TOKEN", "OCR_API_TOKEN_FILE"),
            metrics_port=env.int("OCR_METRICS_PORT", None, 1, 65535),
            sim_page_ms=env.float("OCR_SIM_PAGE_MS", defaults.sim_page_ms, 0),
            sim_jitter_ms=env.float("OCR_SIM_JITTER_MS", defaults.sim_jitter_ms, 0),
            sim_load_ms=env.float("OCR_SIM_LOAD_MS", defaults.sim_load_ms, 0),
            log_level=env.choice("OCR_LOG_LEVEL", defaults.log_level,
                                 ("DEBUG", "INFO", "WARNING", "ERROR")),
        )
        env.check_prefix(ENV_PREFIX, OTHER_OCR_VARIABLES)
        if config.device != "cpu" and not config.device.startswith("gpu"):
            raise ConfigError(f"OCR_DEVICE={config.device!r}: expected cpu or gpu:N")
        if config.backend == "openvino" and config.device != "cpu":
            raise ConfigError("OCR_BACKEND=openvino runs on the CPU only: set OCR_DEVICE=cpu "
                              "or OCR_BACKEND=onnxruntime")
        return config

    def model_paths(self) -> tuple[str, str, str, str]:
        """(det name, det dir, rec name, rec dir): explicit overrides, else the PP-OCRv6
        directories `make models` lays out under model_dir."""
        det_name = self.det_model_name or f"PP-OCRv6_{self.model_size}_det"
        rec_name = self.rec_model_name or f"PP-OCRv6_{self.model_size}_rec"
        det_dir = self.det_model_dir or os.path.join(self.model_dir, det_name)
        rec_dir = self.rec_model_dir or os.path.join(self.model_dir, rec_name)
        return det_name, det_dir, rec_name, rec_dir


# Fonts for drawing recognised text in `visualize` images, CJK-capable first. Without one,
# PaddleX would try to download a font, so visualization is then off by default.
_VIS_FONTS = (
    "/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc",
    "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc",
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
)


def _first_existing(paths) -> str | None:
    return next((p for p in paths if os.path.isfile(p)), None)


@dataclass(frozen=True)
class WorkerServerSettings(ServerSettings):
    """gunicorn's side of the worker (read by gunicorn.conf.py): one process per device, HTTP
    threads enough for the admission queue plus spares (a full queue is answered 503 at once)."""

    port: int = 8101
    processes: int = 1  # one per device
    instances_per_device: int = 1  # engine processes sharing each device
    instance_threads: int = 1  # OCR_THREADS (the device's cores) split between them
    devices: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "WorkerServerSettings":
        env = Env(environ)
        config = WorkerConfig.from_env(environ)
        d = cls()
        instances = env.int("OCR_INSTANCES_PER_DEVICE", d.instances_per_device, 1, 64)
        return cls(
            **cls.shared_fields(env),
            graceful_timeout_s=env.int("OCR_GRACEFUL_TIMEOUT_S", d.graceful_timeout_s, 1),
            # not WORKERS: `make run WORKERS=N` (the fleet size) exports that to every worker
            processes=env.int("OCR_PROCESSES", d.processes, 1, 64),
            instances_per_device=instances,
            instance_threads=max(1, config.threads // instances),
            # enough for every admitted request plus spares that answer 503 and health checks
            http_threads=env.int("HTTP_THREADS", config.queue_size + 16, 2, 1024),
            devices=tuple(env.list("CUDA_VISIBLE_DEVICES_LIST")),
            metrics_port=config.metrics_port,
        ).checked("OCR_METRICS_PORT")

    @property
    def gunicorn_workers(self) -> int:
        """K engine processes per device, each loading its own model after fork."""
        return self.processes * self.instances_per_device
