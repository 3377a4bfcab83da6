"""Fixtures of the dashboard tests: the same simulated probe and model run as tests/model (generated once
per session by whichever directory asks first; ``simprobe`` lives in tests/model)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "model"))

from simprobe import ProbeRun, shared_probe, shared_report

from gpuprobe.devservices import InfluxDBServer


@pytest.fixture(scope="session")
def probe_run(influxdb_server: InfluxDBServer, tmp_path_factory: pytest.TempPathFactory) -> ProbeRun:
    return shared_probe(influxdb_server, tmp_path_factory)


@pytest.fixture(scope="session")
def modelled_probe(probe_run: ProbeRun, tmp_path_factory: pytest.TempPathFactory) -> ProbeRun:
    """The probe with the `model` measurement written by `gpuprobe.model.run` (the dashboards read it)."""
    report: Any = shared_report(probe_run, tmp_path_factory)
    assert report.model_points_written > 0
    return probe_run
