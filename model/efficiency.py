"""Efficiency of one GPU over a probe: throughput, power, energy, and what the energy costs.

Energy comes from NVML's energy counter (``energy_j``, mJ since the driver loaded, so it integrates
*every* tick of power, including those between the agent's samples). Differences of consecutive
readings are summed; a negative difference (the driver was reloaded, the counter reset) or a missing
reading is replaced by that interval's ``power · Δt`` and counted in ``counter_resets``. The
cumulative energy is interpolated linearly at the window's edges. Where there is no counter at all
the energy is ``∫P dt`` (power held between samples) and ``energy_source`` says so.

Derived (docs/models.md, "Efficiency"; kWh and CO2e as in Patterson et al. 2021, "Carbon Emissions
and Large Neural Network Training", arXiv 2104.10350)::

    samples/J   = samples/s ÷ mean W = samples ÷ E_steady        J/sample = E_steady ÷ samples
    kWh         = E_J ÷ 3.6e6 · PUE                              kg CO2e  = kWh · grid kg/kWh
    GPU-hours   = GPUs · probe duration ÷ 3600 s                 cost     = GPU-hours · price
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

J_PER_KWH = 3.6e6


@dataclass(frozen=True)
class Energy:
    """A GPU's cumulative energy (J) at each sample, from the counter where there is one."""

    t_ns: np.ndarray
    cumulative_j: np.ndarray
    source: str  # "counter" or "integral"
    counter_resets: int

    def between(self, start_ns: int, end_ns: int) -> float:
        if len(self.t_ns) < 2:
            return math.nan
        a, b = np.interp([start_ns, end_ns], self.t_ns, self.cumulative_j)
        return float(b - a)


def cumulative_energy(t_ns: np.ndarray, energy_j: np.ndarray, power_w: np.ndarray) -> Energy:
    dt_s = np.diff(t_ns) / 1e9
    held = np.where(np.isfinite(power_w[:-1]), power_w[:-1], 0.0) * dt_s
    if len(energy_j) and float(np.mean(np.isfinite(energy_j))) >= 0.5:
        step = np.diff(energy_j)
        bad = ~np.isfinite(step) | (step < 0)
        resets = int(np.sum(np.isfinite(step) & (step < 0)))
        step = np.where(bad, held, step)
        source = "counter"
    else:
        step, resets, source = held, 0, "integral"
    return Energy(t_ns, np.concatenate([[0.0], np.cumsum(step)]), source, resets)


def integral_j(t_ns: np.ndarray, power_w: np.ndarray, start_ns: int, end_ns: int) -> float:
    """∫P dt over [start, end] with each sample's power held until the next (a cross-check of the counter)."""
    keep = np.isfinite(power_w)
    t, p = t_ns[keep], power_w[keep]
    if len(t) < 2:
        return math.nan
    edges = np.clip(np.append(t, t[-1]), start_ns, end_ns)
    return float(np.sum(p * np.diff(edges)) / 1e9)


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
    if samples_per_s and steady_j and steady_s > 0:
        samples = samples_per_s * steady_s
        j_per_sample, samples_per_j = steady_j / samples, samples / steady_j
    kwh = probe_j / J_PER_KWH * pue if math.isfinite(probe_j) else math.nan
    gpu_hours = (window[1] - window[0]) / 1e9 / 3600
    return GpuEfficiency(
        steady_s=steady_s,
        samples_per_s=samples_per_s,
        mean_power_w=mean_w,
        peak_power_w=peak_w,
        steady_energy_j=steady_j,
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
