"""Headless Chromium (Debian's `chromium`), to check that pages such as the model report render."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from gpuprobe.devservices.errors import BinaryNotFoundError

# Without the networking flags Chromium tries to reach Google's hosts at every start, which this
# machine's closed network refuses many times over.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def screenshot(page: Path, png: Path, width: int = 1280, height: int = 2000) -> subprocess.CompletedProcess[str]:
    """Render ``page`` (a local HTML file) into ``png``; the caller checks returncode and the file."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise BinaryNotFoundError("chromium not found: install it with `apt-get install chromium` (`make test` does)")
    with tempfile.TemporaryDirectory(prefix="gpuprobe-chromium-") as profile:
        return subprocess.run(
            [
                chromium,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                f"--screenshot={png}",
                f"--window-size={width},{height}",
                page.resolve().as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
