"""Part: core (ground floor). A GPU's energy over a window of time, the one formula that ``probe results``
(the agent), ``gpuprobe model`` and ``study report`` share.

Energy comes from NVML's energy counter (``energy_j``, mJ since the driver loaded, so it integrates
*every* tick of power, including those between the agent's samples). Differences of consecutive readings
are summed; a negative difference (the driver was reloaded, the counter reset or wrapped) or a missing
reading is replaced by that interval's ``power · Δt`` and counted in ``counter_resets``. The cumulative
energy is interpolated linearly at the window's edges, so a window's energy does not depend on whether
the samples at its ends belong to it. Where there is no counter the energy is ``∫P dt`` (each power
reading held until the next) and ``source`` says so.

Window convention: ``[start, end)`` for everything counted from samples (the mean of the power readings,
sample counts); the counter is read *at* ``start`` and ``end`` by interpolation. It is used only where
readings reach both ends of the window (within two sampling intervals or 1 s); otherwise the energy is
the mean power reading inside the window times its length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Energy:
    """A GPU's cumulative energy (J) at each sample, from the counter where there is one."""

    t_ns: np.ndarray
    cumulative_j: np.ndarray
    source: str  # "counter" or "integral"
    counter_resets: int

    def between(self, start_ns: int, end_ns: int) -> float:
        """Energy (J) from ``start_ns`` to ``end_ns``, the cumulative energy interpolated at both; NaN with
        fewer than two samples."""
        if len(self.t_ns) < 2:
            return math.nan
        a, b = np.interp([start_ns, end_ns], self.t_ns, self.cumulative_j)
        return float(b - a)


def cumulative_energy(t_ns: np.ndarray, energy_j: np.ndarray, power_w: np.ndarray) -> Energy:
    """The cumulative energy at each sample: counter steps, with resets and gaps bridged by ``power · Δt``."""
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
    """∫P dt over the window with each sample's power held until the next (a cross-check of the counter)."""
    keep = np.isfinite(power_w)
    t, p = t_ns[keep], power_w[keep]
    if len(t) < 2:
        return math.nan
    edges = np.clip(np.append(t, t[-1]), start_ns, end_ns)
    return float(np.sum(p * np.diff(edges)) / 1e9)


@dataclass(frozen=True)
class WindowEnergy:
    """One GPU's energy and mean power over one window."""

    energy_j: float | None
    mean_power_w: float | None
    source: str  # "counter", "power_w" (mean reading times length) or "none"
    counter_resets: int
    mean_power_reading_w: float | None  # the mean of the power readings inside [start, end)


def _counter_covers(t_ns: np.ndarray, start_ns: int, end_ns: int) -> bool:
    if len(t_ns) < 2:
        return False
    slack_ns = max(10**9, 2 * int(np.median(np.diff(t_ns))))
    return bool(t_ns[0] <= start_ns + slack_ns and t_ns[-1] >= end_ns - slack_ns)


def window_energy(
    t_ns: np.ndarray, energy_j: np.ndarray, power_w: np.ndarray, start_ns: int, end_ns: int
) -> WindowEnergy:
    """Energy and mean power of one GPU over ``[start_ns, end_ns)``.

    The arrays are that GPU's samples in time order (NaN where a reading is missing); they may reach
    beyond the window, so the counter can be interpolated exactly at its ends.
    """
    duration_s = (end_ns - start_ns) / 1e9
    inside = (t_ns >= start_ns) & (t_ns < end_ns) & np.isfinite(power_w)
    reading_w = float(np.mean(power_w[inside])) if np.any(inside) else None
    has_counter = np.isfinite(energy_j)
    if duration_s > 0 and _counter_covers(t_ns[has_counter], start_ns, end_ns):
        cumulative = cumulative_energy(t_ns[has_counter], energy_j[has_counter], power_w[has_counter])
        energy = cumulative.between(start_ns, end_ns)
        if math.isfinite(energy) and energy >= 0:
            return WindowEnergy(energy, energy / duration_s, "counter", cumulative.counter_resets, reading_w)
    if reading_w is not None and duration_s > 0:
        return WindowEnergy(reading_w * duration_s, reading_w, "power_w", 0, reading_w)
    return WindowEnergy(None, reading_w, "none", 0, reading_w)
