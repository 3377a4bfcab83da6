"""Part: devservices. Headless Chromium (Debian's `chromium`), to check that pages such as the model report render."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
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
# the viewport (both CSS px) become attributes of <body>, which --dump-dom prints; so do the table cells
# whose text takes more than one line (a JSON object, text to number of lines: a line is a distinct top
# of the text's boxes).
_TABLE_PROBE = (
    "<script>window.addEventListener('load',()=>{const edges=[...document.querySelectorAll('table')]"
    ".map(t=>Math.ceil(t.getBoundingClientRect().right));"
    "document.body.setAttribute('data-table-right',String(Math.max(0,...edges)));"
    "document.body.setAttribute('data-viewport',String(document.documentElement.clientWidth));"
    "const wrapped={};for(const td of document.querySelectorAll('td')){const r=document.createRange();"
    "r.selectNodeContents(td);const tops=new Set([...r.getClientRects()].map(b=>Math.round(b.top)));"
    "if(tops.size>1)wrapped[td.textContent]=tops.size;}"
    "document.body.setAttribute('data-wrapped',JSON.stringify(wrapped));});</script>"
)


@dataclass(frozen=True)
class TableLayout:
    """How a page's tables lay out in a window of a given width (CSS px)."""

    right_px: int  # the rightmost edge of any table: beyond viewport_px, a table is wider than the page
    viewport_px: int
    wrapped_cells: dict[str, int]  # the text of each cell that takes more than one line: its lines


def table_layout(page: Path, width: int = 1400) -> TableLayout:
    """The layout of the tables of ``page`` in headless Chromium, the window ``width`` px wide."""
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
    wrapped = re.search(r'data-wrapped="([^"]*)"', done.stdout)
    if right is None or viewport is None or wrapped is None:
        raise RuntimeError(f"chromium did not lay out {page}: {done.stderr[-500:]}")
    cells = json.loads(html.unescape(wrapped.group(1)))
    return TableLayout(int(right.group(1)), int(viewport.group(1)), {str(k): int(v) for k, v in cells.items()})


def widest_table(page: Path, width: int = 1400) -> tuple[int, int]:
    """(the rightmost edge of any table of ``page``, the viewport's width), in CSS px, with the window
    ``width`` px wide: a table wider than the page has its edge beyond the viewport."""
    layout = table_layout(page, width)
    return layout.right_px, layout.viewport_px
