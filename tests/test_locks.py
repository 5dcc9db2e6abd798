"""The locks against the Python of every image that installs them, without building anything:
`make images` installs each image's wheelhouse offline from its lock (deploy/docker/wheelhouse.py),
and the wheelhouse is downloaded on the host, so a dependency that only the image's interpreter
needs (redis needs async-timeout below Python 3.11.3: Debian bookworm has 3.11.2) must be pinned
in the lock, without a marker the host's pip would judge by the host's Python. The dependencies
of each pinned package are read from its installed metadata (the test environment has most of
them at the locked version) and evaluated for each image's Python."""

from __future__ import annotations

import importlib.metadata
import re

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement

from deploy.docker import images, wheelhouse
from scripts import deps
from tests.conftest import REPO_ROOT

# The Python of each base image the Dockerfiles are built on (their PYTHON_IMAGE / CUDA_IMAGE
# default, or what deploy/docker/images.py gives them): the earliest and the latest 3.11 the
# Debian-based images may carry, and Ubuntu 24.04's for the CUDA one. A new base fails
# test_every_base_image_has_a_known_python until it is added here.
DEBIAN_BOOKWORM = ("3.11.2",)                 # python3 of bookworm (images.LOCAL_BASE)
PYTHON_311_SLIM = ("3.11.2", "3.11.99")       # python:3.11-slim-bookworm: some 3.11 release
BASE_PYTHONS = {
    "python:3.11-slim-bookworm": PYTHON_311_SLIM,
    images.OFFICIAL_PYTHON: PYTHON_311_SLIM,
    images.LOCAL_BASE: DEBIAN_BOOKWORM,
    "nvidia/cuda:13.0.2-cudnn-runtime-ubuntu24.04": ("3.12.3",),
}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def dockerfile(image: str) -> str:
    return (REPO_ROOT / "deploy" / "docker" / wheelhouse.DOCKERFILES[image]).read_text()


def image_bases(image: str) -> set[str]:
    """Every base the image is built on: its Dockerfile's default and make images' choices."""
    if image == "worker-gpu":  # the CUDA image, or (the stand-in) a Python base
        return {wheelhouse.dockerfile_arg(dockerfile(image), "CUDA_IMAGE"),
                images.OFFICIAL_PYTHON, images.LOCAL_BASE}
    return {wheelhouse.dockerfile_arg(dockerfile(image), "PYTHON_IMAGE"),
            images.OFFICIAL_PYTHON, images.LOCAL_BASE}


def image_pythons(image: str) -> list[str]:
    return sorted({version for base in image_bases(image) for version in BASE_PYTHONS[base]})


def lock_text(image: str) -> str:
    return (REPO_ROOT / wheelhouse.IMAGES[image].lock).read_text()


def lock_pins(text: str) -> dict[str, str]:
    return {canonical(name): version
            for name, version in re.findall(r"^([A-Za-z0-9._-]+)==([^\s;\\]+)", text, re.M)}


def environment(python_full_version: str) -> dict[str, str]:
    """The marker environment of CPython `python_full_version` on Linux x86_64."""
    env = default_environment()
    env.update(python_full_version=python_full_version,
               python_version=".".join(python_full_version.split(".")[:2]),
               implementation_version=python_full_version, implementation_name="cpython",
               platform_python_implementation="CPython", platform_system="Linux",
               sys_platform="linux", os_name="posix", platform_machine="x86_64")
    return env


def missing_dependencies(pins: dict[str, str], python: str) -> tuple[list[str], int]:
    """(what a pinned package needs on `python` that the lock lacks or pins outside its
    specifier, how many pinned packages were checked: those installed here at their pin)."""
    env = environment(python)
    missing, checked = [], 0
    for name, version in sorted(pins.items()):
        try:
            distribution = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if distribution.version != version:
            continue
        checked += 1
        for line in distribution.requires or []:
            requirement = Requirement(line)
            if requirement.marker and not requirement.marker.evaluate({**env, "extra": ""}):
                continue
            pinned = pins.get(canonical(requirement.name))
            if pinned is None or not requirement.specifier.contains(pinned, prereleases=True):
                missing.append(f"{name}=={version} needs {line} on Python {python}; "
                               f"the lock has {pinned or 'nothing'}")
    return missing, checked


def test_every_base_image_has_a_known_python():
    for image in wheelhouse.IMAGES:
        unknown = image_bases(image) - set(BASE_PYTHONS)
        assert not unknown, f"{image}: which Python does {unknown} have? add it to BASE_PYTHONS"
    # the wheelhouse is downloaded for the same X.Y
    for image in ("gateway", "worker-cpu"):
        assert {v.rsplit(".", 1)[0] for v in image_pythons(image)} == {wheelhouse.PYTHON_VERSION}
    cuda = wheelhouse.dockerfile_arg(dockerfile("worker-gpu"), "CUDA_IMAGE")
    assert {v.rsplit(".", 1)[0] for v in BASE_PYTHONS[cuda]} == {images.CUDA_PYTHON}


@pytest.mark.parametrize("image", sorted(wheelhouse.IMAGES))
def test_every_image_installs_through_a_hashed_lock_without_markers(image):
    spec = wheelhouse.IMAGES[image]
    assert spec.lock and (REPO_ROOT / spec.lock).is_file(), \
        f"{image} has no lock: its wheelhouse would be resolved on the host (`make lock`)"
    plan = wheelhouse.plan(image)
    assert plan.source == spec.lock and plan.hashed
    # pip download on the host would judge a marker by the host's Python, not the image's
    marked = [line for line in plan.requirements.splitlines()
              if re.match(r"[A-Za-z0-9]", line) and ";" in line]
    assert not marked, f"{spec.lock}: markers the host would evaluate: {marked}"
    assert "--require-hashes" in dockerfile(image)


@pytest.mark.parametrize("image", sorted(wheelhouse.IMAGES))
def test_each_lock_has_what_its_packages_need_on_each_images_python(image):
    pins = lock_pins(lock_text(image))
    for python in image_pythons(image):
        missing, checked = missing_dependencies(pins, python)
        assert not missing, "\n".join(missing) + "\n(`make lock` resolves for Python " \
            f"{deps.PYTHON_VERSION}, i.e. {deps.PYTHON_VERSION}.0 and later)"
        # most pinned packages are installed here at their pin; else this would check nothing
        assert checked >= 0.8 * len(pins), f"only {checked} of {len(pins)} checked"


def test_redis_gets_async_timeout_on_debian_bookworms_python():
    """The break this file guards against: bookworm's 3.11.2 needs it, the host's may not."""
    requirement = next(Requirement(line) for line in importlib.metadata.requires("redis")
                       if canonical(Requirement(line).name) == "async-timeout")
    assert requirement.marker.evaluate({**environment("3.11.2"), "extra": ""})
    for image in wheelhouse.IMAGES:
        pins = lock_pins(lock_text(image))
        assert "redis" in pins and "async-timeout" in pins, image


def test_the_gpu_lock_swaps_onnxruntime_and_keeps_the_cpu_workers_versions():
    gpu, cpu = lock_pins(lock_text("worker-gpu")), lock_pins(lock_text("worker-cpu"))
    version = wheelhouse.dockerfile_arg(dockerfile("worker-gpu"), "ONNXRUNTIME_GPU_VERSION")
    assert gpu.get("onnxruntime-gpu") == version, "run `make lock` after changing the ARG"
    assert "onnxruntime" not in gpu and "openvino" not in gpu
    assert {name: (v, cpu[name]) for name, v in gpu.items() if name in cpu and cpu[name] != v} \
        == {}
    assert set(gpu) - set(cpu) == {"onnxruntime-gpu"}


def test_make_lock_writes_every_images_lock():
    locks = {str(deps.lock_path(name).relative_to(REPO_ROOT)) for name in deps.ALL_LOCKS}
    assert {spec.lock for spec in wheelhouse.IMAGES.values()} <= locks
    gpu = deps.compile_command(deps.GPU_LOCK)
    assert gpu[gpu.index("--constraint") + 1] == "requirements/worker.lock"
    assert "onnxruntime-gpu==" in deps.gpu_requirements()
    assert not re.search(r"^onnxruntime[=<>]", deps.gpu_requirements(), re.M)
