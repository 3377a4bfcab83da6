"""One energy-over-a-window formula (gpuprobe.energy): `probe results` (the agent's probe runner),
`gpuprobe model` (efficiency) and `study report` get the same joules from the same samples, a counter reset
(a driver reload) included. Plain data, in-process."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from gpuprobe.control.gpus import Reading
from gpuprobe.control.probe_run import _mean_power, _metrics
from gpuprobe.energy import window_energy
from gpuprobe.model.efficiency import GpuEfficiency, gpu_efficiency
from gpuprobe.study.analysis import Measurement, WindowStats, window_stats

S = 1_000_000_000
POWER_W = 300.0


def samples(reset_at_s: float | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """30 s at 10 Hz of a GPU at a constant 300 W; its energy counter restarts from 0 at ``reset_at_s``."""
    t_s = np.arange(0, 30, 0.1)
    energy_j = POWER_W * t_s + 1_000_000.0  # the counter counts from the driver's load, long before
    if reset_at_s is not None:
        after = t_s >= reset_at_s
        energy_j[after] = POWER_W * (t_s[after] - reset_at_s)
    return (t_s * S).astype(np.int64), energy_j, np.full(len(t_s), POWER_W)


def readings_of(t_ns: np.ndarray, energy_j: np.ndarray, power_w: np.ndarray) -> list[Reading]:
    """The samples as the probe runner keeps them."""
    return [Reading(int(t), float(p), 60.0, float(e)) for t, e, p in zip(t_ns, energy_j, power_w, strict=True)]


def study_stats(t_ns: np.ndarray, energy_j: np.ndarray, power_w: np.ndarray, start_ns: int, end_ns: int) -> WindowStats:
    """``study report``'s reduction of the window (steady temperature, limit and clock held constant)."""
    return window_stats(
        t_ns,
        start_ns,
        end_ns,
        power_w=power_w,
        energy_j=energy_j,
        temp_c=np.full(len(t_ns), 60.0),
        power_limit_w=np.full(len(t_ns), 700.0),
        sm_clock_mhz=np.full(len(t_ns), 1980.0),
    )


def model_efficiency(
    t_ns: np.ndarray,
    energy_j: np.ndarray,
    power_w: np.ndarray,
    start_ns: int,
    end_ns: int,
    steady_samples: int | None = None,
) -> GpuEfficiency:
    """``gpuprobe model``'s efficiency of a 30 s probe whose steady phase is the window, at 100 samples/s."""
    return gpu_efficiency(
        t_ns,
        power_w,
        power_w,
        energy_j,
        window=(0, 30 * S),
        steady=[(start_ns, end_ns)],
        idle=[],
        samples_per_s=100.0,
        steady_samples=steady_samples,
        pue=1.0,
        grid_kg_per_kwh=0.0,
        price_per_gpu_hour=None,
    )


@pytest.mark.parametrize("reset_at_s", [None, 12.05])
def test_probe_model_and_study_get_the_same_energy_from_one_window(reset_at_s: float | None) -> None:
    t_ns, energy_j, power_w = samples(reset_at_s)
    start_ns, end_ns = 5 * S, 25 * S
    expected_j = POWER_W * 20  # the reset's interval is bridged with power x dt, which is exact here

    shared = window_energy(t_ns, energy_j, power_w, start_ns, end_ns)
    assert shared.source == "counter" and shared.energy_j == pytest.approx(expected_j, rel=1e-9)
    assert shared.counter_resets == (0 if reset_at_s is None else 1)

    probe_j, probe_w = _mean_power(readings_of(t_ns, energy_j, power_w), start_ns, end_ns)
    study = study_stats(t_ns, energy_j, power_w, start_ns, end_ns)
    model = model_efficiency(t_ns, energy_j, power_w, start_ns, end_ns)
    assert probe_j == study.energy_j == model.steady_energy_j == shared.energy_j
    assert probe_w == study.mean_power_w == pytest.approx(POWER_W)
    assert model.j_per_sample == pytest.approx(expected_j / 2000)


def test_without_readings_at_both_ends_the_energy_is_the_mean_power_reading_times_the_window() -> None:
    t_ns, energy_j, power_w = samples(None)
    late = t_ns >= 10 * S  # the counter was not read in the first 10 s (the agent started late)
    energy_j[~late] = math.nan
    result = window_energy(t_ns, energy_j, power_w, 0, 20 * S)
    assert result.source == "power_w" and result.energy_j == pytest.approx(POWER_W * 20)
    assert window_energy(t_ns[:0], energy_j[:0], power_w[:0], 0, S).source == "none"


def test_j_per_sample_divides_by_the_trainers_count_in_all_three() -> None:
    """On a real GPU the throughput varies, so the mean of the trainer's reported rates times the window is
    not the count it processed: `probe results`, `gpuprobe model` and `study report` all divide the window's
    energy by the count (the trainer's result, the `steady_samples` of the event ending the phase)."""
    t_ns, energy_j, power_w = samples(None)
    start_ns, end_ns = 5 * S, 25 * S
    energy = POWER_W * 20
    count = 1900  # the reports' mean rate (100/s) over the 20 s says 2000
    point = {"samples": count, "samples_per_s": 95.0, "steady_start_unix_ns": start_ns, "steady_end_unix_ns": end_ns}
    probe = _metrics(point, [], readings_of(t_ns, energy_j, power_w))
    model = model_efficiency(t_ns, energy_j, power_w, start_ns, end_ns, steady_samples=count)
    stats = study_stats(t_ns, energy_j, power_w, start_ns, end_ns)
    study = Measurement(
        host="a", gpu="0", gpu_model="H100", point=0, workload="resnet50", batch_size=64, power_limit="",
        instance_type="p5", virt="bare_metal", region="r1", start_ns=start_ns, end_ns=end_ns, window_closed=True,
        samples_per_s=100.0, trainer_reports=20, devices=["cuda"], requested_limit_w=None, slowdown_c=None,
        est_dba=None, stats=stats, steady_samples=count,
    )  # fmt: skip
    assert probe.j_per_sample == model.j_per_sample == study.j_per_sample == pytest.approx(energy / count)
    assert model.samples_per_j == study.samples_per_j == pytest.approx(count / energy)
    # without a count (an older trainer's data) the rate stands in
    older = dataclasses.replace(study, steady_samples=None)
    assert older.j_per_sample == pytest.approx(POWER_W / 100.0)
