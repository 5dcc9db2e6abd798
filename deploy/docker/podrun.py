"""Run a rendered Deployment's container with podman (or docker) the way the kubelet runs it:
`make image-test` (tests/test_images.py) starts the fleet's images with these arguments.

From the manifest, not restated here: the user and group (runAsUser / runAsGroup), a read-only
root filesystem, dropped capabilities and no privilege escalation, one tmpfs per emptyDir
volume mount in memory and an anonymous volume per one on disk, the CPU and memory limits, and
the environment of the ConfigMaps named in `envFrom`. The caller adds only what a cluster would
give the pod and a single machine cannot: loopback addresses and ports on the host's network
instead of a pod IP, and /etc/hosts entries instead of the headless Service's DNS."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from deploy.docker import engine as engines

_BINARY_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_DECIMAL_SUFFIXES = {"k": 10**3, "M": 10**6, "G": 10**9}


def quantity_bytes(value: str | int) -> int:
    """A Kubernetes memory quantity (2Gi, 256Mi, 1G, 512) in bytes."""
    text = str(value)
    for suffixes in (_BINARY_SUFFIXES, _DECIMAL_SUFFIXES):
        for suffix, factor in suffixes.items():
            if text.endswith(suffix):
                return int(float(text[: -len(suffix)]) * factor)
    return int(text)


def quantity_cpus(value: str | int | float) -> float:
    """A Kubernetes CPU quantity (2, 500m, 1.5) in CPUs."""
    text = str(value)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


def container_spec(deployment: dict, name: str | None = None) -> dict:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if name is None or c["name"] == name)


def configmap_env(deployment: dict, objects: list[dict]) -> dict[str, str]:
    """The environment `envFrom: configMapRef` gives the container, in order."""
    configmaps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
    env: dict[str, str] = {}
    for source in container_spec(deployment).get("envFrom", []):
        if "configMapRef" in source:
            env.update(configmaps[source["configMapRef"]["name"]].get("data", {}))
    for item in container_spec(deployment).get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
    return env


def volume_args(volume: dict, path: str) -> list[str]:
    """An emptyDir as the kubelet makes it: `medium: Memory` a tmpfs of sizeLimit, mode 0777;
    on disk an anonymous volume (removed with the container; the image's directory, owner
    included, is copied into it: podman's tmpfs over an existing directory would take that
    directory's mode but not its owner, and the uid could not write it)."""
    if "emptyDir" not in volume:
        raise ValueError(f"volume {volume['name']}: only emptyDir can be run here")
    empty_dir = volume["emptyDir"] or {}
    if empty_dir.get("medium") == "Memory":
        size = empty_dir.get("sizeLimit")
        options = "rw,mode=0777" + (f",size={quantity_bytes(size)}" if size else "")
        return ["--tmpfs", f"{path}:{options}"]
    return ["--mount", f"type=volume,destination={path}"]


def run_args(deployment: dict, objects: list[dict], *, name: str, image: str,
             env: dict[str, str] | None = None, add_hosts: tuple[tuple[str, str], ...] = (),
             network: str = "host") -> list[str]:
    """`<engine> run` arguments for the Deployment's (first) container (pure: tested alone)."""
    pod = deployment["spec"]["template"]["spec"]
    container = container_spec(deployment)
    pod_security = pod.get("securityContext", {})
    security = {**pod_security, **container.get("securityContext", {})}
    args = ["run", "--detach", "--name", name, f"--network={network}"]
    if "runAsUser" in security:
        args += ["--user", f"{security['runAsUser']}:{security.get('runAsGroup', 0)}"]
    if security.get("readOnlyRootFilesystem"):
        # podman would add tmpfs /tmp, /run, /var/tmp by itself; the kubelet does not.
        args += ["--read-only", "--read-only-tmpfs=false"]
    for capability in security.get("capabilities", {}).get("drop", []):
        args += ["--cap-drop", capability]
    for capability in security.get("capabilities", {}).get("add", []):
        args += ["--cap-add", capability]
    if security.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        args += volume_args(volumes[mount["name"]], mount["mountPath"])
    limits = container.get("resources", {}).get("limits", {})
    if "memory" in limits:
        memory = quantity_bytes(limits["memory"])
        args += ["--memory", str(memory), "--memory-swap", str(memory)]
    if "cpu" in limits:
        args += ["--cpus", f"{quantity_cpus(limits['cpu']):g}"]
    for host, address in add_hosts:
        args += ["--add-host", f"{host}:{address}"]
    for key, value in {**configmap_env(deployment, objects), **(env or {})}.items():
        args += ["--env", f"{key}={value}"]
    return args + [image]


def cpus_limit(host_config: dict) -> float:
    """The CPU limit an inspected container runs under (NanoCpus, or quota / period)."""
    if host_config.get("NanoCpus"):
        return host_config["NanoCpus"] / 1e9
    return host_config["CpuQuota"] / host_config["CpuPeriod"]


def http_status(url: str, timeout: float = 3.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None


@dataclass
class Container:
    """One running container, stopped and removed by `remove()`."""

    engine: str
    name: str
    log_dir: Path
    exit_code: int | None = field(default=None, init=False)

    def start(self, args: list[str]) -> "Container":
        engines.run(self.engine, *args)
        return self

    def inspect(self) -> dict:
        return json.loads(engines.run(self.engine, "inspect", "--type", "container",
                                      self.name).stdout)[0]

    def running(self) -> bool:
        return self.inspect()["State"]["Running"]

    def wait_for(self, url: str, deadline_s: float, expect: int = 200) -> float:
        """Seconds until `url` answers `expect`; fails if the container exits or the deadline
        passes (polled, with the logs in the error)."""
        started = time.monotonic()
        while time.monotonic() - started < deadline_s:
            if http_status(url) == expect:
                return time.monotonic() - started
            if not self.running():
                raise AssertionError(f"{self.name} exited:\n{self.logs()[-3000:]}")
            time.sleep(0.5)
        raise AssertionError(f"{url} did not answer {expect} within {deadline_s} s:\n"
                             f"{self.logs()[-3000:]}")

    def signal(self, name: str) -> None:
        engines.run(self.engine, "kill", "--signal", name, self.name)

    def wait_exit(self, timeout_s: float) -> int:
        result = engines.run(self.engine, "wait", self.name, timeout=timeout_s)
        self.exit_code = int(result.stdout.decode().strip().splitlines()[-1])
        return self.exit_code

    def logs(self) -> str:
        result = engines.run(self.engine, "logs", self.name, check=False)
        return (result.stdout + result.stderr).decode(errors="replace")

    def cgroup_dir(self, controller: str) -> Path:
        """The container's cgroup directory for a v1 controller (or the v2 unified one)."""
        pid = self.inspect()["State"]["Pid"]
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controller in controllers.split(","):
                return Path("/sys/fs/cgroup") / controller / path.lstrip("/")
            if controllers == "":
                return Path("/sys/fs/cgroup") / path.lstrip("/")
        raise RuntimeError(f"no {controller} cgroup for {self.name}")

    def memory_peak_bytes(self) -> int:
        directory = self.cgroup_dir("memory")
        for name in ("memory.max_usage_in_bytes", "memory.peak"):
            if (directory / name).is_file():
                return int((directory / name).read_text())
        raise RuntimeError(f"no peak memory counter in {directory}")

    def cpu_seconds(self) -> float:
        directory = self.cgroup_dir("cpuacct")
        if (directory / "cpuacct.usage").is_file():
            return int((directory / "cpuacct.usage").read_text()) / 1e9
        stat = dict(line.split() for line in (directory / "cpu.stat").read_text().splitlines())
        return int(stat["usage_usec"]) / 1e6

    def remove(self) -> None:
        if self.exit_code is None:
            (self.log_dir / f"{self.name}.log").write_text(self.logs())
        engines.run(self.engine, "rm", "--force", "--volumes", "--time", "5", self.name,
                    check=False)
