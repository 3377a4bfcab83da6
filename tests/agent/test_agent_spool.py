"""The spool: durable, ordered, capped with counted drop-oldest; and the agent's SIGTERM grace behaviour."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from agent_helpers import (
    AgentFactory,
    Receiver,
    assert_no_loss_no_duplicates,
    machine,
    unique_batches,
    wait_for_batches,
)
from support import clean_env, free_port, gpuprobe_command, wait_until, wait_until_async

from gpuprobe.agent.metrics import Counters
from gpuprobe.agent.settings import UplinkSettings
from gpuprobe.agent.spool import AsyncSpool, Spool, SpoolDiskFull, SpoolError
from gpuprobe.agent.uplink import Uplink, _Session
from gpuprobe.devservices import InfluxDBDatabase
from gpuprobe.devservices.disks import SmallDisk
from gpuprobe.v1 import telemetry_pb2


def batch(samples: int, t_ns: int | None = None) -> telemetry_pb2.SampleBatch:
    b = telemetry_pb2.SampleBatch(agent_id="a", created_unix_ns=t_ns or time.time_ns())
    for i in range(samples):
        b.gpu_samples.add(time_unix_ns=i + 1, gpu_index=0, power_w=100.0 + i)
    return b


def test_seq_keeps_increasing_across_acks_and_restarts(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool_id = spool.spool_id
    assert [spool.append(batch(10), 10).seq for _ in range(3)] == [1, 2, 3]
    assert spool.delete_through(3).batches == 3
    spool.close()
    spool = Spool(tmp_path)
    assert spool.spool_id == spool_id
    assert spool.state().batches == 0
    assert spool.append(batch(10), 10).seq == 4, "seq never restarts within one spool"
    stored = spool.read_after(0, 10)
    assert [s.seq for s in stored] == [4]
    assert telemetry_pb2.SampleBatch.FromString(stored[0].payload).seq == 4


def test_ack_deletes_only_up_to_its_seq(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    for _ in range(5):
        spool.append(batch(7), 7)
    deleted = spool.delete_through(3)
    assert (deleted.batches, deleted.samples) == (3, 21)
    assert [s.seq for s in spool.read_after(0, 10)] == [4, 5]
    assert spool.state().oldest_seq == 4 and spool.state().samples == 14


def test_size_cap_drops_the_oldest_and_reports_each_drop_once_even_across_a_restart(tmp_path: Path) -> None:
    one = len(batch(50).SerializeToString()) + 40
    spool = Spool(tmp_path, max_bytes=3 * one)
    for _ in range(3):
        assert spool.append(batch(50), 50).dropped_batches == 0
    appended = spool.append(batch(50), 50)
    assert (appended.dropped_batches, appended.dropped_samples) == (1, 50)
    assert [s.seq for s in spool.read_after(0, 10)] == [2, 3, 4]
    stored = telemetry_pb2.SampleBatch.FromString(spool.read_after(3, 1)[0].payload)
    assert (stored.stats.dropped_batches, stored.stats.dropped_samples) == (1, 50), "reported in the next batch"
    assert stored.stats.spool_bytes > 0
    spool.close()

    spool = Spool(tmp_path, max_bytes=3 * one)
    nxt = spool.append(batch(50), 50)
    stored = telemetry_pb2.SampleBatch.FromString(spool.read_after(nxt.seq - 1, 1)[0].payload)
    assert (stored.stats.dropped_batches, stored.stats.dropped_samples) == (1, 50), "this append's own drop only"
    assert spool.dropped_totals() == (100, 2)
    assert spool.state().bytes <= 3 * one


def test_samples_the_native_sampler_overwrote_go_into_the_next_batchs_dropped_samples(tmp_path: Path) -> None:
    """The ring's overwrites (counted as samples_overwritten) reach the collector in AgentStats.dropped_samples
    of the next batch the batcher makes, added to the spool's own drops, each once."""
    counters = Counters()
    counters.add(samples_overwritten=16)
    assert counters.take_batch_deltas() == (0, 0, 16)
    assert counters.take_batch_deltas() == (0, 0, 0), "reported once"
    one = len(batch(50).SerializeToString()) + 40
    spool = Spool(tmp_path, max_bytes=3 * one)
    for _ in range(3):
        spool.append(batch(50), 50)
    b = batch(50)
    b.stats.dropped_samples = 16  # as the batcher sets it
    appended = spool.append(b, 50)  # the cap drops the oldest batch too
    stored = telemetry_pb2.SampleBatch.FromString(spool.read_after(appended.seq - 1, 1)[0].payload)
    assert (stored.stats.dropped_samples, stored.stats.dropped_batches) == (50 + 16, 1)
    spool.close()


def test_cap_takes_acknowledged_rows_first_and_spares_batches_in_flight(tmp_path: Path) -> None:
    one = len(batch(50).SerializeToString()) + 40
    spool = Spool(tmp_path, max_bytes=3 * one)
    for _ in range(3):
        spool.append(batch(50), 50)
    # batch 1 is acknowledged (its delete is pending), batch 2 is in flight
    appended = spool.append(batch(50), 50, protect=lambda: (1, 2))
    assert appended.dropped_batches == 0, "an acknowledged batch makes room without being a drop"
    assert [s.seq for s in spool.read_after(0, 10)] == [2, 3, 4]
    appended = spool.append(batch(50), 50, protect=lambda: (1, 2))
    assert (appended.dropped_batches, appended.dropped_samples) == (1, 50)
    assert [s.seq for s in spool.read_after(0, 10)] == [2, 4, 5], "the oldest batch not in flight was dropped"


def test_age_cap_drops_old_batches(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_age_s=60)
    old = time.time_ns() - 120 * 10**9
    spool.append(batch(5, old), 5, now_ns=old)
    spool.append(batch(5, old), 5, now_ns=old)
    appended = spool.append(batch(5), 5)
    assert appended.dropped_batches == 2
    assert [s.seq for s in spool.read_after(0, 10)] == [3]


def test_the_newest_batch_is_kept_even_when_it_alone_exceeds_the_cap(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=100)
    spool.append(batch(50), 50)
    appended = spool.append(batch(50), 50)
    assert appended.dropped_batches == 1
    assert [s.seq for s in spool.read_after(0, 10)] == [2]


def test_a_full_disk_drops_the_oldest_batches_counted_and_keeps_the_newest(
    small_disk: Callable[[str, int], SmallDisk],
) -> None:
    disk = small_disk("spool", 384 * 1024)
    spool = Spool(disk.path)  # the size cap (512 MiB) is far beyond the disk
    appended = [spool.append(batch(200), 200) for _ in range(150)]  # ~2.5 MB into 384 KiB
    full = [a for a in appended if a.disk_full]
    assert full, "the disk never filled"
    dropped_samples = sum(a.dropped_samples for a in appended)
    dropped_batches = sum(a.dropped_batches for a in appended)
    assert dropped_batches > 0 and dropped_samples == 200 * dropped_batches
    # the oldest went, the newest stayed, nothing in between is missing
    seqs = [s.seq for s in spool.read_after(0, 1000)]
    assert seqs == list(range(dropped_batches + 1, 151))
    assert spool.dropped_totals() == (dropped_samples, dropped_batches)
    # each drop is reported once, in the AgentStats of the batch stored with it
    reported = sum(telemetry_pb2.SampleBatch.FromString(a.payload).stats.dropped_samples for a in appended)
    assert reported == dropped_samples
    spool.close()


def test_a_full_disk_with_nothing_left_to_drop_refuses_with_the_cause_then_recovers(
    small_disk: Callable[[str, int], SmallDisk],
) -> None:
    disk = small_disk("spool", 384 * 1024)
    spool = Spool(disk.path)
    in_flight = (0, 10**9)  # everything spooled is in flight: nothing may be dropped
    with pytest.raises(SpoolDiskFull, match=r"no space left on the spool's disk \(.*spool.sqlite3: ENOSPC"):
        for _ in range(150):
            spool.append(batch(200), 200, protect=lambda: in_flight)
    kept = spool.state().batches
    assert kept > 0 and spool.dropped_totals() == (0, 0)
    disk.resize(16 * 1024 * 1024)
    appended = spool.append(batch(200), 200, protect=lambda: in_flight, dropped_elsewhere=(400, 2))
    assert appended.seq == kept + 1 and not appended.disk_full
    stored = telemetry_pb2.SampleBatch.FromString(spool.read_after(kept, 1)[0].payload)
    assert (stored.stats.dropped_samples, stored.stats.dropped_batches) == (400, 2)  # dropped in the agent's memory
    assert spool.dropped_totals() == (400, 2)
    spool.close()


def test_a_second_agent_cannot_open_the_same_spool(tmp_path: Path) -> None:
    first = Spool(tmp_path)
    with pytest.raises(SpoolError, match="in use by another agent"):
        Spool(tmp_path)
    first.close()
    Spool(tmp_path).close()


def test_an_unreadable_spool_is_moved_aside_and_a_new_one_started(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = Spool(tmp_path)
    old_id = spool.spool_id
    spool.append(batch(5), 5)
    spool.close()
    (tmp_path / "spool.sqlite3-wal").unlink(missing_ok=True)
    (tmp_path / "spool.sqlite3").write_bytes(b"this is not a database" * 100)
    spool = Spool(tmp_path)
    assert spool.spool_id != old_id and spool.state().batches == 0
    assert list(tmp_path.glob("spool.sqlite3.corrupt-*"))
    assert "unreadable" in caplog.text


def test_a_batch_is_durable_in_the_spool_file_before_append_returns(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    appended = spool.append(batch(3), 3)
    # another connection (another process would see the same) reads the committed row
    db = sqlite3.connect(tmp_path / "spool.sqlite3")
    assert db.execute("SELECT seq, samples FROM batches").fetchall() == [(appended.seq, 3)]
    db.close()
    spool.close()


# ---------------------------------------------------------------------- the agent process


def spooled_payloads(spool: Path) -> list[bytes]:
    """The batches in an agent's spool file, read as another process would (none before it exists)."""
    if not (spool / "spool.sqlite3").exists():
        return []
    db = sqlite3.connect(spool / "spool.sqlite3")
    try:
        return [bytes(payload) for (payload,) in db.execute("SELECT payload FROM batches ORDER BY seq")]
    except sqlite3.OperationalError:  # not created yet
        return []
    finally:
        db.close()


def spooled_seqs(spool: Path) -> set[int]:
    return {telemetry_pb2.SampleBatch.FromString(p).seq for p in spooled_payloads(spool)}


def spooled_gpu_samples(spool: Path) -> int:
    return sum(len(telemetry_pb2.SampleBatch.FromString(p).gpu_samples) for p in spooled_payloads(spool))


def test_full_spool_drops_oldest_batches_and_the_collector_learns_how_many(
    tmp_path: Path, receiver_factory: Callable[..., Receiver], agent_factory: AgentFactory
) -> None:
    sim = machine(tmp_path / "sim", ["H100-SXM5-80GB"] * 8)
    receiver = receiver_factory(start=False)
    agent = agent_factory(sim, [receiver.address], "--spool-max-bytes", "64KiB", "--metrics-listen", "127.0.0.1:0")
    agent.wait_for_log("spool cap reached", timeout=30)
    receiver.start()
    back_ns = time.time_ns()
    agent.wait_for_log("streaming to collector")
    # the spooled batches are replayed oldest first: a sample taken after the receiver came back ends it
    wait_for_batches(
        receiver,
        lambda got: any(s.time_unix_ns > back_ns for b in got.values() for s in b.gpu_samples),
        "a sample taken after the receiver came back",
        agent=agent,
    )
    assert agent.terminate() == 0
    batches = unique_batches(receiver.batches())
    first = min(batches)
    assert first > 1, "the oldest batches were dropped"
    # every dropped batch is counted in the AgentStats of the batches that did arrive
    assert sum(b.stats.dropped_batches for b in batches.values()) == first - 1
    assert sum(b.stats.dropped_samples for b in batches.values()) > 0
    assert_no_loss_no_duplicates(batches, 0.1, 8, first_seq=first, check_gaps=False)
    # the newest data survived: the samples that arrived run up to the stop
    newest = max(s.time_unix_ns for b in batches.values() for s in b.gpu_samples)
    assert time.time_ns() - newest < 15e9
    dropped = int(agent.wait_for_log(r"(\d+) dropped by the spool cap").group(1))
    assert dropped == sum(b.stats.dropped_samples for b in batches.values())


@pytest.mark.slow
def test_a_full_spool_disk_keeps_the_newest_data_and_counts_what_it_dropped_all_the_way_to_influxdb(
    tmp_path: Path,
    agent_factory: AgentFactory,
    influxdb: InfluxDBDatabase,
    small_disk: Callable[[str, int], SmallDisk],
) -> None:
    sim = machine(tmp_path / "sim", ["H100-SXM5-80GB"] * 8)
    disk = small_disk("spool", 512 * 1024)
    port = free_port()  # no collector there yet
    agent = agent_factory(
        sim, [f"127.0.0.1:{port}"], "--grace", "20", "--metrics-listen", "127.0.0.1:0", spool=disk.path
    )
    agent.wait_for_log(r"the spool's disk is full \(.*ENOSPC\)", timeout=90)
    # full for a while: every batch now makes room by dropping the oldest (three more drops)
    full_drops = agent.metrics()["gpuprobe_agent_batches_dropped_total"]
    wait_until(
        lambda: agent.metrics()["gpuprobe_agent_batches_dropped_total"] >= full_drops + 3,
        20,
        "3 more batches dropped to make room on the full disk",
        interval_s=0.2,
        describe=agent.log,
    )
    assert "could not spool" not in agent.log()  # nothing was refused or lost uncounted
    disk.resize(64 * 1024 * 1024)
    space_back_ns = time.time_ns()
    collector_log = (tmp_path / "collector.log").open("wb")
    collector = subprocess.Popen(
        [
            *gpuprobe_command(),
            "collector",
            "--insecure",
            "--listen",
            f"127.0.0.1:{port}",
            "--influx-url",
            influxdb.server.url,
            "--influx-db",
            influxdb.name,
            "--wal",
            str(tmp_path / "wal"),
        ],
        env=clean_env(),
        stdout=collector_log,
        stderr=subprocess.STDOUT,
    )
    try:
        agent.wait_for_log("streaming to collector", timeout=30)
        wait_until(
            lambda: agent.metrics()["gpuprobe_agent_samples_acked_total"] > 0, 20, "the first acks", interval_s=0.2
        )
        assert agent.terminate() == 0
        stopped = agent.wait_for_log(
            r"stopped: (\d+) samples taken, (\d+) spooled, (\d+) acknowledged, (\d+) dropped by the spool cap;"
            r" everything was delivered"
        )
        taken, spooled, acked, dropped = (int(n) for n in stopped.groups())
        # every sample taken was spooled; of those, what the disk could not hold was dropped, the rest acked
        assert dropped > 0 and taken == spooled and acked == spooled - dropped

        def count(query: str) -> int:
            series = influxdb.server.query(influxdb.name, query)
            return int(max(series[0].values[0][1:])) if series else 0

        def points() -> int:
            """Every stored point of the agent's samples: a field every point of the measurement has, or
            for events, whose points have either `xid` or `data`, both."""
            measurements = ("gpu", "node", "acoustic", "gpu_process", "gpu_nvlink", "gpu_mig")
            events = count('SELECT count("xid") FROM gpu_event') + count('SELECT count("data") FROM gpu_event')
            return sum(count(f"SELECT count(*) FROM {m}") for m in measurements) + events

        # what the agent dropped is what InfluxDB was told it dropped
        wait_until(lambda: points() >= acked, 30, what="every acknowledged sample in InfluxDB")
        stored_points = points()
        assert stored_points == acked
        assert count("SELECT sum(dropped_samples) FROM agent") == dropped
        # the newest data survived the full disk: the last 10 s before space came back are all there
        window = f"time > {space_back_ns - 10 * 10**9} AND time <= {space_back_ns}"
        assert count(f"SELECT count(power_w) FROM gpu WHERE gpu = '0' AND {window}") >= 80
    finally:
        collector.terminate()
        collector.wait(20)
        collector_log.close()


def test_sigterm_without_a_collector_stops_after_the_grace_period_and_keeps_everything(
    tmp_path: Path, receiver_factory: Callable[..., Receiver], agent_factory: AgentFactory
) -> None:
    sim = machine(tmp_path / "sim", ["A100-SXM4-80GB"] * 2)
    receiver = receiver_factory(start=False)
    spool = tmp_path / "spool"
    agent = agent_factory(sim, [receiver.address], "--grace", "3", spool=spool)
    agent.wait_for_log("agent node-1")
    # 2 s of both GPUs at 10 Hz in the spool before the stop (the last partial batch adds to them)
    wait_until(lambda: spooled_gpu_samples(spool) >= 2 * 10 * 2, 20, "40 GPU samples spooled", interval_s=0.2)
    stop_ns = time.time_ns()
    started = time.monotonic()
    assert agent.terminate() == 0
    took = time.monotonic() - started
    assert 2.8 <= took <= 8, f"stopped {took:.1f} s after SIGTERM with --grace 3"
    assert "stay in the spool for the next start" in agent.log()
    kept = spooled_seqs(spool)

    receiver.start()
    nxt = agent_factory(sim, [receiver.address], spool=spool)
    nxt.wait_for_log("from a previous run")
    wait_for_batches(receiver, lambda got: kept <= set(got), "the kept batches", agent=nxt)
    assert nxt.terminate() == 0
    batches = unique_batches(receiver.batches())
    assert_no_loss_no_duplicates(batches, 0.1, 2, check_gaps=False)
    first_run = sorted(s.time_unix_ns for b in batches.values() for s in b.gpu_samples if s.time_unix_ns < stop_ns)
    # sampling stopped at SIGTERM and the last partial batch was spooled, not lost
    assert stop_ns - first_run[-1] < 0.5e9
    assert len(first_run) >= 2 * 10 * 2


def test_sigterm_delivers_within_the_grace_period_when_the_collector_comes_back(
    tmp_path: Path, receiver_factory: Callable[..., Receiver], agent_factory: AgentFactory
) -> None:
    sim = machine(tmp_path / "sim", ["L4"] * 2)
    receiver = receiver_factory(start=False)
    agent = agent_factory(sim, [receiver.address], "--grace", "10", "--reconnect-max", "0.5")
    agent.wait_for_log("agent node-1")
    spool = tmp_path / "spool"
    wait_until(lambda: len(spooled_seqs(spool)) >= 2, 20, "2 batches spooled", interval_s=0.2)
    assert agent.proc is not None
    agent.proc.send_signal(15)
    # the collector comes back during the grace period, while the agent is trying to deliver
    agent.wait_for_log(r"stopping: sampling ends; delivering spooled batches for up to 10 s")
    receiver.start()
    assert agent.proc.wait(15) == 0
    assert "everything was delivered" in agent.log(), agent.log()
    batches = unique_batches(receiver.batches())
    assert_no_loss_no_duplicates(batches, 0.1, 2)
    assert (
        not (tmp_path / "spool" / "spool.sqlite3").exists()
        or not sqlite3.connect(tmp_path / "spool" / "spool.sqlite3")
        .execute("SELECT COUNT(*) FROM batches")
        .fetchone()[0]
    )


def test_an_ack_read_while_its_batch_is_still_being_written_is_not_ignored(tmp_path: Path) -> None:
    """A fast collector can ack a batch before the agent's ``write`` of it has returned (found by the
    end-to-end test: the last batch of a stopping agent stayed spooled). The uplink must count such an
    ack, not ignore it as one "beyond the last batch sent": acks are cumulative and never repeated.

    The stream here answers every write with its ack and lets the reader run before the write returns,
    which a real collector does only now and then."""

    class EagerStream:
        def __init__(self) -> None:
            self.acks: asyncio.Queue[telemetry_pb2.StreamResponse] = asyncio.Queue()

        async def write(self, data: bytes) -> None:
            seq = telemetry_pb2.StreamRequest.FromString(data).batch.seq
            await self.acks.put(telemetry_pb2.StreamResponse(ack=telemetry_pb2.Ack(durable_seq=seq)))
            for _ in range(5):
                await asyncio.sleep(0)  # the receiving task reads the ack meanwhile

        async def read(self) -> telemetry_pb2.StreamResponse:
            return await self.acks.get()

    async def main() -> tuple[int, int]:
        spool = AsyncSpool(Spool(tmp_path))
        for _ in range(3):
            await spool.append(batch(10), 10)
        uplink = Uplink(UplinkSettings(targets=["collector:7447"]), spool, lambda _: telemetry_pb2.Hello(), Counters())
        session = _Session("collector:7447", welcomed=True)
        stream = EagerStream()
        tasks = [
            asyncio.create_task(uplink._send(stream, session)),
            asyncio.create_task(uplink._receive(stream, session)),
        ]
        try:
            ignored = "the acks of batches whose write was still awaited were ignored"
            await wait_until_async(lambda: session.acked == 3, 2, f"acked 3 ({ignored}?)", interval_s=0.01)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        await uplink._delete_acked(force=True)
        left = (await spool.state()).batches
        await spool.close()
        return session.acked, left

    acked, left = asyncio.run(main())
    assert acked == 3, "the acks of batches whose write was still awaited were ignored"
    assert left == 0


# ---------------------------------------------------------------------- the flight recorder


def raw(first_t_ns: int, samples: int = 10) -> telemetry_pb2.SampleBatch:
    """A flight-recorder batch: raw GPU samples, created when its last sample was taken."""
    b = telemetry_pb2.SampleBatch(agent_id="a", created_unix_ns=first_t_ns + samples * 100_000_000)
    for i in range(samples):
        b.gpu_samples.add(time_unix_ns=first_t_ns + i * 100_000_000, gpu_index=0, power_w=100.0 + i)
    return b


def test_the_recorder_is_outside_the_sequence_and_trimmed_by_age_without_counting_drops(tmp_path: Path) -> None:
    t0 = time.time_ns() - 100 * 10**9
    spool = Spool(tmp_path, recorder_max_age_s=30)
    for second in range(60):
        spool.append(
            batch(1, t0 + second * 10**9), 1, now_ns=t0 + second * 10**9, record=(raw(t0 + (second - 1) * 10**9), 10)
        )
    state = spool.state()
    assert (state.oldest_seq, state.newest_seq, state.last_seq) == (1, 60, 60), "recording takes no seq"
    assert state.batches == 60 and state.samples == 60
    # the last append kept the recorded batches created at or after now - 30 s
    assert state.recorded_batches == 31 and state.recorded_samples == 10 * state.recorded_batches
    assert spool.dropped_totals() == (0, 0) and spool.recorder_trimmed_samples == 10 * (60 - state.recorded_batches)
    assert [s.seq for s in spool.read_after(0, 100)] == list(range(1, 61)), "recorded batches are never read"


def test_the_recorder_gives_way_first_when_the_spool_reaches_its_size_cap(tmp_path: Path) -> None:
    cap = 64 * 1024
    spool = Spool(tmp_path, max_bytes=cap, recorder_max_age_s=3600)
    now = time.time_ns()
    for i in range(200):
        spool.append(batch(1, now), 1, now_ns=now + i, record=(raw(now + i * 10**9, 20), 20))
        state = spool.state()
        assert state.bytes + state.recorded_bytes <= cap
    state = spool.state()
    assert state.batches == 200, "no shipped batch was dropped while the recorder could give way"
    assert spool.dropped_totals() == (0, 0)
    assert 0 < state.recorded_batches < 200


def test_promoted_batches_get_the_next_seqs_in_order_before_the_batch_and_survive_a_restart(tmp_path: Path) -> None:
    now = time.time_ns()
    spool = Spool(tmp_path, recorder_max_age_s=60)
    for i in range(5):  # recorded at now-50 s ... now-10 s
        t = now - (50 - 10 * i) * 10**9
        spool.append(batch(1, t), 1, now_ns=t, record=(raw(t - 10**9), 10))
    assert spool.state().last_seq == 5
    spool.close()
    spool = Spool(tmp_path, recorder_max_age_s=60)
    assert spool.state().recorded_batches == 5, "the recorder survives a restart"
    live = batch(3, now)
    appended = spool.append(live, 3, now_ns=now, promote_since_ns=now - 35 * 10**9)
    promoted = [telemetry_pb2.SampleBatch.FromString(p.payload) for p in appended.promoted]
    assert [p.seq for p in appended.promoted] == [6, 7, 8] and appended.seq == 9
    assert [b.seq for b in promoted] == [6, 7, 8], "the stored payload carries its seq"
    assert [b.gpu_samples[0].time_unix_ns for b in promoted] == [now - (30 - 10 * i) * 10**9 - 10**9 for i in range(3)]
    state = spool.state()
    assert state.recorded_batches == 2, "the older recorded batches stay recorded (the age trim takes them)"
    assert state.samples == 5 + 30 + 3
    spool.close()
    spool = Spool(tmp_path, recorder_max_age_s=60)
    stored = spool.read_after(5, 10)
    assert [s.seq for s in stored] == [6, 7, 8, 9], "promoted batches survive a restart like any batch"
    assert [s.samples for s in stored] == [10, 10, 10, 3]
    assert telemetry_pb2.SampleBatch.FromString(stored[0].payload) == promoted[0]
    spool.close()
    spool = Spool(tmp_path, recorder_max_age_s=0)
    spool.append(batch(1), 1)
    assert spool.state().recorded_batches == 0, "with the recorder off, what it held goes"
