"""Each workload trains for real on the CPU (tiny size) through its phases, with honest numbers."""

from __future__ import annotations

import itertools
import json
import math
import time
from typing import Any

import pytest

from gpuprobe import workloads
from gpuprobe.trainer.run import TrainSettings, run


def _run(**kwargs: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    config = TrainSettings(size="tiny", device="cpu", threads=1, progress_interval_s=0.25, **kwargs)
    result = run(config, events.append)
    return result, events


@pytest.mark.parametrize("workload", ["resnet50", "bert-base", "gpt", "matmul-burn"])
def test_each_workload_trains_its_tiny_model_on_the_cpu(workload: str) -> None:
    result, events = _run(workload=workload, duration_s=1.5, idle_baseline_s=0, warmup_s=0.3, cooldown_s=0)
    assert result["status"] == "succeeded", result["message"]
    (point,) = result["points"]
    assert point["batch_size"] == workloads.WORKLOADS[workload].default_batch["tiny"]
    assert point["steps"] >= 3
    assert point["samples"] == point["steps"] * point["batch_size"]
    assert point["samples_per_s"] == pytest.approx(point["samples"] / point["steady_s"])
    assert point["step_time_s"] == pytest.approx(point["steady_s"] / point["steps"])
    # a real optimizer on a real loss: the model fits the (fixed) synthetic batch
    assert math.isfinite(point["last_loss"])
    assert point["last_loss"] < point["first_loss"]
    progress = [e for e in events if e["type"] == "progress" and e["phase"] == "steady"]
    # a window with steps has a rate and a loss (a step longer than the window leaves one without)
    assert any(e["samples_per_s"] for e in progress)
    assert all(e["samples_per_s"] > 0 and e["loss"] is not None for e in progress if e["samples_per_s"] is not None)


def test_idle_workload_runs_the_phases_without_computing() -> None:
    result, _ = _run(workload="idle", duration_s=0.5, idle_baseline_s=0.2, warmup_s=0.1, cooldown_s=0.2)
    assert result["status"] == "succeeded"
    assert result["steps"] == 0 and result["params"] == 0
    assert [p["phase"] for p in result["phases"]] == ["idle", "warmup", "steady", "cooldown"]
    assert result["points"][0]["samples_per_s"] is None


def test_phases_follow_each_other_with_ns_timestamps_and_planned_lengths() -> None:
    start_at = time.time_ns() + 700_000_000
    result, events = _run(
        workload="matmul-burn",
        duration_s=1.0,
        idle_baseline_s=0.5,
        warmup_s=0.4,
        cooldown_s=0.5,
        start_at_unix_ns=start_at,
    )
    phases = result["phases"]
    assert [p["phase"] for p in phases] == ["idle", "warmup", "steady", "cooldown"]
    for before, after in itertools.pairwise(phases):
        assert before["end_unix_ns"] == after["start_unix_ns"]
    lengths = {p["phase"]: (p["end_unix_ns"] - p["start_unix_ns"]) / 1e9 for p in phases}
    # the idle baseline starts at the requested time, and the warm-up ends at a planned absolute time
    assert 0 <= (phases[0]["start_unix_ns"] - start_at) / 1e9 < 0.1
    assert lengths["idle"] == pytest.approx(0.5, abs=0.1)
    assert (phases[2]["start_unix_ns"] - start_at) / 1e9 == pytest.approx(0.9, abs=0.15)
    assert 1.0 <= lengths["steady"] < 1.3
    assert lengths["cooldown"] == pytest.approx(0.5, abs=0.1)
    # warm-up steps are excluded: only the steady phase counts
    (point,) = result["points"]
    assert 0 < point["steps"] < result["steps"]
    assert point["steady_start_unix_ns"] == phases[2]["start_unix_ns"]
    assert point["steady_end_unix_ns"] == phases[2]["end_unix_ns"]
    assert [e["phase"] for e in events if e["type"] == "phase"] == ["idle", "warmup", "steady", "cooldown", "done"]


def test_a_late_start_shortens_the_idle_baseline_and_keeps_the_steady_phase_on_schedule() -> None:
    start_at = time.time_ns() - 1_000_000_000  # the trainer was ready one second too late
    result, _ = _run(
        workload="matmul-burn",
        duration_s=0.5,
        idle_baseline_s=2.0,
        warmup_s=0.5,
        cooldown_s=0,
        start_at_unix_ns=start_at,
    )
    idle, _warmup, steady = result["phases"][:3]
    assert (idle["end_unix_ns"] - idle["start_unix_ns"]) / 1e9 == pytest.approx(1.0, abs=0.15)
    assert (steady["start_unix_ns"] - start_at) / 1e9 == pytest.approx(2.5, abs=0.15)


def test_batch_size_sweep_gives_one_steady_point_per_size() -> None:
    result, events = _run(
        workload="matmul-burn", batch_sizes=(16, 32), duration_s=0.4, idle_baseline_s=0, warmup_s=0.1, cooldown_s=0
    )
    assert result["status"] == "succeeded"
    assert [p["batch_size"] for p in result["points"]] == [16, 32]
    assert all(p["steps"] > 0 and p["samples"] == p["steps"] * p["batch_size"] for p in result["points"])
    assert [p["phase"] for p in result["phases"]] == ["idle", "warmup", "steady", "warmup", "steady", "cooldown"]
    steady_batches = [e["batch_size"] for e in events if e["type"] == "phase" and e["phase"] == "steady"]
    assert steady_batches == [16, 32]


def test_train_command_prints_a_json_result(train: Any) -> None:
    done = train.run(
        "--workload", "resnet50", "--size", "tiny", "--device", "cpu", "--duration", "1.5",
        "--idle-baseline", "0", "--warmup", "0.5", "--cooldown", "0", "--format", "json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "succeeded" and result["workload"] == "resnet50" and result["size"] == "tiny"
    assert result["device"] == "cpu" and result["gpu"] is None and not result["simulated"]
    assert result["points"][0]["samples_per_s"] > 0
    assert "phase steady" in done.stderr  # progress goes to stderr in json mode


def test_train_command_text_summary_and_sweep(train: Any) -> None:
    done = train.run(
        "--workload", "matmul-burn", "--size", "tiny", "--device", "cpu", "--sweep", "--duration", "0.3",
        "--idle-baseline", "0", "--warmup", "0.1", "--cooldown", "0",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "matmul-burn (tiny" in done.stdout and "succeeded" in done.stdout
    for batch in workloads.WORKLOADS["matmul-burn"].sweep["tiny"]:
        assert any(line.split()[:1] == [str(batch)] for line in done.stdout.splitlines()), done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workload", "nope"], "must be one of"),
        (["--workload", "gpt", "--duration", "0"], "positive duration"),
        (["--workload", "gpt", "--batch-size", "8,x"], "batch size"),
        (["--workload", "gpt", "--sweep", "--batch-size", "8"], "either --sweep or --batch-size"),
        (["--workload", "idle", "--device", "cuda:3"], "cuda:3 is not available"),
        (["--workload", "idle", "--device", "tpu"], "--device must be"),
        (["--workload", "idle", "--start-at", "tomorrow"], "not a start time"),
        ([], "--workload is required"),
    ],
)
def test_bad_arguments_are_refused_with_a_clear_message(train: Any, args: list[str], message: str) -> None:
    done = train.run(*args, "--size", "tiny", timeout=60)
    assert done.returncode == 2
    assert message in done.stderr
