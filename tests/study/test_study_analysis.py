"""The maths of the study report on plain data (gpuprobe.study.analysis): windows, window statistics,
grouping, cost, the Pareto frontier, the virtualization overhead, rankings and refusals."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from gpuprobe.model.thermal import window_steady_c
from gpuprobe.study.analysis import (
    Event,
    GroupKey,
    Measurement,
    Node,
    PointSpec,
    Refusal,
    StudyReport,
    WindowStats,
    analyze,
    cost_per_million_samples,
    make_groups,
    pareto_front,
    steady_windows,
    window_stats,
)

S = 10**9


# --- windows -------------------------------------------------------------------------------------


def ev(t_s: float, kind: str, phase: str = "", gpu: str = "0", point: int | None = None, host: str = "h") -> Event:
    return Event(t_ns=int(t_s * S), host=host, kind=kind, phase=phase, gpu=gpu, point=point)


def test_a_steady_window_ends_at_the_next_event_of_the_same_gpu() -> None:
    events = [
        ev(0, "start", "idle", "0"),
        ev(0.001, "start", "idle", "1"),
        ev(10, "phase_change", "steady", "0", 0),
        ev(12, "phase_change", "steady", "1", 0),
        ev(15, "point_refused", gpu="0", point=1),  # a refusal is no phase: the window goes on
        ev(20, "phase_change", "warmup", "1", 1),  # another GPU's event: not the end
        ev(30, "phase_change", "warmup", "0", 1),
        ev(31, "phase_change", "steady", "0", 1),
        ev(25, "phase_change", "steady", "1", 1),
        ev(40, "end", "done", ""),  # node-wide end (no gpu): ends every open window
    ]
    windows = {(w.gpu, w.point): (w.start_ns / S, w.end_ns / S, w.closed) for w in steady_windows(events)}
    assert windows == {
        ("0", 0): (10, 30, True),
        ("1", 0): (12, 20, True),
        ("0", 1): (31, 40, True),
        ("1", 1): (25, 40, True),
    }


def test_an_open_window_ends_at_the_last_trainer_report_or_is_left_out() -> None:
    events = [ev(10, "phase_change", "steady", "0", 0), ev(10, "phase_change", "steady", "1", 0, host="other")]
    (w,) = steady_windows(events, {("h", "0", 0): int(19.5 * S)})
    assert (w.host, w.end_ns, w.closed) == ("h", int(19.5 * S), False)
    assert steady_windows(events) == []


def test_windows_are_per_host() -> None:
    events = [ev(10, "phase_change", "steady", "0", 0, host="a"), ev(11, "phase_change", "warmup", "0", 1, host="b")]
    events.append(ev(20, "phase_change", "cooldown", "0", host="a"))
    (w,) = steady_windows(events)
    assert (w.host, w.start_ns, w.end_ns) == ("a", 10 * S, 20 * S)


# --- window statistics ---------------------------------------------------------------------------


def series(power: np.ndarray, dt_s: float = 0.1, counter: bool = True) -> dict[str, np.ndarray]:
    n = len(power)
    energy = 5e5 + np.concatenate([[0.0], np.cumsum(power[:-1] * dt_s)]) if counter else np.full(n, np.nan)
    return {
        "t_ns": np.arange(n, dtype=np.int64) * int(dt_s * S),
        "power_w": power,
        "energy_j": energy,
        "temp_c": np.linspace(40, 60, n),
        "power_limit_w": np.full(n, 300.0),
        "sm_clock_mhz": np.full(n, 1800.0),
    }


def stats_of(data: dict[str, np.ndarray], start_s: float, end_s: float) -> WindowStats:
    t = data["t_ns"]
    fields = {k: v for k, v in data.items() if k != "t_ns"}
    return window_stats(t, int(start_s * S), int(end_s * S), **fields)


def test_mean_power_is_the_counter_increase_over_the_window() -> None:
    power = np.where(np.arange(400) % 2 == 0, 210.0, 190.0)  # mean 200 W
    power[:100] = 50.0  # before the window: must not count
    s = stats_of(series(power), 10.0, 30.0)
    assert s.energy_source == "counter"
    assert s.mean_power_w == pytest.approx(200.0, rel=1e-9)
    assert s.energy_j == pytest.approx(4000.0, rel=1e-9)
    assert s.duration_s == 20.0
    assert s.gpu_samples == 200  # [start, end): the sample at the end belongs to the next phase
    assert s.peak_temp_c == pytest.approx(float(np.linspace(40, 60, 400)[299]))
    assert s.enforced_limit_w == 300.0 and s.sm_clock_mhz == 1800.0


def test_the_counter_is_interpolated_between_samples() -> None:
    power = np.full(400, 100.0)
    s = stats_of(series(power), 10.05, 20.05)
    assert s.mean_power_w == pytest.approx(100.0, rel=1e-9)


def test_a_counter_reset_is_bridged_with_the_power() -> None:
    data = series(np.full(400, 100.0))
    data["energy_j"][250:] -= data["energy_j"][250] - 3.0  # the driver reloaded: the counter restarts
    s = stats_of(data, 10.0, 30.0)
    assert s.energy_source == "counter" and s.counter_resets == 1
    assert s.mean_power_w == pytest.approx(100.0, rel=1e-6)


def test_without_a_counter_the_mean_power_reading_is_used() -> None:
    power = np.where(np.arange(400) % 2 == 0, 130.0, 110.0)
    s = stats_of(series(power, counter=False), 10.0, 30.0)
    assert s.energy_source == "power_w"
    assert s.mean_power_w == pytest.approx(120.0)
    assert s.energy_j == pytest.approx(2400.0)


def test_a_counter_that_does_not_reach_the_window_ends_is_not_used() -> None:
    data = series(np.full(400, 100.0))
    data["energy_j"][200:] = np.nan  # counter readings stop in the middle of the window
    s = stats_of(data, 10.0, 30.0)
    assert s.energy_source == "power_w" and s.mean_power_w == 100.0


def test_no_samples_no_figures() -> None:
    data = series(np.full(10, 100.0))
    s = stats_of(data, 100.0, 110.0)
    assert (s.gpu_samples, s.mean_power_w, s.energy_source, s.peak_temp_c) == (0, None, "none", None)


def test_the_steady_temperature_is_where_a_short_window_was_heading_not_its_peak() -> None:
    """A window shorter than the GPU's τ ends well below its steady temperature; the headroom is counted
    from the step fit's asymptote (the same steady temperature `gpuprobe model` predicts), not the peak."""
    t_s = np.arange(0.0, 20.0, 0.1)
    rising = np.floor(74.0 + (36.0 - 74.0) * np.exp(-(t_s + 2.0) / 25.0) + 0.5)  # integer °C, as stored
    steady, fitted = window_steady_c((t_s * S).astype(np.int64), rising, np.full(len(t_s), 400.0))
    assert fitted and steady == pytest.approx(74.0, abs=1.5) and float(rising.max()) <= 58.0
    flat = np.full(len(t_s), 61.0)
    flat[50] = 64.0  # one hotter reading is no steady temperature
    assert window_steady_c((t_s * S).astype(np.int64), flat, np.full(len(t_s), 300.0)) == (61.0, True)
    # a straight line has no asymptote to trust: the last quarter's median, marked as not fitted
    line = 40.0 + t_s
    steady, fitted = window_steady_c((t_s * S).astype(np.int64), line, np.full(len(t_s), 300.0))
    assert not fitted and steady == pytest.approx(float(np.median(line[-50:])))
    assert window_steady_c(np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0)) == (None, False)


# --- measurements and groups ---------------------------------------------------------------------


def stats(
    power: float | None, peak: float | None = 72.0, limit: float | None = 300.0, steady: float | None = 70.0
) -> WindowStats:
    return WindowStats(
        20.0, 200, power, None if power is None else power * 20, "counter", 0, power, limit, peak, 1800.0, steady, True
    )


def meas(
    host: str,
    gpu: str,
    point: int,
    rate: float | None,
    power: float | None,
    *,
    model: str = "H100",
    virt: str = "bare_metal",
    instance_type: str = "p5",
    batch: int = 64,
    limit: str = "",
    device: str = "cuda",
    slowdown: float | None = 87.0,
    dba: float | None = 50.0,
) -> Measurement:
    return Measurement(
        host=host,
        gpu=gpu,
        gpu_model=model,
        point=point,
        workload="resnet50",
        batch_size=batch,
        power_limit=limit,
        instance_type=instance_type,
        virt=virt,
        region="r1",
        start_ns=0,
        end_ns=20 * S,
        window_closed=True,
        samples_per_s=rate,
        trainer_reports=0 if rate is None else 20,
        devices=[device] if rate is not None else [],
        requested_limit_w=None,
        slowdown_c=slowdown,
        est_dba=dba,
        stats=stats(power),
    )


def test_a_measurement_derives_samples_per_joule_and_headroom() -> None:
    m = meas("a", "0", 0, 1000.0, 400.0)
    assert m.samples_per_j == 2.5 and m.j_per_sample == 0.4
    # 87 °C - the steady 70 °C, not the peak 72 °C
    assert m.headroom_c == 17.0 and m.has_data and not m.simulated and m.problems == []
    sim = meas("a", "0", 0, 1000.0, 400.0, device="sim", slowdown=None)
    assert sim.simulated and sim.headroom_c is None
    empty = meas("a", "0", 0, None, None)
    assert not empty.has_data and len(empty.problems) == 2


def nodes(**gpus: int) -> dict[str, Node]:
    return {h: Node(h, instance_type="p5", gpus_in_study=n) for h, n in gpus.items()}


def test_groups_by_their_keys_with_ratio_of_sums_and_the_worst_headroom() -> None:
    ms = [
        meas("a", "0", 0, 1000.0, 400.0),
        meas("a", "1", 0, 1200.0, 600.0),
        meas("b", "0", 0, 800.0, 400.0),
        meas("b", "1", 0, None, 500.0),  # no throughput: counted, not in the figures
        meas("a", "0", 1, 1500.0, 500.0, batch=128),
    ]
    ms[1].stats = stats(600.0, peak=82.0, steady=80.0)
    ms[1].__post_init__()
    groups = make_groups(ms, [], nodes(a=2, b=2))
    assert [(g.key.batch_size, g.gpus, g.nodes, g.gpus_with_data) for g in groups] == [(64, 4, 2, 3), (128, 1, 1, 1)]
    g = groups[0]
    assert g.samples_per_s == pytest.approx(1000.0)  # mean per GPU
    assert g.samples_per_j == pytest.approx(3000.0 / 1400.0)  # Σ samples/s ÷ Σ W
    assert g.j_per_sample == pytest.approx(1400.0 / 3000.0)
    assert g.mean_power_w == pytest.approx(475.0)
    assert g.peak_temp_c == 82.0 and g.headroom_c == 7.0
    assert g.hosts == ["a", "b"] and g.points == [0]


def test_cost_per_million_samples() -> None:
    assert cost_per_million_samples(98.32, 1200.0, 8) == pytest.approx(98.32 / 3600 / 9600 * 1e6)
    assert cost_per_million_samples(None, 1200.0, 8) is None
    assert cost_per_million_samples(10.0, None, 8) is None
    assert cost_per_million_samples(10.0, 0.0, 8) is None
    groups = make_groups([meas("a", "0", 0, 1000.0, 400.0)], [], nodes(a=4), {"p5": 36.0})
    assert groups[0].price_per_hour_usd == 36.0
    assert groups[0].cost_per_million_samples_usd == pytest.approx(36.0 / 3600 / 4000 * 1e6)
    assert make_groups([meas("a", "0", 0, 1000.0, 400.0)], [], nodes(a=4))[0].cost_per_million_samples_usd is None


def test_refusals_are_counted_in_their_group_and_make_one_when_alone() -> None:
    ms = [meas("a", "0", 0, 1000.0, 400.0)]
    refusals = [
        Refusal(1, "a", "1", "H100", 0, "resnet50", 64, "", "power limit out of range", "p5", "bare_metal", "r1"),
        Refusal(1, "a", "1", "H100", 1, "resnet50", 128, "", "out of memory", "p5", "bare_metal", "r1"),
    ]
    groups = make_groups(ms, refusals, nodes(a=2))
    assert [(g.key.batch_size, g.gpus, g.refusals, g.samples_per_s) for g in groups] == [
        (64, 1, 1, 1000.0),
        (128, 0, 1, None),
    ]


def test_pareto_front_keeps_what_nothing_beats_on_both() -> None:
    assert pareto_front([(1, 5), (2, 3), (3, 4), (4, 1), (2, 3.5)]) == [0, 1, 3]
    assert pareto_front([(1, 1), (1, 1), (2, 2)]) == [0, 1]  # equal points are both kept
    assert pareto_front([(1, 2), (1, 3)]) == [0]  # equal time, more energy: dominated
    assert pareto_front([]) == []


def study(ms: list[Measurement], refusals: list[Refusal] | None = None, **kwargs: Any) -> StudyReport:
    return analyze(
        study="s",
        database="db",
        start_ns=0,
        end_ns=100 * S,
        points=[PointSpec(0, "resnet50", 64, ""), PointSpec(1, "resnet50", 128, "")],
        nodes=[Node("a", "p5", virt="bare_metal", gpus_in_study=1), Node("v", "vm", virt="vgpu", gpus_in_study=1)],
        measurements=ms,
        refusals=refusals or [],
        **kwargs,
    )


def test_frontier_and_optimal_points() -> None:
    ms = [
        meas("a", "0", 0, 1000.0, 500.0),  # 2.0 samples/J
        meas("a", "0", 1, 1400.0, 650.0, batch=128),  # fastest
        meas("a", "0", 2, 1200.0, 400.0, batch=256, limit="60%"),  # most efficient
        meas("a", "0", 3, 800.0, 340.0, batch=64, limit="60%"),  # dominated by the one above
    ]
    report = study(ms)
    f = report.frontier("H100")
    assert f.energy_optimal == GroupKey("p5", "H100", "bare_metal", "r1", "resnet50", 256, "60%")
    assert f.time_optimal == GroupKey("p5", "H100", "bare_metal", "r1", "resnet50", 128, "")
    assert [(p.key.batch_size, p.key.power_limit) for p in f.frontier] == [(128, ""), (256, "60%")]
    assert [p.time_per_sample_s for p in f.points] == sorted(p.time_per_sample_s for p in f.points)
    best = report.group(batch_size=256)
    assert best.energy_optimal and best.pareto and not best.time_optimal


def test_virtualization_overhead_against_bare_metal_of_the_same_point() -> None:
    ms = [
        meas("a", "0", 0, 1000.0, 500.0),
        meas("v", "0", 0, 930.0, 500.0, virt="vgpu", instance_type="vm"),
        meas("v", "0", 1, 1300.0, 600.0, virt="vgpu", instance_type="vm", batch=128),  # no bare metal at 128
        meas("v", "1", 0, 300.0, 70.0, virt="vgpu", instance_type="vm", model="L4"),  # no bare-metal L4
    ]
    report = study(ms)
    overheads = {(o.key.gpu_model, o.key.batch_size): o for o in report.virt_overhead}
    assert set(overheads) == {("H100", 64), ("H100", 128), ("L4", 64)}
    o = overheads[("H100", 64)]
    assert o.overhead_pct == pytest.approx(7.0) and o.bare_metal_samples_per_s == 1000.0
    assert overheads[("H100", 128)].overhead_pct is None and "no bare_metal group" in overheads[("H100", 128)].note
    assert overheads[("L4", 64)].overhead_pct is None
    assert report.group(virt="vgpu", gpu_model="H100", batch_size=64).virt_overhead_pct == pytest.approx(7.0)
    assert report.group(virt="bare_metal").virt_overhead_pct is None


def test_rankings_by_samples_per_joule_at_each_ones_best_point() -> None:
    ms = [
        meas("a", "0", 0, 1000.0, 500.0),
        meas("a", "0", 1, 1200.0, 400.0, batch=128),  # H100's best: 3.0
        meas("v", "1", 0, 300.0, 60.0, virt="vgpu", instance_type="vm", model="L4", device="sim"),  # 5.0
    ]
    report = study(ms)
    by_model = next(r for r in report.rankings if r.by == "gpu_model")
    assert [(e.rank, e.name, e.samples_per_j, e.simulated) for e in by_model.entries] == [
        (1, "L4", 5.0, True),
        (2, "H100", 3.0, False),
    ]
    assert by_model.entries[1].best.batch_size == 128
    by_type = next(r for r in report.rankings if r.by == "instance_type")
    assert [e.name for e in by_type.entries] == ["vm", "p5"]


def test_simulated_throughput_marks_everything_derived_from_it() -> None:
    ms = [
        meas("a", "0", 0, 1000.0, 500.0),
        meas("v", "0", 0, 900.0, 500.0, virt="vgpu", instance_type="vm", device="sim"),
    ]
    report = study(ms, prices={"vm": 2.0})
    assert report.simulated
    g = report.group(virt="vgpu")
    assert g.simulated and g.devices == ["sim"] and g.cost_per_million_samples_usd is not None
    assert not report.group(virt="bare_metal").simulated
    assert report.virt_overhead[0].simulated
    assert report.frontier("H100").simulated
    assert any("simulated" in n for n in report.notes)


def test_prices_notes() -> None:
    report = study([meas("a", "0", 0, 1000.0, 500.0)], prices={"other": 1.0})
    notes = " ".join(report.notes)
    assert "no price for instance types p5" in notes and "not in this study" in notes and "other" in notes


def test_group_lookup() -> None:
    report = study([meas("a", "0", 0, 1000.0, 500.0), meas("a", "0", 1, 1000.0, 500.0, batch=128)])
    assert report.group(batch_size=128).key.batch_size == 128
    with pytest.raises(KeyError):
        report.group(gpu_model="H100")
    assert len(report.groups_where(gpu_model="H100")) == 2
    assert math.isclose(report.groups[0].samples_per_j or 0, 2.0)
