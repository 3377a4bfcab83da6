"""Fixtures of the dashboard tests: the same simulated probe and model run as tests/model (generated once
per session by whichever directory asks first; ``simprobe`` lives in tests/model), and for the study
dashboard the synthetic study of tests/study (``study_synthetic``) with its report's `model` points; for the
GPU health dashboard and the alert rules a fleet with GPU faults (``gpuhealth_fleet``)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "model"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "study"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpuhealth_fleet import HealthFleet, write_health_fleet
from simprobe import ProbeRun, shared_probe, shared_report
from study_synthetic import StudyRun, write_study

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


@pytest.fixture(scope="session")
def rolled_up_probe(modelled_probe: ProbeRun) -> ProbeRun:
    """The modelled probe's database set up by `gpuprobe collector --init-db` (rollup policies, continuous
    queries, rp_config), with the rollups of the probe's data computed by the continuous queries' own
    SELECT ... INTO statements (the CQs run them only for recent windows, on InfluxDB's schedule). The raw
    policy keeps its infinite duration: tests/model shares the database."""
    from gpuprobe.influx.client import InfluxClient
    from gpuprobe.influx.retention import RetentionPlan, backfill, init_db
    from gpuprobe.influx.settings import InfluxSettings

    run = modelled_probe
    plan = RetentionPlan(database=run.db, raw_s=None)
    minute = 60 * 10**9
    start = (run.start_ns - 2 * minute) // minute * minute
    end = (run.end_ns + 2 * minute) // minute * minute
    with InfluxClient(InfluxSettings(url=run.server.url, database="")) as client:
        init_db(client, plan)
        backfill(client, plan, start, end)
    return run


@pytest.fixture(scope="session")
def reported_study(influxdb_server: InfluxDBServer) -> StudyRun:
    """The synthetic study with the `model` points (kind=study) of `gpuprobe.study.run` (the study dashboard
    reads them)."""
    from gpuprobe.influx.settings import InfluxSettings
    from gpuprobe.study import ReportSettings, run

    influxdb_server.start()
    study = write_study(influxdb_server)
    outcome = run(ReportSettings(study=study.study, influx=InfluxSettings(url=influxdb_server.url, database=study.db)))
    assert outcome.model_points_written > 0
    return study


@pytest.fixture(scope="session")
def gpu_health_fleet(influxdb_server: InfluxDBServer) -> HealthFleet:
    """The GPU health fleet (gpuhealth_fleet.py: faults, events, processes, NVLink, MIG, as the collector's
    encoder writes them) in a database of its own, set up by `--init-db` with its `gpu` and `node` rollups
    computed like `rolled_up_probe`'s."""
    from gpuprobe.influx.client import InfluxClient
    from gpuprobe.influx.retention import RetentionPlan, backfill, init_db
    from gpuprobe.influx.settings import InfluxSettings

    influxdb_server.start()
    db = "gpu_health_dashboard"
    influxdb_server.create_database(db)
    fleet = write_health_fleet(influxdb_server, db, time.time_ns())
    plan = RetentionPlan(database=db, raw_s=None)
    minute = 60 * 10**9
    with InfluxClient(InfluxSettings(url=influxdb_server.url, database="")) as client:
        init_db(client, plan)
        backfill(
            client,
            plan,
            (fleet.start_ns - 2 * minute) // minute * minute,
            (fleet.end_ns + 2 * minute) // minute * minute,
        )
    return fleet
