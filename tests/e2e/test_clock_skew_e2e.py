"""Nodes whose clocks are 15 minutes off (libfaketime, Debian's ``faketime``): everything they sample is
stored, on the collector's clock, and ``gpuprobe fleet`` shows each one's offset
(docs/operations.md, "A node with a wrong clock").

Two real agents under simulated machines, one 15 minutes fast and one 15 minutes slow, both under
libfaketime with the monotonic clock faked as well (libfaketime's real-monotonic mode breaks
``time.sleep``: tests/agent/test_agent_clock.py), a real collector, InfluxDB and Mosquitto, none of
them skewed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from support import clean_env, gpuprobe_command, wait_until
from test_fleet_e2e import (
    HEALTH_MEASUREMENTS,
    System,
    check_exactly_once,
    influx_rows,
    operator_keys,
    run,
    start_collector,
    stop_agents,
    wait_stored,
)

from gpuprobe.devservices import InfluxDBDatabase, MosquittoServer

pytestmark = pytest.mark.slow

SKEWS_S = {"fast-1": 900.0, "slow-1": -900.0}


def faketime_env(offset_s: float) -> dict[str, str]:
    library = next(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"), None)
    if library is None:
        pytest.fail("libfaketime.so.1 not found under /usr/lib/*/faketime: apt-get install faketime")
    return clean_env(LD_PRELOAD=str(library), FAKETIME=f"{offset_s:+.0f}", FAKETIME_DONT_RESET="1")


def test_skewed_nodes_lose_nothing_and_are_stored_on_the_collectors_clock(
    tmp_path: Path, system: System, influxdb: InfluxDBDatabase, mqtt_broker: MosquittoServer
) -> None:
    collector, port = start_collector(tmp_path, system, influxdb)
    public, _private = operator_keys(tmp_path)
    agents = {}
    for host, skew_s in SKEWS_S.items():
        agents[host] = system.start(
            host,
            [
                *gpuprobe_command(), "sim", "run", "--profile", "H100-SXM5-80GB,L4",
                "--state-dir", str(tmp_path / host / "sim"), "--",
                *gpuprobe_command(), "--log-level", "info", "agent", "--host", host, "--cluster", "skew",
                "--collector", f"127.0.0.1:{port}", "--broker", mqtt_broker.url, "--presence-interval", "1",
                "--trusted-keys", str(public), "--spool", str(tmp_path / host / "spool"),
                "--resolution", "full", "--reconnect-max", "1",
            ],
            env=faketime_env(skew_s),
        )  # fmt: skip

    def offsets() -> dict[str, float] | None:
        for p in [collector, *agents.values()]:
            assert p.alive(), f"{p.name} exited ({p.proc.returncode})\n{system.logs()}"
        fleet = json.loads(run("fleet", "--broker", mqtt_broker.url, "--json").stdout or "[]")
        seen = {p["host"]: p["clock_offset_s"] for p in fleet if p["clock_offset_s"] is not None}
        return seen if set(SKEWS_S) <= set(seen) else None

    seen = wait_until(offsets, 60, "both agents' clock offsets in gpuprobe fleet", interval_s=0.5)
    for host, skew_s in SKEWS_S.items():
        assert abs(seen[host] - skew_s) < 1.0, (host, seen[host])
    table = run("fleet", "--broker", mqtt_broker.url).stdout
    assert "fast-1: clock +900" in table and "slow-1: clock -900" in table, table

    wait_until(
        lambda: all(len(influx_rows(influxdb, f"SELECT \"spool_bytes\" FROM \"agent\" WHERE \"host\" = '{h}'")) >= 3
                    for h in SKEWS_S),
        60, "three batches of each agent stored", interval_s=0.5, describe=collector.log,
    )  # fmt: skip
    taken = stop_agents(agents, mqtt_broker.url)  # every sample spooled and acknowledged, none refused
    stopped_at_ns = time.time_ns()

    counts = wait_stored(influxdb, collector, ("gpu", "node", "acoustic", *HEALTH_MEASUREMENTS), taken)
    check_exactly_once(influxdb, counts, taken)  # none lost, none twice, 10 Hz throughout
    for host, skew_s in SKEWS_S.items():
        # on the collector's clock: the last samples are from just before the agents stopped, not 15 min off
        (last,) = influx_rows(influxdb, f'SELECT last("power_w") FROM "gpu" WHERE "host" = \'{host}\'')
        assert -10.0 < (stopped_at_ns - last["time"]) / 1e9 < 30.0, (host, last)
        offsets_s = [r["clock_offset_s"] for r in influx_rows(
            influxdb, f"SELECT \"clock_offset_s\" FROM \"agent\" WHERE \"host\" = '{host}'"
        )]  # fmt: skip
        assert offsets_s and all(abs(o - skew_s) < 1.0 for o in offsets_s), (host, offsets_s[:5])
    assert "its timestamps are moved by -900 s" in collector.log() and "moved by +900 s" in collector.log()
