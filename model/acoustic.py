"""Part: model. Acoustic levels (the agent's proxy estimate) and their calibration against a microphone.

Levels are averaged *energetically*, ``L̄ = 10·log10(mean(10^(L/10)))`` (the same summation as
for several sources, cpemma "Multiple fans total dB"), because the arithmetic mean of decibels
underrates loud moments.

Calibration. A microphone's ``laeq_db`` is the A-weighted equivalent level over the 1 s *ending* at
its timestamp (docs/schema.md, ``acoustic``). For each microphone point the node's proxy estimates in that
same second are averaged energetically; over all such pairs::

    offset_db            = mean(mic - proxy)             add it to the proxy: the calibrated estimate
    mic = slope·proxy + intercept_db                     least squares, with R² and the RMS residual

A slope near 1 means the proxy tracks loudness changes and only its absolute level was off; a slope
far from 1 means the proxy's constants (rated fan level, floor) need changing, not just an offset.

The fan-law exponent the microphone supports is stored with the calibration,
``fan_law_db_per_decade = slope·50`` (``gpuprobe.fanlaw``): where the proxy's changes are its fans'
(the fan law, 50 dB per decade of speed), a microphone that moves ``slope`` dB per dB of the proxy
hears the fans' level grow ``slope·50`` dB per decade. Where the room's floor or the passive chassis
term carries the change instead, it says less.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpuprobe.fanlaw import FAN_LAW_DB_PER_DECADE
from gpuprobe.model.efficiency import mask_of


def energetic_mean(levels: np.ndarray) -> float:
    levels = levels[np.isfinite(levels)]
    if len(levels) == 0:
        return math.nan
    return float(10 * np.log10(np.mean(10 ** (levels / 10))))


@dataclass
class LevelStats:
    """A level's energetic means over the whole window and its phases, and its maximum (dBA)."""

    mean_db: float | None
    max_db: float | None
    idle_db: float | None
    steady_db: float | None
    samples: int


def _opt(value: float) -> float | None:
    return value if math.isfinite(value) else None


def level_stats(
    t_ns: np.ndarray, levels: np.ndarray, idle: Sequence[tuple[int, int]], steady: Sequence[tuple[int, int]]
) -> LevelStats:
    finite = np.isfinite(levels)
    return LevelStats(
        mean_db=_opt(energetic_mean(levels)),
        max_db=_opt(float(np.max(levels[finite]))) if np.any(finite) else None,
        idle_db=_opt(energetic_mean(levels[mask_of(t_ns, idle)])),
        steady_db=_opt(energetic_mean(levels[mask_of(t_ns, steady)])),
        samples=int(np.sum(finite)),
    )


@dataclass
class Calibration:
    """Proxy against microphone on one node."""

    pairs: int
    offset_db: float
    offset_stderr_db: float
    slope: float | None
    intercept_db: float | None
    r2: float | None
    rmse_db: float
    mic_mean_db: float
    proxy_mean_db: float
    fan_law_db_per_decade: float | None = None  # the fan law's exponent the microphone supports (slope·50)


def pair_levels(
    mic_t_ns: np.ndarray, mic_db: np.ndarray, proxy_t_ns: np.ndarray, proxy_db: np.ndarray, window_s: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """(mic, proxy) pairs: each microphone level with the proxy's energetic mean over its window."""
    order = np.argsort(proxy_t_ns)
    pt, pv = proxy_t_ns[order], proxy_db[order]
    window_ns = int(window_s * 1e9)
    mics, proxies = [], []
    for t, level in zip(mic_t_ns, mic_db, strict=True):
        if not math.isfinite(level):
            continue
        lo, hi = np.searchsorted(pt, t - window_ns, side="right"), np.searchsorted(pt, t, side="right")
        mean = energetic_mean(pv[lo:hi])
        if math.isfinite(mean):
            mics.append(float(level))
            proxies.append(mean)
    return np.array(mics), np.array(proxies)


def calibrate(mic_db: np.ndarray, proxy_db: np.ndarray, min_pairs: int = 5) -> Calibration | None:
    if len(mic_db) < min_pairs:
        return None
    diff = mic_db - proxy_db
    offset = float(np.mean(diff))
    stderr = float(np.std(diff, ddof=1) / math.sqrt(len(diff))) if len(diff) > 1 else math.nan
    slope = intercept = r2 = None
    residuals = diff - offset
    if float(np.std(proxy_db)) > 0.1:  # the proxy must vary to tell a slope
        slope_f, intercept_f = np.polyfit(proxy_db, mic_db, 1)
        slope, intercept = float(slope_f), float(intercept_f)
        residuals = mic_db - (slope * proxy_db + intercept)
        total = float(np.sum((mic_db - np.mean(mic_db)) ** 2))
        r2 = 1.0 - float(np.sum(residuals**2)) / total if total > 0 else None
    return Calibration(
        pairs=len(mic_db),
        offset_db=offset,
        offset_stderr_db=stderr,
        slope=slope,
        intercept_db=intercept,
        r2=r2,
        rmse_db=float(np.sqrt(np.mean(residuals**2))),
        mic_mean_db=energetic_mean(mic_db),
        proxy_mean_db=energetic_mean(proxy_db),
        fan_law_db_per_decade=slope * FAN_LAW_DB_PER_DECADE if slope is not None else None,
    )
