"""Collectors that come and go (issue 14): ``--ack-after sink`` acks a batch only once InfluxDB has it,
and a drain (SIGTERM) writes the WAL into InfluxDB before it exits, or says what it left behind."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import support
from collector_helpers import CollectorProcess, collector_config, running, wait_until
from test_collector_faults import Fleet, assert_exactly_once

from gpuprobe.app.loadgen import AgentSpec, SyntheticAgent
from gpuprobe.collector.runner import DRAIN_UNREACHABLE_GRACE_S, EXIT_WAL_LEFT
from gpuprobe.devservices import InfluxDBServer
from gpuprobe.devservices.influxdb import ADMIN_USER


def pending_lines(wal_dir: Path) -> int:
    db = sqlite3.connect(f"file:{wal_dir / 'collector-0.sqlite'}?mode=ro", uri=True)
    try:
        return int(db.execute("SELECT coalesce(sum(line_count), 0) FROM pending").fetchone()[0])
    finally:
        db.close()


def test_ack_after_sink_acks_nothing_while_influxdb_is_down_and_everything_once_it_is_back(
    private_influxdb: InfluxDBServer, tmp_path: Path
) -> None:
    private_influxdb.create_database("sinkack")
    config = collector_config(tmp_path, private_influxdb.url, "sinkack", ack_after="sink")
    private_influxdb.stop()

    async def scenario() -> None:
        async with running(config) as collector:
            agent = SyntheticAgent(f"127.0.0.1:{collector.port}", AgentSpec("sink-1", gpus=2), window=8)
            task = asyncio.create_task(agent.run())
            sent = []
            for _ in range(5):
                batch = agent.factory.batch(samples_per_gpu=5)
                sent.extend(batch.gpu_samples)
                last = agent.enqueue(batch)
            await wait_until(lambda: collector.wal.depth_rows == 5, 10, "the batches in the WAL")
            await wait_until(
                lambda: collector.metrics.value("gpuprobe_collector_sink_up") == 0, 10, "the sink to find InfluxDB down"
            )
            # durable in the WAL, but InfluxDB does not have them: no ack, the agent keeps them (while the
            # sink retries, every 0.5 s at most)
            await support.stays_async(
                lambda: agent.acked_seq == 0 and agent.acks == 0, 1.0, "no ack while InfluxDB is down"
            )
            assert collector.metrics.value("gpuprobe_collector_acks_waiting_for_influxdb") == 5
            assert collector.metrics.value("gpuprobe_collector_sink_up") == 0
            await asyncio.to_thread(private_influxdb.start)
            started = time.monotonic()
            await agent.wait_acked(last, 30)
            print(f"acked {time.monotonic() - started:.2f} s after InfluxDB was back")
            assert collector.metrics.value("gpuprobe_collector_acks_waiting_for_influxdb") == 0
            await agent.close()
            await task
            # an ack means InfluxDB has the batch: it is there already, without waiting
            assert_exactly_once(private_influxdb, "sinkack", {"sink-1": list(sent)})

    asyncio.run(scenario())


def test_ack_after_sink_stores_a_replay_again_and_acks_it_only_once_written(
    private_influxdb: InfluxDBServer, tmp_path: Path
) -> None:
    """A batch durable in the WAL but not yet in InfluxDB is not acked as a replay (it would be
    stranded if this collector never came back)."""
    private_influxdb.create_database("replay")
    config = collector_config(tmp_path, private_influxdb.url, "replay", ack_after="sink")

    async def scenario() -> None:
        async with running(config) as collector:
            target = f"127.0.0.1:{collector.port}"
            first = SyntheticAgent(target, AgentSpec("replay-1", gpus=1), window=4)
            batch = first.factory.batch(samples_per_gpu=3)
            first.enqueue(batch)
            task = asyncio.create_task(first.run())
            await first.wait_acked(1, 10)
            await first.close()
            await task
            await wait_until(lambda: collector.wal.depth_rows == 0, 10, "the WAL to empty")
            # the same batch again (an agent whose ack was lost): stored again, acked once written
            again = SyntheticAgent(target, AgentSpec("replay-1", gpus=1), window=4)
            again.enqueue(batch)
            task = asyncio.create_task(again.run())
            await again.wait_acked(1, 10)
            await again.close()
            await task
            assert collector.metrics.value("gpuprobe_collector_batches_replayed_total") == 0
            assert collector.metrics.value("gpuprobe_collector_written_lines_total") == 2 * len(batch.gpu_samples)
            assert_exactly_once(private_influxdb, "replay", {"replay-1": list(batch.gpu_samples)})

    asyncio.run(scenario())


def test_sigterm_drains_the_wal_into_influxdb_before_exiting(
    private_influxdb: InfluxDBServer, tmp_path: Path, collector_process: Callable[..., CollectorProcess]
) -> None:
    """InfluxDB is down while the agents are acked (the WAL holds their batches) and still down when
    SIGTERM comes; it is back during the drain, which writes the whole WAL and exits 0."""
    private_influxdb.create_database("drain")
    wal = tmp_path / "wal"
    process = collector_process(
        "--insecure", "--influx-url", private_influxdb.url, "--influx-db", "drain", "--wal", str(wal),
        "--sink-max-backoff", "0.3", "--drain-timeout", "20",
        "--sink-linger", "60",  # a drain does not wait for a partly filled write to fill up
    )  # fmt: skip
    process.start()
    private_influxdb.stop()
    fleet = Fleet(f"127.0.0.1:{process.port}", ["drain-1", "drain-2", "drain-3"], gpus=2)

    async def scenario() -> None:
        fleet.start()
        await wait_until(lambda: fleet.all_acked_beyond([5] * 3), 30, "five batches of each agent acked")
        await fleet.finish()  # everything acked: durable in the WAL only
        proc = process.proc
        assert proc is not None
        proc.send_signal(15)
        await wait_until(lambda: "stopping: ending agent streams" in process.log(), 10, "the drain to start")
        # draining: waiting for InfluxDB; back within the drain's grace for an InfluxDB that cannot be
        # reached (DRAIN_UNREACHABLE_GRACE_S, 2 s)
        await support.stays_async(lambda: proc.poll() is None, 0.5, "the collector draining", describe=process.log)
        await asyncio.to_thread(private_influxdb.start)
        code = await asyncio.to_thread(process.proc.wait, 60)
        assert code == 0, process.log()

    asyncio.run(scenario())
    log = process.log()
    match = re.search(r"drained in ([\d.]+) s \(streams ended after ([\d.]+) s\): the WAL is empty, (\d+) queued", log)
    assert match, log
    assert int(match[3]) > 0
    print(f"drain took {match[1]} s ({match[3]} queued lines written)")
    assert pending_lines(wal) == 0
    assert_exactly_once(private_influxdb, "drain", fleet.sent)


def test_sigterm_with_influxdb_down_says_what_it_left_in_the_wal_and_exits_75_after_a_short_grace(
    tmp_path: Path, collector_process: Callable[..., CollectorProcess]
) -> None:
    """Connection refused for the whole drain: it ends after DRAIN_UNREACHABLE_GRACE_S, not after
    --drain-timeout (an InfluxDB that is down does not come back for the deadline)."""
    dead_influx = "http://127.0.0.1:9"
    wal = tmp_path / "wal"
    process = collector_process(
        "--insecure", "--influx-url", dead_influx, "--wal", str(wal), "--drain-timeout", "25",
        "--sink-max-backoff", "30",  # a drain retries now, whatever the backoff had reached
    )  # fmt: skip
    process.start()
    fleet = Fleet(f"127.0.0.1:{process.port}", ["left-1"], gpus=2)

    async def scenario() -> None:
        fleet.start()
        await wait_until(lambda: fleet.all_acked_beyond([3]), 30, "three batches acked")
        await fleet.finish()

    asyncio.run(scenario())
    started = time.monotonic()
    assert process.terminate() == EXIT_WAL_LEFT
    took_s = time.monotonic() - started
    print(f"SIGTERM to exit: {took_s:.2f} s")
    assert DRAIN_UNREACHABLE_GRACE_S <= took_s < DRAIN_UNREACHABLE_GRACE_S + 3, process.log()
    assert "InfluxDB cannot be reached (ConnectError" in process.log()
    left = pending_lines(wal)
    assert left == fleet.total  # one line per GPU sample
    match = re.search(
        r"(\d+) acknowledged lines \((\d+) bytes compressed, (\d+) rows\) are left in the WAL (\S+?)\.? ", process.log()
    )
    assert match, process.log()
    assert int(match[1]) == left and match[4] == str(wal / "collector-0.sqlite")


def test_sigterm_in_sink_mode_with_influxdb_down_leaves_only_unacked_lines_and_exits_0(
    tmp_path: Path, collector_process: Callable[..., CollectorProcess]
) -> None:
    wal = tmp_path / "wal"
    process = collector_process(
        "--insecure", "--influx-url", "http://127.0.0.1:9", "--wal", str(wal),
        "--ack-after", "sink", "--drain-timeout", "1.5",
    )  # fmt: skip
    process.start()
    fleet = Fleet(f"127.0.0.1:{process.port}", ["unacked-1"], gpus=2)

    async def scenario() -> None:
        fleet.start()
        # batches durable in the WAL, none acknowledged (InfluxDB never has them)
        await wait_until(lambda: pending_lines(wal) > 0, 30, "lines in the WAL")
        assert process.terminate() == 0
        assert all(agent.acked_seq == 0 for agent in fleet.agents)
        for task in fleet._tasks:
            task.cancel()
        assert fleet._producer is not None
        fleet._producer.cancel()
        await asyncio.gather(*fleet._tasks, fleet._producer, return_exceptions=True)

    asyncio.run(scenario())
    assert "none was acknowledged (--ack-after sink): the agents still have them" in process.log()


def test_sigterm_with_influxdb_refusing_the_credentials_ends_at_once_and_the_next_collector_delivers_all(
    tmp_path: Path, collector_process: Callable[..., CollectorProcess]
) -> None:
    """A wrong password (HTTP 401): retrying cannot fix it, so the drain ends at once and releases the
    WAL's lock; the collector started right after with the right password writes everything."""
    wal = tmp_path / "wal"
    with InfluxDBServer(tmp_path / "influxdb", admin_password="right-password") as influx:
        influx.create_database("auth")
        common = [
            "--insecure", "--influx-url", influx.url, "--influx-db", "auth", "--wal", str(wal),
            "--influx-username", ADMIN_USER, "--drain-timeout", "25", "--sink-max-backoff", "0.3",
        ]  # fmt: skip
        wrong = collector_process(*common, "--influx-password", "wrong-password").start()
        fleet = Fleet(f"127.0.0.1:{wrong.port}", ["auth-1", "auth-2"], gpus=2)

        async def scenario() -> None:
            fleet.start()
            await wait_until(lambda: fleet.all_acked_beyond([2, 2]), 30, "two batches of each agent acked")
            await fleet.finish()  # everything acked: durable in the WAL only

        asyncio.run(scenario())
        support.wait_until(
            lambda: "refuses the collector's writes (HTTP 401" in wrong.log(), 10, "the 401 alert", describe=wrong.log
        )
        started = time.monotonic()
        assert wrong.terminate() == EXIT_WAL_LEFT
        took_s = time.monotonic() - started
        print(f"SIGTERM to exit with InfluxDB refusing: {took_s:.2f} s")
        assert took_s < 3, wrong.log()
        assert "drain ended after" in wrong.log() and "refuses the writes (HTTP 401" in wrong.log(), wrong.log()
        assert pending_lines(wal) == fleet.total

        right = collector_process(*common, "--influx-password", "right-password").start()  # the WAL is free

        def stored() -> int:
            series = influx.query("auth", "SELECT count(power_w) FROM gpu")
            return int(series[0].values[0][1]) if series else 0

        support.wait_until(lambda: stored() >= fleet.total, 30, "every sample in InfluxDB", describe=right.log)
        assert right.terminate() == 0, right.log()
        assert_exactly_once(influx, "auth", fleet.sent)
        assert pending_lines(wal) == 0
