"""Headless Chromium (Debian's `chromium`), to check that pages such as the model report render."""

from __future__ import annotations

import re
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


# Appended to a copy of the page: once it is laid out, the rightmost edge of its tables and the width of
# the viewport (both CSS px) become attributes of <body>, which --dump-dom prints.
_TABLE_PROBE = (
    "<script>window.addEventListener('load',()=>{const edges=[...document.querySelectorAll('table')]"
    ".map(t=>Math.ceil(t.getBoundingClientRect().right));"
    "document.body.setAttribute('data-table-right',String(Math.max(0,...edges)));"
    "document.body.setAttribute('data-viewport',String(document.documentElement.clientWidth));});</script>"
)


def widest_table(page: Path, width: int = 1400) -> tuple[int, int]:
    """(the rightmost edge of any table of ``page``, the viewport's width), in CSS px, with the window
    ``width`` px wide: a table wider than the page has its edge beyond the viewport."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise BinaryNotFoundError("chromium not found: install it with `apt-get install chromium` (`make test` does)")
    with tempfile.TemporaryDirectory(prefix="gpuprobe-chromium-") as folder:
        probed = Path(folder) / "page.html"
        probed.write_text(page.read_text(encoding="utf-8").replace("</body>", _TABLE_PROBE + "</body>"), "utf-8")
        profile = Path(folder) / "profile"
        done = subprocess.run(
            [
                chromium,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                f"--window-size={width},2000",
                "--virtual-time-budget=5000",
                "--dump-dom",
                probed.as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    right = re.search(r'data-table-right="(\d+)"', done.stdout)
    viewport = re.search(r'data-viewport="(\d+)"', done.stdout)
    if right is None or viewport is None:
        raise RuntimeError(f"chromium did not lay out {page}: {done.stderr[-500:]}")
    return int(right.group(1)), int(viewport.group(1))
