"""Part: devservices. A small real disk for fault tests: a tmpfs that fills up, and gets room again when resized.

Mounting needs root (CI runs as root).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


class SmallDisk:
    """A real tmpfs of a given size: a disk that fills up, and gets room again when resized."""

    def __init__(self, path: Path, size_bytes: int) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(path)], check=True)
        self.mounted = True

    def resize(self, size_bytes: int) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size_bytes}", str(self.path)], check=True)

    def free_bytes(self) -> int:
        stat = os.statvfs(self.path)
        return stat.f_bavail * stat.f_frsize

    def unmount(self) -> None:
        if self.mounted:
            # lazy: a process killed by the test may still hold files there for a moment
            subprocess.run(["umount", "-l", str(self.path)], check=False)
            self.mounted = False
