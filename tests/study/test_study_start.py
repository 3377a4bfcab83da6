"""`gpuprobe study start` before anything is sent: the matrix, its order, and usage errors."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import pytest

from gpuprobe.config import ConfigError
from gpuprobe.control import signing
from gpuprobe.study import start as study_start
from gpuprobe.v1 import control_pb2


def values(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "workloads": ("resnet50",),
        "batch_sizes": None,
        "power_limits": None,
        "duration": 30.0,
        "warmup": None,
        "idle_baseline": None,
        "cooldown": None,
        "nodes": "all",
        "size": "full",
        "start_in": 30.0,
        "study_id": "s-test-1",
    }
    return {**base, **overrides}


def built(**overrides: Any) -> tuple[study_start.Matrix, control_pb2.ProbeStart]:
    command = signing.new_command(issuer="tests", lifetime_s=300, now_ns=time.time_ns())
    found, _ = study_start.build(values(**overrides), command, time.time_ns())
    return found, command.probe_start


def test_the_matrix_runs_each_limit_over_every_batch_size_per_workload() -> None:
    found, start = built(
        workloads=("resnet50", "bert-base"), batch_sizes=(32, 64), power_limits=("60%", "250W", "default")
    )
    assert len(start.points) == 2 * 3 * 2
    first = [(p.workload, p.power_limit.WhichOneof("limit"), p.batch_size) for p in start.points[:6]]
    assert first == [
        ("resnet50", "percent_of_max", 32),
        ("resnet50", "percent_of_max", 64),
        ("resnet50", "watts", 32),
        ("resnet50", "watts", 64),
        ("resnet50", None, 32),
        ("resnet50", None, 64),
    ]
    assert start.points[0].power_limit.percent_of_max == 60 and start.points[2].power_limit.watts == 250
    assert {p.workload for p in start.points[6:]} == {"bert-base"}
    assert start.probe_id == "s-test-1" and start.duration_s == 30.0 and start.start_at_unix_ns > time.time_ns()
    assert "12 points" in study_start.describe(found, values())


def test_without_batch_sizes_each_workload_runs_its_own_default() -> None:
    _, start = built(workloads=("resnet50", "matmul-burn"))
    assert [(p.workload, p.batch_size) for p in start.points] == [("resnet50", 64), ("matmul-burn", 8192)]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"workloads": ()}, "--workloads is required"),
        ({"workloads": ("resnet50", "idle")}, "untrainable workload(s) idle"),
        ({"duration": None}, "--duration is required"),
        ({"batch_sizes": tuple(range(1, 60)), "power_limits": ("50%", "60%", "70%", "80%", "90%")}, "at most 256"),
    ],
)
def test_usage_errors_say_what_is_wrong(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        built(**overrides)


@pytest.mark.parametrize("bad", ["0%", "150%", "-5W", "fast", "60%,60%"])
def test_a_bad_power_limit_is_a_usage_error_before_anything_is_sent(bad: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpuprobe.app", "study", "start", "--workloads", "resnet50", "--duration", "10",
         "--power-limits", bad, "--broker", "mqtt://127.0.0.1:9", "--key", "/nonexistent"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "power" in done.stderr.lower() or "repeats" in done.stderr
