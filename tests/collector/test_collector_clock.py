"""A skewed node's timestamps moved onto the collector's clock (collector/clock.py)."""

from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor

from gpuprobe.collector import clock
from gpuprobe.v1 import telemetry_pb2

S = 1_000_000_000


def stamped_fields(descriptor: object = telemetry_pb2.SampleBatch.DESCRIPTOR, path: str = "") -> list[str]:
    """Every ``*_unix_ns`` field reachable from SampleBatch (repeated messages and their sub-messages)."""
    out = []
    for f in descriptor.fields:  # type: ignore[attr-defined]
        if f.name.endswith("_unix_ns"):
            out.append(f"{path}{f.name}")
        elif f.type == FieldDescriptor.TYPE_MESSAGE:
            out.extend(stamped_fields(f.message_type, f"{path}{f.name}."))
    return out


def test_every_timestamp_of_a_batch_is_moved() -> None:
    """Filled from the descriptor, so a timestamp field added to the contract later cannot be missed."""
    batch = telemetry_pb2.SampleBatch()
    for path in stamped_fields():
        *parents, name = path.split(".")
        message = batch
        for parent in parents:
            field = getattr(message, parent)
            message = field.add() if hasattr(field, "add") else field
        setattr(message, name, 2000 * S)
    clock.shift_batch(batch, 900 * S)
    moved = []
    for path in stamped_fields():
        *parents, name = path.split(".")
        message = batch
        for parent in parents:
            field = getattr(message, parent)
            message = field[0] if hasattr(field, "add") else field
        moved.append((path, getattr(message, name)))
    # the aggregate's min/max/last samples' time_unix_ns are not used (docs/schema.md), so left alone is fine
    unused = {f"gpu_aggregates.{part}.time_unix_ns" for part in ("mean", "min", "max", "last")}
    assert [(p, t) for p, t in moved if p not in unused and t != 1100 * S] == []


def test_a_zero_timestamp_stays_zero_for_the_validator_to_refuse() -> None:
    batch = telemetry_pb2.SampleBatch(gpu_samples=[telemetry_pb2.GpuSample(time_unix_ns=0)])
    clock.shift_batch(batch, -900 * S)
    assert batch.gpu_samples[0].time_unix_ns == 0


def test_the_correction_is_whole_seconds_from_one_second_either_way() -> None:
    assert clock.correction_ns(999_000_000) == 0
    assert clock.correction_ns(-999_000_000) == 0
    assert clock.correction_ns(900 * S + 3_000_000) == 900 * S  # a few ms of latency either way
    assert clock.correction_ns(900 * S - 3_000_000) == 900 * S
    assert clock.correction_ns(-900 * S - 300_000_000) == -900 * S
    assert clock.correction_ns(S) == S


def test_the_offset_is_measured_from_the_hello() -> None:
    assert clock.measured_offset_ns(telemetry_pb2.Hello(time_unix_ns=1000 * S), 100 * S) == 900 * S
    assert clock.measured_offset_ns(telemetry_pb2.Hello(), 100 * S) == 0  # an agent that sends no time
