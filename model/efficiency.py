"""Part: model. Efficiency of one GPU over a probe: throughput, power, energy, and what the energy costs.

Energy over a window is :mod:`gpuprobe.energy`'s (NVML's counter with resets bridged, interpolated at
the window's edges; ``∫P dt`` without a counter), the same formula as ``probe results`` and
``study report``.

Derived (docs/models.md, "Efficiency"; kWh and CO2e as in Patterson et al. 2021, "Carbon Emissions
and Large Neural Network Training", arXiv 2104.10350)::

    samples/J   = samples ÷ E_steady                              J/sample = E_steady ÷ samples
    samples     = the trainer's count of its steady phases (their ending events' ``steady_samples``),
                  else samples/s · steady time (older data)
    kWh         = E_J ÷ 3.6e6 · PUE                              kg CO2e  = kWh · grid kg/kWh
    GPU-hours   = GPUs · probe duration ÷ 3600 s                 cost     = GPU-hours · price
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpuprobe.energy import cumulative_energy, integral_j

J_PER_KWH = 3.6e6


def mask_of(t_ns: np.ndarray, intervals: Sequence[tuple[int, int]]) -> np.ndarray:
    mask = np.zeros(len(t_ns), dtype=bool)
    for start, end in intervals:
        mask |= (t_ns >= start) & (t_ns < end)
    return mask


def total_s(intervals: Sequence[tuple[int, int]]) -> float:
    return sum(max(0, b - a) for a, b in intervals) / 1e9


@dataclass
class GpuEfficiency:
    steady_s: float
    samples_per_s: float | None
    mean_power_w: float | None
    peak_power_w: float | None
    steady_energy_j: float | None
    steady_samples: float | None  # the trainer's count, else samples/s · steady time; None without either
    j_per_sample: float | None
    samples_per_j: float | None
    idle_power_w: float | None
    probe_energy_j: float
    probe_energy_integral_j: float
    energy_source: str
    counter_resets: int
    kwh: float
    kg_co2e: float
    gpu_hours: float
    cost: float | None


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def gpu_efficiency(
    t_ns: np.ndarray,
    power_w: np.ndarray,
    peak_source_w: np.ndarray,
    energy_j: np.ndarray,
    *,
    window: tuple[int, int],
    steady: Sequence[tuple[int, int]],
    idle: Sequence[tuple[int, int]],
    samples_per_s: float | None,
    pue: float,
    steady_samples: int | None = None,
    grid_kg_per_kwh: float,
    price_per_gpu_hour: float | None,
) -> GpuEfficiency:
    """Every efficiency number of one GPU; ``steady`` and ``idle`` are the phases' intervals."""
    energy = cumulative_energy(t_ns, energy_j, power_w)
    probe_j = energy.between(*window)
    steady_mask = mask_of(t_ns, steady)
    steady_s = total_s(steady)
    mean_w = peak_w = steady_j = None
    if np.any(steady_mask & np.isfinite(power_w)):
        steady_j = _finite(sum(energy.between(a, b) for a, b in steady))
        mean_w = steady_j / steady_s if steady_j is not None and steady_s > 0 else None
        peaks = peak_source_w[steady_mask]
        peak_w = _finite(float(np.nanmax(peaks))) if np.any(np.isfinite(peaks)) else None
    idle_mask = mask_of(t_ns, idle) & np.isfinite(power_w)
    idle_w = float(np.mean(power_w[idle_mask])) if np.any(idle_mask) else None
    j_per_sample = samples_per_j = None
    samples: float | None = None
    if steady_samples:
        samples = float(steady_samples)
    elif samples_per_s and steady_s > 0:
        samples = samples_per_s * steady_s
    if samples and steady_j:
        j_per_sample, samples_per_j = steady_j / samples, samples / steady_j
    kwh = probe_j / J_PER_KWH * pue if math.isfinite(probe_j) else math.nan
    gpu_hours = (window[1] - window[0]) / 1e9 / 3600
    return GpuEfficiency(
        steady_s=steady_s,
        samples_per_s=samples_per_s,
        mean_power_w=mean_w,
        peak_power_w=peak_w,
        steady_energy_j=steady_j,
        steady_samples=samples,
        j_per_sample=j_per_sample,
        samples_per_j=samples_per_j,
        idle_power_w=idle_w,
        probe_energy_j=probe_j,
        probe_energy_integral_j=integral_j(t_ns, power_w, *window),
        energy_source=energy.source,
        counter_resets=energy.counter_resets,
        kwh=kwh,
        kg_co2e=kwh * grid_kg_per_kwh,
        gpu_hours=gpu_hours,
        cost=None if price_per_gpu_hour is None else gpu_hours * price_per_gpu_hour,
    )
