"""The trainer socket: progress lines become trainer samples and probe events; bad lines hurt nobody."""

from __future__ import annotations

import itertools
import json
import socket
import time
from pathlib import Path

from agent_helpers import AgentFactory, Receiver, machine, unique_batches, wait_for_batches
from support import wait_until

from gpuprobe.v1 import common_pb2, telemetry_pb2


def connect(path: Path) -> socket.socket:
    wait_until(path.exists, 10, f"the trainer socket {path}")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))
    sock.settimeout(5)
    return sock


def send(sock: socket.socket, *messages: dict[str, object] | bytes) -> None:
    for m in messages:
        sock.sendall(m if isinstance(m, bytes) else json.dumps(m).encode() + b"\n")


def test_trainer_progress_and_probe_events_arrive_in_the_stream(
    tmp_path: Path, receiver: Receiver, agent_factory: AgentFactory
) -> None:
    path = tmp_path / "trainer.sock"
    sim = machine(tmp_path / "sim", ["H100-SXM5-80GB"])
    agent = agent_factory(sim, [receiver.address], "--trainer-socket", str(path))
    agent.wait_for_log("streaming to collector")
    sock = connect(path)
    send(
        sock,
        {"type": "probe_event", "probe": "p-1", "workload": "resnet50", "kind": "start", "phase": "idle",
         "status": "running"},
        {"type": "progress", "workload": "resnet50", "probe": "p-1", "gpu": 0, "step": 10, "batch_size": 64,
         "samples_per_s": 812.5, "step_time_s": 0.0788, "loss": 2.31, "phase": "warmup"},
        {"type": "progress", "workload": "resnet50", "step": 20, "batch_size": 64, "phase": "steady",
         "loss": float("nan"), "time_unix_ns": 1_700_000_000_000_000_000, "future_key": "ignored"},
    )  # fmt: skip
    sock.close()
    wait_until(lambda: any(b.trainer_samples for b in receiver.batches()), 10, "trainer samples")
    assert agent.terminate() == 0
    batches = unique_batches(receiver.batches()).values()
    trainer = [s for b in batches for s in b.trainer_samples]
    events = [e for b in batches for e in b.probe_events]
    assert len(trainer) == 2 and len(events) == 1
    first, second = trainer
    assert (first.probe_id, first.workload, first.gpu_index, first.step, first.batch_size) == (
        "p-1",
        "resnet50",
        0,
        10,
        64,
    )
    assert (first.samples_per_s, first.step_time_s, first.loss) == (812.5, 0.0788, 2.31)
    assert first.phase == common_pb2.PROBE_PHASE_WARMUP and abs(first.time_unix_ns - time.time_ns()) < 60e9
    assert not second.HasField("gpu_index") and not second.HasField("loss"), "absent, not a fake value"
    assert second.time_unix_ns == 1_700_000_000_000_000_000 and second.phase == common_pb2.PROBE_PHASE_STEADY
    assert (
        events[0].kind == telemetry_pb2.PROBE_EVENT_KIND_START and events[0].status == common_pb2.PROBE_STATUS_RUNNING
    )
    assert events[0].phase == common_pb2.PROBE_PHASE_IDLE_BASELINE


def test_bad_trainer_input_gets_a_clear_error_and_nothing_else_is_lost(
    tmp_path: Path, receiver: Receiver, agent_factory: AgentFactory
) -> None:
    path = tmp_path / "trainer.sock"
    sim = machine(tmp_path / "sim", ["L4", "L4"])
    agent = agent_factory(sim, [receiver.address], "--trainer-socket", str(path))
    agent.wait_for_log("streaming to collector")
    sock = connect(path)
    good = {"type": "progress", "workload": "bert", "step": 1, "batch_size": 8, "phase": "steady"}
    send(
        sock,
        b"{not json\n",
        b"x" * (200 * 1024) + b"\n",  # oversized
        {"type": "progress", "workload": "bert", "step": -5, "phase": "steady"},
        {"type": "progress", "workload": "bert\n", "step": 1, "phase": "steady"},
        {"type": "telemetry", "step": 1},
        {"type": "progress", "workload": "bert", "step": 1, "phase": "running-fast"},
        [1, 2, 3],  # type: ignore[arg-type]
        good,
    )
    replies = b""
    deadline = time.monotonic() + 10
    while replies.count(b"\n") < 7 and time.monotonic() < deadline:
        replies += sock.recv(65536)
    errors = [json.loads(line)["error"] for line in replies.splitlines()]
    assert len(errors) == 7, errors
    assert errors[0].startswith("not valid JSON")
    assert "longer than 65536 bytes" in errors[1]
    assert "'step' must be between 0" in errors[2]
    assert "'workload' contains control characters" in errors[3]
    assert "'type' must be 'progress' or 'probe_event'" in errors[4]
    assert "'phase' must be one of" in errors[5]
    assert "must be a JSON object" in errors[6]
    # the same connection still works, and so does a new one
    send(sock, {**good, "step": 2})
    other = connect(path)
    send(other, {**good, "step": 3})
    other.close()
    wait_until(lambda: sum(len(b.trainer_samples) for b in receiver.batches()) >= 3, 10, "good lines")
    sock.close()
    closed_ns = time.time_ns()
    # the agent goes on sampling after the trainer hung up
    sampling = "a GPU sample taken after the connection closed"
    wait_for_batches(
        receiver,
        lambda got: any(s.time_unix_ns > closed_ns for b in got.values() for s in b.gpu_samples),
        sampling,
        agent=agent,
    )
    assert agent.terminate() == 0
    log = agent.log()
    assert log.count("refused a line") == 7
    batches = unique_batches(receiver.batches())
    assert sorted(s.step for b in batches.values() for s in b.trainer_samples) == [1, 2, 3]
    gpu_times = sorted(s.time_unix_ns for b in batches.values() for s in b.gpu_samples if s.gpu_index == 0)
    assert max(b - a for a, b in itertools.pairwise(gpu_times)) < 0.25e9, "GPU sampling was not disturbed"
