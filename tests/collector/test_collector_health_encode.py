"""GPU health (issue 12): the health fields and verdict of `gpu` points, and the `gpu_event`,
`gpu_process`, `gpu_nvlink` and `gpu_mig` measurements, encoded exactly (docs/schema.md): GPU tags
as on `gpu` points, unknown GPUs and unspecified event kinds refused per sample, hostile strings
cleaned, the rest of the batch written; read back from the real InfluxDB."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from collector_helpers import collector_config, running, wait_until

from gpuprobe.app.loadgen import AgentSpec, SyntheticAgent
from gpuprobe.collector.encode import GPU_HEALTH_FIELDS, StreamEncoder
from gpuprobe.devservices import InfluxDBDatabase
from gpuprobe.v1 import common_pb2, telemetry_pb2
from gpuprobe.wire.validate import (
    INVALID_STRING,
    MISSING_FIELD,
    NON_FINITE_VALUE,
    TIMESTAMP_OUT_OF_RANGE,
    UNKNOWN_GPU,
    Identity,
    Limits,
    Problems,
)

NOW_NS = time.time_ns()
T = NOW_NS - 5_000_000_000
IDENTITY = Identity(agent_id="a1", host="node-1", cluster="c1", virt="bare_metal")
GPU_TAGS = "cluster=c1,gpu=3,host=node-1,model=NVIDIA\\ H100,uuid=GPU-abc,virt=bare_metal"
HOSTILE = 'bad\ncpu_pct=1 1\r\t"q" back\\slash,comma space=eq\x00\x7f\x85😀 '


def batch(**lists: object) -> telemetry_pb2.SampleBatch:
    return telemetry_pb2.SampleBatch(
        agent_id="a1",
        seq=9,
        created_unix_ns=NOW_NS,
        gpus=[
            telemetry_pb2.GpuRef(index=3, uuid="GPU-abc", name="NVIDIA H100"),
            telemetry_pb2.GpuRef(index=4, uuid="GPU-def", name="NVIDIA H100"),
        ],
        **lists,  # type: ignore[arg-type]
    )


def encode(b: telemetry_pb2.SampleBatch, limits: Limits | None = None) -> tuple[list[str], Problems, int]:
    encoded = StreamEncoder(IDENTITY, limits or Limits()).encode(b, NOW_NS)
    text = encoded.lines.decode()
    lines = text.split("\n")
    assert lines[-1] == "" and len(lines) - 1 == encoded.line_count
    return lines[:-1], encoded.problems, encoded.sample_count


def health_sample(**fields: object) -> telemetry_pb2.GpuSample:
    values: dict[str, object] = {"time_unix_ns": T, "gpu_index": 3}
    return telemetry_pb2.GpuSample(**(values | fields))  # type: ignore[arg-type]


# --- gpu: health fields and the verdict ----------------------------------------------------------


def test_health_fields_are_written_with_their_types_and_zero_counts_are_readings() -> None:
    sample = health_sample(
        temp_c=60.0,
        ecc_corrected_volatile=0,
        ecc_uncorrected_volatile=2,
        retired_pages_pending=False,
        remap_failure=True,
        fan_rpm=3200.5,
        sm_active_pct=87.25,
        nvlink_tx_bytes_per_s=1.5e9,
        health=common_pb2.GPU_HEALTH_FAILED,
        health_reason="XID 79: GPU has fallen off the bus",
    )
    (line,), problems, count = encode(batch(gpu_samples=[sample]))
    assert not problems and count == 1
    assert line == (
        f"gpu,{GPU_TAGS} temp_c=60.0,ecc_corrected_volatile=0i,ecc_uncorrected_volatile=2i,"
        "retired_pages_pending=false,remap_failure=true,fan_rpm=3200.5,sm_active_pct=87.25,"
        'nvlink_tx_bytes_per_s=1500000000.0,health="failed",'
        f'health_reason="XID 79: GPU has fallen off the bus" {T}'
    )


@pytest.mark.parametrize(
    ("health", "text"),
    [
        (common_pb2.GPU_HEALTH_HEALTHY, 'health="healthy"'),
        (common_pb2.GPU_HEALTH_DEGRADED, 'health="degraded"'),
        (common_pb2.GPU_HEALTH_FAILED, 'health="failed"'),
    ],
)
def test_each_verdict_is_its_string(health: int, text: str) -> None:
    (line,), problems, _ = encode(batch(gpu_samples=[health_sample(temp_c=1.0, health=health)]))  # type: ignore[arg-type]
    assert not problems and line == f"gpu,{GPU_TAGS} temp_c=1.0,{text} {T}"


def test_an_unspecified_verdict_and_an_empty_reason_are_not_written() -> None:
    sample = health_sample(temp_c=1.0, health=common_pb2.GPU_HEALTH_UNSPECIFIED, health_reason="")
    (line,), problems, _ = encode(batch(gpu_samples=[sample]))
    assert not problems and line == f"gpu,{GPU_TAGS} temp_c=1.0 {T}"
    # a sample with only an unspecified verdict has nothing to store
    lines, problems, _ = encode(batch(gpu_samples=[health_sample(health=common_pb2.GPU_HEALTH_UNSPECIFIED)]))
    assert lines == [] and MISSING_FIELD in problems.by_reason


def test_a_hostile_reason_is_cleaned_and_cut_never_a_second_point() -> None:
    sample = health_sample(health=common_pb2.GPU_HEALTH_DEGRADED, health_reason=HOSTILE + "x" * 10_000)
    (line,), problems, _ = encode(batch(gpu_samples=[sample]), Limits(max_string_field_bytes=100))
    assert not problems
    assert "\n" not in line and "\r" not in line and "\x00" not in line and "\ud800" not in line
    reason = line.split('health_reason="', 1)[1].rsplit('" ', 1)[0]
    assert reason.startswith('bad cpu_pct=1 1  \\"q\\" back\\\\slash,comma space=eq')
    assert len(reason.replace('\\"', '"').replace("\\\\", "\\").encode()) == 100


def test_health_samples_take_the_exact_path_and_write_the_same_text_as_the_fast_path() -> None:
    """A batch of 10 Hz samples with one 1 Hz health sample: the plain samples read as before, the
    health one carries its fields; a NaN in a health sample drops that value only."""
    plain = [health_sample(time_unix_ns=T + i, temp_c=50.0 + i, power_w=100.0) for i in range(10)]
    with_health = health_sample(
        time_unix_ns=T + 10, temp_c=60.0, power_w=100.0, sm_active_pct=float("nan"), pcie_replay_count=7
    )
    lines, problems, count = encode(batch(gpu_samples=[*plain[:5], with_health, *plain[5:]]))
    assert count == 11 and len(lines) == 11
    assert sorted(lines) == sorted(
        [f"gpu,{GPU_TAGS} power_w=100.0,temp_c={50.0 + i} {T + i}" for i in range(10)]
        + [f"gpu,{GPU_TAGS} power_w=100.0,temp_c=60.0,pcie_replay_count=7i {T + 10}"]
    )
    assert set(problems.by_reason) == {NON_FINITE_VALUE} and problems.by_reason[NON_FINITE_VALUE].values == 1
    assert "gpu_samples[5]" in problems.by_reason[NON_FINITE_VALUE].first_message
    # the same plain samples alone: identical text (the fast path)
    alone, none, _ = encode(batch(gpu_samples=plain))
    assert not none and sorted(alone) == sorted(line for line in lines if "pcie_replay_count" not in line)


def test_every_health_field_alone_sends_its_sample_through_the_exact_path() -> None:
    for name in GPU_HEALTH_FIELDS:
        sample = health_sample(temp_c=1.0)
        if name == "health_reason":
            sample.health_reason = "r"
        elif name == "health":
            sample.health = common_pb2.GPU_HEALTH_HEALTHY
        else:
            setattr(sample, name, (sample.DESCRIPTOR.fields_by_name[name].type == 1 and 2.5) or 1)
        lines, problems, _ = encode(batch(gpu_samples=[health_sample(time_unix_ns=T - 1, temp_c=0.5), sample]))
        assert not problems and len(lines) == 2
        assert f"gpu,{GPU_TAGS} temp_c=0.5 {T - 1}" in lines
        (line,) = (line for line in lines if line.endswith(f" {T}"))
        assert f",{name}=" in line and line.startswith(f"gpu,{GPU_TAGS} temp_c=1.0,"), name


def test_a_health_sample_of_an_unknown_gpu_is_refused_alone() -> None:
    lines, problems, _ = encode(
        batch(gpu_samples=[health_sample(gpu_index=9, remap_pending=True), health_sample(temp_c=1.0)])
    )
    assert lines == [f"gpu,{GPU_TAGS} temp_c=1.0 {T}"]
    assert problems.by_reason[UNKNOWN_GPU].samples == 1


# --- gpu_event -----------------------------------------------------------------------------------


def event(**fields: object) -> telemetry_pb2.GpuEvent:
    values: dict[str, object] = {"time_unix_ns": T, "gpu_index": 3, "kind": telemetry_pb2.GPU_EVENT_KIND_XID}
    return telemetry_pb2.GpuEvent(**(values | fields))  # type: ignore[arg-type]


def test_gpu_events_xid_and_data_text_and_gpu_instance() -> None:
    events = [
        event(data=79, text="GPU has fallen off the bus"),
        event(time_unix_ns=T + 1, kind=telemetry_pb2.GPU_EVENT_KIND_ECC_DOUBLE_BIT, data=0, gpu_instance_id=2),
        event(time_unix_ns=T + 2, kind=telemetry_pb2.GPU_EVENT_KIND_CLOCK_CHANGE, data=4),
    ]
    lines, problems, count = encode(batch(gpu_events=events))
    assert not problems and count == 3
    assert lines == [
        "gpu_event,cluster=c1,gpu=3,host=node-1,kind=xid,model=NVIDIA\\ H100,uuid=GPU-abc,virt=bare_metal "
        f'xid=79i,text="GPU has fallen off the bus" {T}',
        "gpu_event,cluster=c1,gpu=3,host=node-1,kind=ecc_dbe,model=NVIDIA\\ H100,uuid=GPU-abc,virt=bare_metal "
        f"data=0i,gpu_instance=2i {T + 1}",
        "gpu_event,cluster=c1,gpu=3,host=node-1,kind=clock_change,model=NVIDIA\\ H100,uuid=GPU-abc,virt=bare_metal "
        f"data=4i {T + 2}",
    ]


@pytest.mark.parametrize(
    ("kind", "tag"),
    [
        (telemetry_pb2.GPU_EVENT_KIND_XID, "xid"),
        (telemetry_pb2.GPU_EVENT_KIND_ECC_SINGLE_BIT, "ecc_sbe"),
        (telemetry_pb2.GPU_EVENT_KIND_ECC_DOUBLE_BIT, "ecc_dbe"),
        (telemetry_pb2.GPU_EVENT_KIND_CLOCK_CHANGE, "clock_change"),
        (telemetry_pb2.GPU_EVENT_KIND_POWER_SOURCE_CHANGE, "power_source_change"),
        (telemetry_pb2.GPU_EVENT_KIND_LOST, "lost"),
        (telemetry_pb2.GPU_EVENT_KIND_RECOVERED, "recovered"),
    ],
)
def test_every_event_kind_has_its_tag(kind: int, tag: str) -> None:
    (line,), problems, _ = encode(batch(gpu_events=[event(kind=kind, data=5)]))
    assert not problems and f",kind={tag}," in line
    assert (" xid=5i " if tag == "xid" else " data=5i ") in line


def test_an_unspecified_or_unknown_kind_refuses_that_event_only() -> None:
    events = [event(kind=telemetry_pb2.GPU_EVENT_KIND_UNSPECIFIED, data=79), event(data=48), event(kind=99, data=1)]
    lines, problems, count = encode(batch(gpu_events=events))
    assert count == 3 and len(lines) == 1 and " xid=48i " in lines[0]
    assert set(problems.by_reason) == {MISSING_FIELD} and problems.by_reason[MISSING_FIELD].samples == 2
    assert "gpu_events[0]" in problems.by_reason[MISSING_FIELD].first_message
    (rejection,) = problems.rejections()
    assert rejection.reason == MISSING_FIELD and rejection.rejected_samples == 2 and rejection.seq == 9


def test_events_of_unknown_gpus_or_out_of_range_times_are_refused_alone() -> None:
    events = [event(gpu_index=7), event(time_unix_ns=NOW_NS + 3600 * 10**9), event(time_unix_ns=0), event(data=13)]
    lines, problems, _ = encode(batch(gpu_events=events))
    assert len(lines) == 1 and " xid=13i " in lines[0]
    assert problems.by_reason[UNKNOWN_GPU].samples == 1 and problems.by_reason[TIMESTAMP_OUT_OF_RANGE].samples == 2


def test_a_hostile_event_text_and_huge_data_never_break_the_batch() -> None:
    events = [
        event(text=HOSTILE * 1000, kind=telemetry_pb2.GPU_EVENT_KIND_LOST),
        event(data=2**64 - 1, text="t"),
        event(data=2**64 - 1, kind=telemetry_pb2.GPU_EVENT_KIND_RECOVERED),
    ]
    lines, problems, _ = encode(batch(gpu_events=events))
    assert len(lines) == 2 and all(line.startswith("gpu_event,") for line in lines)
    assert "\r" not in "".join(lines) and "\n" not in "".join(lines)
    text = lines[0].split(',text="', 1)[1].rsplit('" ', 1)[0]
    assert len(text.replace('\\"', '"').replace("\\\\", "\\").encode()) == 4096
    assert lines[1].endswith(f' text="t" {T}') and "xid=" not in lines[1]
    assert problems.by_reason[NON_FINITE_VALUE].values == 2 and problems.by_reason[MISSING_FIELD].samples == 1


# --- gpu_process ---------------------------------------------------------------------------------


def process(**fields: object) -> telemetry_pb2.ProcessSample:
    values: dict[str, object] = {"time_unix_ns": T, "gpu_index": 3, "pid": 4242}
    return telemetry_pb2.ProcessSample(**(values | fields))  # type: ignore[arg-type]


PROCESS_TAGS = "cluster=c1,gpu=3,host=node-1,model=NVIDIA\\ H100,pid=4242,uuid=GPU-abc,virt=bare_metal"


def test_process_samples() -> None:
    samples = [
        process(
            command="python3",
            cgroup="/kubepods/pod-1/abc",
            used_memory_bytes=1 << 30,
            sm_pct=42.0,
            mem_util_pct=0.0,
            energy_j=1234.5,
        ),
        process(time_unix_ns=T + 1, ended=True),
    ]
    lines, problems, count = encode(batch(process_samples=samples))
    assert not problems and count == 2
    assert lines == [
        f'gpu_process,{PROCESS_TAGS} command="python3",cgroup="/kubepods/pod-1/abc",'
        f"used_memory_bytes=1073741824i,sm_pct=42.0,mem_util_pct=0.0,energy_j=1234.5,ended=false {T}",
        f"gpu_process,{PROCESS_TAGS} ended=true {T + 1}",
    ]


def test_hostile_command_and_cgroup_are_cleaned_and_cut_and_the_other_points_survive() -> None:
    samples = [
        process(command=HOSTILE + "é" * 5000, cgroup="\\" + HOSTILE + "\\"),
        process(pid=1, command="ok", sm_pct=float("inf")),
    ]
    lines, problems, _ = encode(batch(process_samples=samples, gpu_samples=[health_sample(temp_c=1.0)]))
    assert len(lines) == 3 and [line.split(",", 1)[0] for line in lines] == ["gpu", "gpu_process", "gpu_process"]
    hostile = lines[1]
    assert "\n" not in hostile and "\r" not in hostile and "\x00" not in hostile and "\x85" not in hostile
    assert 'command="bad cpu_pct=1 1  \\"q\\" back\\\\slash,comma space=eq' in hostile
    assert 'cgroup="\\\\bad cpu_pct' in hostile and '\\\\",ended=false ' in hostile
    command = hostile.split('command="', 1)[1].split('",cgroup=', 1)[0]
    assert len(command.replace('\\"', '"').replace("\\\\", "\\").encode()) <= 4096
    assert lines[2] == f'gpu_process,{PROCESS_TAGS.replace("pid=4242", "pid=1")} command="ok",ended=false {T}'
    assert problems.by_reason[NON_FINITE_VALUE].values == 1


def test_invalid_utf8_in_a_command_never_reaches_the_encoder() -> None:
    """proto3 strings must be UTF-8: a batch carrying invalid bytes does not decode (the stream
    ends with INVALID_ARGUMENT, docs/wire.md), so it can never become a point."""
    good = batch(process_samples=[process(command="AAAA")]).SerializeToString()
    bad = good.replace(b"AAAA", b"A\xff\xfeA")
    with pytest.raises(Exception, match=r"(?i)utf-?8|parse|decode"):
        telemetry_pb2.SampleBatch.FromString(bad)


def test_process_samples_of_unknown_gpus_are_refused_alone() -> None:
    lines, problems, _ = encode(batch(process_samples=[process(gpu_index=5), process(ended=True)]))
    assert len(lines) == 1 and problems.by_reason[UNKNOWN_GPU].samples == 1


# --- gpu_nvlink and gpu_mig ----------------------------------------------------------------------


def test_nvlink_samples() -> None:
    links = [
        telemetry_pb2.NvLinkSample(
            time_unix_ns=T, gpu_index=3, link=0, tx_bytes_per_s=2.5e10, rx_bytes_per_s=0.0, crc_flit_errors=0,
            crc_data_errors=1, replay_errors=2, recovery_errors=3,
        ),
        telemetry_pb2.NvLinkSample(time_unix_ns=T, gpu_index=3, link=17, replay_errors=2**64 - 1),
        telemetry_pb2.NvLinkSample(time_unix_ns=T, gpu_index=8, link=1, replay_errors=1),
    ]  # fmt: skip
    lines, problems, count = encode(batch(nvlink_samples=links))
    assert count == 3
    assert lines == [
        "gpu_nvlink,cluster=c1,gpu=3,host=node-1,link=0,model=NVIDIA\\ H100,uuid=GPU-abc,virt=bare_metal "
        f"tx_bytes_per_s=25000000000.0,rx_bytes_per_s=0.0,crc_flit_errors=0i,crc_data_errors=1i,replay_errors=2i,"
        f"recovery_errors=3i {T}"
    ]
    assert problems.by_reason[MISSING_FIELD].samples == 1  # link 17: its only value is beyond int64
    assert problems.by_reason[NON_FINITE_VALUE].values == 1 and problems.by_reason[UNKNOWN_GPU].samples == 1


def test_mig_samples() -> None:
    migs = [
        telemetry_pb2.MigSample(
            time_unix_ns=T, gpu_index=4, gpu_instance_id=7, mig_uuid="MIG-1a2b", name="NVIDIA H100 MIG 1g.10gb",
            mem_used_bytes=0, mem_total_bytes=10 << 30, multiprocessor_count=16, sm_active_pct=80.75,
            tensor_active_pct=0.0,
        ),
        telemetry_pb2.MigSample(time_unix_ns=T, gpu_index=4, gpu_instance_id=8, mig_uuid="MIG-\nevil", name="x"),
        telemetry_pb2.MigSample(time_unix_ns=T, gpu_index=4, gpu_instance_id=9, name="only\tname"),
    ]  # fmt: skip
    lines, problems, _ = encode(batch(mig_samples=migs))
    assert lines == [
        "gpu_mig,cluster=c1,gpu=4,gpu_instance=7,host=node-1,mig_uuid=MIG-1a2b,model=NVIDIA\\ H100,uuid=GPU-def,"
        f'virt=bare_metal name="NVIDIA H100 MIG 1g.10gb",mem_used_bytes=0i,mem_total_bytes=10737418240i,'
        f"multiprocessor_count=16i,sm_active_pct=80.75,tensor_active_pct=0.0 {T}",
        "gpu_mig,cluster=c1,gpu=4,gpu_instance=9,host=node-1,model=NVIDIA\\ H100,uuid=GPU-def,virt=bare_metal "
        f'name="only name" {T}',
    ]
    assert problems.by_reason[INVALID_STRING].samples == 1


def test_gpu_info_mig_and_gpm_flags() -> None:
    info = common_pb2.GpuInfo(index=3, uuid="GPU-abc", name="NVIDIA H100", mig_enabled=False, gpm_supported=True)
    (line,), problems, _ = encode(batch(gpu_info=[info]))
    assert not problems and line == f"gpu_info,{GPU_TAGS} mig_enabled=false,gpm_supported=true {NOW_NS}"


def test_a_batch_with_only_events_is_counted_and_written() -> None:
    lines, problems, count = encode(batch(gpu_events=[event(data=94)]))
    assert not problems and count == 1 and len(lines) == 1


# --- through the real InfluxDB --------------------------------------------------------------------


def full_batch() -> telemetry_pb2.SampleBatch:
    return batch(
        gpu_samples=[
            health_sample(time_unix_ns=T + i, temp_c=50.0, power_w=300.0) for i in range(5)
        ] + [
            health_sample(
                time_unix_ns=T + 5, temp_c=51.0, ecc_uncorrected_volatile=1, remap_pending=True,
                health=common_pb2.GPU_HEALTH_FAILED, health_reason='XID 79 "bus"\nnext',
            )
        ],
        gpu_events=[
            event(data=79, text="GPU has fallen off the bus"),
            event(time_unix_ns=T + 1, data=48),
            event(time_unix_ns=T + 2, gpu_index=4, data=63),
            event(time_unix_ns=T + 3, kind=telemetry_pb2.GPU_EVENT_KIND_ECC_SINGLE_BIT, data=1),
        ],
        process_samples=[process(command='py "x"\n\\', cgroup="/k8s,a b=c", energy_j=10.5, used_memory_bytes=1 << 20)],
        nvlink_samples=[telemetry_pb2.NvLinkSample(time_unix_ns=T, gpu_index=3, link=2, replay_errors=4)],
        mig_samples=[
            telemetry_pb2.MigSample(
                time_unix_ns=T, gpu_index=4, gpu_instance_id=1, mig_uuid="MIG-x", name="1g.10gb", sm_active_pct=42.5
            )
        ],
        gpu_info=[common_pb2.GpuInfo(index=3, uuid="GPU-abc", name="NVIDIA H100", mig_enabled=True)],
    )  # fmt: skip


def test_round_trip_through_real_influxdb_and_a_replay_overwrites_itself(influxdb: InfluxDBDatabase) -> None:
    lines, problems, count = encode(full_batch())
    assert not problems and count == 14 and len(lines) == 14
    influxdb.write_lines(lines)
    influxdb.write_lines(encode(full_batch())[0])  # the same batch again: exactly once
    (series,) = influxdb.query('SELECT count("temp_c") FROM "gpu"')
    assert series.values[0][1] == 6
    (series,) = influxdb.query('SELECT "health", "health_reason", "remap_pending" FROM "gpu" WHERE "health" != \'\'')
    (row,) = series.rows()
    assert row["health"] == "failed" and row["health_reason"] == 'XID 79 "bus" next' and row["remap_pending"] is True
    # the schema's example query: XIDs per host and GPU
    result = influxdb.query(
        f'SELECT count("xid") FROM "gpu_event" WHERE "kind"=\'xid\' AND time >= {T - 1} AND time <= {NOW_NS} '
        'GROUP BY "host","gpu"'
    )
    counts = {s.tags["gpu"]: s.values[0][1] for s in result}
    assert counts == {"3": 2, "4": 1}
    (series,) = influxdb.query('SELECT "data" FROM "gpu_event" WHERE "kind"=\'ecc_sbe\'')
    assert series.values[0][1] == 1
    (series,) = influxdb.query('SELECT * FROM "gpu_process"')
    (row,) = series.rows()
    assert row["command"] == 'py "x" \\' and row["cgroup"] == "/k8s,a b=c" and row["pid"] == "4242"
    assert row["energy_j"] == 10.5 and row["used_memory_bytes"] == 1 << 20 and row["ended"] is False
    (series,) = influxdb.query('SELECT * FROM "gpu_nvlink"')
    (row,) = series.rows()
    assert row["link"] == "2" and row["replay_errors"] == 4 and row["uuid"] == "GPU-abc"
    (series,) = influxdb.query('SELECT * FROM "gpu_mig"')
    (row,) = series.rows()
    assert row["gpu_instance"] == "1" and row["mig_uuid"] == "MIG-x" and row["name"] == "1g.10gb"
    assert row["sm_active_pct"] == 42.5, "the instance's GPM"
    assert row["uuid"] == "GPU-def"
    (series,) = influxdb.query('SELECT "mig_enabled" FROM "gpu_info"')
    assert series.values[0][1] is True


def test_plain_samples_take_the_fast_path_and_only_health_samples_the_exact_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []
    original = StreamEncoder._encode_gpu_checked

    def counting(self: StreamEncoder, i: int, *args: object) -> None:
        calls.append(i)
        original(self, i, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(StreamEncoder, "_encode_gpu_checked", counting)
    plain = [health_sample(time_unix_ns=T + i, temp_c=40.0, power_w=float(i)) for i in range(20)]
    lines, problems, _ = encode(batch(gpu_samples=plain))
    assert len(lines) == 20 and not problems and calls == []
    tick = health_sample(time_unix_ns=T + 20, temp_c=41.0, ecc_corrected_volatile=0, health=1)  # type: ignore[arg-type]
    lines, problems, _ = encode(batch(gpu_samples=[*plain[:7], tick, *plain[7:]]))
    assert len(lines) == 21 and not problems and calls == [7]
    assert lines[-1] == f'gpu,{GPU_TAGS} temp_c=41.0,ecc_corrected_volatile=0i,health="healthy" {T + 20}'


def test_over_grpc_a_batch_of_events_only_is_acked_and_written_and_a_bad_event_rejected(
    influxdb: InfluxDBDatabase, tmp_path: Path
) -> None:
    """The collector's whole path (stream, WAL, sink, metrics) for the new lists: nothing but the
    encoder had to learn them."""
    spec = AgentSpec("node-h", gpus=2)

    async def scenario() -> tuple[SyntheticAgent, float]:
        async with running(collector_config(tmp_path, influxdb.server.url, influxdb.name)) as collector:
            agent = SyntheticAgent(f"127.0.0.1:{collector.port}", spec, window=3)
            task = asyncio.create_task(agent.run())
            now = time.time_ns()
            only_events = telemetry_pb2.SampleBatch(created_unix_ns=now, gpus=agent.factory.refs)
            only_events.gpu_events.add(
                time_unix_ns=now - 10, gpu_index=1, kind=telemetry_pb2.GPU_EVENT_KIND_XID, data=79
            )
            agent.enqueue(only_events)
            mixed = telemetry_pb2.SampleBatch(created_unix_ns=now, gpus=agent.factory.refs)
            mixed.gpu_events.add(time_unix_ns=now - 9, gpu_index=0, data=3)  # kind UNSPECIFIED: refused
            mixed.gpu_events.add(time_unix_ns=now - 8, gpu_index=5, kind=telemetry_pb2.GPU_EVENT_KIND_LOST)
            mixed.process_samples.add(time_unix_ns=now - 7, gpu_index=0, pid=11, command="a\nb", ended=True)
            mixed.nvlink_samples.add(time_unix_ns=now - 7, gpu_index=0, link=1, replay_errors=0)
            mixed.mig_samples.add(time_unix_ns=now - 7, gpu_index=1, gpu_instance_id=2, name="1g.10gb")
            agent.enqueue(mixed)
            await agent.close()
            await task
            await wait_until(lambda: collector.wal.depth_lines == 0, 30, "the WAL to drain")
            return agent, collector.metrics.value("gpuprobe_collector_written_lines_total")

    agent, written = asyncio.run(scenario())
    assert agent.acked_seq == 2 and not agent.errors
    reasons = sorted((r.seq, r.reason, r.rejected_samples) for r in agent.rejections)
    assert reasons == sorted([(2, MISSING_FIELD, 1), (2, UNKNOWN_GPU, 1)])
    assert written == 4
    (series,) = influxdb.query('SELECT "xid" FROM "gpu_event" GROUP BY "host", "gpu", "kind"')
    assert series.tags == {"host": "node-h", "gpu": "1", "kind": "xid"} and series.values[0][1] == 79
    (series,) = influxdb.query('SELECT "command", "ended" FROM "gpu_process"')
    assert list(series.values[0][1:]) == ["a b", True]
    for measurement in ("gpu_nvlink", "gpu_mig"):
        (series,) = influxdb.query(f'SELECT count(*) FROM "{measurement}"')
        assert max(series.values[0][1:]) == 1, measurement
