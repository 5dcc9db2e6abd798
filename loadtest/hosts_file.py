"""A DNS name of our own for the DNS-mode benchmarks (a k8s headless Service on loopback): the
gateway runs in a mount namespace of its own where /etc/hosts is a file this object rewrites
in place, so the gateway's real resolver (getaddrinfo) sees the name's addresses change as
replicas come and go. Needs `unshare -m` (root, or user namespaces)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path


class HostsFile:
    def __init__(self, name: str):
        self.name = name
        self.path = Path(tempfile.mkdtemp(prefix="ocrfleet-hosts-")) / "hosts"
        self.path.write_text("127.0.0.1 localhost\n")

    def set_addresses(self, addresses: list[str]) -> None:
        """Rewrite in place (the bind mount follows the inode, not the name)."""
        text = "127.0.0.1 localhost\n" + "".join(f"{a} {self.name}\n" for a in addresses)
        with open(self.path, "r+") as f:
            f.truncate(0)
            f.write(text)

    def wrap(self, cmd: list[str]) -> list[str]:
        """`cmd` run with this file as its /etc/hosts."""
        return ["unshare", "-m", "sh", "-c", f'mount --bind "{self.path}" /etc/hosts && '
                'exec "$@"', "sh", *cmd]

    @staticmethod
    def available() -> bool:
        return shutil.which("unshare") is not None and subprocess.run(
            ["unshare", "-m", "true"], capture_output=True).returncode == 0

    def remove(self) -> None:
        shutil.rmtree(self.path.parent, ignore_errors=True)
