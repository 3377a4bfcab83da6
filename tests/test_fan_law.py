"""The fan law of the acoustic proxy against published levels of fans at several speeds.

``tests/data/fans/`` keeps the figures with their sources. Each fan's slower speeds are predicted
from its fastest (only the change of level with speed counts, so each maker's way of measuring
cancels); the issue's bar is within 3 dB for at least 70 % of the points. The proxy's 50 dB per
decade meets it; the server fans support about that slope, the duct fans a much flatter one
(docs/models.md, "Acoustic model": the table per kind of fan).
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


def kind(point: Point) -> str:
    return point.fan.split()[0]  # the maker: San Ace (server), Noctua (PC), Manrose (duct)


def test_the_published_fans_the_law_is_held_against() -> None:
    points, left_out = slower_points()
    assert left_out == ["Manrose MixFlo MF200"]
    assert len(points) == 20 and len({p.fan for p in points}) == 16
    assert sorted({kind(p) for p in points}) == ["Manrose", "Noctua", "San"]


def test_the_proxy_law_meets_the_bar_and_is_the_slope_the_axial_fans_support() -> None:
    points, _ = slower_points()
    # 15 of 20: misses are the two 9GAX at 20 % duty (4.0, 4.8 dB quieter) and the duct fans' slowest
    assert share_within(points, FAN_LAW_DB_PER_DECADE) == 15 / 20
    server = [p for p in points if kind(p) == "San"]
    assert share_within(server, FAN_LAW_DB_PER_DECADE) == 10 / 12
    assert 50.0 < fitted_db_per_decade(server) < 54.0  # 52
    noctua = [p for p in points if kind(p) == "Noctua"]
    assert share_within(noctua, FAN_LAW_DB_PER_DECADE) == 1.0
    assert 40.0 < fitted_db_per_decade(noctua) < 50.0  # 44
    # the duct fans alone follow a much flatter law: a different kind of fan, and the reason the law
    # was held against fans of the kind a GPU sits behind before its default was kept
    duct = [p for p in points if kind(p) == "Manrose"]
    assert share_within(duct, FAN_LAW_DB_PER_DECADE) == 0.5
    assert 25.0 < fitted_db_per_decade(duct) < 31.0  # 28
