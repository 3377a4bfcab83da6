"""Helpers of the importer tests (fixtures in conftest.py): read InfluxDB back, compute expectations."""

from __future__ import annotations

import os
import tarfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

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


ROOT = Path(__file__).resolve().parents[2]


def realdata(name: str) -> Path:
    """A real GPU log of the shared realdata folder beside the clone (or $REALDATA_DIR; a worktree's
    clone sits one level deeper), read in place; the test is skipped where it is absent (a user's clone)."""
    given = os.environ.get("REALDATA_DIR")
    folders = [Path(given)] if given else [ROOT.parent / "shared" / "realdata", ROOT.parents[1] / "shared" / "realdata"]
    for folder in folders:
        if (folder / name).is_file():
            return folder / name
    pytest.skip(f"real GPU log {name} absent (no shared realdata folder beside the clone)")


def extract_single(archive: Path, into: Path) -> Path:
    """The one CSV of a .tar.gz realdata log, unpacked under the test's tmp_path (never the repository)."""
    with tarfile.open(archive) as tar:
        member = next(m for m in tar.getmembers() if m.isfile())
        source = tar.extractfile(member)
        assert source is not None
        target = into / Path(member.name).name
        target.write_bytes(source.read())
    return target
