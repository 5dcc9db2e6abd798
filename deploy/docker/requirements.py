"""Print the pip requirements of pyproject.toml for one image, one per line, so that every
Dockerfile installs exactly what the project declares (one place for versions).

    python requirements.py [--pyproject pyproject.toml] [--extra worker]
                           [--drop onnxruntime] [--add onnxruntime-gpu==1.31.1]

--extra adds an optional-dependency group to [project].dependencies; --drop removes a package
by name (the GPU image drops CPU onnxruntime: never both in one environment); --add appends a
requirement. Standard library only (tomllib, Python >= 3.11), so it runs before anything is
installed."""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    match = _NAME.match(requirement)
    if not match:
        raise ValueError(f"cannot read a package name from {requirement!r}")
    return canonical(match.group(1))


def requirements(pyproject: dict, extras=(), drop=(), add=()) -> list[str]:
    project = pyproject["project"]
    optional = project.get("optional-dependencies", {})
    lines = list(project.get("dependencies", []))
    for extra in extras:
        if extra not in optional:
            raise SystemExit(f"pyproject.toml has no optional-dependencies group {extra!r} "
                             f"(it has: {', '.join(sorted(optional))})")
        lines += optional[extra]
    dropped = {canonical(name) for name in drop}
    missing = dropped - {requirement_name(line) for line in lines}
    if missing:
        raise SystemExit(f"--drop {', '.join(sorted(missing))}: not a requirement of the "
                         "selected groups (pyproject.toml changed? update the Dockerfile)")
    kept = [line for line in lines if requirement_name(line) not in dropped]
    return kept + list(add)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pyproject", default="pyproject.toml")
    parser.add_argument("--extra", action="append", default=[])
    parser.add_argument("--drop", action="append", default=[])
    parser.add_argument("--add", action="append", default=[])
    args = parser.parse_args(argv)
    with open(Path(args.pyproject), "rb") as handle:
        pyproject = tomllib.load(handle)
    print("\n".join(requirements(pyproject, args.extra, args.drop, args.add)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
