"""The load generator's GPU aggregates follow the agent's rules (proto comment of ``GpuAggregate``):
the statistics of the readings they summarise, the counter's last value, the OR of the bitmask,
whole aligned intervals, and no interval sent twice."""

from __future__ import annotations

import pytest

from gpuprobe.app.loadgen import AgentSpec, SampleFactory, aggregate

NS = 1_000_000_000


def test_an_aggregate_holds_the_statistics_of_its_readings() -> None:
    factory = SampleFactory(AgentSpec("node-1", gpus=1, fan=True), seed=3)
    readings = [factory.gpu_sample(0, 100 * NS + k * NS // 10) for k in range(10)]
    agg = aggregate(readings, 100 * NS, 1000, 0)
    powers = [r.power_w for r in readings]
    assert agg.mean.power_w == pytest.approx(sum(powers) / 10)
    assert (agg.min.power_w, agg.max.power_w, agg.last.power_w) == (min(powers), max(powers), powers[-1])
    assert agg.mean.sm_clock_mhz == round(sum(r.sm_clock_mhz for r in readings) / 10)  # integers stay integers
    assert agg.mean.energy_j == readings[-1].energy_j and not agg.last.HasField("energy_j")
    reasons = 0
    for r in readings:
        reasons |= r.clock_event_reasons
    assert agg.mean.clock_event_reasons == reasons and not agg.min.HasField("clock_event_reasons")
    assert (agg.sample_count, agg.interval_ms, agg.start_unix_ns) == (10, 1000, 100 * NS)


def test_batches_cover_aligned_intervals_once() -> None:
    factory = SampleFactory(AgentSpec("node-1", gpus=2))
    first = factory.aggregate_batch(seconds=3, end_ns=1000 * NS + 400_000_000)
    assert [a.start_unix_ns for a in first.gpu_aggregates] == [s * NS for s in (997, 997, 998, 998, 999, 999)]
    assert [a.gpu_index for a in first.gpu_aggregates] == [0, 1] * 3
    again = factory.aggregate_batch(seconds=3, end_ns=1001 * NS)
    assert [a.start_unix_ns for a in again.gpu_aggregates] == [1000 * NS] * 2
    with pytest.raises(ValueError, match="at least 1"):
        factory.aggregate_batch(interval_ms=0)
