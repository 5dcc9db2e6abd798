"""`make lock` and `make audit`: the hashed lock files of the two images, and a check of them
against the known-vulnerability database.

    python -m scripts.deps lock    # requirements/{gateway,worker,worker-gpu}.lock
    python -m scripts.deps audit   # pip-audit on both; skipped, with a note, when unreachable

Locks are resolved with `uv pip compile --generate-hashes` from pyproject.toml for the images'
platform (Linux x86_64, CPython 3.11): the gateway from [project].dependencies, the worker from
those plus the `worker` and `openvino` extras, the GPU worker from the `worker` extra with
onnxruntime-gpu (the version its Dockerfile names) instead of onnxruntime, at the versions
worker.lock pins. uv reads "3.11" as 3.11.0, so a lock holds what every 3.11 needs, also what
later patch releases stop needing: async-timeout for redis below 3.11.3, which Debian
bookworm's Python 3.11.2 (the images' base without a registry) must have. The locks carry no
markers: the host's pip, downloading an image's wheelhouse, would judge them by the host's
Python. tests/test_locks.py checks each lock against each image's Python. The tools (uv,
pip-audit) come from pyproject's `lock` and `audit` groups, installed into the running
environment on first use.

The audit asks pip-audit's vulnerability service about every pinned version. Where that
service cannot be reached (a machine that reaches only a package index, or none), pip-audit
reports each package as "not found" and would pass; a one-package probe detects that first and
the audit is skipped with a printed note, so CI passes offline and fails only on real findings.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCKS = {"gateway": (), "worker": ("worker", "openvino")}  # lock name -> pyproject extras
# The GPU worker image's lock: requirements.py's list for it (no CPU onnxruntime beside the GPU
# one), constrained to worker.lock's versions so that both workers run the same packages.
GPU_LOCK = "worker-gpu"
ALL_LOCKS = (*LOCKS, GPU_LOCK)
PYTHON_VERSION = "3.11"
PLATFORM = "x86_64-manylinux_2_28"
SERVICES = ("pypi", "osv")  # pip-audit's vulnerability services, tried in this order


def lock_path(name: str) -> Path:
    return ROOT / "requirements" / f"{name}.lock"


def tool_requirements(group: str) -> list[str]:
    with open(ROOT / "pyproject.toml", "rb") as handle:
        return tomllib.load(handle)["project"]["optional-dependencies"][group]


def ensure_tool(module: str, group: str) -> bool:
    """Import-or-install a tool from its pyproject group; False (with a note) if it can't be."""
    if _importable(module):
        return True
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet",
                             *tool_requirements(group)], capture_output=True, text=True)
    if result.returncode != 0 or not _importable(module):
        print(f"note: could not install {', '.join(tool_requirements(group))} "
              f"(no package index reachable?): {result.stderr.strip()[-300:]}")
        return False
    return True


def _importable(module: str) -> bool:
    return subprocess.run([sys.executable, "-c", f"import {module}"],
                          capture_output=True).returncode == 0


def gpu_requirements() -> str:
    """The GPU worker's requirements, as its Dockerfile's fallback (requirements.py) lists them."""
    from deploy.docker import requirements, wheelhouse

    spec = wheelhouse.IMAGES["worker-gpu"]
    package, arg = spec.pin
    dockerfile = (ROOT / "deploy" / "docker" / wheelhouse.DOCKERFILES["worker-gpu"]).read_text()
    pin = f"{package}=={wheelhouse.dockerfile_arg(dockerfile, arg)}"
    with open(ROOT / "pyproject.toml", "rb") as handle:
        pyproject = tomllib.load(handle)
    return "\n".join(requirements.requirements(pyproject, spec.extras, spec.drop, (pin,))) + "\n"


def compile_command(name: str) -> list[str]:
    """uv's command for one lock; the GPU lock's requirements come on stdin."""
    if name == GPU_LOCK:
        source = ["-", "--constraint", str(lock_path("worker").relative_to(ROOT))]
    else:
        source = ["pyproject.toml"] + [arg for extra in LOCKS[name] for arg in ("--extra", extra)]
    return [sys.executable, "-m", "uv", "pip", "compile", *source,
            "--generate-hashes", "--python-version", PYTHON_VERSION,
            "--python-platform", PLATFORM, "--custom-compile-command", "make lock",
            "--no-progress", "--quiet", "--output-file", str(lock_path(name))]


def lock() -> int:
    if not ensure_tool("uv", "lock"):
        return 1
    lock_path("gateway").parent.mkdir(exist_ok=True)
    for name in ALL_LOCKS:  # the GPU lock last: worker.lock constrains it
        subprocess.run(compile_command(name), cwd=ROOT, check=True, text=True,
                       input=gpu_requirements() if name == GPU_LOCK else None)
        print(f"wrote {lock_path(name).relative_to(ROOT)}")
    return 0


# ---- audit --------------------------------------------------------------------------------------
@dataclass
class AuditOutcome:
    audited: list[str]  # name==version checked against the database
    skipped: list[str]  # not checked, with pip-audit's reason
    findings: list[str]  # "name version: ID (fixed in ...)"


def read_audit_json(text: str) -> AuditOutcome:
    """pip-audit's --format json output, sorted into what was checked, skipped and found."""
    report = json.loads(text)
    outcome = AuditOutcome([], [], [])
    for dep in report.get("dependencies", []):
        if "skip_reason" in dep:
            outcome.skipped.append(f"{dep['name']}: {dep['skip_reason']}")
            continue
        outcome.audited.append(f"{dep['name']}=={dep.get('version')}")
        for vuln in dep.get("vulns", []):
            fixed = ", ".join(vuln.get("fix_versions") or []) or "no fix yet"
            outcome.findings.append(f"{dep['name']} {dep.get('version')}: {vuln.get('id')} "
                                    f"(fixed in {fixed})")
    return outcome


def run_pip_audit(requirement_files: list[Path], service: str,
                  timeout_s: int) -> AuditOutcome | None:
    """None when pip-audit could not produce a report at all (no network, a crash)."""
    args = [sys.executable, "-m", "pip_audit", "--no-deps", "--disable-pip",
            "--vulnerability-service", service, "--timeout", str(timeout_s),
            "--progress-spinner", "off", "--format", "json"]
    for path in requirement_files:
        args += ["--requirement", str(path)]
    result = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
    try:
        return read_audit_json(result.stdout)
    except ValueError:
        return None


def first_pin(path: Path) -> str:
    return next(line.split()[0] for line in path.read_text().splitlines()
                if "==" in line and not line.startswith(("#", " ")))


def reachable_service(probe_file: Path) -> str | None:
    """The first vulnerability service that actually audits one pinned package."""
    for service in SERVICES:
        outcome = run_pip_audit([probe_file], service, timeout_s=10)
        if outcome is not None and outcome.audited:
            return service
    return None


def audit() -> int:
    locks = [lock_path(name) for name in ALL_LOCKS]
    missing = [str(p.relative_to(ROOT)) for p in locks if not p.is_file()]
    if missing:
        print(f"missing lock file(s) {', '.join(missing)}: run `make lock`")
        return 1
    if not ensure_tool("pip_audit", "audit"):
        print("note: dependency audit skipped (pip-audit unavailable)")
        return 0
    probe = ROOT / "requirements" / ".audit-probe.txt"
    probe.write_text(first_pin(locks[0]) + "\n")
    try:
        service = reachable_service(probe)
    finally:
        probe.unlink()
    if service is None:
        print("note: dependency audit skipped: no vulnerability service answered "
              f"(tried {', '.join(SERVICES)}); run `make audit` where one is reachable")
        return 0
    outcome = run_pip_audit(locks, service, timeout_s=30)
    if outcome is None:
        print("dependency audit failed: pip-audit produced no report")
        return 1
    print(f"audited {len(outcome.audited)} pinned packages against {service}")
    for line in outcome.skipped:
        print(f"warning: not audited: {line}")
    for line in outcome.findings:
        print(f"VULNERABLE: {line}")
    return 1 if outcome.findings else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("lock", "audit"))
    args = parser.parse_args(argv)
    return lock() if args.command == "lock" else audit()


if __name__ == "__main__":
    sys.exit(main())
