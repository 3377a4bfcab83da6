"""Fixtures shared by all tests: one real InfluxDB and one real Mosquitto per session, on free ports.

Tests that kill or restart a server construct their own (``InfluxDBServer(tmp_path)``,
``MosquittoServer(tmp_path)``) so the shared ones stay up for everybody else.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import check_sleep

from gpuprobe.devservices import InfluxDBDatabase, InfluxDBServer, MosquittoServer
from gpuprobe.devservices.disks import SmallDisk


@pytest.fixture(scope="session")
def influxdb_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InfluxDBServer]:
    """The session's InfluxDB (started on first use, stopped at the end of the session)."""
    with InfluxDBServer(tmp_path_factory.mktemp("influxdb")) as server:
        yield server


@pytest.fixture
def second_influxdb(tmp_path: Path) -> Iterator[InfluxDBServer]:
    """A second InfluxDB process of this test alone (another region's server, for routing): it may be
    stopped and started again; started the same way as the session's."""
    server = InfluxDBServer(tmp_path / "influxdb-second")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def mosquitto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MosquittoServer]:
    """The session's Mosquitto broker: anonymous clients allowed, no persistence."""
    with MosquittoServer(tmp_path_factory.mktemp("mosquitto")) as server:
        yield server


@pytest.fixture
def influxdb(influxdb_server: InfluxDBServer, request: pytest.FixtureRequest) -> Iterator[InfluxDBDatabase]:
    """The session's InfluxDB and a fresh database named after the test, dropped afterwards."""
    influxdb_server.start()  # no-op unless a test stopped the shared server
    stem = re.sub(r"[^A-Za-z0-9_]", "_", request.node.name)[:40]
    name = f"t_{stem}_{uuid.uuid4().hex[:8]}"
    influxdb_server.create_database(name)
    yield InfluxDBDatabase(influxdb_server, name)
    if influxdb_server.running:
        influxdb_server.drop_database(name)


@pytest.fixture
def mqtt_broker(mosquitto_server: MosquittoServer) -> MosquittoServer:
    """The session's Mosquitto broker (started again if an earlier test stopped it)."""
    return mosquitto_server.start()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[[str, int], SmallDisk]]:
    """``small_disk(name, size_bytes)`` mounts a tmpfs under ``tmp_path``; unmounted afterwards.

    Needs root (CI runs as root); elsewhere the test is skipped with that reason.
    """
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
    disks: list[SmallDisk] = []

    def make(name: str, size_bytes: int) -> SmallDisk:
        disk = SmallDisk(tmp_path / name, size_bytes)
        disks.append(disk)
        return disk

    yield make
    for disk in disks:
        disk.unmount()


@pytest.fixture(autouse=True)
def no_long_sleeps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail a test (or a helper under ``tests/``) that sleeps longer than ``MAX_TEST_SLEEP_S`` at a time.

    Only calls made from files under ``tests/`` count: the product's own waits (backoff, drain) are what
    the tests exercise. Helper processes the tests start are not covered (they are not this process).
    """
    real_sleep = time.sleep
    real_async_sleep = asyncio.sleep

    def sleep(seconds: float) -> None:
        check_sleep(seconds, sys._getframe(1).f_code.co_filename)
        real_sleep(seconds)

    def async_sleep(delay: float, result: Any = None) -> Any:
        check_sleep(delay, sys._getframe(1).f_code.co_filename)
        return real_async_sleep(delay, result)

    monkeypatch.setattr(time, "sleep", sleep)
    monkeypatch.setattr(asyncio, "sleep", async_sleep)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Start the long tests first (end-to-end, then those marked slow): with two workers, a long test
    collected last would run on its own at the end while the other worker has nothing left to do.
    The sort is stable, so every worker sees the same order (xdist requires it)."""

    def rank(item: pytest.Item) -> int:
        if "e2e" in item.path.parts:
            return 0
        return 1 if item.get_closest_marker("slow") else 2

    items.sort(key=rank)
