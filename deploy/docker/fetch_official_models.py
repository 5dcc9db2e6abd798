"""Fetch official PaddleOCR models (Paddle inference format) at image build time with PaddleX's
own downloader, and lay them out as DEST/<model name>/ for OCR_DET_MODEL_DIR / OCR_REC_MODEL_DIR.
Used by the paddlepaddle-gpu variant of deploy/docker/worker-gpu.Dockerfile: the running
container never downloads anything.

    python fetch_official_models.py --dest /opt/ocrfleet/models \
        PP-OCRv5_server_det PP-OCRv5_server_rec

PADDLE_PDX_MODEL_SOURCE picks the hoster (huggingface, modelscope, aistudio, bos; PaddleX's
default order otherwise). Each model directory is checked: inference.yml whose
Global.model_name is the requested name (PaddleOCR refuses a mismatch) and the weights file."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path


def check_model_dir(path: Path, name: str) -> None:
    import yaml  # a PaddleX dependency

    config_file = path / "inference.yml"
    if not config_file.is_file():
        raise SystemExit(f"{path}: no inference.yml; not a PaddleX model directory")
    declared = ((yaml.safe_load(config_file.read_text()) or {}).get("Global") or {}).get(
        "model_name")
    if declared != name:
        raise SystemExit(f"{config_file}: Global.model_name is {declared!r}, expected {name!r}")
    weights = [p for p in path.iterdir() if p.name in ("inference.pdiparams", "inference.onnx")]
    if not weights:
        raise SystemExit(f"{path}: no inference.pdiparams (nor inference.onnx)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", required=True)
    parser.add_argument("models", nargs="+", help="official model names, e.g. PP-OCRv5_server_det")
    args = parser.parse_args(argv)
    dest = Path(args.dest)
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pdx-cache-") as cache:
        # Set before PaddleX is imported: its cache directory is read at import time.
        os.environ["PADDLE_PDX_CACHE_HOME"] = cache
        from paddlex.inference.utils.official_models import official_models

        for name in args.models:
            source = Path(official_models[name])
            check_model_dir(source, name)
            target = dest / name
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(source, target)
            print(f"{name}: {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
