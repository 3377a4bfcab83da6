"""The load generator is the agent's uplink (gpuprobe.agent.uplink) over an in-memory spool: how
:meth:`SyntheticAgent.close` and :meth:`SyntheticAgent.run` end when the uplink cannot deliver.

What a stream that ends while a batch is written does (once tested here against the generator's own
protocol code) is the uplink's: tests/agent/test_uplink_memory_spool.py and
tests/agent/test_agent_delivery.py::test_internal_ends_the_stream_like_unavailable_reconnect_at_once_and_replay.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from gpuprobe.agent.spool import SpoolState
from gpuprobe.agent.uplink import _Session
from gpuprobe.app.loadgen import AgentSpec, SyntheticAgent
from gpuprobe.devservices.ports import LOOPBACK
from gpuprobe.v1 import telemetry_pb2


def test_a_single_address_is_used_and_none_is_refused() -> None:
    agent = SyntheticAgent(f"{LOOPBACK}:1", AgentSpec("solo", gpus=1))
    assert agent.targets == [f"{LOOPBACK}:1"] and agent.target == f"{LOOPBACK}:1"
    with pytest.raises(ValueError, match="no collector address"):
        SyntheticAgent([], AgentSpec("none", gpus=1))


@pytest.mark.timeout(60)
def test_an_unexpected_error_is_a_stream_event_and_close_fails_at_once_when_run_is_gone() -> None:
    class BrokenHello(SyntheticAgent):
        def _hello(self, state: SpoolState) -> telemetry_pb2.Hello:
            raise RuntimeError("hello cannot be built")

    async def scenario() -> None:
        # nothing listens there: the Hello is built before the stream opens, so every session fails on it
        agent = BrokenHello(f"{LOOPBACK}:1", AgentSpec("broken-1", gpus=1), reconnect_max_s=0.05)
        task = asyncio.create_task(agent.run())
        try:
            agent.enqueue(agent.factory.batch(samples_per_gpu=1))
            deadline = asyncio.get_running_loop().time() + 10
            while len(agent.errors) < 2 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.02)
            # every session fails with the same unexpected error: recorded, and the uplink reconnects
            assert not task.done() and len(agent.errors) >= 2
            assert all(e.code is None and str(e) == "hello cannot be built" for e in agent.errors)
            task.cancel()
            await asyncio.sleep(0.05)
            started = asyncio.get_running_loop().time()
            with pytest.raises(RuntimeError, match="run\\(\\) ended before everything was acked"):
                await agent.close(timeout_s=30)
            assert asyncio.get_running_loop().time() - started < 5  # not the 30 s timeout
        finally:
            task.cancel()

    asyncio.run(scenario())


@pytest.mark.timeout(60)
def test_a_cancel_that_the_session_turns_into_an_error_still_ends_run() -> None:
    """gRPC's asyncio calls can answer a cancel of the task awaiting them with an error of their own
    (CI saw it once: close() then waited 30 s for acks from a run() that kept reconnecting)."""
    turned: list[bool] = []

    async def session(_: _Session) -> None:
        try:
            await asyncio.Event().wait()  # a session that never ends by itself
        except asyncio.CancelledError:
            if turned:
                raise  # only the first cancel is turned (the test's own cleanup must end the task)
            turned.append(True)
            raise grpc.aio.UsageError("the call was cancelled") from None

    async def scenario() -> None:
        agent = SyntheticAgent(f"{LOOPBACK}:1", AgentSpec("cancelled-1", gpus=1), reconnect_max_s=0.05)
        agent.uplink._session = session  # type: ignore[method-assign]
        agent.enqueue(agent.factory.batch(samples_per_gpu=1))
        task = asyncio.create_task(agent.run())
        await asyncio.sleep(0.2)
        task.cancel()
        await asyncio.wait({task}, timeout=5)
        try:
            assert task.done() and task.cancelled(), "run() went on reconnecting after it was cancelled"
        finally:
            task.cancel()
        assert turned and agent.streams == 1
        with pytest.raises(RuntimeError, match="run\\(\\) ended before everything was acked"):
            await agent.close(timeout_s=30)

    asyncio.run(scenario())
