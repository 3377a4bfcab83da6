"""`gpuprobe demo` (what `make demo` runs): the whole system ends in a report that opens in a browser,
a summary table on the terminal, and nothing left running or lying around."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuprobe.app.demo import NODE_LABELS
from gpuprobe.devservices.browser import screenshot

# the demo's phases are real time (about 5 minutes alone, more beside another worker)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture
def demo_tmp() -> Iterator[Path]:
    """The demo's TMPDIR, this test's own: its working directory and every process that names it are
    this demo's, not the other worker's demo (both demo tests may run at once). Short, for the unix
    sockets under it (pytest's tmp_path is too long for them)."""
    path = Path(tempfile.mkdtemp(prefix="demo-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def demo_processes(tmp: Path) -> set[int]:
    """Processes whose command line names a demo working directory under ``tmp`` (InfluxDB, agents...)."""
    marker = f"{tmp}/gpuprobe-demo-".encode()
    found = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker in (proc / "cmdline").read_bytes():
                    found.add(int(proc.name))
            except OSError:
                continue
    return found


def test_demo_ends_in_a_report_that_opens_in_a_browser(tmp_path: Path, demo_tmp: Path) -> None:
    out = tmp_path / "report"
    phases = ["--idle", "8", "--steady", "30", "--cooldown", "20", "--start-in", "30", "--study-steady", "10"]
    # its own process group, so that a demo that fails or hangs leaves no InfluxDB, agents or simulator
    # behind to load the rest of the suite
    demo = subprocess.Popen(
        [sys.executable, "-m", "gpuprobe.app", "demo", "--out", str(out), *phases],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=dict(os.environ, TMPDIR=str(demo_tmp)),
    )
    try:
        stdout, stderr = demo.communicate(timeout=840)
    except BaseException:  # a timeout, pytest-timeout's own: the demo's processes go with it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(demo.pid, signal.SIGKILL)
        demo.wait()
        raise
    result = subprocess.CompletedProcess(demo.args, demo.returncode, stdout, stderr)
    assert result.returncode == 0, result.stderr[-3000:]
    # progress while it runs, then the results and the summary table
    assert "both agents are online" in result.stderr
    assert "node-a" in result.stdout and "node-b" in result.stdout
    summary = result.stdout[result.stdout.index("R_th") : result.stdout.index("\nreport: ")]
    # each host heads its GPUs' rows (the table fits 120 columns)
    assert re.findall(r"^node-[ab]$", summary, re.M) == ["node-a", "node-b"], summary
    gpu_rows = re.findall(r"^ +\d (?:H100|A100|L4|GeForce)\b.*$", summary, re.M)
    assert len(gpu_rows) == 8, summary
    report_line = next(line for line in result.stdout.splitlines() if line.startswith("report: "))
    html = Path(report_line.removeprefix("report: "))
    assert html.parent == out and html.exists()

    # every GPU got a thermal fit close to its profile's ground truth (docs/simulator.md)
    numbers = json.loads(html.with_suffix(".json").read_text())
    assert len(numbers["gpus"]) == 8
    truth = {"NVIDIA H100 80GB HBM3": 0.07, "NVIDIA A100-SXM4-80GB": 0.11, "NVIDIA L4": 0.70}
    for gpu in numbers["gpus"]:
        if gpu["model"] in truth:
            r_th = gpu["thermal"]["rc"]["r_th_c_per_w"]
            print(f"{gpu['host']} GPU {gpu['gpu']} {gpu['model']}: R_th {r_th / truth[gpu['model']] - 1:+.1%}")
            assert abs(r_th - truth[gpu["model"]]) / truth[gpu["model"]] < 0.1, (gpu["model"], r_th)

    # the small study: full-size ResNet-50 on the simulated H100 and A100 (GPU 0 of each node) shows the
    # published per-GPU figures (Lambda, PyTorch fp16: H100 SXM 2616 img/s, A100 80GB SXM 1582 img/s at
    # 700 W and 400 W, so about 0.27 and 0.25 J per image), labelled simulated
    assert "SIMULATED" in result.stderr and "simulated" in result.stdout.lower()
    study = json.loads((out / "study.json").read_text())
    assert study["simulated"] is True and (out / "study.html").exists()
    published = {"NVIDIA H100 80GB HBM3": (2616.0, 700.0 / 2616), "NVIDIA A100-SXM4-80GB": (1582.0, 400.0 / 1582)}
    for model, (img_per_s, j_per_img) in published.items():
        group = next(
            g
            for g in study["groups"]
            if g["key"]["gpu_model"] == model and g["key"]["batch_size"] == 256 and g["key"]["power_limit"] == "100%"
        )
        assert group["simulated"] and group["throughput_source"] == "simulated"
        assert group["samples_per_s"] == pytest.approx(img_per_s, rel=0.15), (model, group)
        assert group["j_per_sample"] == pytest.approx(j_per_img, rel=0.25), (model, group)
        assert model.split()[1] in result.stdout  # the terminal table names both GPU models

    # the two nodes carry simulated instance types (named so nobody takes them for a cloud's), and
    # the report ranks them, as it would a real fleet's
    labels = {"NVIDIA H100 80GB HBM3": NODE_LABELS["node-a"], "NVIDIA A100-SXM4-80GB": NODE_LABELS["node-b"]}
    for group in study["groups"]:
        node = labels[group["key"]["gpu_model"]]
        assert {k: group["key"][k] for k in ("instance_type", "virt", "region")} == node, group["key"]
    by_type = next(r for r in study["rankings"] if r["by"] == "instance_type")
    ranked = [entry["name"] for entry in by_type["entries"]]
    assert sorted(ranked) == sorted(node["instance_type"] for node in NODE_LABELS.values()), by_type
    assert all(name.startswith("sim-") for name in ranked)
    # (the summary wraps at 120 columns: a continuation is indented 4 spaces deeper than its line)
    unwrapped = re.sub(r"\n {4,}", " ", result.stdout)
    ranking_line = next(line for line in unwrapped.splitlines() if "ranking of instance types" in line)
    assert all(name in ranking_line for name in ranked), ranking_line
    assert "(none)" not in ranking_line and "(no instance type)" not in result.stdout

    png = tmp_path / "report.png"
    shot = screenshot(html, png)
    assert shot.returncode == 0 and png.stat().st_size > 50_000, shot.stderr[-2000:]

    # it cleans up after itself
    assert list(demo_tmp.glob("gpuprobe-demo-*")) == []
    assert demo_processes(demo_tmp) == set()


def test_a_demo_stopped_with_sigterm_leaves_nothing_running_or_lying_around(tmp_path: Path, demo_tmp: Path) -> None:
    """Its services run in sessions of their own, so a SIGTERM to the demo (a CI job cancelled, `kill`)
    must stop them as a Ctrl-C does, not leave InfluxDB, Mosquitto and the agents behind."""
    demo = subprocess.Popen(
        [sys.executable, "-m", "gpuprobe.app", "demo", "--out", str(tmp_path / "report"), "--no-study"],
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=dict(os.environ, TMPDIR=str(demo_tmp)),
    )
    try:
        assert demo.stderr is not None
        lines = []
        for line in demo.stderr:  # the demo says when its services are up
            lines.append(line)
            if "both agents are online" in line:
                break
        assert demo_processes(demo_tmp), "".join(lines)  # its services were running
        demo.send_signal(signal.SIGTERM)
        _, rest = demo.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(demo.pid, signal.SIGKILL)
    assert demo.returncode == 1, rest
    assert "stopped by SIGTERM" in rest
    assert demo_processes(demo_tmp) == set()
    assert list(demo_tmp.glob("gpuprobe-demo-*")) == []
