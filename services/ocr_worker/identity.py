"""The worker's engine identity: one digest of everything on this side that decides a page's
result, sent as `X-Ocr-Engine` on every /ocr and /readyz answer once the engine is loaded.
The gateway's page cache (gateway/cache/) keys answers by it, so a result read by one model,
backend or precision is never served for another: the model files' bytes, the engine's info
(engine, backend, device, models, precision and its other tuning; not its thread count), the
rendering and detection settings (the page's pixel cap too: it changes the render scale and
so every box), the visualization font and default, the versions of the inference libraries,
and a digest of the worker's own source, services/ (the package's version number does not
change with its code: an answer read by older code is not served after a deploy)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
from importlib import metadata
from typing import Any

from .config import WorkerConfig

# the worker's code and the shared code it runs (services/: documents, ocr_api, ...)
SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NOT_IN_IDENTITY = {"threads"}  # how fast, not what
_LIBRARIES = ("ocrfleet", "paddleocr", "paddlex", "paddlepaddle", "onnxruntime",
              "onnxruntime-gpu", "openvino", "pypdfium2", "opencv-python-headless", "pillow")


def files_digest(directory: str) -> str:
    """sha256 over every file below `directory` (relative names and bytes, in name order)."""
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            digest.update(os.path.relpath(path, directory).encode() + b"\0")
            with open(path, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()


@functools.lru_cache(maxsize=None)
def source_digest(directory: str) -> str:
    """sha256 over the Python source below `directory` (relative names and bytes, in name
    order; compiled caches left out, as they come and go with the same code)."""
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(name for name in dirs if name != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(root, name)
                digest.update(os.path.relpath(path, directory).encode() + b"\0")
                with open(path, "rb") as handle:
                    digest.update(hashlib.sha256(handle.read()).digest())
    return digest.hexdigest()


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def engine_identity(engine: Any, config: WorkerConfig, visualize_default: bool) -> str:
    info = {k: v for k, v in dict(engine.info).items() if k not in _NOT_IN_IDENTITY}
    described: dict[str, Any] = {
        "info": info,
        "pdf_dpi": config.pdf_dpi,
        "pdf_scan_dpi_max": config.pdf_scan_dpi_max,
        "det_max_side": config.det_max_side,
        "max_pixels": config.max_pixels,
        "visualize_default": visualize_default,
        "vis_font": os.path.basename(config.vis_font) if config.vis_font else None,
        "versions": {name: _version(name) for name in _LIBRARIES},
        "source": source_digest(SOURCE_DIR),
    }
    paths = getattr(engine, "model_paths", None)
    if paths:
        described["models"] = {key: files_digest(paths[key]) for key in ("det_dir", "rec_dir")
                               if os.path.isdir(paths[key])}
    text = json.dumps(described, sort_keys=True, separators=(",", ":"), default=str)
    return "e1-" + hashlib.sha256(text.encode()).hexdigest()[:40]
