"""Content problems: dropped, counted and reported per reason; the rest of the batch is stored."""

from __future__ import annotations

import math
import time

import grpc
import pytest

from gpuprobe.collector.encode import StreamEncoder
from gpuprobe.v1 import common_pb2, telemetry_pb2
from gpuprobe.wire.validate import (
    MISSING_FIELD,
    NON_FINITE_VALUE,
    TIMESTAMP_OUT_OF_RANGE,
    UNKNOWN_GPU,
    Identity,
    Limits,
    StreamError,
    check_hello,
)

NOW_NS = time.time_ns()
S = 1_000_000_000
IDENTITY = Identity(agent_id="a1", host="node-1")


def encode(batch: telemetry_pb2.SampleBatch, limits: Limits | None = None):  # type: ignore[no-untyped-def]
    batch.agent_id, batch.seq = "a1", 7
    return StreamEncoder(IDENTITY, limits or Limits()).encode(batch, NOW_NS)


def gpu_batch(*samples: telemetry_pb2.GpuSample) -> telemetry_pb2.SampleBatch:
    return telemetry_pb2.SampleBatch(gpus=[telemetry_pb2.GpuRef(index=0, uuid="GPU-0", name="L4")], gpu_samples=samples)


def test_nan_and_infinity_are_dropped_per_value_counted_and_reported_the_rest_is_stored() -> None:
    batch = gpu_batch(
        telemetry_pb2.GpuSample(time_unix_ns=NOW_NS, gpu_index=0, power_w=math.nan, temp_c=50.0),
        telemetry_pb2.GpuSample(time_unix_ns=NOW_NS + 1, gpu_index=0, power_w=math.inf, energy_j=-math.inf),
        telemetry_pb2.GpuSample(time_unix_ns=NOW_NS + 2, gpu_index=0, power_w=100.0),
    )
    encoded = encode(batch)
    lines = encoded.lines.decode().splitlines()
    assert [line.rsplit(" ", 2)[1] for line in lines] == ["temp_c=50.0", "power_w=100.0"]
    by_reason = {r.reason: r for r in encoded.problems.rejections()}
    rejection = by_reason[NON_FINITE_VALUE]
    assert rejection.seq == 7
    assert "gpu_samples[0]" in rejection.message and "power_w is nan" in rejection.message
    assert "3 value(s) dropped" in rejection.message
    # the second sample lost all its values: the sample itself is dropped and counted
    assert by_reason[MISSING_FIELD].rejected_samples == 1
    assert "no value that can be stored" in by_reason[MISSING_FIELD].message


def test_unknown_gpu_index_refuses_that_sample_only() -> None:
    batch = gpu_batch(
        telemetry_pb2.GpuSample(time_unix_ns=NOW_NS, gpu_index=0, power_w=1.0),
        telemetry_pb2.GpuSample(time_unix_ns=NOW_NS, gpu_index=5, power_w=2.0),
    )
    encoded = encode(batch)
    assert encoded.line_count == 1
    (rejection,) = encoded.problems.rejections()
    assert rejection.reason == UNKNOWN_GPU and rejection.rejected_samples == 1
    assert "gpu index 5 is not in SampleBatch.gpus" in rejection.message


@pytest.mark.parametrize(
    ("offset_ns", "policy", "stored"),
    [
        (0, "reject", True),
        (599 * S, "reject", True),
        (601 * S, "reject", False),  # too far in the future
        (-8 * 24 * 3600 * S, "reject", False),  # older than a week
        (601 * S, "flag", True),
    ],
)
def test_timestamps_far_from_the_collector_clock_are_refused_or_flagged(
    offset_ns: int, policy: str, stored: bool
) -> None:
    encoded = encode(
        gpu_batch(telemetry_pb2.GpuSample(time_unix_ns=NOW_NS + offset_ns, gpu_index=0, power_w=1.0)),
        Limits(timestamp_policy=policy),
    )
    assert (encoded.line_count == 1) is stored
    if not stored:
        (rejection,) = encoded.problems.rejections()
        assert rejection.reason == TIMESTAMP_OUT_OF_RANGE and rejection.rejected_samples == 1
    assert encoded.problems.flagged_timestamps == (1 if policy == "flag" else 0)


def test_zero_timestamp_is_refused_even_when_flagging() -> None:
    encoded = encode(
        gpu_batch(telemetry_pb2.GpuSample(time_unix_ns=0, gpu_index=0, power_w=1.0)), Limits(timestamp_policy="flag")
    )
    assert encoded.line_count == 0
    assert "zero or negative" in encoded.problems.rejections()[0].message


def test_integers_beyond_int64_are_dropped_not_wrapped() -> None:
    encoded = encode(
        gpu_batch(telemetry_pb2.GpuSample(time_unix_ns=NOW_NS, gpu_index=0, mem_used_bytes=2**64 - 1, power_w=1.0))
    )
    assert "mem_used_bytes" not in encoded.lines.decode()
    assert "int64" in encoded.problems.rejections()[0].message


def test_unspecified_enums_and_missing_workload_are_missing_fields() -> None:
    batch = telemetry_pb2.SampleBatch(
        acoustic_samples=[telemetry_pb2.AcousticSample(time_unix_ns=NOW_NS, est_dba=40.0)],
        trainer_samples=[
            telemetry_pb2.TrainerSample(time_unix_ns=NOW_NS, workload="", step=1, phase=common_pb2.PROBE_PHASE_STEADY),
            telemetry_pb2.TrainerSample(time_unix_ns=NOW_NS, workload="resnet50", step=1),
        ],
    )
    encoded = encode(batch)
    assert encoded.line_count == 0
    assert encoded.problems.by_reason[MISSING_FIELD].samples == 3


def test_node_hwmon_fields_and_bad_sensor_names() -> None:
    batch = telemetry_pb2.SampleBatch(
        node_samples=[
            telemetry_pb2.NodeSample(
                time_unix_ns=NOW_NS,
                cpu_pct=12.5,
                load1=0.5,
                hwmon_temp_c={"coretemp_package_id_0": 55.0, "Bad Name": 1.0},
            )
        ]
    )
    encoded = encode(batch)
    assert encoded.lines.decode() == (
        f"node,host=node-1,virt=unknown cpu_pct=12.5,load1=0.5,hwmon_coretemp_package_id_0_c=55.0 {NOW_NS}\n"
    )
    assert "Bad Name" in encoded.problems.rejections()[0].message


def test_trainer_acoustic_probe_and_agent_points_follow_the_schema() -> None:
    batch = telemetry_pb2.SampleBatch(
        created_unix_ns=NOW_NS,
        gpus=[telemetry_pb2.GpuRef(index=1, uuid="GPU-1", name="L4")],
        acoustic_samples=[
            telemetry_pb2.AcousticSample(
                time_unix_ns=NOW_NS,
                source=telemetry_pb2.ACOUSTIC_SOURCE_PROXY,
                gpu_index=1,
                est_dba=41.5,
                tdp_flag=True,
            )
        ],
        trainer_samples=[
            telemetry_pb2.TrainerSample(
                time_unix_ns=NOW_NS,
                probe_id="p-1",
                workload="resnet50",
                gpu_index=1,
                step=10,
                samples_per_s=250.5,
                batch_size=64,
                phase=common_pb2.PROBE_PHASE_STEADY,
            )
        ],
        probe_events=[
            telemetry_pb2.ProbeEvent(
                time_unix_ns=NOW_NS,
                probe_id="p-1",
                workload="resnet50",
                kind=telemetry_pb2.PROBE_EVENT_KIND_PHASE_CHANGE,
                phase=common_pb2.PROBE_PHASE_STEADY,
                status=common_pb2.PROBE_STATUS_RUNNING,
            )
        ],
        stats=telemetry_pb2.AgentStats(dropped_samples=3, spool_bytes=4096),
    )
    lines = encode(batch).lines.decode().splitlines()
    assert lines == [
        f"acoustic,gpu=1,host=node-1,source=proxy,virt=unknown est_dba=41.5,tdp_flag=true {NOW_NS}",
        f"trainer,gpu=1,host=node-1,probe=p-1,virt=unknown,workload=resnet50 "
        f'step=10i,samples_per_s=250.5,batch_size=64i,phase="steady" {NOW_NS}',
        'probe,host=node-1,probe=p-1,virt=unknown kind="phase_change",phase="steady",status="running",'
        f'workload="resnet50" {NOW_NS}',
        f"agent,host=node-1,virt=unknown dropped_samples=3i,dropped_batches=0i,read_errors=0i,missed_ticks=0i,"
        f"spool_bytes=4096i {NOW_NS}",
    ]


@pytest.mark.parametrize(
    ("identity", "message"),
    [
        (common_pb2.AgentIdentity(host="h"), "agent_id is empty"),
        (common_pb2.AgentIdentity(agent_id="a"), "host is empty"),
        (common_pb2.AgentIdentity(agent_id="a", host="h/1"), "'/', '+' or '#'"),
        (common_pb2.AgentIdentity(agent_id="a", host="h", region="eu\nwest"), "identity.region"),
        (common_pb2.AgentIdentity(agent_id="a", host="h" * 300), "more than the limit of 256"),
    ],
)
def test_bad_identity_labels_end_the_stream_with_invalid_argument(
    identity: common_pb2.AgentIdentity, message: str
) -> None:
    with pytest.raises(StreamError) as caught:
        check_hello(telemetry_pb2.Hello(identity=identity), Limits())
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert message in caught.value.message
