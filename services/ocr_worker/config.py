"""WorkerConfig: every setting of the OCR worker, gunicorn's side included, each declared once as
a field (variable, default, bounds; services/ocr_api/settings.py reads them all), read once by
gunicorn's master and validated (docs/configuration.md lists the same variables)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from services.ocr_api.server_settings import ServerSettings
from services.ocr_api.settings import ConfigError, setting

REPO_ROOT = Path(__file__).resolve().parents[2]

ENGINES = ("paddleocr", "sim")
BACKENDS = ("auto", "onnxruntime", "openvino", "paddle")
OV_PRECISIONS = ("fp32", "bf16", "auto")
MODEL_SIZES = ("tiny", "small")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

# Fonts for drawing recognised text in `visualize` images, CJK-capable first. Without one,
# PaddleX would try to download a font, so visualization is then off by default.
_VIS_FONTS = (
    "/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc",
    "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc",
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
)


def _first_existing(paths) -> str | None:
    return next((p for p in paths if os.path.isfile(p)), None)


def _or_installed_font(path: str | None) -> str | None:
    return path or _first_existing(_VIS_FONTS)


@dataclass(frozen=True)
class WorkerConfig(ServerSettings):
    env_prefix = "OCR_"

    # gunicorn's side (gunicorn.conf.py; HOST and the timeouts in ServerSettings): one process
    # per device, HTTP threads enough for the admission queue plus spares (a full queue is
    # answered 503 at once)
    port: int = setting("PORT", 8101, 1, 65535)
    # not WORKERS: `make run WORKERS=N` (the fleet size) exports that to every worker
    processes: int = setting("OCR_PROCESSES", 1, 1, 64)  # one per device
    # engine processes sharing each device, OCR_THREADS (the device's cores) split between them
    instances_per_device: int = setting("OCR_INSTANCES_PER_DEVICE", 1, 1, 64)
    # None: queue_size + 16, every admitted request plus spares that answer 503 and health checks
    http_threads: int | None = setting("HTTP_THREADS", None, 2, 1024)
    graceful_timeout_s: int = setting("OCR_GRACEFUL_TIMEOUT_S", 120, 1)
    devices: tuple[str, ...] = setting("CUDA_VISIBLE_DEVICES_LIST", ())  # one per process

    engine: str = setting("OCR_ENGINE", "paddleocr", choices=ENGINES)
    backend: str = setting("OCR_BACKEND", "auto", choices=BACKENDS)
    ov_precision: str = setting("OCR_OV_PRECISION", "auto", choices=OV_PRECISIONS)
    rec_batch_size: int = setting("OCR_REC_BATCH_SIZE", 2, 1, 64)
    device: str = setting("OCR_DEVICE", "cpu")
    model_size: str = setting("OCR_MODEL_SIZE", "tiny", choices=MODEL_SIZES)
    model_dir: str = setting("OCR_MODEL_DIR", str(REPO_ROOT / "models"))
    det_model_name: str | None = setting("OCR_DET_MODEL_NAME")
    det_model_dir: str | None = setting("OCR_DET_MODEL_DIR")
    rec_model_name: str | None = setting("OCR_REC_MODEL_NAME")
    rec_model_dir: str | None = setting("OCR_REC_MODEL_DIR")
    threads: int = setting("OCR_THREADS", 1, 1, 256)
    vis_font: str | None = setting("OCR_VIS_FONT", convert=_or_installed_font)
    visualize_default: bool = setting("OCR_VISUALIZE", True)
    cache_dir: str = setting("OCR_CACHE_DIR", str(Path.home() / ".cache" / "ocrfleet" / "paddlex"))

    pdf_dpi: float = setting("OCR_PDF_DPI", 144.0, 36, 600)
    # a scanned page is rendered at its own DPI, up to this
    pdf_scan_dpi_max: float = setting("OCR_PDF_SCAN_DPI_MAX", 400.0, 36, 1200)
    max_bytes: int = setting("OCR_MAX_BYTES", 64 * 1024 * 1024, 1024)
    max_pages: int = setting("OCR_MAX_PAGES", 1000, 1)
    max_pixels: int = setting("OCR_MAX_PIXELS", 50_000_000, 10_000)

    queue_size: int = setting("OCR_QUEUE_SIZE", 32, 1)
    page_buffer: int = setting("OCR_PAGE_BUFFER", 4, 1)
    max_batch: int = setting("OCR_MAX_BATCH", 1, 1, 64)
    batch_wait_ms: float = setting("OCR_BATCH_WAIT_MS", 0.0, 0, 1000)
    retry_after_s: int = setting("OCR_RETRY_AFTER_S", 1, 1)
    request_timeout_s: float = setting("OCR_REQUEST_TIMEOUT_S", 600.0, 1)
    stall_timeout_s: float = setting("OCR_STALL_TIMEOUT_S", 120.0, 1)  # per page; health.py
    warmup: bool = setting("OCR_WARMUP", True)

    # memory (docs/operations.md "Memory")
    page_window: int = setting("OCR_PAGE_WINDOW", 2, 1, 64)
    ort_cpu_arena: bool = setting("OCR_ORT_CPU_ARENA", True)
    trim_min_pixels: int = setting("OCR_TRIM_MIN_PIXELS", 1_000_000, 0)
    det_max_side: int = setting("OCR_DET_MAX_SIDE", 2000, 320, 16384)
    memory_budget_mb: int = setting("OCR_MEMORY_BUDGET_MB", 1024, 0)
    memory_ceiling_mb: int = setting("OCR_MEMORY_CEILING_MB", 0, 0)

    allow_url_input: bool = setting("OCR_ALLOW_URL_INPUT", False)
    url_timeout_s: float = setting("OCR_URL_TIMEOUT_S", 20.0, 1)

    # tokens a caller (the gateway) must send; none: no check. Never in repr (logs).
    api_tokens: tuple[str, ...] = setting("OCR_API_TOKEN", (), file="OCR_API_TOKEN_FILE")
    # /metrics on this port only (a second bind)
    metrics_port: int | None = setting("OCR_METRICS_PORT", None, 1, 65535)

    sim_page_ms: float = setting("OCR_SIM_PAGE_MS", 200.0, 0)
    # pixels of a full page: a smaller image takes its share of OCR_SIM_PAGE_MS, as OCR time
    # follows the pixels (0: every page takes the full time)
    sim_page_pixels: int = setting("OCR_SIM_PAGE_PIXELS", 0, 0)
    sim_jitter_ms: float = setting("OCR_SIM_JITTER_MS", 0.0, 0)
    sim_load_ms: float = setting("OCR_SIM_LOAD_MS", 0.0, 0)

    log_level: str = setting("OCR_LOG_LEVEL", "INFO", choices=LOG_LEVELS)

    def __post_init__(self) -> None:
        if self.http_threads is None:
            object.__setattr__(self, "http_threads", self.queue_size + 16)

    def validate(self) -> None:
        super().validate()
        if self.device != "cpu" and not self.device.startswith("gpu"):
            raise ConfigError(f"OCR_DEVICE={self.device!r}: expected cpu or gpu:N")
        if self.backend == "openvino" and self.device != "cpu":
            raise ConfigError("OCR_BACKEND=openvino runs on the CPU only: set OCR_DEVICE=cpu "
                              "or OCR_BACKEND=onnxruntime")

    @property
    def gunicorn_workers(self) -> int:
        """K engine processes per device, each loading its own model after fork."""
        return self.processes * self.instances_per_device

    @property
    def instance_threads(self) -> int:
        """One engine process's share of the device's OCR_THREADS."""
        return max(1, self.threads // self.instances_per_device)

    def model_paths(self) -> tuple[str, str, str, str]:
        """(det name, det dir, rec name, rec dir): explicit overrides, else the PP-OCRv6
        directories `make models` lays out under model_dir."""
        det_name = self.det_model_name or f"PP-OCRv6_{self.model_size}_det"
        rec_name = self.rec_model_name or f"PP-OCRv6_{self.model_size}_rec"
        det_dir = self.det_model_dir or os.path.join(self.model_dir, det_name)
        rec_dir = self.rec_model_dir or os.path.join(self.model_dir, rec_name)
        return det_name, det_dir, rec_name, rec_dir
