"""The field catalogue (gpuprobe/fields.py) is what the proto's GpuSample carries and what docs/schema.md's
``gpu`` tables and rollup table say: every field classified once, none invented, none undocumented."""

from __future__ import annotations

import re
from pathlib import Path

from google.protobuf.descriptor import FieldDescriptor

from gpuprobe.fields import GPU_FIELDS, Aggregate, GpuField
from gpuprobe.influx.retention import GPU_10S
from gpuprobe.v1 import telemetry_pb2

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = (ROOT / "docs" / "schema.md").read_text(encoding="utf-8")
PROTO = (ROOT / "proto" / "gpuprobe" / "v1" / "telemetry.proto").read_text(encoding="utf-8")
NOT_FIELDS = ("time_unix_ns", "gpu_index")  # the point's time and its `gpu` tag


def influx_type(fd: FieldDescriptor) -> str:
    """The InfluxDB type the collector writes a GpuSample field as (an enum as its name)."""
    if fd.type in (fd.TYPE_DOUBLE, fd.TYPE_FLOAT):
        return "float"
    if fd.type == fd.TYPE_BOOL:
        return "boolean"
    if fd.type in (fd.TYPE_STRING, fd.TYPE_ENUM):
        return "string"
    return "integer"


def test_the_catalogue_is_gpu_sample_field_for_field_with_the_proto_types() -> None:
    fields = [fd for fd in telemetry_pb2.GpuSample.DESCRIPTOR.fields if fd.name not in NOT_FIELDS]
    assert [f.name for f in GPU_FIELDS] == [fd.name for fd in fields]  # every field, none invented, in order
    assert [f.type for f in GPU_FIELDS] == [influx_type(fd) for fd in fields]


def test_the_health_fields_are_those_the_proto_declares_as_read_once_per_health_interval() -> None:
    message = re.search(r"^message GpuSample \{(.*?)^\}", PROTO, re.S | re.M)
    assert message
    per_tick, marker, health = message.group(1).partition("// The health fields below are read at most once")
    assert marker

    def declared(text: str) -> list[str]:
        return [n for n in re.findall(r"^\s+(?:optional )?\w+ (\w+) = \d+;", text, re.M) if n not in NOT_FIELDS]

    assert [f.name for f in GPU_FIELDS if not f.health] == declared(per_tick)
    assert [f.name for f in GPU_FIELDS if f.health] == declared(health)


def schema_section(heading: str) -> str:
    match = re.search(rf"^## {re.escape(heading)}.*?(?=^## )", SCHEMA, re.S | re.M)
    assert match, heading
    return match.group(0)


def test_the_schemas_gpu_tables_are_the_catalogue() -> None:
    """Name, type, unit and aggregate of every field, the per-tick table first, then the health fields."""
    section = schema_section("`gpu`")
    per_tick, marker, health = section.partition("**Health fields.**")
    assert marker
    row = re.compile(r"^\| `([a-z0-9_]+)` \| (\w+) \| ([^|]+?) \| (\w+) \|", re.M)

    def catalogue(fields: list[GpuField]) -> list[tuple[str, ...]]:
        return [(f.name, f.type, f.unit, f.aggregate.value) for f in fields]

    assert row.findall(per_tick) == catalogue([f for f in GPU_FIELDS if not f.health])
    assert row.findall(health) == catalogue([f for f in GPU_FIELDS if f.health])


def test_the_schemas_rollup_table_is_the_catalogues_rollups() -> None:
    """Every ``gpu`` row of the rollup table, in order, with the type InfluxDB gives a rollup field (a
    mean is a float, a count an integer, the rest keep the raw field's type) and its aggregate."""
    rows = re.findall(r"^\| `gpu` \| `([a-z0-9_]+)` \| (\w+) \| (.+) \|$", schema_section("Rollups"), re.M)
    types = {f.name: f.type for f in GPU_FIELDS}

    def rollup_type(aggregate: str, raw: str) -> str:
        return "integer" if aggregate == "count" else "float" if aggregate == "mean" else types[raw]

    assert [(name, kind) for name, kind, _ in rows] == [(name, rollup_type(agg, raw)) for name, agg, raw in GPU_10S]
    for (name, _, value), (_, agg, raw) in zip(rows, GPU_10S, strict=True):
        assert value.startswith(agg) or f'`{agg}("{raw}")`' in value, name


def test_the_catalogues_own_rules() -> None:
    for f in GPU_FIELDS:
        assert set(f.rollup) <= {"mean", "min", "max", "last"}, f.name
        assert not f.rollup[1:] or set(f.rollup[1:]) <= {"min", "max"}, f.name
        # the agent's aggregates roll up by their own `_min`/`_max` fields, which only gauges carry
        assert len(f.rollup) <= 1 or f.aggregate is Aggregate.GAUGE, f.name
        assert not (f.health and f.rollup), f"{f.name}: the health fields are not rolled up"
        assert f.aggregate is not Aggregate.BITMASK or f.integer, f.name
        assert f.aggregate is not Aggregate.AVERAGE or f.type == "float", f.name
        assert f.aggregate in (Aggregate.LAST,) or f.type in ("float", "integer"), f"{f.name}: no mean of a {f.type}"
