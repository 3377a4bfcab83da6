"""Collectors that come and go (issue 14): ``--ack-after sink`` acks a batch only once InfluxDB has it,
and a drain (SIGTERM) writes the WAL into InfluxDB before it exits, or says what it left behind."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from collector_helpers import CollectorProcess, collector_config, running, wait_until
from test_collector_faults import Fleet, assert_exactly_once

from gpuprobe.collector.runner import EXIT_WAL_LEFT
from gpuprobe.devservices import InfluxDBServer
from gpuprobe.loadgen import AgentSpec, SyntheticAgent


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
            await asyncio.sleep(2.0)
            # durable in the WAL, but InfluxDB does not have them: no ack, the agent keeps them
            assert agent.acked_seq == 0 and agent.acks == 0
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
        await asyncio.sleep(1.5)
        await fleet.finish()  # everything acked: durable in the WAL only
        assert process.proc is not None
        process.proc.send_signal(15)
        await asyncio.sleep(0.5)
        assert process.proc.poll() is None  # draining: waiting for InfluxDB
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


def test_sigterm_with_influxdb_down_says_what_it_left_in_the_wal_and_exits_75(
    tmp_path: Path, collector_process: Callable[..., CollectorProcess]
) -> None:
    dead_influx = "http://127.0.0.1:9"
    wal = tmp_path / "wal"
    process = collector_process(
        "--insecure", "--influx-url", dead_influx, "--wal", str(wal), "--drain-timeout", "1.5",
    )  # fmt: skip
    process.start()
    fleet = Fleet(f"127.0.0.1:{process.port}", ["left-1"], gpus=2)

    async def scenario() -> None:
        fleet.start()
        await asyncio.sleep(1.0)
        await fleet.finish()

    asyncio.run(scenario())
    started = time.monotonic()
    assert process.terminate() == EXIT_WAL_LEFT
    assert time.monotonic() - started < 10
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
    process = collector_process(
        "--insecure", "--influx-url", "http://127.0.0.1:9", "--wal", str(tmp_path / "wal"),
        "--ack-after", "sink", "--drain-timeout", "1.5",
    )  # fmt: skip
    process.start()
    fleet = Fleet(f"127.0.0.1:{process.port}", ["unacked-1"], gpus=2)

    async def scenario() -> None:
        fleet.start()
        await asyncio.sleep(1.0)
        assert process.terminate() == 0
        assert all(agent.acked_seq == 0 for agent in fleet.agents)
        for task in fleet._tasks:
            task.cancel()
        assert fleet._producer is not None
        fleet._producer.cancel()
        await asyncio.gather(*fleet._tasks, fleet._producer, return_exceptions=True)

    asyncio.run(scenario())
    assert "none was acknowledged (--ack-after sink): the agents still have them" in process.log()
