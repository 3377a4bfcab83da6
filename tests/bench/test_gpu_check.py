"""The prepared real-GPU check (bench/gpu_check/check.py) runs through on a simulated H200.

It runs on a lent GPU machine rarely and with minutes of device time: a script that broke since it was
last run would waste them. So it is run here, end to end at a twentieth of its length, against the
simulator: NVML's answers are gathered, the trainer's two runs complete, and the agent's samples of the
whole run are counted at the receiver and measured. NVML's answers alone (``--nvml-only``) are checked on a
simulated MIG-enabled H100 too, whose user is an unprivileged one: what nvml.h documents comes back.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from gpuprobe.sim import state
from gpuprobe.v1 import telemetry_pb2

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "bench" / "gpu_check" / "check.py"
NOT_SUPPORTED = "error 3: Not Supported"
NO_PERMISSION = "error 4: Insufficient Permissions"
VERSION_MISMATCH = 25  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH


@pytest.mark.slow
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
    assert gpu["brand"] == 14 and gpu["architecture"] == 9  # NVML_BRAND_NVIDIA, Hopper
    assert len(gpu["nvlink_errors"]["per_link"]) == 18
    assert nvml["mig_unprivileged"]["gpus"] == [{"index": 0, "mig_mode": [0, 0]}], "MIG off: nothing more"

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


def test_nvml_answers_alone_on_a_mig_gpu_without_privileges(tmp_path: Path) -> None:
    """``--nvml-only`` on a simulated MIG-enabled H100 whose user is not privileged there: every extra answer
    is recorded (the NVLink counters and total fields per link, brand, wrong version words, the MIG reads),
    none of them stops the script."""
    out = tmp_path / "out"
    command = [
        sys.executable,
        str(CHECK),
        "--sim",
        "H100-SXM5-80GB",
        "--sim-mig",
        "2",
        "--nvml-only",
        "--out",
        str(out),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["nvml.json"]
    nvml = json.loads((out / "nvml.json").read_text())
    assert nvml["driver"] == state.DRIVER_VERSION and nvml["nvml"] == f"13.{state.DRIVER_VERSION}"
    assert nvml["simulated"] is True
    (gpu,) = nvml["gpus"]
    assert gpu["brand"] == 14
    errors = gpu["nvlink_errors"]
    assert [p["link"] for p in errors["per_link"]] == list(range(18))
    link = errors["per_link"][5]
    assert link["counters"] == {"replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0, "ecc_data": 0}
    assert all(f == {"rc": 0, "type": 3, "value": 0} for f in link["total_fields"].values()), "per link"
    assert errors["counter_sums"]["crc_flit"] == 0 == errors["total_field_sums"]["crc_flit"]
    assert all(f["rc"] == 2 for f in errors["scope_uint_max"].values()), "no whole-GPU scope for these fields"
    words = gpu["version_words"]
    # the right word: NO_PERMISSION on this MIG GPU (4); a wrong one: the version mismatch (the simulator checks
    # the word first; which a driver checks first is what a real MIG GPU would show)
    memory = words["nvmlDeviceGetMemoryInfo_v2"]
    assert memory == {"0x2000028": 4, "0x1000028": VERSION_MISMATCH, "0x2000020": VERSION_MISMATCH}
    assert words["nvmlDeviceGetTemperatureV"] == {"0x100000c": 0, "0x200000c": VERSION_MISMATCH}
    assert words["nvmlGpmMetricsGet"] == {"1": 0, "2": VERSION_MISMATCH}
    (mig,) = nvml["mig_unprivileged"]["gpus"]
    assert mig["mig_mode"] == [1, 1]
    parent = mig["parent"]
    for read in ("memory_v1", "memory_v2", "compute_processes", "graphics_processes"):
        assert parent[read] == NO_PERMISSION, read
    for read in ("utilization", "encoder", "decoder", "gpu_util_samples", "remapped_rows", "process_utilization"):
        assert parent[read] == NOT_SUPPORTED, read
    assert parent["power_mw"] > 0
    assert [i["gpu_instance_id"] for i in mig["instances"]] == [7, 8]
    for instance in mig["instances"]:
        assert instance["memory"] > 0 and instance["compute_processes"] == 0
        assert instance["gpm_mig_sample"] == 0 and instance["gpm_sample_on_handle"] == 0
