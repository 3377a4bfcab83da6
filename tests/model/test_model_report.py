"""The report opens in a real browser, works offline, and the command prints the summary and its path."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from simprobe import ProbeRun

from gpuprobe.devservices.browser import screenshot, widest_table
from gpuprobe.model import ReportPaths

pytestmark = pytest.mark.slow


def test_report_renders_in_headless_chromium(report: ReportPaths, tmp_path: Path) -> None:
    import matplotlib.image

    png = tmp_path / "report.png"
    done = screenshot(report.html, png)
    assert done.returncode == 0 and png.exists(), done.stderr[-2000:]
    image = matplotlib.image.imread(png)
    assert image.shape[:2] == (2000, 1280)
    pixels = image[..., :3].reshape(-1, 3)
    # a page with text, tables and plots, not a blank or error page: many colours, much non-white
    colours = len(np.unique((pixels * 255).astype(np.uint8), axis=0))
    non_white = float(np.mean(pixels.min(axis=1) < 0.95))
    assert colours > 200, colours
    assert non_white > 0.05, non_white
    # at 1400 px no table is wider than the page (the thermal table reached past it)
    right_px, viewport_px = widest_table(report.html, 1400)
    assert 0 < right_px <= viewport_px, (right_px, viewport_px)


def test_report_is_self_contained_and_shows_every_plot(report: ReportPaths) -> None:
    text = report.html.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", text), "the report must not load anything"
    images = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)
    alts = {alt for alt, _ in images}
    assert {
        "temperature of node-a",
        "temperature of node-b",
        "power and energy of node-a",
        "acoustic levels",
        "efficiency",
    } <= alts
    assert all(len(data) > 10_000 for _, data in images)
    for number in (f"{g.thermal.rc.r_th_c_per_w:.4g}" for g in report.results.gpus if g.thermal.rc):
        assert number in text


def test_cli_prints_the_summary_table_and_the_report_path(probe_run: ProbeRun, tmp_path: Path) -> None:
    env = dict(os.environ, GPUPROBE_INFLUX_URL=probe_run.server.url)  # options also come from the environment
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuprobe.app",
            "model",
            "--probe",
            probe_run.probe_id,
            "--influx-db",
            probe_run.db,
            "--out",
            str(tmp_path),
            "--no-write-model",
            "--price-per-gpu-hour",
            "3",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert re.search(r"^  gpu\s+model\s+R_th", out, re.M)
    assert re.findall(r"^node-[ab]$", out, re.M) == ["node-a", "node-b"]  # each host heads its rows
    assert len(re.findall(r"^  +\d (L4|H100|A100|GeForce)\b", out, re.M)) == 8  # without the "NVIDIA "
    assert max(map(len, out.splitlines())) <= 120, out  # it was 165
    assert "microphone: proxy +" in out and "stands out: node-a gpu 3 is hotter" in out
    html = Path(re.search(r"^report: (.+)$", out, re.M).group(1))  # type: ignore[union-attr]
    assert html.exists() and html.parent == tmp_path
    assert (tmp_path / f"{probe_run.probe_id}.json").exists()
    assert "`model` points written" not in out


def test_the_summary_fits_120_columns_and_leaves_columns_to_the_report_only_when_it_must(
    report: ReportPaths,
) -> None:
    from gpuprobe.model.output import summary_table

    lines = report.summary.splitlines()
    assert max(map(len, lines)) <= 120, report.summary
    assert "in the HTML report and the JSON only" not in report.summary  # these columns fit
    hotter = next(i for i, line in enumerate(lines) if re.match(r"^ +3 L4 ", line) and i > lines.index("node-a"))
    assert lines[hotter + 1].strip() == "flags: hotter"  # under its row, not at the end of it
    # a longer GPU model and long flags: columns go, in their order, the model shortens, the flags wrap
    gpus = [
        dataclasses.replace(g, model="NVIDIA RTX PRO 6000 Blackwell Server Edition", flags=["much too hot " * 12])
        for g in report.results.gpus
    ]
    text = summary_table(dataclasses.replace(report.results, gpus=gpus), width=100)
    assert max(map(len, text.splitlines())) <= 100, text
    assert re.search(r"^in the HTML report and the JSON only: T_amb(, held)?", text, re.M), text
    assert "RTX PRO 6000" in text and "much too hot" in text


def test_cli_errors_are_clear(probe_run: ProbeRun, tmp_path: Path) -> None:
    base = [
        sys.executable,
        "-m",
        "gpuprobe.app",
        "model",
        "--influx-url",
        probe_run.server.url,
        "--influx-db",
        probe_run.db,
        "--out",
        str(tmp_path),
    ]
    missing = subprocess.run([*base, "--probe", "no-such-probe"], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "no probe 'no-such-probe'" in missing.stderr
    neither = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert neither.returncode == 2 and "--probe" in neither.stderr
    down = subprocess.run(
        [*base[:4], "--influx-url", "http://127.0.0.1:9", "--probe", "p"], capture_output=True, text=True, timeout=60
    )
    assert down.returncode == 1 and "cannot reach InfluxDB" in down.stderr
