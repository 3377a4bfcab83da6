"""The `gpu_info` measurement: a GPU's static facts from ``SampleBatch.gpu_info``, encoded exactly
(docs/schema.md): present fields written with their types, absent ones left out, hostile strings
cleaned (fields) or refused (tags), stamped with the batch's creation time."""

from __future__ import annotations

import time

from gpuprobe.collector.encode import StreamEncoder
from gpuprobe.devservices import InfluxDBDatabase
from gpuprobe.v1 import common_pb2, telemetry_pb2
from gpuprobe.wire.validate import INVALID_STRING, TIMESTAMP_OUT_OF_RANGE, Identity, Limits, Problems

NOW_NS = time.time_ns()
IDENTITY = Identity(agent_id="a1", host="node-1", cluster="c1", virt="bare_metal")
PREFIX = "gpu_info,cluster=c1,gpu=3,host=node-1,model=NVIDIA\\ H100\\ 80GB\\ HBM3,uuid=GPU-abc,virt=bare_metal "


def full_info(**changes: object) -> common_pb2.GpuInfo:
    info = common_pb2.GpuInfo(
        index=3,
        uuid="GPU-abc",
        name="NVIDIA H100 80GB HBM3",
        pci_bus_id="00000000:48:00.0",
        memory_total_bytes=85520809984,
        power_limit_min_w=200.0,
        power_limit_max_w=700.0,
        power_limit_default_w=700.0,
        temp_slowdown_c=89.0,
        temp_shutdown_c=92.0,
        temp_gpu_max_c=87.0,
        temp_mem_max_c=95.0,
        driver_version="570.133.20",
        architecture="hopper",
        fan_count=0,
        passive_cooling=True,
        compute_capability="9.0",
        vbios_version="96.00.89.00.01",
        pcie_gen_max=5,
        pcie_width_max=16,
    )
    for key, value in changes.items():
        setattr(info, key, value)
    return info


def encode(*infos: common_pb2.GpuInfo, created: int = NOW_NS, samples: bool = False) -> tuple[list[str], Problems]:
    batch = telemetry_pb2.SampleBatch(agent_id="a1", seq=7, created_unix_ns=created, gpu_info=infos)
    if samples:
        batch.gpus.add(index=3, uuid="GPU-abc", name="NVIDIA H100 80GB HBM3")
        batch.gpu_samples.add(time_unix_ns=created - 5, gpu_index=3, temp_c=40.0)
    encoded = StreamEncoder(IDENTITY, Limits()).encode(batch, NOW_NS)
    lines = encoded.lines.decode().split("\n")
    assert lines[-1] == "" and len(lines) - 1 == encoded.line_count
    return lines[:-1], encoded.problems


def test_every_present_fact_is_written_with_its_type_and_the_batch_time() -> None:
    (line,), problems = encode(full_info())
    assert not problems
    assert line == (
        PREFIX + "temp_slowdown_c=89.0,temp_shutdown_c=92.0,temp_gpu_max_c=87.0,temp_mem_max_c=95.0,"
        "power_limit_min_w=200.0,power_limit_max_w=700.0,power_limit_default_w=700.0,pcie_gen_max=5i,"
        "pcie_width_max=16i,fan_count=0i,passive_cooling=true,memory_total_bytes=85520809984i,"
        'driver_version="570.133.20",vbios_version="96.00.89.00.01",architecture="hopper",'
        f'compute_capability="9.0" {NOW_NS}'
    )


def test_absent_facts_stay_absent_and_zero_counts_are_readings() -> None:
    info = common_pb2.GpuInfo(index=3, uuid="GPU-abc", name="NVIDIA H100 80GB HBM3", temp_slowdown_c=83.5)
    (line,), problems = encode(info)
    assert not problems
    assert line == f"{PREFIX}temp_slowdown_c=83.5 {NOW_NS}"
    # fan_count 0 is a reading (no fans), passive_cooling false too; the unset memory total is left out
    info = common_pb2.GpuInfo(index=3, uuid="GPU-abc", name="NVIDIA H100 80GB HBM3", fan_count=0, passive_cooling=False)
    (line,), _ = encode(info)
    assert line == f"{PREFIX}fan_count=0i,passive_cooling=false {NOW_NS}"
    # nothing to store: nothing written, and said
    (none, problems) = encode(common_pb2.GpuInfo(index=3, uuid="GPU-abc", name="x"))
    assert none == [] and problems


def test_hostile_strings_in_vbios_and_driver_are_cleaned_never_a_second_point() -> None:
    info = full_info(
        vbios_version='96.00\nevil,host=x temp_slowdown_c=1 1\r\t"quoted" back\\',
        driver_version="570\x00.1" + "9" * 400,
        architecture='a"b',
    )
    (line,), problems = encode(info)
    assert not problems
    assert '\\"quoted\\" back\\\\"' in line and "\n" not in line and "\r" not in line and "\x00" not in line
    assert 'vbios_version="96.00 evil,host=x temp_slowdown_c=1 1  \\"quoted\\" back\\\\"' in line
    driver = line.split('driver_version="')[1].split('"')[0]
    assert driver.startswith("570 .1999") and len(driver.encode()) == 256
    assert 'architecture="a\\"b"' in line


def test_a_bad_uuid_or_name_drops_that_point_only() -> None:
    bad = full_info(uuid="GPU-\nx")
    lines, problems = encode(bad, full_info(index=4, uuid="GPU-def"), samples=True)
    assert [line.split(",")[0] for line in lines] == ["gpu", "gpu_info"]
    assert ",gpu=4," in lines[1]
    assert INVALID_STRING in problems.by_reason
    lines, problems = encode(full_info(name="trailing\\"))
    assert lines == [] and INVALID_STRING in problems.by_reason


def test_an_out_of_range_batch_time_drops_the_point() -> None:
    lines, problems = encode(full_info(), created=NOW_NS + 3600 * 10**9)
    assert lines == [] and TIMESTAMP_OUT_OF_RANGE in problems.by_reason


def test_the_line_reads_back_from_real_influxdb_and_a_replay_overwrites_itself(influxdb: InfluxDBDatabase) -> None:
    info = full_info(vbios_version="v\n1 ,=\\")
    lines, _ = encode(info)
    influxdb.write_lines(lines)
    influxdb.write_lines(encode(info)[0])  # the same batch again
    (series,) = influxdb.query('SELECT * FROM "gpu_info"')
    assert len(series.values) == 1
    (row,) = series.rows()
    assert row["vbios_version"] == "v 1 ,=\\"
    assert row["temp_slowdown_c"] == 89 and row["memory_total_bytes"] == 85520809984 and row["pcie_gen_max"] == 5
    assert row["passive_cooling"] is True and row["uuid"] == "GPU-abc" and row["model"] == "NVIDIA H100 80GB HBM3"
