"""The agent's uplink over the in-memory spool (gpuprobe.agent.spool.MemorySpool), in this process,
against the agents' test receiver (tests/agent/receiver.py) served from the same event loop: the
seam the load generator (app/loadgen.py) uses, checked without an agent process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import grpc.aio
import pytest
from agent_helpers import read_records
from receiver import Receiver as ReceiverService

from gpuprobe.agent.metrics import Counters
from gpuprobe.agent.settings import UplinkSettings
from gpuprobe.agent.spool import MemorySpool, SpoolState
from gpuprobe.agent.uplink import Uplink
from gpuprobe.devservices.ports import LOOPBACK
from gpuprobe.v1 import common_pb2, telemetry_pb2, telemetry_pb2_grpc

AGENT_ID = "memory-1"


@asynccontextmanager
async def receiver(out: Path, ack: bool = True, abort_at: int = 0) -> AsyncIterator[str]:
    out.mkdir()
    server = grpc.aio.server()
    telemetry_pb2_grpc.add_TelemetryServiceServicer_to_server(
        ReceiverService(out, None, ack, set(), abort_at, "UNAVAILABLE"), server
    )
    port = server.add_insecure_port(f"{LOOPBACK}:0")
    await server.start()
    try:
        yield f"{LOOPBACK}:{port}"
    finally:
        await server.stop(None)


def hello(state: SpoolState) -> telemetry_pb2.Hello:
    return telemetry_pb2.Hello(
        identity=common_pb2.AgentIdentity(agent_id=AGENT_ID, host=AGENT_ID),
        spool_id=state.spool_id,
        oldest_unacked_seq=state.oldest_seq,
        newest_unacked_seq=state.newest_seq,
    )


def spool_batches(spool: MemorySpool, uplink: Uplink, count: int) -> None:
    for seq in range(spool.last_seq + 1, spool.last_seq + 1 + count):
        batch = telemetry_pb2.SampleBatch(agent_id=AGENT_ID, seq=seq)
        batch.gpu_samples.add(time_unix_ns=seq, power_w=100.0 + seq)
        uplink.notify(spool.append(seq, 1, batch.SerializeToString()))


def stored_seqs(out: Path) -> list[int]:
    return [telemetry_pb2.StreamRequest.FromString(r).batch.seq for r in read_records(out / "batches.bin")]


async def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


@pytest.mark.timeout(60)
def test_a_dropped_stream_is_replayed_from_the_oldest_unacked_batch_and_every_batch_is_acked_once(
    tmp_path: Path,
) -> None:
    """The receiver ends the first stream (UNAVAILABLE) when batch 5 arrives, without storing it."""
    out = tmp_path / "receiver"

    async def scenario() -> tuple[Counters, MemorySpool, int]:
        async with receiver(out, abort_at=5) as address:
            spool, counters = MemorySpool(), Counters()
            settings = UplinkSettings([address], max_in_flight_batches=4, reconnect_min_s=0.05, reconnect_max_s=0.1)
            uplink = Uplink(settings, spool, hello, counters)
            spool_batches(spool, uplink, 10)
            uplink.start()
            assert await uplink.drain(20)
            await uplink.stop()
            return counters, spool, uplink.acked_through

    counters, spool, acked_through = asyncio.run(scenario())
    hellos = [telemetry_pb2.StreamRequest.FromString(r).hello for r in read_records(out / "hellos.bin")]
    assert len(hellos) == 2 and hellos[0].spool_id == hellos[1].spool_id == spool.spool_id
    assert (hellos[0].oldest_unacked_seq, hellos[0].newest_unacked_seq) == (1, 10)
    # the second stream starts at the oldest batch not acknowledged on the first: 5, or earlier where an
    # ack of the first stream was still unread when its end was (then that batch is stored twice)
    replay_from = hellos[1].oldest_unacked_seq
    assert 1 <= replay_from <= 5 and hellos[1].newest_unacked_seq == 10
    assert stored_seqs(out) == [1, 2, 3, 4, *range(replay_from, 11)]  # in order; nothing acked is resent
    totals = counters.snapshot()
    assert acked_through == totals.acked_seq == 10
    assert totals.batches_acked == 10 and totals.samples_acked == 10  # each batch acknowledged once
    assert totals.reconnects == 1
    assert spool.batches == 0 and spool.bytes == 0  # acknowledged batches left the spool at stop


@pytest.mark.timeout(60)
def test_no_more_than_the_window_is_sent_unacknowledged(tmp_path: Path) -> None:
    out = tmp_path / "receiver"

    async def scenario() -> None:
        async with receiver(out, ack=False) as address:
            spool, counters = MemorySpool(), Counters()
            uplink = Uplink(UplinkSettings([address], max_in_flight_batches=3), spool, hello, counters)
            spool_batches(spool, uplink, 8)
            uplink.start()
            await wait_for(lambda: len(stored_seqs(out)) >= 3, "three batches stored")
            spool_batches(spool, uplink, 2)  # wakes the sender: still nothing beyond the window
            await asyncio.sleep(0.2)
            assert stored_seqs(out) == [1, 2, 3] and counters.snapshot().batches_sent == 3
            assert not await uplink.drain(0.05)
            await uplink.stop(timeout_s=0.5)
            assert spool.batches == 10  # nothing acknowledged, nothing deleted

    asyncio.run(scenario())
