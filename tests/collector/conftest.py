"""Fixtures for the collector's tests (helpers in collector_helpers.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from collector_helpers import CollectorProcess, RecordingServer

from gpuprobe.devservices.certs import Pki, make_pki
from gpuprobe.devservices.influxdb import InfluxDBServer
from gpuprobe.devservices.ports import LOOPBACK, free_port


@pytest.fixture
def recording_server() -> Iterator[RecordingServer]:
    server = RecordingServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"), client_name="agent-tls")


@pytest.fixture
def collector_process(tmp_path: Path) -> Iterator[Callable[..., CollectorProcess]]:
    started: list[CollectorProcess] = []

    def make(*args: str, port: int | None = None, env: dict[str, str] | None = None) -> CollectorProcess:
        chosen = port if port is not None else free_port()
        process = CollectorProcess(
            ["--listen", f"{LOOPBACK}:{chosen}", *args], tmp_path / f"collector-{len(started)}.log", chosen, env
        )
        started.append(process)
        return process

    yield make
    for process in started:
        process.kill()


@pytest.fixture
def private_influxdb(tmp_path: Path) -> Iterator[InfluxDBServer]:
    """An InfluxDB of this test alone: it may be stopped, killed and started again."""
    server = InfluxDBServer(tmp_path / "influxdb")
    server.start()
    yield server
    server.stop()
