"""Fixtures of the model tests: one simulated probe per session (``simprobe``) and the model run on it."""

from __future__ import annotations

import pytest
from simprobe import ProbeRun, shared_probe, shared_report

from gpuprobe.devservices import InfluxDBServer
from gpuprobe.model import ReportPaths


@pytest.fixture(scope="session")
def probe_run(influxdb_server: InfluxDBServer, tmp_path_factory: pytest.TempPathFactory) -> ProbeRun:
    """Two simulated nodes through a 40 s probe (about 45 s, once per run: the xdist workers share it),
    stored in a database of this worker's InfluxDB."""
    return shared_probe(influxdb_server, tmp_path_factory)


@pytest.fixture(scope="session")
def report(probe_run: ProbeRun, tmp_path_factory: pytest.TempPathFactory) -> ReportPaths:
    """`gpuprobe.model.run` on that probe: report, JSON and `model` points (fitted once per run, the
    points written into this worker's database)."""
    result: ReportPaths = shared_report(probe_run, tmp_path_factory)
    return result
