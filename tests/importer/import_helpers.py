"""Helpers of the importer tests (fixtures in conftest.py): read InfluxDB back, compute expectations."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from gpuprobe.devservices import InfluxDBDatabase

Import = Callable[..., tuple[int, str, str]]


def influx_args(db: InfluxDBDatabase) -> list[str]:
    return ["--influx-url", db.server.url, "--influx-db", db.name]


def stored_points(db: InfluxDBDatabase, where: str = "") -> list[dict[str, Any]]:
    """Every ``gpu`` point (tags and fields as columns, absent ones None), ordered by time, host, gpu."""
    rows = [row for series in db.query(f'SELECT * FROM "gpu" {where}') for row in series.rows()]
    return sorted(rows, key=lambda row: (row["time"], row.get("host") or "", int(row.get("gpu") or 0)))


def field_types(db: InfluxDBDatabase) -> dict[str, str]:
    return {row["fieldKey"]: row["fieldType"] for s in db.query('SHOW FIELD KEYS FROM "gpu"') for row in s.rows()}


def measurements(db: InfluxDBDatabase) -> list[str]:
    return [str(row[0]) for series in db.query("SHOW MEASUREMENTS") for row in series.values]


def utc_ns(text: str, fraction_ns: int = 0) -> int:
    """``2025-06-01T12:00:00`` (UTC) + ns as ns since the epoch, computed independently of the importer."""
    moment = datetime.fromisoformat(text).replace(tzinfo=UTC)
    return int(moment.timestamp()) * 1_000_000_000 + fraction_ns
