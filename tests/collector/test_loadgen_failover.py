"""The load generator with several collector addresses: it starts at the agent's own first choice
(``gpuprobe.agent.uplink.first_choice``), fails over in the given order when that collector goes
away, replays what was not acknowledged there, and reports each ack to ``on_ack`` (the fleet-scale
benchmark, bench/fleet_scale.py, measures ack latency and failover time with these)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest

from gpuprobe.agent.uplink import METHOD, first_choice
from gpuprobe.app.loadgen import AgentSpec, SyntheticAgent
from gpuprobe.devservices.ports import LOOPBACK
from gpuprobe.v1 import telemetry_pb2
from gpuprobe.wire.validate import STREAM_ACCEPTED_HEADER


class Acking:
    """A TelemetryService that welcomes every stream and acks every batch at once."""

    def __init__(self) -> None:
        self.stored: set[int] = set()

    async def stream(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        await context.send_initial_metadata((STREAM_ACCEPTED_HEADER,))  # as the collector does
        async for raw in requests:
            request = telemetry_pb2.StreamRequest.FromString(raw)
            if request.HasField("hello"):
                yield telemetry_pb2.StreamResponse(welcome=telemetry_pb2.Welcome()).SerializeToString()
                continue
            self.stored.add(request.batch.seq)
            yield telemetry_pb2.StreamResponse(ack=telemetry_pb2.Ack(durable_seq=request.batch.seq)).SerializeToString()


async def _serve(service: Acking) -> tuple[grpc.aio.Server, str]:
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
    return server, f"{LOOPBACK}:{port}"


@pytest.mark.timeout(60)
def test_the_agent_starts_at_its_first_choice_and_fails_over_in_order() -> None:
    async def scenario() -> None:
        services = [Acking(), Acking(), Acking()]
        served = [await _serve(s) for s in services]
        addresses = [address for _, address in served]
        acks: list[int] = []
        spec = AgentSpec("failover-1", gpus=1)
        first = first_choice(spec.id, 3)
        agent = SyntheticAgent(addresses, spec, reconnect_initial_s=0.05, on_ack=lambda a, seq: acks.append(seq))
        assert agent.target == addresses[first]
        task = asyncio.create_task(agent.run())
        try:
            await agent.wait_acked(agent.enqueue(agent.factory.batch(samples_per_gpu=1)), timeout_s=10)
            assert services[first].stored == {1} and acks == [1]
            assert agent.welcomed_at[-1][1] == addresses[first]

            await served[first][0].stop(None)  # that collector goes away
            following = (first + 1) % 3
            seq = agent.enqueue(agent.factory.batch(samples_per_gpu=1))
            await agent.wait_acked(seq, timeout_s=10)
            assert agent.target == addresses[following]  # the next one in the given order
            assert agent.welcomed_at[-1][1] == addresses[following]
            assert seq in services[following].stored and acks[-1] == seq
            await agent.close(timeout_s=10)
            await task
        finally:
            task.cancel()
            for server, _ in served:
                await server.stop(None)

    asyncio.run(scenario())
