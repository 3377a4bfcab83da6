"""docs/schema.md is the storage contract: its tables list exactly what the encoder writes, and its
example lines are accepted by the real InfluxDB."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuprobe.collector.encode import (
    ACOUSTIC_SPECS,
    AGENT_SPECS,
    GPU_INFO_SPECS,
    GPU_INFO_STRINGS,
    GPU_SPECS,
    GPU_STRINGS,
    MIG_SPECS,
    MIG_STRINGS,
    NODE_SPECS,
    NVLINK_SPECS,
    PROCESS_SPECS,
    PROCESS_STRINGS,
    TRAINER_SPECS,
)
from gpuprobe.devservices import InfluxDBDatabase

SCHEMA = (Path(__file__).resolve().parents[2] / "docs" / "schema.md").read_text()
KINDS = {0: "float", 1: "integer", 2: "boolean"}


def section(measurement: str) -> str:
    match = re.search(rf"^## `{measurement}`.*?(?=^## )", SCHEMA, re.S | re.M)
    assert match, measurement
    return match.group(0)


def documented_fields(measurement: str) -> dict[str, str]:
    rows = re.findall(r"^\| `([a-z0-9_<>]+)` \| (float|integer|boolean|string) \|", section(measurement), re.M)
    return dict(rows)


@pytest.mark.parametrize(
    ("measurement", "specs", "extra"),
    [
        ("gpu", GPU_SPECS, dict.fromkeys(GPU_STRINGS, "string")),
        ("node", NODE_SPECS, {"hwmon_<sensor>_c": "float"}),
        ("acoustic", ACOUSTIC_SPECS, {}),
        ("trainer", TRAINER_SPECS, {"phase": "string"}),
        ("agent", AGENT_SPECS, {"clock_offset_s": "float"}),  # the collector's measurement, not AgentStats
        (
            "gpu_info",
            GPU_INFO_SPECS,
            {"memory_total_bytes": "integer"} | dict.fromkeys(GPU_INFO_STRINGS, "string"),
        ),
        ("gpu_event", (), {"xid": "integer", "data": "integer", "text": "string", "gpu_instance": "integer"}),
        ("gpu_process", PROCESS_SPECS, dict.fromkeys(PROCESS_STRINGS, "string")),
        ("gpu_nvlink", NVLINK_SPECS, {}),
        ("gpu_mig", MIG_SPECS, dict.fromkeys(MIG_STRINGS, "string")),
    ],
)
def test_every_field_the_encoder_writes_is_documented_with_its_type(
    measurement: str, specs: tuple[tuple[str, int, bool], ...], extra: dict[str, str]
) -> None:
    assert documented_fields(measurement) == {name: KINDS[kind] for name, kind, _ in specs} | extra


MEASUREMENTS = ("gpu", "gpu_info", "gpu_event", "gpu_process", "gpu_nvlink", "gpu_mig", "node", "acoustic", "trainer")
EXAMPLE = re.compile(rf"^(?:{'|'.join((*MEASUREMENTS, 'probe', 'agent'))}),.*$", re.M)


def test_example_lines_are_accepted_by_real_influxdb(influxdb: InfluxDBDatabase) -> None:
    examples = EXAMPLE.findall(SCHEMA)
    assert len(examples) >= 14
    influxdb.write_lines(examples)
    (series,) = influxdb.query("SELECT count(power_w) FROM gpu WHERE res = ''")  # raw, not the aggregate
    assert series.values[0][1] == 2
    (series,) = influxdb.query("SELECT count(ecc_corrected_volatile) FROM gpu")
    assert series.values[0][1] == 1


@pytest.mark.parametrize("measurement", MEASUREMENTS)
def test_example_lines_carry_exactly_the_documented_fields(measurement: str) -> None:
    """Every field of a measurement's example lines is in its table, with the type the line gives it."""
    documented = documented_fields(measurement)
    lines = [line for line in EXAMPLE.findall(section(measurement)) if line.startswith(f"{measurement},")]
    assert lines, measurement
    for line in lines:
        fields = re.split(r"(?<!\\) ", line)[1]
        for key, value in re.findall(r'(?:^|,)([a-z0-9_]+)=("(?:[^"\\]|\\.)*"|[^,]+)', fields):
            kind = (
                "string"
                if value.startswith('"')
                else "integer"
                if value.endswith("i")
                else "boolean"
                if value in ("true", "false")
                else "float"
            )
            documented_kind = documented.get(key) or documented.get("hwmon_<sensor>_c")
            assert documented_kind == kind, (measurement, key)


def test_the_xid_example_query_counts_xids_per_host_and_gpu(influxdb: InfluxDBDatabase) -> None:
    query = re.search(r'^SELECT count\("xid"\) FROM "gpu_event" .*$', SCHEMA, re.M)
    assert query is not None
    influxdb.write_lines(EXAMPLE.findall(section("gpu_event")))
    (series,) = influxdb.query(query.group(0).replace("$timeFilter", "time > 0"))
    assert series.tags == {"host": "gpu-node-17", "gpu": "3"} and series.values[0][1] == 1
