"""Progress goes to the local agent's trainer socket as JSON lines, and training never depends on it."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest

from gpuprobe.collector.encode import StreamEncoder
from gpuprobe.devservices import InfluxDBDatabase
from gpuprobe.influx.client import InfluxClient
from gpuprobe.influx.settings import InfluxSettings
from gpuprobe.model.data import find_probe
from gpuprobe.trainer.run import TrainSettings, parse_plan, run
from gpuprobe.v1 import telemetry_pb2
from gpuprobe.wire.validate import Identity, Limits


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
    # the event that ends the steady phase carries the trainer's count of it (J/sample divides by it),
    # the result's figure; no other event carries one
    (point,) = result["points"]
    assert point["samples"] > 0
    assert [e.get("steady_samples") for e in events] == [None, None, None, point["samples"], None]
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
    caplog.set_level(logging.WARNING, logger="gpuprobe.trainer.agent_socket")
    config = TrainSettings(
        workload="idle", size="tiny", device="cpu", duration_s=0.5, idle_baseline_s=0, warmup_s=0,
        cooldown_s=0, probe_id="p-1", agent_socket=tmp_path / "nobody.sock", progress_interval_s=0.1,
    )  # fmt: skip
    result = run(config, lambda event: None)
    assert result["status"] == "succeeded"
    warnings = [r for r in caplog.records if "no agent on the trainer socket" in r.getMessage()]
    assert len(warnings) == 1


def run_study(agent_socket: Any, probe_id: str, plan: str) -> dict[str, Any]:
    """A short study run of the trainer on the CPU, reporting to the fake agent socket; its result, once
    the socket has every line."""
    config = TrainSettings(
        workload="matmul-burn", size="tiny", device="cpu", threads=1, duration_s=0.4, idle_baseline_s=0.1,
        warmup_s=0.1, cooldown_s=0.1, probe_id=probe_id, agent_socket=agent_socket.path, progress_interval_s=0.2,
        plan=parse_plan(plan),
    )  # fmt: skip
    result = run(config, lambda event: None)
    assert result["status"] == "succeeded"
    agent_socket.wait_closed()
    return result


def test_in_a_study_each_steady_phase_ends_with_its_count(agent_socket: Any) -> None:
    """Each point's steady phase ends at the next point's warm-up (the last at the cool-down), and that
    event carries the point's count: what ``study report`` and ``gpuprobe model`` divide its energy by."""
    result = run_study(
        agent_socket,
        "p-9",
        '[{"index": 0, "batch_size": 8}, {"index": 1, "batch_size": 16}, {"index": 2, "batch_size": 8}]',
    )
    events = [line for line in agent_socket.lines if line["type"] == "probe_event"]
    ends = [e for e in events if e.get("steady_samples") is not None]
    assert [(e["phase"], e.get("point")) for e in ends] == [("warmup", 1), ("warmup", 2), ("cooldown", None)]
    assert [e["steady_samples"] for e in ends] == [p["samples"] for p in result["points"]]
    assert all(p["samples"] > 0 for p in result["points"])


def test_a_refused_point_is_no_steady_phase_for_the_model(agent_socket: Any, influxdb: InfluxDBDatabase) -> None:
    """A study whose middle point this GPU refuses: the trainer's events, read by the agent's parser and
    written by the collector's encoder, give ``gpuprobe model`` the two steady phases the trainer ran.
    (The refusal is stamped with the phase the trainer was still in, ``steady``, after the idle that
    follows; read as a phase change it made the refused slot a third steady phase. The counts of a GPU's
    phases are checked through the whole pipeline, tests/e2e/test_study_e2e.py.)"""
    trainer_input = pytest.importorskip("gpuprobe.agent.trainer_input")
    result = run_study(
        agent_socket,
        "s-refused",
        '[{"index": 0, "batch_size": 8}, {"index": 1, "batch_size": 16, "refused": "power limit 150 W out of range"},'
        ' {"index": 2, "batch_size": 8}]',
    )
    now_ns = time.time_ns()
    events = [trainer_input.parse_line(raw, now_ns) for raw in agent_socket.raw]
    batch = telemetry_pb2.SampleBatch(probe_events=[m for m in events if isinstance(m, telemetry_pb2.ProbeEvent)])
    encoded = StreamEncoder(Identity(agent_id="a1", host="node-1", cluster="c1"), Limits()).encode(batch, now_ns)
    assert not encoded.problems.by_reason, encoded.problems
    influxdb.write_lines(encoded.lines)
    with InfluxClient(InfluxSettings(url=influxdb.server.url, database=influxdb.name)) as client:
        window = find_probe(client, "s-refused")
    ran = [p for p in result["points"] if not p.get("error")]
    assert [p["index"] for p in ran] == [0, 2]
    # gpu is absent on a CPU run: the host's phases are the trainer's
    steady = window.intervals("node-1", "steady")
    assert steady == [(p["steady_start_unix_ns"], p["steady_end_unix_ns"]) for p in ran], (steady, ran)
