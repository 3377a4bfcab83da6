"""The load generator under a stream that ends while it writes: the race that made the SIGKILL fault
test fail one run in three. Deterministic: the server aborts the first stream, and the synthetic
agent's reader is held back until a batch has been written into the ended RPC."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest
import support

from gpuprobe.devservices.ports import LOOPBACK
from gpuprobe.loadgen import METHOD, AgentSpec, SyntheticAgent
from gpuprobe.v1 import telemetry_pb2

ABORT_MESSAGE = "the first stream is aborted on purpose"


class AbortFirstStream:
    """A TelemetryService that aborts its first stream right after the Hello and acks the rest."""

    def __init__(self) -> None:
        self.streams = 0
        self.stored: dict[int, bytes] = {}

    async def stream(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        self.streams += 1
        first = True
        async for raw in requests:
            request = telemetry_pb2.StreamRequest.FromString(raw)
            if first:
                first = False
                if self.streams == 1:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, ABORT_MESSAGE)
                yield telemetry_pb2.StreamResponse(welcome=telemetry_pb2.Welcome()).SerializeToString()
                continue
            self.stored[request.batch.seq] = raw
            yield telemetry_pb2.StreamResponse(ack=telemetry_pb2.Ack(durable_seq=request.batch.seq)).SerializeToString()


class HeldReader(SyntheticAgent):
    """Reads its first stream only once the test releases it, so the RPC ends unnoticed."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.first_call: grpc.aio.StreamStreamCall | None = None
        self.release = asyncio.Event()
        self.first_call_writes = 0  # writes tried on the first stream (Hello included), failed or not

    async def _write(self, call: grpc.aio.StreamStreamCall, request: bytes) -> None:
        try:
            await super()._write(call, request)
        finally:
            if call is self.first_call or self.first_call is None:
                self.first_call_writes += 1

    async def _read(self, call: grpc.aio.StreamStreamCall) -> None:
        if self.first_call is None:
            self.first_call = call
            await self.release.wait()
        await super()._read(call)


async def _serve(service: AbortFirstStream) -> tuple[grpc.aio.Server, int]:
    method = METHOD.rsplit("/", 1)[-1]
    service_name = METHOD.strip("/").rsplit("/", 1)[0]
    server = grpc.aio.server(
        handlers=[
            grpc.method_handlers_generic_handler(
                service_name, {method: grpc.stream_stream_rpc_method_handler(service.stream)}
            )
        ]
    )
    port = server.add_insecure_port(f"{LOOPBACK}:0")
    await server.start()
    return server, port


@pytest.mark.timeout(60)
def test_a_write_into_a_stream_that_already_ended_is_a_stream_error_and_the_agent_reconnects() -> None:
    async def scenario() -> None:
        service = AbortFirstStream()
        server, port = await _serve(service)
        agent = HeldReader(f"{LOOPBACK}:{port}", AgentSpec("gap-1", gpus=2), reconnect_initial_s=0.05)
        task = asyncio.create_task(agent.run())
        try:
            agent.enqueue(agent.factory.batch(samples_per_gpu=2))
            # the server aborts after the Hello; the held reader has not seen it
            await support.wait_until_async(
                lambda: agent.first_call is not None and agent.first_call.done(), 5, "the first stream to end"
            )
            # the first batch's write has failed (the session ended) or gone through
            await support.wait_until_async(
                lambda: agent.errors or agent.first_call_writes >= 2, 5, "the first batch written"
            )
            seq = agent.enqueue(agent.factory.batch(samples_per_gpu=2))  # written into the ended RPC
            await support.wait_until_async(
                lambda: agent.errors or agent.first_call_writes >= 3, 5, "the second batch written into the ended RPC"
            )
            agent.release.set()
            await agent.close(timeout_s=10)  # the old generator died here and close() waited it out
            await task
            assert agent.acked_seq == seq and set(service.stored) == {1, seq}
            assert agent.streams >= 2
            assert agent.errors[0].code == grpc.StatusCode.UNAVAILABLE
            assert agent.errors[0].details == ABORT_MESSAGE
        finally:
            task.cancel()
            await server.stop(None)

    asyncio.run(scenario())


@pytest.mark.timeout(60)
def test_an_unexpected_error_is_a_stream_event_and_close_fails_at_once_when_run_is_gone() -> None:
    class BrokenHello(SyntheticAgent):
        def hello(self) -> bytes:
            raise RuntimeError("hello cannot be built")

    async def scenario() -> None:
        service = AbortFirstStream()
        server, port = await _serve(service)
        agent = BrokenHello(f"{LOOPBACK}:{port}", AgentSpec("broken-1", gpus=1), reconnect_max_s=0.05)
        task = asyncio.create_task(agent.run())
        try:
            agent.enqueue(agent.factory.batch(samples_per_gpu=1))
            # every session fails with the same unexpected error: recorded, and run() reconnects
            await support.wait_until_async(lambda: len(agent.errors) >= 2, 10, "two failed sessions")
            assert not task.done()
            assert len(agent.errors) >= 2
            assert all(e.code == grpc.StatusCode.UNKNOWN for e in agent.errors)
            assert all("RuntimeError: hello cannot be built" in e.details for e in agent.errors)
            task.cancel()
            await asyncio.sleep(0.05)
            started = asyncio.get_running_loop().time()
            with pytest.raises(RuntimeError, match="run\\(\\) ended before everything was acked"):
                await agent.close(timeout_s=30)
            assert asyncio.get_running_loop().time() - started < 5  # not the 30 s timeout
        finally:
            task.cancel()
            await server.stop(None)

    asyncio.run(scenario())


@pytest.mark.timeout(60)
def test_a_cancel_that_the_session_turns_into_an_error_still_ends_run() -> None:
    """gRPC's asyncio calls can answer a cancel of the task awaiting them with an error of their own
    (CI saw it once: close() then waited 30 s for acks from a run() that kept reconnecting)."""

    class CancelBecomesError(SyntheticAgent):
        turned = False

        async def _session(self) -> bool:
            try:
                await asyncio.Event().wait()  # a session that never ends by itself
            except asyncio.CancelledError:
                if self.turned:
                    raise  # only the first cancel is turned (the test's own cleanup must end the task)
                self.turned = True
                raise RuntimeError("the call was cancelled") from None
            return False

    async def scenario() -> None:
        agent = CancelBecomesError(f"{LOOPBACK}:1", AgentSpec("cancelled-1", gpus=1), reconnect_max_s=0.05)
        agent.enqueue(agent.factory.batch(samples_per_gpu=1))
        task = asyncio.create_task(agent.run())
        await asyncio.sleep(0.2)
        task.cancel()
        await asyncio.wait({task}, timeout=5)
        try:
            assert task.done() and task.cancelled(), "run() went on reconnecting after it was cancelled"
        finally:
            task.cancel()
        assert [e.details for e in agent.errors] == ["RuntimeError: the call was cancelled"]
        with pytest.raises(RuntimeError, match="run\\(\\) ended before everything was acked"):
            await agent.close(timeout_s=30)

    asyncio.run(scenario())
