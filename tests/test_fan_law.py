"""The fan law of the acoustic proxy against published levels of fans at several speeds.

``tests/data/fans/`` keeps the figures with their sources. Each fan's slower speeds are predicted
from its fastest (only the change of level with speed counts, so each maker's way of measuring
cancels); the issue's bar is within 3 dB for at least 70 % of the points. The proxy's 50 dB per
decade misses it on these figures, the exponent they support meets it (docs/models.md, "Acoustic
model": both figures).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpuprobe.fanlaw import FAN_LAW_DB_PER_DECADE, fan_law_dba

FANS = Path(__file__).resolve().parent / "data" / "fans" / "fan_levels.csv"
WITHIN_DB = 3.0


@dataclass(frozen=True)
class Point:
    """One slower setting of a fan: its speed as a share of the fastest, and the change of level."""

    fan: str
    speed_pct: float
    change_db: float


def slower_points() -> tuple[list[Point], list[str]]:
    """Every fan's slower settings against its fastest, and the fans left out (a published level that
    does not change with speed is one figure for the model, not a level per speed; its README)."""
    by_fan: dict[str, list[tuple[float, float]]] = {}
    with FANS.open(encoding="utf-8") as f:
        for row in csv.DictReader(f):
            by_fan.setdefault(row["fan"], []).append((float(row["speed_rpm"]), float(row["level_dba"])))
    points, left_out = [], []
    for fan, rows in by_fan.items():
        if len({level for _, level in rows}) == 1:
            left_out.append(fan)
            continue
        top_rpm, top_dba = max(rows)
        points += [Point(fan, 100 * rpm / top_rpm, dba - top_dba) for rpm, dba in rows if rpm < top_rpm]
    return points, left_out


def share_within(points: list[Point], db_per_decade: float) -> float:
    hits = [abs(fan_law_dba(p.speed_pct, 0.0, db_per_decade) - p.change_db) <= WITHIN_DB for p in points]
    return sum(hits) / len(hits)


def fitted_db_per_decade(points: list[Point]) -> float:
    """The exponent the published figures support: least squares of the change of level on
    log10 of the speed ratio, through zero (the fastest setting is the reference)."""
    x = np.array([math.log10(p.speed_pct / 100) for p in points])
    y = np.array([p.change_db for p in points])
    return float(x @ y / (x @ x))


def test_the_published_fans_the_law_is_held_against() -> None:
    points, left_out = slower_points()
    assert left_out == ["Manrose MixFlo MF200"]
    assert len(points) == 8 and len({p.fan for p in points}) == 4


def test_the_proxy_law_misses_the_bar_and_the_fitted_exponent_meets_it() -> None:
    points, _ = slower_points()
    # 50 dB per decade: within 3 dB on 5 of 8 (the Noctua's two adapters, each duct fan's middle speed;
    # each duct fan's slowest is 3.5 dB under its published level)
    assert share_within(points, FAN_LAW_DB_PER_DECADE) == 5 / 8
    fitted = fitted_db_per_decade(points)
    assert 30.0 < fitted < 35.0, fitted
    assert share_within(points, fitted) >= 0.7
    # the Noctua alone (an axial PC fan, the kind a GPU has) follows the fifth-power law
    noctua = [p for p in points if p.fan.startswith("Noctua")]
    assert share_within(noctua, FAN_LAW_DB_PER_DECADE) == 1.0
    assert 40.0 < fitted_db_per_decade(noctua) < 50.0  # 44
