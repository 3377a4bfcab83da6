"""The resolution policy: the aggregation maths, the windows (probes, triggers) and what a batch take ships."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuprobe.agent.batcher import Batcher
from gpuprobe.agent.metrics import Counters
from gpuprobe.agent.resolution import ResolutionPolicy, aggregate
from gpuprobe.agent.settings import AgentSettings
from gpuprobe.config import ConfigError
from gpuprobe.fields import GPU_FIELDS, Aggregate, GpuField
from gpuprobe.v1 import common_pb2, telemetry_pb2

S = 1_000_000_000
T0 = 1_700_000_000 * S  # a whole second


def tick(gpu: int, t_ns: int, **fields: Any) -> dict[str, Any]:
    return {"time_unix_ns": t_ns, "gpu_index": gpu, **fields}


def second_of_samples(gpu: int, start_ns: int, n: int = 10, **extra: Any) -> list[dict[str, Any]]:
    """``n`` ticks at 10 Hz with known values: power 100..100+n-1, util alternating 0/100."""
    return [
        tick(
            gpu,
            start_ns + i * S // 10,
            power_w=100.0 + i,
            util_pct=0.0 if i % 2 else 100.0,
            sm_clock_mhz=1000 + i,  # mean 1004.5 rounds to 1004 (banker's) or 1005: checked below
            energy_j=5000.0 + i,
            clock_event_reasons=[0x1, 0x4][i % 2],
            **extra,
        )
        for i in range(n)
    ]


def test_an_interval_of_samples_becomes_mean_min_max_last_and_counters_their_last_value() -> None:
    samples = second_of_samples(0, T0)
    samples[3]["ecc_corrected_volatile"] = 7  # a 1 Hz health read in one tick
    samples[4]["sm_active_pct"] = 40.0
    samples[8]["sm_active_pct"] = 60.0
    samples[9]["health"] = common_pb2.GPU_HEALTH_HEALTHY
    (agg,) = aggregate(samples, S)
    assert (agg.start_unix_ns, agg.interval_ms, agg.gpu_index, agg.sample_count) == (T0, 1000, 0, 10)
    assert agg.mean.power_w == pytest.approx(104.5)
    assert (agg.min.power_w, agg.max.power_w, agg.last.power_w) == (100.0, 109.0, 109.0)
    assert agg.mean.util_pct == 50.0 and agg.min.util_pct == 0.0 and agg.max.util_pct == 100.0
    assert agg.mean.sm_clock_mhz == round(1004.5), "integer fields: the mean rounded"
    assert (agg.min.sm_clock_mhz, agg.max.sm_clock_mhz, agg.last.sm_clock_mhz) == (1000, 1009, 1009)
    assert agg.mean.energy_j == 5009.0, "the energy counter travels as its last value"
    assert not agg.min.HasField("energy_j") and not agg.max.HasField("energy_j") and not agg.last.HasField("energy_j")
    assert agg.mean.ecc_corrected_volatile == 7
    assert agg.mean.sm_active_pct == 50.0 and not agg.max.HasField("sm_active_pct"), "GPM: the mean only"
    assert agg.mean.clock_event_reasons == 0x5, "clock reasons: OR over the interval"
    assert agg.last.clock_event_reasons == 0x4 and not agg.min.HasField("clock_event_reasons")
    assert agg.mean.health == common_pb2.GPU_HEALTH_HEALTHY
    assert not agg.mean.HasField("temp_c") and not agg.min.HasField("temp_c"), "absent stays absent, never 0"


def two_readings(f: GpuField) -> tuple[Any, Any]:
    """Two different values of a field, in GpuSample's types (the health verdict is an enum)."""
    if f.name == "health":
        return common_pb2.GPU_HEALTH_DEGRADED, common_pb2.GPU_HEALTH_HEALTHY
    return {"float": (1.0, 4.0), "integer": (1, 2), "boolean": (True, False), "string": ("a", "b")}[f.type]


def test_every_field_aggregates_as_the_field_catalogue_says() -> None:
    """Each GpuSample field, from two readings: a gauge as its mean (integers rounded), min, max and last;
    an average as its mean only; a last field as its last value, in `mean`; a bitmask as the OR and last."""
    first = tick(0, T0, **{f.name: two_readings(f)[0] for f in GPU_FIELDS})
    second = tick(0, T0 + S // 10, **{f.name: two_readings(f)[1] for f in GPU_FIELDS})
    (agg,) = aggregate([first, second], S)
    for f in GPU_FIELDS:
        a, b = two_readings(f)
        if f.aggregate is Aggregate.LAST:
            expected = {"mean": b}
        elif f.aggregate is Aggregate.BITMASK:
            expected = {"mean": a | b, "last": b}
        else:
            mean = (a + b) / 2 if f.type == "float" else round((a + b) / 2)
            both = {"mean": mean, "min": min(a, b), "max": max(a, b), "last": b}
            expected = both if f.aggregate is Aggregate.GAUGE else {"mean": mean}
        got = {
            role: value
            for role in ("mean", "min", "max", "last")
            for fd, value in getattr(agg, role).ListFields()
            if fd.name == f.name
        }
        assert got == expected, f.name


def test_aggregates_are_per_gpu_and_aligned_interval_ordered_by_time() -> None:
    samples = second_of_samples(1, T0 + S // 2, n=10) + second_of_samples(0, T0, n=20)
    aggs = aggregate(samples, S)
    assert [(a.start_unix_ns, a.gpu_index, a.sample_count) for a in aggs] == [
        (T0, 0, 10),
        (T0, 1, 5),
        (T0 + S, 0, 10),
        (T0 + S, 1, 5),
    ]
    two_s = aggregate(second_of_samples(0, T0, n=30), 2 * S)
    assert [(a.start_unix_ns, a.interval_ms, a.sample_count) for a in two_s] == [(T0, 2000, 20), (T0 + 2 * S, 2000, 10)]


def test_outside_windows_only_complete_intervals_leave_and_the_raw_samples_are_recorded() -> None:
    policy = ResolutionPolicy("auto", 1.0, hires_after_s=30, flight_recorder_s=60)
    first = second_of_samples(0, T0, n=15)  # 1.5 s: the second interval is still open
    d = policy.take(first, [], [], now_ns=T0 + 15 * S // 10)
    assert not d.hires and not d.raw and d.promote_since_ns is None
    assert [(a.start_unix_ns, a.sample_count) for a in d.aggregates] == [(T0, 10)]
    assert d.recorded == first, "every raw sample goes to the flight recorder"
    assert policy.pending == 5
    rest = second_of_samples(0, T0 + 15 * S // 10, n=5)
    d = policy.take(rest, [], [], now_ns=T0 + 2 * S)
    assert not d.aggregates and policy.pending == 10, "the interval is one aggregate: it waits until it is complete"
    d = policy.take([], [], [], now_ns=T0 + 3 * S)
    assert [(a.start_unix_ns, a.sample_count) for a in d.aggregates] == [(T0 + S, 10)], (
        "a GPU that stops answering: its last interval leaves an interval after its end"
    )
    policy.take(second_of_samples(0, T0 + 3 * S, n=4), [], [], now_ns=T0 + 3 * S + S // 2)
    d = policy.take([], [], [], now_ns=T0 + 3 * S + S // 2, final=True)
    assert [a.sample_count for a in d.aggregates] == [4], "on stop the open interval leaves as it is"


def test_a_thermal_slowdown_opens_a_window_that_promotes_the_recorder_and_ends_after_hires_after() -> None:
    policy = ResolutionPolicy("auto", 1.0, hires_after_s=30, flight_recorder_s=60)
    policy.take(second_of_samples(0, T0, n=15), [], [], now_ns=T0 + 15 * S // 10)
    hot = second_of_samples(0, T0 + 15 * S // 10, n=10)
    hot[6]["clock_event_reasons"] = 0x20 | 0x1  # SW thermal slowdown
    now = T0 + 25 * S // 10
    d = policy.take(hot, [], [], now_ns=now)
    assert d.hires and d.raw == hot, "from the batch with the trigger on, every sample ships"
    assert d.promote_since_ns == now - 60 * S, "the flight recorder's last 60 s are shipped"
    assert [a.sample_count for a in d.aggregates] == [5], "the interval begun before the window is aggregated"
    assert not d.recorded
    trigger_ns = hot[6]["time_unix_ns"]
    d = policy.take(second_of_samples(0, now, n=10), [], [], now_ns=now + S)
    assert d.hires and d.promote_since_ns is None, "the recorder is promoted once per window"
    late = second_of_samples(0, trigger_ns + 30 * S, n=10)  # 32.1 .. 33.0 s after T0
    d = policy.take(late, [], [], now_ns=trigger_ns + 31 * S)
    assert not d.hires, "30 s after the trigger without another one the window is closed"
    assert d.raw == late[:9], "the rest of the second in which it closed still ships raw"
    d = policy.take(second_of_samples(0, trigger_ns + 31 * S, n=10), [], [], now_ns=trigger_ns + 32 * S)
    assert not d.raw and [a.start_unix_ns for a in d.aggregates] == [T0 + 33 * S], "then aggregates again"


@pytest.mark.parametrize("bit", [0x8, 0x20, 0x40, 0x80])
def test_each_slowdown_bit_is_a_trigger_and_power_cap_or_idle_is_not(bit: int) -> None:
    policy = ResolutionPolicy("auto", 1.0, hires_after_s=10, flight_recorder_s=0)
    quiet = [tick(0, T0, clock_event_reasons=0x1 | 0x4 | 0x2 | 0x10 | 0x100)]
    assert not policy.take(quiet, [], [], now_ns=T0 + S).hires
    d = policy.take([tick(0, T0 + S, clock_event_reasons=bit)], [], [], now_ns=T0 + S)
    assert d.hires and d.promote_since_ns is None, "no promotion when the recorder is off"


def test_fault_events_open_a_window_and_a_recovery_or_clock_change_does_not() -> None:
    policy = ResolutionPolicy("auto", 1.0, hires_after_s=10, flight_recorder_s=5)
    harmless = [
        telemetry_pb2.GpuEvent(time_unix_ns=T0, gpu_index=0, kind=telemetry_pb2.GPU_EVENT_KIND_RECOVERED),
        telemetry_pb2.GpuEvent(time_unix_ns=T0, gpu_index=0, kind=telemetry_pb2.GPU_EVENT_KIND_CLOCK_CHANGE),
    ]
    assert not policy.take([], harmless, [], now_ns=T0).hires
    xid = telemetry_pb2.GpuEvent(time_unix_ns=T0 + S, gpu_index=0, kind=telemetry_pb2.GPU_EVENT_KIND_XID)
    d = policy.take([], [xid], [], now_ns=T0 + S)
    assert d.hires and d.promote_since_ns == T0 + S - 5 * S
    assert policy.hires(T0 + 10 * S) and not policy.hires(T0 + 11 * S)


def test_a_probe_is_at_full_resolution_from_its_start_to_its_end() -> None:
    policy = ResolutionPolicy("auto", 1.0, hires_after_s=0, flight_recorder_s=60)

    def event(kind: int, probe: str = "p-1") -> telemetry_pb2.ProbeEvent:
        return telemetry_pb2.ProbeEvent(time_unix_ns=T0, probe_id=probe, kind=kind)  # type: ignore[arg-type]

    assert policy.take([], [], [event(telemetry_pb2.PROBE_EVENT_KIND_START)], now_ns=T0).promote_since_ns == T0 - 60 * S
    assert policy.take(second_of_samples(0, T0), [], [], now_ns=T0 + 10 * S).hires, "a probe has no time limit"
    assert policy.take([], [], [event(telemetry_pb2.PROBE_EVENT_KIND_PHASE_CHANGE, "p-2")], now_ns=T0).hires
    assert policy.take([], [], [event(telemetry_pb2.PROBE_EVENT_KIND_END)], now_ns=T0).hires, "p-2 still runs"
    assert not policy.take([], [], [event(telemetry_pb2.PROBE_EVENT_KIND_END, "p-2")], now_ns=T0).hires


def test_a_probe_on_several_gpus_ends_when_the_last_of_them_ends() -> None:
    """A study on a node's two GPUs whose trainers end seconds apart (one lagging on a busy machine): the
    slower GPU's last steady window stays raw to its end. GPU 1's end used to close the window for the
    whole node, so GPU 0's last seconds went out as 1 s aggregates, which a study then read as readings
    (the way one GPU's last point can come out high in power: issue 28)."""
    policy = ResolutionPolicy("auto", 1.0, hires_after_s=0, flight_recorder_s=60)

    def event(kind: int, gpu: int, t_ns: int = T0) -> telemetry_pb2.ProbeEvent:
        return telemetry_pb2.ProbeEvent(time_unix_ns=t_ns, probe_id="s-1", kind=kind, gpu_index=gpu)  # type: ignore[arg-type]

    starts = [event(telemetry_pb2.PROBE_EVENT_KIND_START, gpu) for gpu in (0, 1)]
    assert policy.take(second_of_samples(0, T0) + second_of_samples(1, T0), [], starts, now_ns=T0 + S).hires
    gpu1_done = event(telemetry_pb2.PROBE_EVENT_KIND_END, 1, T0 + S)
    d = policy.take(second_of_samples(0, T0 + S), [], [gpu1_done], now_ns=T0 + 2 * S)
    assert d.hires and d.raw == second_of_samples(0, T0 + S) and not d.aggregates, "GPU 0 is still running"
    gpu0_done = event(telemetry_pb2.PROBE_EVENT_KIND_END, 0, T0 + 2 * S)
    assert not policy.take(second_of_samples(0, T0 + 2 * S), [], [gpu0_done], now_ns=T0 + 3 * S).hires
    # an end of a GPU the probe never ran on ends nothing
    assert policy.take([], [], [event(telemetry_pb2.PROBE_EVENT_KIND_START, 0)], now_ns=T0 + 4 * S).hires
    assert policy.take([], [], [event(telemetry_pb2.PROBE_EVENT_KIND_END, 3)], now_ns=T0 + 4 * S).hires


def test_the_batch_that_closes_a_probe_ships_its_samples_up_to_the_end_raw() -> None:
    """The probe's last samples share a batch with its end event: they stay raw (a fit of the probe must
    not meet an aggregate inside its window, whose mean of whole degrees is not a reading); the samples
    after the end start the aggregates. Seen as a 12 % R_th error in the demo's fit before this."""
    policy = ResolutionPolicy("auto", 1.0, hires_after_s=0, flight_recorder_s=60)
    start = telemetry_pb2.ProbeEvent(time_unix_ns=T0, probe_id="p-1", kind=telemetry_pb2.PROBE_EVENT_KIND_START)
    assert policy.take(second_of_samples(0, T0), [], [start], now_ns=T0 + S).hires
    batch = second_of_samples(0, T0 + S, n=15)  # 1.0 .. 2.4 s
    end_ns = batch[6]["time_unix_ns"]  # 1.6 s
    end = telemetry_pb2.ProbeEvent(time_unix_ns=end_ns, probe_id="p-1", kind=telemetry_pb2.PROBE_EVENT_KIND_END)
    d = policy.take(batch, [], [end], now_ns=T0 + 25 * S // 10)
    assert not d.hires
    # an aggregate of 1.7-1.9 s would be stamped 1.0 s, inside the probe: its second ships raw to the end
    assert d.raw == batch[:10], "every sample up to the end event, and the rest of its second, ships raw"
    assert d.recorded == batch[10:] and not d.aggregates and policy.pending == 5, "the next second waits"
    d = policy.take(second_of_samples(0, T0 + 25 * S // 10, n=10), [], [], now_ns=T0 + 35 * S // 10)
    assert not d.raw and [a.sample_count for a in d.aggregates] == [10], "then aggregates, from 2.0 s"
    assert d.aggregates[0].start_unix_ns == T0 + 2 * S


def test_full_resolution_ships_every_sample_and_records_nothing() -> None:
    policy = ResolutionPolicy("full")
    samples = second_of_samples(0, T0)
    d = policy.take(samples, [], [], now_ns=T0 + S)
    assert d.raw == samples and not d.aggregates and not d.recorded and policy.pending == 0


def test_the_batcher_ships_aggregates_and_other_samples_and_hands_the_raw_ones_to_the_recorder() -> None:
    info = common_pb2.GpuInfo(index=0, uuid="GPU-0", name="Sim")
    batcher = Batcher("a", lambda: [info], Counters(), policy=ResolutionPolicy("auto", 1.0, 30, 60))
    batcher.add_gpu(second_of_samples(0, T0, n=10))
    batcher.add_node(telemetry_pb2.NodeSample(time_unix_ns=T0, cpu_pct=3.0))
    taken = batcher.take(final=True)
    assert taken is not None and taken.batch is not None and taken.recorded is not None
    assert not taken.batch.gpu_samples and len(taken.batch.gpu_aggregates) == 1
    assert len(taken.batch.node_samples) == 1 and taken.samples == 2, "an aggregate counts as one sample"
    assert [g.uuid for g in taken.batch.gpus] == ["GPU-0"] and len(taken.batch.gpu_info) == 1
    assert len(taken.recorded.gpu_samples) == 10 and taken.recorded_samples == 10
    assert [g.uuid for g in taken.recorded.gpus] == ["GPU-0"] and not taken.recorded.HasField("stats")
    assert batcher.take() is None


def settings_values(**overrides: Any) -> dict[str, Any]:
    from gpuprobe.agent.options import AGENT_OPTIONS

    values: dict[str, Any] = {o.name: o.default for o in AGENT_OPTIONS}
    values.update(collector=["127.0.0.1:7447"], host="node-1", cloud="none", instance_type="none")
    values.update(overrides)
    return values


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"aggregate_interval": 0.05}, "--aggregate-interval must be at least --interval"),
        ({"aggregate_interval": 1.0005}, "--aggregate-interval must be a whole number of milliseconds"),
        ({"hires_after": -1.0}, "--hires-after must not be negative"),
        ({"flight_recorder": -1.0}, "--flight-recorder must not be negative"),
    ],
)
def test_bad_resolution_options_are_refused_naming_the_option(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        AgentSettings.from_values(settings_values(**overrides))


def test_a_sampling_interval_longer_than_the_aggregate_needs_full_resolution() -> None:
    with pytest.raises(ConfigError, match=r"at least --interval \(2 s\).*--resolution full"):
        AgentSettings.from_values(settings_values(interval=2.0))
    assert AgentSettings.from_values(settings_values(interval=2.0, resolution="full")).resolution == "full"


def test_the_resolution_options_reach_the_settings(tmp_path: Path) -> None:
    s = AgentSettings.from_values(
        settings_values(spool=tmp_path, aggregate_interval=2.0, hires_after=60.0, flight_recorder=0.0)
    )
    assert (s.resolution, s.aggregate_interval_s, s.hires_after_s, s.flight_recorder_s) == ("auto", 2.0, 60.0, 0.0)
    assert "auto: 2 s aggregates" in s.describe() and "no flight recorder" in s.describe()
