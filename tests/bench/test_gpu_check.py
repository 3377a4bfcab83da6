"""The prepared real-GPU check (bench/gpu_check/check.py) runs through on a simulated H200.

It runs on a lent GPU machine rarely and with minutes of device time: a script that broke since it was
last run would waste them. So it is run here, end to end at a twentieth of its length, against the
simulator: NVML's answers are gathered, the trainer's two runs complete, and the agent's samples of the
whole run are counted at the receiver and measured.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from gpuprobe.v1 import telemetry_pb2

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "bench" / "gpu_check" / "check.py"

pytestmark = pytest.mark.slow


def test_the_gpu_check_runs_through_on_a_simulated_gpu(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(CHECK), "--sim", "H200-SXM-141GB", "--out", str(out), "--scale", "0.05"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # what the device tool brings back: at most 8 files
    files = sorted(p.name for p in out.iterdir())
    assert files == ["agent.log", "batches.bin", "nvml.json", "summary.json", "trainer-1.json", "trainer-2.json"]
    assert len(files) <= 8

    nvml = json.loads((out / "nvml.json").read_text())
    (gpu,) = nvml["gpus"]
    assert gpu["name"] == "NVIDIA H200"
    # each field id is answered next to the function the agent calls today
    assert set(gpu["ecc"]) == {"3", "4", "5", "6"} and all(len(pair) == 2 for pair in gpu["ecc"].values())
    assert gpu["remapped_rows"]["function"] == [0, 0, 0, 0]
    assert len(gpu["nvlink_state"]) == 18 and all(state == 1 for _, state in gpu["nvlink_state"])
    assert gpu["gpm_supported"] is True
    assert all(isinstance(us, float) and us > 0 for us in gpu["call_cpu_us"].values())

    summary = json.loads((out / "summary.json").read_text())
    assert summary["simulated"] is True  # never to be taken for a measurement on a real GPU
    assert summary["trace"] is None  # the simulator has no nvidia-smi logger
    runs = summary["trainer"]
    assert [r["returncode"] for r in runs] == [0, 0]
    resnet = runs[0]["result"]
    assert resnet is not None and [p["batch_size"] for p in resnet["points"]] == [16, 256]
    assert all(p["samples_per_s"] > 0 and not p["error"] for r in runs for p in r["result"]["points"])

    agent = summary["agent"]
    # 10 Hz, one GPU, every sample of the window delivered (--resolution full)
    assert agent["gpu_samples"] == pytest.approx(agent["window_s"] * 10, rel=0.1)
    assert 0 < agent["core_pct"] < 50
    assert agent["threads_core_pct"]["gpuprobe-sample"] > 0
    assert agent["cpu_us_per_gpu_sample"] > 0 and "idle_baseline_core_pct" in agent

    # the receiver's file decodes: the agent's stream, its GPU named
    data = (out / "batches.bin").read_bytes()
    (n,) = struct.unpack(">I", data[:4])
    first = telemetry_pb2.StreamRequest.FromString(data[4 : 4 + n]).batch
    assert [g.name for g in first.gpus] == ["NVIDIA H200"]
