"""Progress goes to the local agent's trainer socket as JSON lines, and training never depends on it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from gpuprobe.trainer.run import TrainSettings, run


def test_progress_and_probe_events_reach_the_agent_socket(agent_socket: Any) -> None:
    config = TrainSettings(
        workload="matmul-burn", size="tiny", device="cpu", threads=1, duration_s=1.0, idle_baseline_s=0.3,
        warmup_s=0.2, cooldown_s=0.3, probe_id="p-42", agent_socket=agent_socket.path, progress_interval_s=0.2,
    )  # fmt: skip
    result = run(config, lambda event: None)
    assert result["status"] == "succeeded"
    agent_socket.wait_closed()
    lines = agent_socket.lines
    events = [line for line in lines if line["type"] == "probe_event"]
    assert [(e["kind"], e["phase"], e["status"]) for e in events] == [
        ("start", "idle", "running"),
        ("phase_change", "warmup", "running"),
        ("phase_change", "steady", "running"),
        ("phase_change", "cooldown", "running"),
        ("end", "done", "succeeded"),
    ]
    assert all(e["probe"] == "p-42" and e["workload"] == "matmul-burn" for e in events)
    progress = [line for line in lines if line["type"] == "progress"]
    assert {p["phase"] for p in progress} >= {"idle", "steady", "cooldown"}
    for p in progress:
        assert p["probe"] == "p-42" and p["workload"] == "matmul-burn" and p["batch_size"] == 64
        assert "gpu" not in p  # a CPU run has no GPU tag
        assert isinstance(p["time_unix_ns"], int) and isinstance(p["step"], int)
    steady = [p for p in progress if p["phase"] == "steady"]
    assert all(p["samples_per_s"] > 0 and p["step_time_s"] > 0 and "loss" in p for p in steady)
    assert all("samples_per_s" not in p and "loss" not in p for p in progress if p["phase"] == "idle")
    steps = [p["step"] for p in progress]
    assert steps == sorted(steps) and steps[-1] == result["steps"]


def test_every_line_is_valid_for_the_agents_parser(agent_socket: Any) -> None:
    trainer_input = pytest.importorskip("gpuprobe.agent.trainer_input")
    config = TrainSettings(
        workload="gpt", size="tiny", device="cpu", threads=1, duration_s=0.5, idle_baseline_s=0.1,
        warmup_s=0.1, cooldown_s=0.1, probe_id="p-7", agent_socket=agent_socket.path, progress_interval_s=0.1,
    )  # fmt: skip
    run(config, lambda event: None)
    agent_socket.wait_closed()
    assert len(agent_socket.raw) > 5
    for raw in agent_socket.raw:
        trainer_input.parse_line(raw, 1)  # raises BadMessage on any line the agent would refuse


def test_without_an_agent_the_run_succeeds_and_warns_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="gpuprobe.trainer.report")
    config = TrainSettings(
        workload="idle", size="tiny", device="cpu", duration_s=0.5, idle_baseline_s=0, warmup_s=0,
        cooldown_s=0, probe_id="p-1", agent_socket=tmp_path / "nobody.sock", progress_interval_s=0.1,
    )  # fmt: skip
    result = run(config, lambda event: None)
    assert result["status"] == "succeeded"
    warnings = [r for r in caplog.records if "no agent on the trainer socket" in r.getMessage()]
    assert len(warnings) == 1
