"""Fixtures of the study report tests: a synthetic study (study_synthetic.py) in a real InfluxDB, and
`gpuprobe study report` run in this process."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from study_synthetic import PRICES, StudyCommand, StudyRun, write_study

from gpuprobe.devservices import InfluxDBServer
from gpuprobe.influx.client import InfluxClient
from gpuprobe.influx.settings import InfluxSettings
from gpuprobe.study import StudyReport, build_report


@pytest.fixture(autouse=True)
def _no_gpuprobe_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPUPROBE_* variable of the machine must not change what the tests run."""
    for name in list(os.environ):
        if name.startswith("GPUPROBE_"):
            monkeypatch.delenv(name)


@pytest.fixture(scope="session")
def study_run(influxdb_server: InfluxDBServer) -> StudyRun:
    """The synthetic study in its own database, written once per session."""
    influxdb_server.start()
    return write_study(influxdb_server)


@pytest.fixture(scope="session")
def study_report(study_run: StudyRun) -> StudyReport:
    """`build_report` on the synthetic study, with its prices."""
    settings = InfluxSettings(url=study_run.server.url, database=study_run.db)
    with InfluxClient(settings) as client:
        return build_report(client, study_run.study, prices=PRICES)


@pytest.fixture
def fresh_study(influxdb_server: InfluxDBServer) -> Iterator[Callable[..., StudyRun]]:
    """``fresh_study(**kwargs)``: the synthetic study (write_study's options) in a new database, dropped
    afterwards."""
    made: list[StudyRun] = []

    def make(**kwargs: Any) -> StudyRun:
        influxdb_server.start()
        run = write_study(influxdb_server, **kwargs)
        made.append(run)
        return run

    yield make
    for run in made:
        if influxdb_server.running:
            influxdb_server.drop_database(run.db)


@pytest.fixture
def gpuprobe_study(capsys: pytest.CaptureFixture[str]) -> StudyCommand:
    """``gpuprobe_study(run, *args)`` runs ``gpuprobe study report <args> --influx-url … --influx-db …``
    against ``run``'s database (``run`` None: no InfluxDB options): (exit status, stdout, stderr)."""
    from gpuprobe.app.cli import main

    def command(run: StudyRun | None, *args: str | Path) -> tuple[int, str, str]:
        capsys.readouterr()
        influx = [] if run is None else ["--influx-url", run.server.url, "--influx-db", run.db]
        try:
            status = main(["study", "report", *map(str, args), *influx])
        except SystemExit as e:  # argparse's usage errors
            status = int(e.code or 0)
        out = capsys.readouterr()
        return status, out.out, out.err

    return command
