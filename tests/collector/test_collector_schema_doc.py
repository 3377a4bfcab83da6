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
    NODE_SPECS,
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
        ("gpu", GPU_SPECS, {}),
        ("node", NODE_SPECS, {"hwmon_<sensor>_c": "float"}),
        ("acoustic", ACOUSTIC_SPECS, {}),
        ("trainer", TRAINER_SPECS, {"phase": "string"}),
        ("agent", AGENT_SPECS, {}),
        (
            "gpu_info",
            GPU_INFO_SPECS,
            {"memory_total_bytes": "integer"} | dict.fromkeys(GPU_INFO_STRINGS, "string"),
        ),
    ],
)
def test_every_field_the_encoder_writes_is_documented_with_its_type(
    measurement: str, specs: tuple[tuple[str, int, bool], ...], extra: dict[str, str]
) -> None:
    assert documented_fields(measurement) == {name: KINDS[kind] for name, kind, _ in specs} | extra


def test_example_lines_are_accepted_by_real_influxdb(influxdb: InfluxDBDatabase) -> None:
    examples = [line for line in re.findall(r"^(?:gpu|gpu_info|node|acoustic|trainer|probe|agent),.*$", SCHEMA, re.M)]
    assert len(examples) >= 8
    influxdb.write_lines(examples)
    (series,) = influxdb.query("SELECT count(power_w) FROM gpu")
    assert series.values[0][1] == 1
