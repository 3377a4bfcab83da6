"""Line protocol: exact escaping, the fast path equals the exact one, no injection, and a property
test through the real InfluxDB: what is sent reads back exactly, or is refused with a clear reason."""

from __future__ import annotations

import itertools
import math
import re
import time

import grpc
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpuprobe.collector.encode import GPU_HEALTH_FIELDS, GPU_SPECS, StreamEncoder
from gpuprobe.devservices import InfluxDBDatabase
from gpuprobe.influx.lineprotocol import (
    UnrepresentableError,
    encode_line,
    escape_measurement,
    escape_tag_value,
    field_text,
    quote_string_field,
)
from gpuprobe.influx.storable import tag_value_problem
from gpuprobe.v1 import common_pb2, telemetry_pb2
from gpuprobe.wire.validate import (
    INVALID_STRING,
    Identity,
    Limits,
    StreamError,
    check_hello,
    clean_string_field,
)

NOW_NS = time.time_ns()
IDENTITY = Identity(agent_id="a1", host="node-1", cluster="c1", virt="passthrough")


def one_gpu_batch(
    *samples: telemetry_pb2.GpuSample, name: str = "NVIDIA H100", uuid: str = "GPU-1"
) -> telemetry_pb2.SampleBatch:
    return telemetry_pb2.SampleBatch(
        agent_id="a1",
        seq=1,
        created_unix_ns=NOW_NS,
        gpus=[telemetry_pb2.GpuRef(index=0, uuid=uuid, name=name)],
        gpu_samples=samples,
    )


# --- exact escaping -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "escaped"),
    [
        ("plain", "plain"),
        ("a,b", "a\\,b"),
        ("a b", "a\\ b"),
        ("a=b", "a\\=b"),
        ('say "hi"', 'say\\ "hi"'),
        ("a\\b", "a\\b"),  # inner backslashes stay as they are (InfluxDB reads them back as one)
        ("a\\,b", "a\\\\,b"),
        ("😀 ü", "😀\\ ü"),
    ],
)
def test_tag_values_escape_commas_spaces_and_equals_signs(value: str, escaped: str) -> None:
    assert escape_tag_value(value) == escaped


@pytest.mark.parametrize(
    "value", ["two\nlines", "cr\r", "tab\t", "nul\x00", "del\x7f", "c1\x85", "trailing\\", "", "\ud800"]
)
def test_tag_values_that_line_protocol_cannot_carry_are_refused_not_mangled(value: str) -> None:
    with pytest.raises(UnrepresentableError):
        escape_tag_value(value)
    assert tag_value_problem(value, 256) is not None


def test_measurement_field_and_string_escaping() -> None:
    assert escape_measurement("gpu stats,x") == "gpu\\ stats\\,x"
    assert quote_string_field('a "b" \\c') == '"a \\"b\\" \\\\c"'
    with pytest.raises(UnrepresentableError):
        quote_string_field("line\nbreak")


def test_field_values_floats_round_trip_integers_get_i_booleans_and_no_nan() -> None:
    assert field_text(0.1) == "0.1"
    assert float(field_text(1e16)) == 1e16
    assert float(field_text(5e-324)) == 5e-324
    assert field_text(2**63 - 1) == "9223372036854775807i"
    assert field_text(True) == "true"
    for bad in (math.nan, math.inf, -math.inf, 2**63):
        with pytest.raises(UnrepresentableError):
            field_text(bad)


def test_gpu_line_carries_identity_and_gpu_tags_sorted() -> None:
    sample = telemetry_pb2.GpuSample(time_unix_ns=NOW_NS, gpu_index=0, power_w=251.5, sm_clock_mhz=1980)
    encoded = StreamEncoder(IDENTITY, Limits()).encode(one_gpu_batch(sample, name="NVIDIA H100 80GB HBM3"), NOW_NS)
    assert encoded.lines.decode() == (
        "gpu,cluster=c1,gpu=0,host=node-1,model=NVIDIA\\ H100\\ 80GB\\ HBM3,uuid=GPU-1,virt=passthrough "
        f"power_w=251.5,sm_clock_mhz=1980i {NOW_NS}\n"
    )


def test_a_gpu_held_by_a_pod_carries_its_pod_tags_on_its_points_and_only_then() -> None:
    """The agent names the pod that holds a GPU (kubelet pod-resources) in the batch's GPU reference:
    its readings and process points carry `pod`, `namespace`, `container`; a GPU without one has none,
    and a pod name that line protocol cannot carry refuses the GPU's samples instead of being mangled."""
    held = telemetry_pb2.GpuRef(index=0, uuid="GPU-0", name="L4", pod="train-0", namespace="ml", container="trainer")
    free = telemetry_pb2.GpuRef(index=1, uuid="GPU-1", name="L4")
    batch = telemetry_pb2.SampleBatch(
        agent_id="a1",
        seq=1,
        gpus=[held, free],
        gpu_samples=[telemetry_pb2.GpuSample(time_unix_ns=NOW_NS, gpu_index=i, power_w=70.0) for i in (0, 1)],
        process_samples=[telemetry_pb2.ProcessSample(time_unix_ns=NOW_NS, gpu_index=0, pid=42, command="python")],
    )
    lines = StreamEncoder(IDENTITY, Limits()).encode(batch, NOW_NS).lines.decode().splitlines()
    gpu0 = next(line for line in lines if line.startswith("gpu,") and ",gpu=0," in line)
    gpu1 = next(line for line in lines if line.startswith("gpu,") and ",gpu=1," in line)
    process = next(line for line in lines if line.startswith("gpu_process,"))
    for line in (gpu0, process):
        assert ",container=trainer," in line and ",namespace=ml," in line and ",pod=train-0," in line, line
    assert "pod=" not in gpu1 and "namespace=" not in gpu1 and "container=" not in gpu1
    bad = telemetry_pb2.SampleBatch()
    bad.CopyFrom(batch)
    bad.gpus[0].pod = "train\n0\x00"
    encoded = StreamEncoder(IDENTITY, Limits()).encode(bad, NOW_NS)
    assert not any(",gpu=0," in line for line in encoded.lines.decode().splitlines())
    assert any(r.reason == INVALID_STRING and "pod" in r.message for r in encoded.problems.rejections())


def test_absent_fields_are_not_written_and_zero_is_a_reading() -> None:
    sample = telemetry_pb2.GpuSample(time_unix_ns=NOW_NS, gpu_index=0, util_pct=0.0, clock_event_reasons=0)
    line = StreamEncoder(IDENTITY, Limits()).encode(one_gpu_batch(sample), NOW_NS).lines.decode()
    assert line.rsplit(" ", 2)[1] == "util_pct=0.0,clock_event_reasons=0i"
    assert "fan_pct" not in line and "power_w" not in line


# --- the fast path writes what the exact reference writes -------------------------------------------

finite = st.floats(allow_nan=False, allow_infinity=False)
GPU_VALUE = {
    name: (
        finite
        if kind == 0
        else st.booleans()
        if kind == 2
        else st.integers(0, 2**63 - 1)
        if name != "sm_clock_mhz" and name != "mem_clock_mhz"
        else st.integers(0, 2**32 - 1)
    )
    for name, kind, _ in GPU_SPECS
}
HEALTH_TEXT = {common_pb2.GPU_HEALTH_HEALTHY: "healthy", common_pb2.GPU_HEALTH_DEGRADED: "degraded"}
HEALTH_TEXT[common_pb2.GPU_HEALTH_FAILED] = "failed"


@st.composite
def gpu_samples(draw: st.DrawFn) -> telemetry_pb2.GpuSample:
    sample = telemetry_pb2.GpuSample(
        time_unix_ns=NOW_NS - draw(st.integers(0, 10**12)), gpu_index=draw(st.integers(0, 3))
    )
    # the health fields (read once per health interval) in about one sample of four
    health = draw(st.integers(0, 3)) == 0
    for name, strategy in GPU_VALUE.items():
        if name in GPU_HEALTH_FIELDS and not health:
            continue
        if draw(st.booleans()):
            setattr(sample, name, draw(st.one_of(strategy, st.just(0))))
    if health and draw(st.booleans()):
        sample.health = draw(st.sampled_from([0, 1, 2, 3]))  # type: ignore[assignment]
    if health and draw(st.booleans()):
        sample.health_reason = draw(st.sampled_from(["", "XID 79", 'remap "pending"\n']))
    return sample


@settings(max_examples=150, deadline=None)
@given(st.lists(gpu_samples(), min_size=1, max_size=12))
def test_fast_gpu_path_equals_the_exact_reference_encoder(samples: list[telemetry_pb2.GpuSample]) -> None:
    refs = [telemetry_pb2.GpuRef(index=i, uuid=f"GPU-{i}", name="L4 x") for i in range(4)]
    batch = telemetry_pb2.SampleBatch(agent_id="a1", seq=1, gpus=refs, gpu_samples=samples)
    got = StreamEncoder(IDENTITY, Limits()).encode(batch, NOW_NS)
    # given the StreamRequest it came in, the encoder finds the health samples from it: same text
    request = telemetry_pb2.StreamRequest(batch=batch).SerializeToString()
    assert StreamEncoder(IDENTITY, Limits()).encode(batch, NOW_NS, request).lines == got.lines
    expected: list[str] = []
    carrying: list[str] = []  # the lines of samples with health fields: written after the others
    for sample in samples:
        fields: dict[str, object] = {name: getattr(sample, name) for name, _, _ in GPU_SPECS if sample.HasField(name)}
        if sample.health in HEALTH_TEXT:
            fields["health"] = HEALTH_TEXT[sample.health]
        if sample.health_reason:
            fields["health_reason"] = sample.health_reason.replace("\n", " ")
        if fields:
            tags = dict(IDENTITY.tags(), gpu=str(sample.gpu_index), uuid=f"GPU-{sample.gpu_index}", model="L4 x")
            line = encode_line("gpu", tags, fields, sample.time_unix_ns)  # type: ignore[arg-type]
            has_health = sample.health_reason or any(
                sample.HasField(name) for name in GPU_HEALTH_FIELDS if name != "health_reason"
            )
            (carrying if has_health else expected).append(line)
    # (line order carries no meaning)
    assert got.lines.decode() == "".join(expected + carrying)


# --- no input injects a second point ----------------------------------------------------------------

SPECIAL = list(",= \"'\\\n\r\t#😀é\x00\x7f\u2028\u0085")
any_text = st.text(alphabet=st.one_of(st.sampled_from(SPECIAL), st.characters(codec="utf-8")), max_size=24)
LINE = re.compile(r"^(gpu|node|acoustic|trainer|probe|agent),[^\n]* [^\n]+ \d+$")


@settings(max_examples=300, deadline=None)
@given(uuid=any_text, model=any_text, workload=any_text, probe=any_text, message=any_text, sensor=any_text)
def test_no_string_from_an_agent_injects_a_second_point(
    uuid: str, model: str, workload: str, probe: str, message: str, sensor: str
) -> None:
    batch = one_gpu_batch(telemetry_pb2.GpuSample(time_unix_ns=NOW_NS, gpu_index=0, temp_c=40.0), name=model, uuid=uuid)
    batch.node_samples.add(time_unix_ns=NOW_NS, cpu_pct=1.0, hwmon_temp_c={sensor: 50.0})
    batch.trainer_samples.add(
        time_unix_ns=NOW_NS, probe_id=probe, workload=workload, step=1, phase=common_pb2.PROBE_PHASE_STEADY
    )
    batch.probe_events.add(
        time_unix_ns=NOW_NS,
        probe_id=probe or "p",
        workload=workload or "w",
        kind=telemetry_pb2.PROBE_EVENT_KIND_START,
        phase=common_pb2.PROBE_PHASE_IDLE_BASELINE,
        status=common_pb2.PROBE_STATUS_RUNNING,
        message=message,
    )
    encoded = StreamEncoder(IDENTITY, Limits()).encode(batch, NOW_NS)
    lines = encoded.lines.decode().split("\n")
    assert lines[-1] == ""
    assert len(lines) - 1 == encoded.line_count <= 4  # gpu, node, trainer, probe: never more
    for line in lines[:-1]:
        assert LINE.match(line), line
    # what was refused says why
    if (tag_value_problem(model, 256) or tag_value_problem(uuid, 256)) and model and uuid:
        assert INVALID_STRING in encoded.problems.by_reason


HEALTH_LINE = re.compile(r"^(gpu|gpu_event|gpu_process|gpu_nvlink|gpu_mig),[^\n]* [^\n]+ \d+$")


@settings(max_examples=200, deadline=None)
@given(command=any_text, cgroup=any_text, text=any_text, reason=any_text, mig_uuid=any_text, mig_name=any_text)
def test_no_string_of_the_health_measurements_injects_a_second_point(
    command: str, cgroup: str, text: str, reason: str, mig_uuid: str, mig_name: str
) -> None:
    batch = one_gpu_batch(
        telemetry_pb2.GpuSample(time_unix_ns=NOW_NS, gpu_index=0, temp_c=40.0),
        telemetry_pb2.GpuSample(
            time_unix_ns=NOW_NS + 1, gpu_index=0, health=common_pb2.GPU_HEALTH_DEGRADED, health_reason=reason
        ),
    )
    batch.gpu_events.add(time_unix_ns=NOW_NS, gpu_index=0, kind=telemetry_pb2.GPU_EVENT_KIND_XID, data=79, text=text)
    batch.process_samples.add(time_unix_ns=NOW_NS, gpu_index=0, pid=7, command=command, cgroup=cgroup)
    batch.mig_samples.add(
        time_unix_ns=NOW_NS, gpu_index=0, gpu_instance_id=1, mig_uuid=mig_uuid, name=mig_name, mem_total_bytes=1
    )
    batch.nvlink_samples.add(time_unix_ns=NOW_NS, gpu_index=0, link=0, replay_errors=1)
    encoded = StreamEncoder(IDENTITY, Limits()).encode(batch, NOW_NS)
    lines = encoded.lines.decode().split("\n")
    assert lines[-1] == ""
    # gpu (2), gpu_event, gpu_process, gpu_nvlink always; gpu_mig unless its uuid cannot be a tag
    mig_refused = bool(mig_uuid) and tag_value_problem(mig_uuid, 256) is not None
    assert len(lines) - 1 == encoded.line_count == 6 - mig_refused
    assert encoded.sample_count == 6
    for line in lines[:-1]:
        assert HEALTH_LINE.match(line), line
    assert (INVALID_STRING in encoded.problems.by_reason) == mig_refused


# --- through the real InfluxDB ------------------------------------------------------------------------

_TIMES = itertools.count(NOW_NS - 10**12, 1000)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(cluster=any_text, model=any_text, message=any_text, power=finite)
@example(cluster="a,b c=d", model="q\"uote's 100%", message='say "hi" \\ back 5%s', power=1e-7)
@example(cluster="inner\\backslash", model="trailing\\", message="trailing\\", power=-0.0)
@example(cluster="new\nline", model="😀 emoji, ü", message="new\nline\r\n", power=1e300)
@example(cluster="=", model="\\,", message="", power=5e-324)
def test_arbitrary_unicode_reads_back_exactly_from_real_influxdb_or_is_refused_clearly(
    influxdb: InfluxDBDatabase, cluster: str, model: str, message: str, power: float
) -> None:
    hello = telemetry_pb2.Hello(identity=common_pb2.AgentIdentity(agent_id="a1", host="node-1", cluster=cluster))
    if cluster and tag_value_problem(cluster, 256):
        with pytest.raises(StreamError) as refused:
            check_hello(hello, Limits())
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "identity.cluster" in refused.value.message
        return
    identity = check_hello(hello, Limits())
    t = next(_TIMES)
    batch = one_gpu_batch(
        telemetry_pb2.GpuSample(time_unix_ns=t, gpu_index=0, temp_c=40.0, power_w=power), name=model, uuid="GPU-1"
    )
    batch.probe_events.add(
        time_unix_ns=t,
        probe_id="p1",
        workload="w",
        kind=telemetry_pb2.PROBE_EVENT_KIND_END,
        phase=common_pb2.PROBE_PHASE_DONE,
        status=common_pb2.PROBE_STATUS_FAILED,
        message=message,
    )
    encoded = StreamEncoder(identity, Limits()).encode(batch, t)
    model_problem = tag_value_problem(model, 256) if model else None
    if model_problem:
        (rejection,) = encoded.problems.rejections()
        assert rejection.reason == INVALID_STRING and "name" in rejection.message
        assert encoded.line_count == 1  # the probe event only
    influxdb.write_lines(encoded.lines)

    if not model_problem:
        (series,) = influxdb.query(f"SELECT * FROM gpu WHERE time = {t}")
        (row,) = series.rows()
        assert (row.get("cluster") or "") == cluster
        assert (row.get("model") or "") == model
        assert row["temp_c"] == 40
        assert float(row["power_w"]) == power  # (InfluxDB's JSON prints integral floats as integers)
    (series,) = influxdb.query(f"SELECT * FROM probe WHERE time = {t}")
    (row,) = series.rows()
    assert (row.get("message") or "") == clean_string_field(message, 4096)
    if not re.search("[\x00-\x1f\x7f-\x9f]", message):
        assert (row.get("message") or "") == message
    assert (row["kind"], row["phase"], row["status"]) == ("end", "done", "failed")
