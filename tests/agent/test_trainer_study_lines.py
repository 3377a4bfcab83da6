"""A study's trainer lines, from the trainer socket to line protocol: the `device` tag, the `point`
field, `point_refused` events and the study keys of phase changes; and bad values refused clearly."""

from __future__ import annotations

import json
import time

import pytest

from gpuprobe.agent.trainer_input import BadMessage, parse_line
from gpuprobe.collector.encode import StreamEncoder
from gpuprobe.trainer.agent_socket import probe_event_line, progress_line
from gpuprobe.v1 import telemetry_pb2
from gpuprobe.wire.validate import Identity, Limits

NOW_NS = time.time_ns()
IDENTITY = Identity(agent_id="a1", host="node-1", cluster="c1", virt="vgpu")


def _line(message: dict[str, object]) -> bytes:
    return json.dumps(message).encode()


def _encode(*messages: telemetry_pb2.TrainerSample | telemetry_pb2.ProbeEvent) -> list[str]:
    batch = telemetry_pb2.SampleBatch(
        agent_id="a1",
        seq=1,
        created_unix_ns=NOW_NS,
        gpus=[telemetry_pb2.GpuRef(index=0, uuid="GPU-1", name="NVIDIA H100 80GB HBM3")],
        trainer_samples=[m for m in messages if isinstance(m, telemetry_pb2.TrainerSample)],
        probe_events=[m for m in messages if isinstance(m, telemetry_pb2.ProbeEvent)],
    )
    encoded = StreamEncoder(IDENTITY, Limits()).encode(batch, NOW_NS)
    return [line for line in encoded.lines.decode().splitlines() if not line.startswith("agent,")]


def test_simulated_progress_is_tagged_sim_and_carries_its_point() -> None:
    line = progress_line(
        workload="resnet50", step=7, batch_size=256, phase="steady", time_unix_ns=NOW_NS,
        samples_per_s=2656.9, gpu=0, probe="s-1", device="sim", point=3,
    )  # fmt: skip
    sample = parse_line(_line(line), NOW_NS)
    assert isinstance(sample, telemetry_pb2.TrainerSample)
    assert sample.device == telemetry_pb2.TRAINER_DEVICE_SIM and sample.point == 3
    (stored,) = _encode(sample)
    tags = stored.split(" ")[0].split(",")
    assert "device=sim" in tags and "probe=s-1" in tags and "gpu=0" in tags
    assert "point=3i" in stored.split(" ")[1].split(",")


def test_an_older_trainer_without_a_device_writes_no_device_tag() -> None:
    line = progress_line(workload="resnet50", step=1, batch_size=8, phase="steady", time_unix_ns=NOW_NS, gpu=0)
    sample = parse_line(_line(line), NOW_NS)
    (stored,) = _encode(sample)
    assert "device=" not in stored and "point=" not in stored


def test_a_refused_point_and_a_study_phase_change_keep_their_keys() -> None:
    refused = probe_event_line(
        probe="s-1", workload="resnet50", kind="point_refused", phase="idle", status="running", time_unix_ns=NOW_NS,
        message="power limit 150W for GPU 0 is outside the GPU's range 200 W to 700 W", gpu=0,
        study={"point": 6, "batch_size": 8, "power_limit": "150W"},
    )  # fmt: skip
    steady = probe_event_line(
        probe="s-1", workload="resnet50", kind="phase_change", phase="steady", status="running",
        time_unix_ns=NOW_NS + 1, gpu=0,
        study={"point": 2, "batch_size": 32, "power_limit": "70%", "power_limit_w": 490.0, "temp_slowdown_c": 89.0},
    )  # fmt: skip
    events = [parse_line(_line(m), NOW_NS) for m in (refused, steady)]
    assert events[0].kind == telemetry_pb2.PROBE_EVENT_KIND_POINT_REFUSED
    stored_refused, stored_steady = _encode(*events)
    assert 'kind="point_refused"' in stored_refused and 'gpu="0"' in stored_refused
    assert "point=6i" in stored_refused and "batch_size=8i" in stored_refused and 'power_limit="150W"' in stored_refused
    assert 'message="power limit 150W' in stored_refused
    wanted = ('phase="steady"', "point=2i", "batch_size=32i", 'power_limit="70%"', "power_limit_w=490")
    wanted += ("temp_slowdown_c=89",)
    for text in wanted:
        assert text in stored_steady, (text, stored_steady)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"type": "progress", "device": "gpu"}, "'device' must be one of cuda, cpu, sim"),
        ({"type": "progress", "point": -1}, "'point' must be between 0"),
        ({"type": "probe_event", "kind": "point_refused", "power_limit": "60%\n"}, "'power_limit' contains control"),
        ({"type": "probe_event", "kind": "point_refused", "power_limit": "W" * 65}, "'power_limit' is longer than 64"),
        ({"type": "probe_event", "kind": "phase_change", "power_limit_w": "high"}, "'power_limit_w' must be a number"),
        ({"type": "probe_event", "kind": "phase_change", "batch_size": 1.5}, "'batch_size' must be an integer"),
    ],
)
def test_bad_study_keys_are_refused_with_the_reason(change: dict[str, object], reason: str) -> None:
    base: dict[str, object] = (
        {"workload": "resnet50", "step": 1, "phase": "steady"}
        if change["type"] == "progress"
        else {"probe": "s-1", "workload": "resnet50", "phase": "steady", "status": "running"}
    )
    with pytest.raises(BadMessage, match=reason.replace("(", r"\(")):
        parse_line(_line({**base, **change}), NOW_NS)
