"""`make images`: build the fleet's images from the project's Dockerfiles with the local engine,
offline except for Debian's apt inside the builds.

    python -m deploy.docker.images [--image gateway --image worker-cpu ...] [--python-image IMG]
                                   [--cuda-image IMG] [--keep-cache] [--force]

An image whose label io.ocrfleet.sources equals the digest of what it is built from (the
Dockerfile, pyproject.toml, lock files, the services' code) is up to date and not rebuilt
(--force rebuilds), so `make image-test` after `make images` builds nothing.

1. Base: --python-image if given, else python:3.11-slim-bookworm when it is already in local
   storage, else a Debian bookworm base made here (deploy/docker/base_image.sh: debootstrap +
   import). Nothing is pulled from a registry (--pull=never) unless --python-image names an
   image that is not local.
2. A wheelhouse per image on the host (deploy/docker/wheelhouse.py), installed with --no-index.
3. The builds, tagged localhost/ocrfleet-<image>:dev. worker-gpu: the CUDA base cannot be pulled
   here, so unless --cuda-image names a local CUDA image it is built on the Debian base as a
   stand-in (tag :standin): every stage and the Python layer (onnxruntime-gpu, the worker's
   code, the models) are the real ones; the CUDA and cuDNN libraries, Ubuntu 24.04 and its
   Python 3.12 are not.
4. Dangling intermediate images removed (--keep-cache keeps them for faster rebuilds), then each
   step's time and each image's size printed."""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from deploy.docker import engine as engines
from deploy.docker import wheelhouse

REPO = Path(__file__).resolve().parents[2]
OFFICIAL_PYTHON = "docker.io/library/python:3.11-slim-bookworm"
LOCAL_BASE = "localhost/ocrfleet-python-base:bookworm"
CUDA_PYTHON = "3.12"  # the CUDA image's (Ubuntu 24.04) python3
SOURCES_LABEL = "io.ocrfleet.sources"
# What the images are built from, besides their Dockerfile (directories: every file in them).
INPUTS = ("pyproject.toml", "deploy/docker/requirements.py", "scripts/fetch_models.py",
          "scripts/fetch_layout_models.py", "requirements", "services", "gateway")


@dataclass(frozen=True)
class Build:
    image: str
    tag: str
    args: tuple[str, ...]       # engine build arguments, without the context
    python_version: str         # the image's CPython, for its wheelhouse


def source_digest(image: str, repo: Path = REPO) -> str:
    """SHA-256 over the paths and contents of the image's inputs (compiled files skipped)."""
    digest = hashlib.sha256()
    paths = [repo / "deploy" / "docker" / wheelhouse.DOCKERFILES[image]]
    for name in INPUTS:
        path = repo / name
        paths += sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for path in paths:
        if not path.exists() or "__pycache__" in path.parts or path.suffix == ".pyc":
            continue
        digest.update(str(path.relative_to(repo)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def tag_of(image: str, standin: bool = False) -> str:
    return f"localhost/ocrfleet-{image}:{'standin' if standin else 'dev'}"


def build_plan(images: list[str], python_image: str, cuda_image: str | None,
               pull: bool, digests: dict[str, str] | None = None,
               engine: str = "podman") -> list[Build]:
    """The engine's build command for each image (pure: tested without an engine)."""
    builds = []
    for image in images:
        dockerfile = f"deploy/docker/{wheelhouse.DOCKERFILES[image]}"
        args = ["build", "-f", dockerfile]
        if engine == "podman":
            args.append("--format=docker")  # OCI images drop the Dockerfiles' HEALTHCHECK
        if not pull:
            args.append("--pull=never")
        python_version = wheelhouse.PYTHON_VERSION
        standin = False
        if image == "worker-gpu":
            standin = cuda_image is None
            args += ["--target", "worker-gpu",
                     "--build-arg", f"CUDA_IMAGE={cuda_image or python_image}"]
            python_version = wheelhouse.PYTHON_VERSION if standin else CUDA_PYTHON
        else:
            args += ["--build-arg", f"PYTHON_IMAGE={python_image}"]
        tag = tag_of(image, standin)
        if digests:
            args += ["--label", f"{SOURCES_LABEL}={digests[image]}"]
        builds.append(Build(image, tag, tuple(args + ["-t", tag]), python_version))
    return builds


def timed(label: str, timings: list, func, *args):
    started = time.monotonic()
    result = func(*args)
    timings.append((label, time.monotonic() - started))
    print(f"[{label}: {timings[-1][1]:.0f} s]", flush=True)
    return result


def base_image(engine: str, requested: str | None) -> tuple[str, bool]:
    """(image, may pull): the requested one, else the official one when local, else ours."""
    if requested:
        return requested, not engines.image_exists(engine, requested)
    if engines.image_exists(engine, OFFICIAL_PYTHON):
        return OFFICIAL_PYTHON, False
    subprocess.run(["bash", str(REPO / "deploy/docker/base_image.sh"), LOCAL_BASE],
                   env={**engines.env(engine), "ENGINE": engine}, check=True)
    return LOCAL_BASE, False


def up_to_date(engine: str, tag: str, digest: str) -> bool:
    if not engines.image_exists(engine, tag):
        return False
    labels = engines.image_labels(engine, tag)
    return labels.get(SOURCES_LABEL) == digest


def build(engine: str, item: Build) -> None:
    print(f"building {item.tag}", flush=True)
    engines.run(engine, *item.args, str(REPO), capture=False)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", action="append", choices=sorted(wheelhouse.IMAGES),
                        help="repeat for several (default: all)")
    parser.add_argument("--python-image", default=None)
    parser.add_argument("--cuda-image", default=None)
    parser.add_argument("--keep-cache", action="store_true")
    parser.add_argument("--force", action="store_true", help="rebuild up-to-date images too")
    args = parser.parse_args(argv)
    images = args.image or ["gateway", "worker-cpu", "worker-gpu"]
    engine = engines.name()
    timings: list[tuple[str, float]] = []
    digests = {image: source_digest(image) for image in images}
    planned = build_plan(images, "-", args.cuda_image, False, digests, engine)
    todo = [b.image for b in planned
            if args.force or not up_to_date(engine, b.tag, digests[b.image])]
    for item in planned:
        if item.image not in todo:
            print(f"{item.tag}: up to date ({SOURCES_LABEL}={digests[item.image]})")
    python_image, pull = (timed("base image", timings, base_image, engine, args.python_image)
                          if todo else ("-", False))
    builds = build_plan(todo, python_image, args.cuda_image, pull, digests, engine)
    for item in builds:
        timed(f"wheelhouse {item.image}", timings, wheelhouse.prepare, item.image, None,
              item.python_version)
        timed(f"build {item.image}", timings, build, engine, item)
    if builds and not args.keep_cache:
        timed("prune intermediate images", timings,
              lambda: engines.run(engine, "image", "prune", "--force"))
    print("\nstep                              seconds")
    for label, seconds in timings:
        print(f"{label:<34}{seconds:>7.0f}")
    print(f"{'total':<34}{sum(s for _, s in timings):>7.0f}\n\nimage{'':<40}MB")
    for item in planned:
        print(f"{item.tag:<45}{engines.image_size(engine, item.tag) / 1e6:>5.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
