"""Which container engine runs the images here, and how it is called: podman when installed
(with deploy/podman/containers.conf unless CONTAINERS_CONF already names one), else a docker
whose daemon answers. Used by `make images`, `make image-test` and `make kube-play`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONTAINERS_CONF = REPO / "deploy" / "podman" / "containers.conf"


class NoEngine(RuntimeError):
    """Neither podman nor a working docker."""


def name() -> str:
    if shutil.which("podman"):
        return "podman"
    if shutil.which("docker") and subprocess.run(["docker", "info"], capture_output=True,
                                                 timeout=30).returncode == 0:
        return "docker"
    raise NoEngine("no container engine: run scripts/install_container_deps.sh (podman), or "
                   "start your docker daemon")


def env(engine: str) -> dict[str, str]:
    """The environment for the engine: podman gets the project's containers.conf unless the
    caller chose one (runc + cgroupfs + explicit ulimits; see that file)."""
    environ = dict(os.environ)
    if engine == "podman":
        environ.setdefault("CONTAINERS_CONF", str(CONTAINERS_CONF))
    return environ


def run(engine: str, *args: str, check: bool = True, capture: bool = True,
        timeout: float | None = None, input: bytes | None = None
        ) -> subprocess.CompletedProcess:
    return subprocess.run([engine, *args], env=env(engine), check=check,
                          capture_output=capture, timeout=timeout, input=input)


def image_exists(engine: str, tag: str) -> bool:
    return run(engine, "image", "inspect", tag, check=False).returncode == 0


def image_size(engine: str, tag: str) -> int:
    """Bytes of the image (all its layers, shared ones included)."""
    info = json.loads(run(engine, "image", "inspect", tag).stdout)
    return int(info[0]["Size"])


def image_labels(engine: str, tag: str) -> dict[str, str]:
    info = json.loads(run(engine, "image", "inspect", tag).stdout)[0]
    return (info.get("Config") or {}).get("Labels") or info.get("Labels") or {}
