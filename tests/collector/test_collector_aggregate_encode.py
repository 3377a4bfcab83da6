"""GPU aggregates (``SampleBatch.gpu_aggregates``): one ``gpu`` point per GPU and interval, tagged
``res``, with the mean under the raw field names and min/max/last suffixed; field types equal to
the raw points' (one measurement, so they must never conflict); bad aggregates refused with a clear
reason while the rest of the batch is stored; and through a real collector into the real InfluxDB."""

from __future__ import annotations

import asyncio
import math
import re
import time
from pathlib import Path

import pytest
from collector_helpers import collector_config, running, wait_until
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuprobe.app.loadgen import AgentSpec, SampleFactory, SyntheticAgent, aggregate
from gpuprobe.collector.encode import GPU_SPECS, StreamEncoder, resolution_tag
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
START_NS = NOW_NS // 10**9 * 10**9 - 10 * 10**9
IDENTITY = Identity(agent_id="a1", host="node-1", cluster="c1", virt="passthrough")
PREFIX = "gpu,cluster=c1,gpu=0,host=node-1,model=NVIDIA\\ H100,res=1s,uuid=GPU-1,virt=passthrough "
RAW_KINDS = {name: kind for name, kind, _ in GPU_SPECS}


def batch(*aggregates: telemetry_pb2.GpuAggregate, **more: object) -> telemetry_pb2.SampleBatch:
    return telemetry_pb2.SampleBatch(
        agent_id="a1",
        seq=7,
        created_unix_ns=NOW_NS,
        gpus=[telemetry_pb2.GpuRef(index=0, uuid="GPU-1", name="NVIDIA H100")],
        gpu_aggregates=aggregates,
        **more,  # type: ignore[arg-type]
    )


def one(**fields: object) -> telemetry_pb2.GpuAggregate:
    values: dict[str, object] = {"start_unix_ns": START_NS, "interval_ms": 1000, "gpu_index": 0, "sample_count": 10}
    values.update(fields)
    return telemetry_pb2.GpuAggregate(**values)  # type: ignore[arg-type]


def encode(b: telemetry_pb2.SampleBatch, limits: Limits | None = None):  # type: ignore[no-untyped-def]
    return StreamEncoder(IDENTITY, limits or Limits()).encode(b, NOW_NS)


def fields_of(line: str) -> dict[str, str]:
    body = re.split(r"(?<!\\) ", line, maxsplit=1)[1].rsplit(" ", 1)[0]  # string fields may hold spaces
    return dict(re.findall(r'(?:^|,)([a-z0-9_]+)=("(?:[^"\\]|\\.)*"|[^,]+)', body))


def test_an_aggregate_is_one_gpu_line_with_the_raw_tags_plus_res_and_suffixed_fields() -> None:
    agg = one(
        mean=telemetry_pb2.GpuSample(
            power_w=301.25, mem_used_bytes=1000, energy_j=5000.5, clock_event_reasons=0x5, sm_clock_mhz=1980
        ),
        min=telemetry_pb2.GpuSample(power_w=290.0, mem_used_bytes=900, sm_clock_mhz=1755),
        max=telemetry_pb2.GpuSample(power_w=312.5, mem_used_bytes=1100, sm_clock_mhz=1980),
        last=telemetry_pb2.GpuSample(power_w=300.0, clock_event_reasons=0x4),
    )
    encoded = encode(batch(agg))
    assert not encoded.problems
    assert encoded.lines.decode() == (
        f"{PREFIX}mem_used_bytes=1000i,power_w=301.25,energy_j=5000.5,sm_clock_mhz=1980i,clock_event_reasons=5i,"
        "mem_used_bytes_min=900i,power_w_min=290.0,sm_clock_mhz_min=1755i,"
        "mem_used_bytes_max=1100i,power_w_max=312.5,sm_clock_mhz_max=1980i,"
        f"power_w_last=300.0,clock_event_reasons_last=4i,samples=10i {START_NS}\n"
    )
    assert (encoded.line_count, encoded.sample_count) == (1, 1)


def test_the_tags_are_those_of_a_raw_point_of_the_same_gpu_plus_res() -> None:
    raw = telemetry_pb2.GpuSample(time_unix_ns=START_NS, gpu_index=0, power_w=1.0)
    agg = one(mean=telemetry_pb2.GpuSample(power_w=1.0))
    lines = encode(batch(agg, gpu_samples=[raw])).lines.decode().splitlines()
    raw_tags, agg_tags = (set(re.split(r"(?<!\\) ", line)[0].split(",")[1:]) for line in lines)
    assert agg_tags - raw_tags == {"res=1s"} and raw_tags <= agg_tags


@pytest.mark.parametrize(
    ("interval_ms", "tag"),
    [(1000, "1s"), (10_000, "10s"), (500, "500ms"), (1500, "1500ms"), (1, "1ms"), (60_000, "1m"),
     (90_000, "90s"), (300_000, "5m"), (3_600_000, "1h")],
)  # fmt: skip
def test_res_is_the_interval_in_its_largest_whole_unit(interval_ms: int, tag: str) -> None:
    assert resolution_tag(interval_ms) == tag
    lines = encode(batch(one(interval_ms=interval_ms, mean=telemetry_pb2.GpuSample(power_w=1.0)))).lines
    assert f",res={tag},".encode() in lines


def test_every_field_keeps_the_influxdb_type_of_the_raw_field_in_every_role() -> None:
    """Integers stay integers under every suffix: a float ``sm_clock_mhz_max`` next to an integer
    one would make InfluxDB refuse whole write requests (field type conflict)."""
    factory = SampleFactory(AgentSpec("node-1", gpus=1, fan=True))
    samples = [factory.gpu_sample(0, START_NS + k * 10**8) for k in range(10)]
    samples[3].ecc_corrected_volatile = 4
    samples[3].retired_pages_pending = False
    samples[3].health = common_pb2.GPU_HEALTH_HEALTHY
    agg = aggregate(samples, START_NS, 1000, 0)
    agg.mean.ecc_corrected_volatile = 4
    agg.mean.retired_pages_pending = False
    agg.last.health = common_pb2.GPU_HEALTH_HEALTHY
    (line,) = encode(batch(agg)).lines.decode().splitlines()
    fields = fields_of(line)
    assert fields.pop("samples") == "10i"
    kinds = {0: "float", 1: "integer", 2: "boolean"}
    seen = set()
    for key, text in fields.items():
        base = re.sub(r"_(min|max|last)$", "", key)
        kind = "string" if text.startswith('"') else "integer" if text.endswith("i") else "boolean"
        if kind == "boolean" and text not in ("true", "false"):
            kind = "float"
        expected = "string" if base in ("health", "health_reason") else kinds[RAW_KINDS[base]]
        assert kind == expected, key
        seen.add(key)
    # every per-tick field in all four roles, but the counter and the bitmask as the proto says
    assert {"power_w", "power_w_min", "power_w_max", "power_w_last", "fan_pct_last", "energy_j"} <= seen
    assert {"energy_j_min", "energy_j_max", "energy_j_last", "clock_event_reasons_min"}.isdisjoint(seen)
    assert {"ecc_corrected_volatile", "retired_pages_pending", "health_last"} <= seen


def test_bad_values_are_dropped_as_in_raw_samples_and_the_rest_of_the_point_is_kept() -> None:
    agg = one(
        mean=telemetry_pb2.GpuSample(power_w=math.nan, temp_c=60.0, mem_used_bytes=2**63, health_reason="a\nb"),
        max=telemetry_pb2.GpuSample(power_w=math.inf, temp_c=61.0),
    )
    raw = telemetry_pb2.GpuSample(time_unix_ns=START_NS, gpu_index=0, power_w=math.nan, temp_c=60.0)
    encoded = encode(batch(agg, gpu_samples=[raw]))
    agg_line = next(line for line in encoded.lines.decode().splitlines() if ",res=" in line)
    assert agg_line == f'{PREFIX}temp_c=60.0,temp_c_max=61.0,health_reason="a b",samples=10i {START_NS}'
    tally = encoded.problems.by_reason[NON_FINITE_VALUE]
    assert (tally.values, tally.samples) == (4, 0)  # the raw NaN, the mean's NaN and uint64, max's inf
    (rejection,) = encoded.problems.rejections()
    assert "is beyond the int64 range" in rejection.message or "is nan" in rejection.message


@pytest.mark.parametrize(
    ("change", "reason", "text"),
    [
        ({"interval_ms": 0}, MISSING_FIELD, "interval_ms 0 is not between 1 and 3600000"),
        ({"interval_ms": 3_600_001}, MISSING_FIELD, "interval_ms 3600001 is not between 1 and 3600000"),
        ({"sample_count": 0}, MISSING_FIELD, "sample_count is 0"),
        ({"gpu_index": 5}, UNKNOWN_GPU, "gpu index 5 is not in SampleBatch.gpus"),
        ({"start_unix_ns": 0}, TIMESTAMP_OUT_OF_RANGE, "is zero or negative"),
        ({"start_unix_ns": NOW_NS + 3600 * 10**9}, TIMESTAMP_OUT_OF_RANGE, "s in the future"),
        ({"mean": telemetry_pb2.GpuSample(power_w=math.nan)}, MISSING_FIELD, "no value that can be stored"),
        ({"mean": None}, MISSING_FIELD, "no value that can be stored"),
    ],
)
def test_an_invalid_aggregate_is_refused_with_its_reason_and_the_rest_of_the_batch_is_stored(
    change: dict[str, object], reason: int, text: str
) -> None:
    good = one(start_unix_ns=START_NS + 10**9, mean=telemetry_pb2.GpuSample(power_w=5.0))
    bad = one(mean=telemetry_pb2.GpuSample(power_w=7.0))
    for key, value in change.items():
        if value is None:
            bad.ClearField(key)
        elif isinstance(value, telemetry_pb2.GpuSample):
            getattr(bad, key).CopyFrom(value)
        else:
            setattr(bad, key, value)
    node = telemetry_pb2.NodeSample(time_unix_ns=START_NS, cpu_pct=3.0)
    encoded = encode(batch(bad, good, node_samples=[node]))
    lines = encoded.lines.decode().splitlines()
    assert lines == [f"{PREFIX}power_w=5.0,samples=10i {START_NS + 10**9}", f"node,{lines[1].split(',', 1)[1]}"]
    rejections = {r.reason: r for r in encoded.problems.rejections()}
    assert rejections[reason].rejected_samples == 1 and rejections[reason].seq == 7
    assert rejections[reason].message.startswith(f"gpu_aggregates[0] (gpu {bad.gpu_index}, start {bad.start_unix_ns})")
    assert text in rejections[reason].message


def test_hostile_strings_and_an_oversized_batch() -> None:
    limits = Limits(max_string_field_bytes=64)
    injected = one(
        mean=telemetry_pb2.GpuSample(power_w=1.0, health_reason='x\ngpu,host=evil power_w=1 1\n"' + "ü" * 5000),
        last=telemetry_pb2.GpuSample(health_reason="\\"),
    )
    (line,) = encode(batch(injected), limits).lines.decode().splitlines()
    fields = fields_of(line)
    assert fields["health_reason"].startswith('"x gpu,host=evil power_w=1 1 \\"ü')
    assert len(fields["health_reason"].encode()) <= 64 + 4 and fields["health_reason_last"] == '"\\\\"'
    # a uuid that would end the line refuses the GPU's aggregates, not the batch
    hostile_gpu = batch(one(mean=telemetry_pb2.GpuSample(power_w=1.0)))
    hostile_gpu.gpus.add(index=1, uuid="GPU-2\nnode,host=x a=1 1", name="x")
    hostile_gpu.gpu_aggregates.add().CopyFrom(one(gpu_index=1, mean=telemetry_pb2.GpuSample(power_w=2.0)))
    encoded = encode(hostile_gpu)
    assert encoded.lines.decode().count("\n") == 1 and encoded.problems.by_reason[INVALID_STRING].samples == 1
    # an hour of 1 s aggregates of 8 GPUs in one batch (28 800 points): every one written
    factory = SampleFactory(AgentSpec("node-1", gpus=8))
    big = factory.aggregate_batch(seconds=3600, samples_per_interval=1, end_ns=NOW_NS)
    encoded = StreamEncoder(IDENTITY, Limits()).encode(big, NOW_NS)
    assert not encoded.problems and encoded.line_count == encoded.sample_count == 8 * 3600
    starts = [int(line.rsplit(b" ", 1)[1]) for line in encoded.lines.splitlines()]
    assert len(set(zip(starts, range(len(starts)), strict=True))) == 28_800 and min(starts) % 10**9 == 0


def test_aggregates_are_stored_and_queryable_through_a_real_collector(
    influxdb: InfluxDBDatabase, tmp_path: Path
) -> None:
    spec = AgentSpec("node-agg", gpus=2)

    async def scenario() -> SyntheticAgent:
        async with running(collector_config(tmp_path, influxdb.server.url, influxdb.name)) as collector:
            agent = SyntheticAgent(f"127.0.0.1:{collector.port}", spec, window=2)
            task = asyncio.create_task(agent.run())
            sent = agent.factory.aggregate_batch(seconds=3)
            sent.gpu_samples.extend(agent.factory.batch(samples_per_gpu=2).gpu_samples)
            agent.enqueue(sent)
            await agent.close()
            await task
            await wait_until(lambda: collector.wal.depth_lines == 0, 30, "the WAL to drain")
            assert collector.metrics.value("gpuprobe_collector_samples_received_total") == 6 + 4
            agent.factory_sent = sent  # type: ignore[attr-defined]
            return agent

    agent = asyncio.run(scenario())
    assert not agent.errors and not agent.rejections
    sent: telemetry_pb2.SampleBatch = agent.factory_sent  # type: ignore[attr-defined]
    by_gpu = {g: [a for a in sent.gpu_aggregates if a.gpu_index == g] for g in (0, 1)}
    series = influxdb.query(
        "SELECT mean(power_w), max(power_w_max), sum(samples), count(energy_j) FROM gpu WHERE res = '1s' GROUP BY gpu"
    )
    got = {s.tags["gpu"]: s.values[0][1:] for s in series}
    for g, aggs in by_gpu.items():
        assert got[str(g)] == pytest.approx(
            [sum(a.mean.power_w for a in aggs) / 3, max(a.max.power_w for a in aggs), 30, 3]
        )
    # the raw points alone, and the integer field types InfluxDB recorded for the suffixed fields
    (raw,) = influxdb.query("SELECT count(power_w) FROM gpu WHERE res = ''")
    assert raw.values[0][1] == 4
    (keys,) = influxdb.query("SHOW FIELD KEYS FROM gpu")
    types = dict(keys.values)
    assert types["sm_clock_mhz_max"] == types["sm_clock_mhz"] == "integer" and types["samples"] == "integer"
    assert types["power_w_last"] == "float"


# --- docs/schema.md ---------------------------------------------------------------------------------

SCHEMA = (Path(__file__).resolve().parents[2] / "docs" / "schema.md").read_text()


def aggregate_section() -> str:
    match = re.search(r"^## Aggregated GPU points \(`res` tag\).*?(?=^## )", SCHEMA, re.S | re.M)
    assert match
    return match.group(0)


def test_the_schema_documents_the_suffixes_and_the_res_spellings_the_encoder_uses() -> None:
    section = aggregate_section()
    documented = re.findall(r"^\| `([a-z_<>]+)` \| `?([a-z_]+)`? \|", section, re.M)
    assert documented == [
        ("<field>", "mean"),
        ("<field>_min", "min"),
        ("<field>_max", "max"),
        ("<field>_last", "last"),
        ("samples", "sample_count"),
    ]
    for tag, ms in (("1s", 1000), ("10s", 10_000), ("1m", 60_000), ("1h", 3_600_000), ("500ms", 500)):
        assert f"`{tag}`" in section and resolution_tag(ms) == tag


def test_the_schema_example_aggregate_is_accepted_and_typed_like_the_raw_fields(influxdb: InfluxDBDatabase) -> None:
    (line,) = re.findall(r"^gpu,.*$", aggregate_section(), re.M)
    assert ",res=1s," in line
    for key, text in fields_of(line).items():
        base = re.sub(r"_(min|max|last)$", "", key)
        kind = "integer" if text.endswith("i") else "float"
        assert kind == ("integer" if key == "samples" else {0: "float", 1: "integer"}[RAW_KINDS[base]]), key
    influxdb.write_lines([line])
    (series,) = influxdb.query("SELECT max(power_w_max), sum(samples) FROM gpu WHERE res = '1s'")
    assert list(series.values[0][1:]) == [671.0, 10]


# --- the fast path writes what the exact path writes ----------------------------------------------------

FIELD_VALUES = {
    0: st.one_of(
        st.floats(allow_nan=False, allow_infinity=False, width=64), st.sampled_from([0.0, -0.0, 1e-300, 1e300, 650.25])
    ),
    1: st.one_of(st.integers(0, 2**32 - 1), st.sampled_from([0, 2**63 - 1])),
    2: st.booleans(),
}
# values a point cannot hold (dropped and reported, on either path)
BAD_VALUES = {0: st.sampled_from([math.nan, math.inf, -math.inf]), 1: st.sampled_from([2**63, 2**64 - 1])}


@st.composite
def gpu_samples(draw: st.DrawFn, clean: bool) -> telemetry_pb2.GpuSample:
    sample = telemetry_pb2.GpuSample()
    for name, kind, _ in draw(st.lists(st.sampled_from(GPU_SPECS), max_size=12, unique=True)):
        bad = not clean and kind in BAD_VALUES and draw(st.booleans())
        value = draw(BAD_VALUES[kind] if bad else FIELD_VALUES[kind])
        fd = telemetry_pb2.GpuSample.DESCRIPTOR.fields_by_name[name]
        if fd.type == fd.TYPE_UINT32:
            value = value % 2**32
        setattr(sample, name, value)
    if draw(st.booleans()):
        sample.health = draw(st.sampled_from([0, 1, 2, 3]))  # type: ignore[assignment]
    sample.health_reason = draw(st.sampled_from(["", "XID 79", "a\nb", 'q"\\']))
    if draw(st.booleans()):
        sample.time_unix_ns, sample.gpu_index = 5, 1  # not fields: ignored
    return sample


@st.composite
def aggregates(draw: st.DrawFn, valid: bool) -> telemetry_pb2.GpuAggregate:
    agg = telemetry_pb2.GpuAggregate(
        start_unix_ns=START_NS + draw(st.integers(0, 5)) * 10**9,
        interval_ms=draw(st.sampled_from([1000, 500, 10_000]) if valid else st.sampled_from([0, 1000, 3_600_001])),
        gpu_index=draw(st.sampled_from([0, 1] if valid else [0, 1, 9])),
        sample_count=draw(st.integers(1, 20) if valid else st.integers(0, 2)),
    )
    for role in ("mean", "min", "max", "last"):
        if draw(st.booleans()):
            getattr(agg, role).CopyFrom(draw(gpu_samples(clean=valid)))
    return agg


def exact_lines(b: telemetry_pb2.SampleBatch) -> tuple[bytes, dict[int, tuple[str, int, int]]]:
    encoder = StreamEncoder(IDENTITY, Limits())
    problems = Problems(seq=b.seq)
    low, high = Limits().time_window_ns(NOW_NS)
    gpus = encoder._resolve_gpus(b.gpus)
    refs = {ref.index: ref for ref in b.gpus}
    out: list[bytes] = []
    for i, agg in enumerate(b.gpu_aggregates):
        encoder._encode_gpu_aggregate(i, agg, gpus, refs, low, high, problems, out)
    return b"".join(out), {r: (t.first_message, t.values, t.samples) for r, t in problems.by_reason.items()}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(aggregates(valid=True), max_size=8), st.lists(aggregates(valid=False), max_size=3))
def test_the_fast_path_writes_exactly_what_the_exact_path_writes(
    good: list[telemetry_pb2.GpuAggregate], bad: list[telemetry_pb2.GpuAggregate]
) -> None:
    for aggs in (good, good + bad):
        b = batch(*aggs)
        b.gpus.add(index=1, uuid="GPU-2", name="NVIDIA L4")
        encoded = encode(b)
        lines, problems = exact_lines(b)
        assert encoded.lines == lines
        assert {r: (t.first_message, t.values, t.samples) for r, t in encoded.problems.by_reason.items()} == problems
        assert encoded.line_count == lines.count(b"\n")
    # and the fast path did apply where nothing had to be dropped
    b = batch(*good)
    b.gpus.add(index=1, uuid="GPU-2", name="NVIDIA L4")
    encoder = StreamEncoder(IDENTITY, Limits())
    low, high = Limits().time_window_ns(NOW_NS)
    fast = encoder._encode_gpu_aggregates_fast(
        b.gpu_aggregates, encoder._resolve_gpus(b.gpus), {r.index: r for r in b.gpus}, low, high
    )
    if not exact_lines(b)[1] and good:
        assert fast is not None and fast[0] == exact_lines(b)[0]
