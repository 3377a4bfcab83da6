"""Failures with real processes and real signals: the collector killed with SIGKILL mid-stream, InfluxDB
stopped for 20 s, the WAL's disk full, a SIGTERM, several worker processes on one port. Nothing lost,
nothing duplicated."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
import support
from collector_helpers import CollectorProcess, collector_config, running, wait_until

from gpuprobe.agent.uplink import WRITE_RACED_END
from gpuprobe.app.loadgen import AgentSpec, SyntheticAgent
from gpuprobe.collector.settings import SinkSettings
from gpuprobe.devservices import InfluxDBDatabase, InfluxDBServer
from gpuprobe.devservices.disks import SmallDisk
from gpuprobe.v1 import telemetry_pb2

Sent = dict[str, list[telemetry_pb2.GpuSample]]


class Fleet:
    """Synthetic agents that produce a batch every ``period_s`` until stopped, remembering every sample."""

    def __init__(
        self, target: str, hosts: list[str], gpus: int = 4, samples_per_gpu: int = 5, period_s: float = 0.05
    ) -> None:
        self.agents = [
            SyntheticAgent(target, AgentSpec(host, gpus=gpus), window=8, reconnect_initial_s=0.1, reconnect_max_s=0.5)
            for host in hosts
        ]
        self.sent: Sent = {host: [] for host in hosts}
        self.samples_per_gpu = samples_per_gpu
        self.period_s = period_s
        self._tasks: list[asyncio.Task[None]] = []
        self._producer: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._tasks = [asyncio.create_task(agent.run()) for agent in self.agents]
        self._producer = asyncio.create_task(self._produce())

    async def _produce(self) -> None:
        while True:
            for agent in self.agents:
                batch = agent.factory.batch(samples_per_gpu=self.samples_per_gpu)
                self.sent[agent.spec.host].extend(
                    telemetry_pb2.GpuSample.FromString(s.SerializeToString()) for s in batch.gpu_samples
                )
                agent.enqueue(batch)
            await support.pass_time_async(self.period_s)  # the agents' sampling schedule

    async def finish(self, timeout_s: float = 60.0) -> None:
        assert self._producer is not None
        self._producer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._producer
        for agent in self.agents:
            await agent.close(timeout_s)
        await asyncio.gather(*self._tasks)

    @property
    def total(self) -> int:
        return sum(len(samples) for samples in self.sent.values())

    def all_acked_beyond(self, seqs: list[int]) -> bool:
        """Whether every agent has had a batch after ``seqs[i]`` (one per agent) acknowledged."""
        return all(agent.acked_seq > seq for agent, seq in zip(self.agents, seqs, strict=True))

    def acked(self) -> list[int]:
        return [agent.acked_seq for agent in self.agents]


def assert_exactly_once(influx: InfluxDBServer, db: str, sent: Sent) -> None:
    rows: dict[tuple[str, str, int], dict[str, object]] = {}
    for series in influx.query(db, 'SELECT * FROM gpu GROUP BY "host", "gpu"'):
        for row in series.rows():
            rows[(str(row["host"]), str(row["gpu"]), int(str(row["time"])))] = row
    expected = {(host, str(s.gpu_index), s.time_unix_ns): s for host, samples in sent.items() for s in samples}
    assert len(expected) == sum(len(s) for s in sent.values())  # the agents never repeat a timestamp
    assert set(rows) == set(expected), (
        f"missing {len(set(expected) - set(rows))}, extra {len(set(rows) - set(expected))}"
    )
    for key, sample in expected.items():
        row = rows[key]
        assert (
            row["power_w"] == sample.power_w
            and row["energy_j"] == sample.energy_j
            and row["mem_used_bytes"] == sample.mem_used_bytes
        )


async def wait_stored(influx: InfluxDBServer, db: str, count: int, timeout_s: float) -> None:
    def stored() -> int:
        series = influx.query(db, "SELECT count(power_w) FROM gpu")
        return int(series[0].values[0][1]) if series else 0

    async def enough() -> bool:
        return await asyncio.to_thread(stored) >= count

    await wait_until(enough, timeout_s, f"{count} samples stored", interval_s=0.2, describe=stored)


def test_collector_killed_with_sigkill_mid_stream_and_restarted_loses_and_duplicates_nothing(
    influxdb: InfluxDBDatabase, tmp_path: Path, collector_process: Callable[..., CollectorProcess]
) -> None:
    metrics_port = support.free_port()
    process = collector_process(
        "--insecure",
        "--influx-url", influxdb.server.url,
        "--influx-db", influxdb.name,
        "--wal", str(tmp_path / "wal"),
        "--sink-max-backoff", "0.5",
        "--metrics-listen", f"127.0.0.1:{metrics_port}",
    )  # fmt: skip
    process.start()
    fleet = Fleet(f"127.0.0.1:{process.port}", ["node-1", "node-2", "node-3"])

    async def scenario() -> None:
        fleet.start()
        await wait_until(lambda: fleet.all_acked_beyond([5] * 3), 30, "five batches of each agent acked")
        acked_before = fleet.acked()
        process.kill()  # SIGKILL: no chance to flush or say goodbye
        # the agents keep spooling (batches beyond the last acked one) and try to reconnect (an error each)
        await wait_until(
            lambda: all(a.errors and a.next_seq > a.acked_seq + 3 for a in fleet.agents),
            30,
            "every agent to lose its stream and spool three batches more",
        )
        spooled = [agent.next_seq - 1 for agent in fleet.agents]
        await asyncio.to_thread(process.start)
        # the restarted collector takes what was spooled while it was away
        await wait_until(lambda: fleet.all_acked_beyond(spooled), 30, "the batches spooled meanwhile acked")
        await fleet.finish()
        assert all(agent.acked_seq > before for agent, before in zip(fleet.agents, acked_before, strict=True))
        for agent in fleet.agents:
            assert agent.streams >= 2 and agent.errors  # each one lost its stream and came back
            # transport errors only: nothing the agent did was refused
            refusals = {
                grpc.StatusCode.INVALID_ARGUMENT,
                grpc.StatusCode.FAILED_PRECONDITION,
                grpc.StatusCode.UNAUTHENTICATED,
                grpc.StatusCode.PERMISSION_DENIED,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
            }
            assert not {e.code for e in agent.errors} & refusals
        await wait_stored(influxdb.server, influxdb.name, fleet.total, 30)

    asyncio.run(scenario())
    assert_exactly_once(influxdb.server, influxdb.name, fleet.sent)
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    assert "gpuprobe_collector_wal_queued_lines 0.0" in metrics
    assert process.terminate() == 0


@pytest.mark.slow
def test_influxdb_stopped_for_20_s_mid_stream_the_wal_grows_then_drains_and_nothing_is_lost(
    private_influxdb: InfluxDBServer, tmp_path: Path
) -> None:
    private_influxdb.create_database("outage")
    config = collector_config(
        tmp_path,
        private_influxdb.url,
        "outage",
        sink=SinkSettings(linger_s=0.05, backoff_initial_s=0.2, backoff_max_s=2.0),
    )
    depth: list[tuple[float, int]] = []

    async def scenario() -> None:
        async with running(config) as collector:
            fleet = Fleet(
                f"127.0.0.1:{collector.port}", ["rack-1", "rack-2", "rack-3"], gpus=8, samples_per_gpu=10, period_s=0.5
            )
            fleet.start()
            await wait_until(lambda: fleet.all_acked_beyond([2] * 3), 30, "two batches of each agent acked")
            await asyncio.to_thread(private_influxdb.stop)
            outage_started = time.monotonic()
            acked_at_stop = [agent.acked_seq for agent in fleet.agents]
            # the outage lasts 20 s, ten of the sink's longest backoffs: its WAL depth once a second
            while time.monotonic() - outage_started < 20.0:
                depth.append((time.monotonic() - outage_started, collector.wal.depth_lines))
                await support.pass_time_async(1.0)
            # acks went on during the outage: the batches were durable in the WAL
            assert all(
                agent.acked_seq > at_stop + 30 for agent, at_stop in zip(fleet.agents, acked_at_stop, strict=True)
            )
            assert collector.metrics.value("gpuprobe_collector_sink_up") == 0
            peak = collector.wal.depth_lines
            await asyncio.to_thread(private_influxdb.start)
            await wait_until(
                lambda: collector.metrics.value("gpuprobe_collector_sink_up") == 1, 30, "the sink up again"
            )
            await fleet.finish()
            await wait_until(lambda: collector.wal.depth_lines == 0, 60, "the WAL to drain")
            assert collector.metrics.value("gpuprobe_collector_sink_up") == 1
            assert all(not agent.errors for agent in fleet.agents)
            assert peak >= 3 * 8 * 10 * 30  # ~40 batches per agent waited in the WAL
            await wait_stored(private_influxdb, "outage", fleet.total, 30)
            assert_exactly_once(private_influxdb, "outage", fleet.sent)

    asyncio.run(scenario())
    growth = [lines for _, lines in depth]
    assert growth == sorted(growth) and growth[-1] > growth[0]


def test_wal_disk_full_then_space_and_influxdb_back_delivers_everything_once_without_a_restart(
    private_influxdb: InfluxDBServer, tmp_path: Path, small_disk: Callable[[str, int], SmallDisk]
) -> None:
    private_influxdb.create_database("walfull")
    disk = small_disk("wal", 256 * 1024)
    config = collector_config(
        tmp_path,
        private_influxdb.url,
        "walfull",
        wal_dir=disk.path,
        sink=SinkSettings(linger_s=0.05, backoff_initial_s=0.2, backoff_max_s=1.0),
    )
    private_influxdb.stop()  # nothing drains the WAL: it grows until the disk is full
    timings: dict[str, float] = {}
    sent: Sent = {}

    async def scenario() -> None:
        async with running(config) as collector:
            fleet = Fleet(f"127.0.0.1:{collector.port}", ["full-1", "full-2", "full-3"], gpus=4, samples_per_gpu=5)
            sent.update(fleet.sent)
            fleet.start()
            await wait_until(lambda: collector.wal.failure is not None, 60, "the WAL's disk to fill")
            failure = collector.wal.failure
            assert failure is not None and failure.disk_full, failure
            assert collector.metrics.value("gpuprobe_collector_wal_up") == 0
            # the WAL retries the commit (after 0.2 s, then doubling) and keeps failing; acks of what it
            # committed before are long delivered by then (the agents run in this event loop)
            await wait_until(
                lambda: collector.wal.failure is not None and collector.wal.failure.failed_commits >= 2,
                30,
                "the WAL's commit to fail twice",
            )
            acked_while_full = fleet.acked()
            await support.stays_async(
                lambda: fleet.acked() == acked_while_full,
                2.0,
                "nothing more acked while the WAL's disk is full",
                describe=fleet.acked,
            )
            assert collector.wal.failure is not None and collector.wal.failure.failed_commits >= 2
            assert "NOT WRITABLE (disk full" in collector.wal.state()

            disk.resize(64 * 1024 * 1024)
            space_back = time.monotonic()
            await asyncio.to_thread(private_influxdb.start)
            await wait_until(
                lambda: all(
                    agent.acked_seq > before for agent, before in zip(fleet.agents, acked_while_full, strict=True)
                ),
                60,
                "acks to resume",
            )
            timings["acks_resumed_s"] = time.monotonic() - space_back
            assert collector.wal.healthy and collector.metrics.value("gpuprobe_collector_wal_up") == 1
            await fleet.finish()
            await wait_until(lambda: collector.wal.depth_lines == 0, 60, "the WAL to drain")
            await wait_stored(private_influxdb, "walfull", fleet.total, 30)
            # the collector ended streams with UNAVAILABLE only (no INTERNAL, no refusal)...
            ended = {
                code: collector.metrics.value("gpuprobe_collector_streams_ended_total", {"code": code})
                for code in ("UNAVAILABLE", "INTERNAL", "UNKNOWN", "RESOURCE_EXHAUSTED", "INVALID_ARGUMENT")
            }
            assert ended["UNAVAILABLE"] > 0 and not any(ended[code] for code in ended if code != "UNAVAILABLE")
            for agent in fleet.agents:
                # ...and saw that, or a write that raced the end of the stream (their gRPC library's INTERNAL)
                assert all(e.code == grpc.StatusCode.UNAVAILABLE or WRITE_RACED_END in str(e) for e in agent.errors), (
                    agent.errors
                )
                assert any("disk full" in str(e) for e in agent.errors)

    asyncio.run(scenario())
    assert_exactly_once(private_influxdb, "walfull", sent)
    # the WAL retries every 5 s at most; the agents reconnect within 0.5 s
    assert timings["acks_resumed_s"] < 10.0, timings
    print(f"acks resumed {timings['acks_resumed_s']:.2f} s after the WAL's disk got room")


@pytest.mark.slow
def test_influxdb_disk_full_is_retried_nothing_is_quarantined_and_everything_arrives_once_when_it_has_room(
    tmp_path: Path, small_disk: Callable[[str, int], SmallDisk]
) -> None:
    disk = small_disk("influxdb", 8 * 1024 * 1024)
    influx = InfluxDBServer(disk.path / "influxdb")
    influx.start()
    try:
        influx.create_database("influxfull")
        config = collector_config(
            tmp_path,
            influx.url,
            "influxfull",
            sink=SinkSettings(linger_s=0.05, backoff_initial_s=0.2, backoff_max_s=1.0),
        )

        async def scenario() -> None:
            async with running(config) as collector:
                fleet = Fleet(
                    f"127.0.0.1:{collector.port}", ["if-1", "if-2", "if-3"], gpus=8, samples_per_gpu=10, period_s=0.02
                )
                fleet.start()
                await wait_until(
                    lambda: (
                        collector.metrics.value(
                            "gpuprobe_collector_write_requests_total", {"status": "500", "outcome": "retry"}
                        )
                        > 0
                    ),
                    90,
                    "InfluxDB to answer that its disk is full",
                )
                await wait_until(
                    lambda: collector.metrics.value("gpuprobe_collector_sink_up") == 0, 30, "the sink down"
                )
                assert collector.wal.quarantine_count() == 0  # a full disk is not the lines' fault
                acked = fleet.acked()
                # the agents are still acked: the collector's WAL holds what InfluxDB cannot take yet
                await wait_until(lambda: fleet.all_acked_beyond(acked), 30, "acks while InfluxDB's disk is full")
                assert collector.wal.quarantine_count() == 0
                disk.resize(512 * 1024 * 1024)
                # InfluxDB 1.x does not recover from a full disk by itself (its WAL writer keeps failing
                # with ENOSPC): it needs a restart once it has room, which the collector rides out
                await asyncio.to_thread(influx.stop)
                await asyncio.to_thread(influx.start)
                await fleet.finish()
                await wait_until(lambda: collector.wal.depth_lines == 0, 120, "the WAL to drain into InfluxDB")
                assert collector.metrics.value("gpuprobe_collector_sink_up") == 1
                assert collector.wal.quarantine_count() == 0
                await wait_stored(influx, "influxfull", fleet.total, 60)
                sent.update(fleet.sent)

        sent: Sent = {}
        asyncio.run(scenario())
        assert_exactly_once(influx, "influxfull", sent)
    finally:
        influx.stop()


def test_sigterm_acks_what_is_durable_ends_streams_with_unavailable_and_keeps_the_wal(
    influxdb: InfluxDBDatabase, tmp_path: Path, collector_process: Callable[..., CollectorProcess]
) -> None:
    dead_influx = f"http://127.0.0.1:{support.free_port()}"
    common = ["--insecure", "--influx-db", influxdb.name, "--wal", str(tmp_path / "wal"), "--sink-max-backoff", "0.3"]
    first = collector_process(*common, "--influx-url", dead_influx, "--drain-timeout", "1")
    first.start()
    fleet = Fleet(f"127.0.0.1:{first.port}", ["term-1"], gpus=2)

    async def scenario() -> None:
        fleet.start()
        # batches acknowledged (durable in the WAL) that InfluxDB, being down, cannot take
        await wait_until(lambda: fleet.all_acked_beyond([3]), 30, "three batches acked")
        code = await asyncio.to_thread(first.terminate)
        assert code == 75  # InfluxDB is down: the drain left acknowledged lines in the WAL, and says so
        assert "stopping: ending agent streams" in first.log()
        assert "acknowledged lines" in first.log() and "are left in the WAL" in first.log()
        assert any(e.code == grpc.StatusCode.UNAVAILABLE for e in fleet.agents[0].errors)
        second = collector_process(*common, "--influx-url", influxdb.server.url, port=first.port)
        await asyncio.to_thread(second.start)
        await fleet.finish()
        await wait_stored(influxdb.server, influxdb.name, fleet.total, 30)

    asyncio.run(scenario())
    assert_exactly_once(influxdb.server, influxdb.name, fleet.sent)


def free_port_pair() -> int:
    """A port ``p`` with ``p + 1`` free too: worker ``i`` serves its metrics on ``p + i``. A lone free port's
    neighbour is often an outgoing connection's (both come from the ephemeral range)."""
    for _ in range(100):
        port = support.free_port()
        if port < 65535:
            with contextlib.suppress(OSError), socket.socket() as probe:
                probe.bind(("127.0.0.1", port + 1))
                return port
    raise AssertionError("no two neighbouring free ports")


def test_workers_share_one_port_each_with_its_own_wal_and_metrics(
    influxdb: InfluxDBDatabase, tmp_path: Path, collector_process: Callable[..., CollectorProcess]
) -> None:
    metrics_port = free_port_pair()
    process = collector_process(
        "--insecure",
        "--workers", "2",
        "--influx-url", influxdb.server.url,
        "--influx-db", influxdb.name,
        "--wal", str(tmp_path / "wal"),
        "--metrics-listen", f"127.0.0.1:{metrics_port}",
    )  # fmt: skip
    process.start()
    fleet = Fleet(f"127.0.0.1:{process.port}", [f"w-{i}" for i in range(6)], gpus=2)

    async def scenario() -> None:
        fleet.start()
        # every agent streams (to one worker or the other) and is acked before they all stop
        await wait_until(lambda: fleet.all_acked_beyond([3] * 6), 30, "three batches of each agent acked")
        await fleet.finish()
        await wait_stored(influxdb.server, influxdb.name, fleet.total, 30)

    asyncio.run(scenario())
    assert_exactly_once(influxdb.server, influxdb.name, fleet.sent)
    assert sorted(p.name for p in (tmp_path / "wal").glob("*.sqlite")) == ["collector-0.sqlite", "collector-1.sqlite"]
    streams = 0.0
    for worker in range(2):
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port + worker}/metrics", timeout=5).read().decode()
        streams += sum(
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith("gpuprobe_collector_streams_ended_total{")
        )
    assert streams == 6
    assert process.proc is not None
    process.proc.send_signal(signal.SIGTERM)
    assert process.proc.wait(20) == 0


def test_a_worker_whose_metrics_port_is_taken_stops_the_collector_before_it_serves(tmp_path: Path) -> None:
    """Worker 1's metrics port (``--metrics-listen`` port + 1) is taken: the collector exits 1 and says why
    instead of running on with one worker (what made test_workers_share_one_port... hang in CI when the
    port next to its free metrics port was an outgoing connection's)."""
    metrics_port = free_port_pair()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", metrics_port + 1))
        taken.listen()
        done = subprocess.run(
            [
                sys.executable, "-m", "gpuprobe.app", "--log-level", "info", "collector", "--insecure",
                "--workers", "2", "--listen", f"127.0.0.1:{support.free_port()}", "--influx-url", "http://127.0.0.1:9",
                "--wal", str(tmp_path / "wal"), "--metrics-listen", f"127.0.0.1:{metrics_port}",
            ],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "a collector worker failed to start" in done.stderr and "Address already in use" in done.stderr


def test_plaintext_without_insecure_refuses_to_start(
    tmp_path: Path, collector_process: Callable[..., CollectorProcess]
) -> None:
    process = collector_process("--wal", str(tmp_path / "wal"))
    with pytest.raises(AssertionError, match="refusing to serve agents over plaintext"):
        process.start(timeout_s=20)
    assert process.proc is not None and process.proc.returncode == 2


def test_influx_and_collector_options_come_from_toml_and_environment(tmp_path: Path) -> None:
    from gpuprobe.app.cli import all_commands, build_parser
    from gpuprobe.collector.cli import config_from_options
    from gpuprobe.config import load_file, resolve

    config_file = tmp_path / "collector.toml"
    config_file.write_text(
        '[collector]\ninsecure = true\ninflux_db = "from_file"\nworkers = 3\nlisten = "127.0.0.1:9999"\n'
    )
    commands = {c.name: c for c in all_commands()}
    args = build_parser(list(commands.values())).parse_args(["collector", "--workers", "2"])
    values = resolve(
        "collector",
        commands["collector"].options,
        args,
        load_file(config_file),
        config_file,
        {"GPUPROBE_INFLUX_RP": "env_rp"},
    )
    config = config_from_options(values)
    assert (config.influx.database, config.influx.retention_policy, config.workers) == ("from_file", "env_rp", 2)
    assert replace(config, workers=1).listen == "127.0.0.1:9999"


def test_at_start_an_unreachable_influxdb_or_a_missing_database_is_named_with_what_to_do(
    tmp_path: Path, collector_process: Callable[..., CollectorProcess], influxdb: InfluxDBDatabase
) -> None:
    """It said only "cannot list the retention policies of default: ..." with no cause."""
    dead_url = f"http://127.0.0.1:{support.free_port()}"  # nothing listens there
    down = collector_process("--insecure", "--influx-url", dead_url, "--wal", str(tmp_path / "wal-1")).start()
    support.wait_until(lambda: "is unreachable" in down.log(), 20, "the unreachable InfluxDB named", describe=down.log)
    line = next(line for line in down.log().splitlines() if "is unreachable" in line)
    assert " ERROR " in line and f"InfluxDB at {dead_url}" in line and "--influx-url" in line, line
    assert "the agents' data waits in the WAL" in line
    assert down.terminate() in (0, 75)
    missing = f"{influxdb.name}_missing"
    no_db = collector_process(
        "--insecure", "--influx-url", influxdb.server.url, "--influx-db", missing, "--wal", str(tmp_path / "wal-2")
    ).start()
    support.wait_until(lambda: "has no database" in no_db.log(), 20, "the missing database named", describe=no_db.log)
    line = next(line for line in no_db.log().splitlines() if "has no database" in line)
    assert f"has no database {missing!r}" in line and "--init-db" in line and "--influx-db" in line, line
    assert no_db.terminate() in (0, 75)
    # the database that exists: no such line
    fine = collector_process(
        "--insecure", "--influx-url", influxdb.server.url, "--influx-db", influxdb.name, "--wal", str(tmp_path / "w3")
    ).start()
    support.wait_until(
        lambda: "serving on port" in fine.log(), 20, '"serving on port" in fine.log()'
    )  # logged after the InfluxDB check at start
    assert fine.terminate() == 0
    assert "has no database" not in fine.log() and "is unreachable" not in fine.log(), fine.log()
