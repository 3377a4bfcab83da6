"""Part: top floor. Synthetic agents: real gRPC clients of ``TelemetryService.Stream`` that behave like the agent.

It sits on the top floor, beside the CLI and the demo, because it drives one part with another: it
takes the agent's hash of collectors and its resolution policy to load the collector, and the
collector may not import the agent (docs/architecture.md, "Allowed imports").

Used by the collector's tests and benchmarks (and by end-to-end tests that need traffic without
GPUs). A :class:`SyntheticAgent` keeps its batches in an in-memory spool until they are acked,
sends ``Hello`` with the spool state first on every stream, keeps a window of unacked batches in
flight, reconnects with backoff and jitter after any error and then replays everything unacked
from the oldest, exactly as docs/wire.md asks of an agent. Given several collector addresses it starts at the one the
agent's stable hash picks (:func:`gpuprobe.agent.uplink.first_choice`) and, after a stream ends with an
error, tries the next one in the given order at once, pausing with backoff only once every address
has failed since the last ``Welcome``, as the agent's uplink does. Values come from
:class:`SampleFactory`: NVML-like readings (integer percentages and degrees, watts from
milliwatts, an energy counter that only grows), deterministic for a seed.

    agent = SyntheticAgent("127.0.0.1:7447", AgentSpec("node-1", gpus=8))
    task = asyncio.create_task(agent.run())
    agent.enqueue(agent.factory.batch(samples_per_gpu=20))
    await agent.close()           # sends the rest, waits for every ack, ends the stream
    await task
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc

from gpuprobe import __version__
from gpuprobe.agent.resolution import aggregate_one
from gpuprobe.agent.uplink import first_choice
from gpuprobe.backoff import Backoff
from gpuprobe.v1 import common_pb2, telemetry_pb2

METHOD = "/gpuprobe.v1.TelemetryService/Stream"
NS_PER_S = 1_000_000_000

PROFILES: dict[str, tuple[float, float, int, int]] = {
    # name: (TDP W, idle W, max SM clock MHz, memory bytes)
    "NVIDIA H100 80GB HBM3": (700.0, 70.0, 1980, 80 << 30),
    "NVIDIA A100-SXM4-80GB": (400.0, 55.0, 1410, 80 << 30),
    "NVIDIA L4": (72.0, 16.0, 2040, 24 << 30),
}


@dataclass(frozen=True)
class AgentSpec:
    """Who a synthetic agent claims to be."""

    host: str
    gpus: int = 8
    model: str = "NVIDIA H100 80GB HBM3"
    cluster: str = "synthetic"
    cloud: str = ""
    instance_type: str = ""
    region: str = ""
    virtualization: int = common_pb2.VIRTUALIZATION_PASSTHROUGH
    agent_id: str = ""
    spool_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    fan: bool = False  # cloud GPUs: no fan reading (the field stays absent)

    @property
    def id(self) -> str:
        return self.agent_id or self.host

    def identity(self) -> common_pb2.AgentIdentity:
        return common_pb2.AgentIdentity(
            agent_id=self.id,
            host=self.host,
            cluster=self.cluster,
            cloud=self.cloud,
            instance_type=self.instance_type,
            region=self.region,
            virtualization=self.virtualization,  # type: ignore[arg-type]
        )

    def gpu_refs(self) -> list[telemetry_pb2.GpuRef]:
        return [
            telemetry_pb2.GpuRef(
                index=i, uuid=f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{self.host}/{i}')}", name=self.model
            )
            for i in range(self.gpus)
        ]


class SampleFactory:
    """NVML-like GPU samples for one agent; deterministic for a seed."""

    def __init__(self, spec: AgentSpec, seed: int = 0) -> None:
        self.spec = spec
        self.refs = spec.gpu_refs()
        self._rng = random.Random(f"{spec.host}/{seed}")
        tdp, idle, clock, memory = PROFILES.get(spec.model, PROFILES["NVIDIA H100 80GB HBM3"])
        self._tdp_w, self._idle_w, self._clock_mhz, self._memory_bytes = tdp, idle, clock, memory
        self._energy_mj = [self._rng.randrange(10**9, 10**10) for _ in range(spec.gpus)]
        self._last_ns = 0
        self._last_aggregate_ns = 0

    def gpu_sample(self, index: int, time_ns: int) -> telemetry_pb2.GpuSample:
        rng = self._rng
        util = rng.randrange(0, 101)
        power_mw = int((self._idle_w + (self._tdp_w - self._idle_w) * util / 100) * 1000) + rng.randrange(-5000, 5000)
        self._energy_mj[index] += max(power_mw, 0) // 10
        sample = telemetry_pb2.GpuSample(
            time_unix_ns=time_ns,
            gpu_index=index,
            util_pct=float(util),
            mem_util_pct=float(util // 2),
            mem_used_bytes=self._memory_bytes * util // 100,
            mem_total_bytes=self._memory_bytes,
            power_w=max(power_mw, 0) / 1000,
            power_instant_w=max(power_mw + rng.randrange(-20000, 20000), 0) / 1000,
            energy_j=self._energy_mj[index] / 1000,
            temp_c=float(30 + util // 2 + rng.randrange(0, 3)),
            mem_temp_c=float(35 + util // 2),
            sm_clock_mhz=self._clock_mhz if util > 0 else 345,
            mem_clock_mhz=2619,
            power_limit_w=self._tdp_w,
            clock_event_reasons=0 if util > 90 else 1 if util == 0 else 4,
            pcie_tx_bytes_per_s=float(rng.randrange(0, 10**6) * 1024),
            pcie_rx_bytes_per_s=float(rng.randrange(0, 10**6) * 1024),
        )
        if self.spec.fan:
            sample.fan_pct = float(30 + util // 2)
        return sample

    def batch(
        self, samples_per_gpu: int, *, interval_s: float = 0.1, start_ns: int | None = None
    ) -> telemetry_pb2.SampleBatch:
        """``samples_per_gpu`` readings of every GPU, ``interval_s`` apart, ending now (or from
        ``start_ns``); timestamps never repeat across batches of this factory."""
        step = int(interval_s * NS_PER_S)
        first = start_ns if start_ns is not None else time.time_ns() - (samples_per_gpu - 1) * step
        first = max(first, self._last_ns + 1)
        batch = telemetry_pb2.SampleBatch(created_unix_ns=time.time_ns(), gpus=self.refs)
        t = first
        for _ in range(samples_per_gpu):
            for index in range(self.spec.gpus):
                batch.gpu_samples.append(self.gpu_sample(index, t + index))
            t += step
        self._last_ns = t - step + self.spec.gpus
        return batch

    def aggregate_batch(
        self, seconds: int = 1, *, samples_per_interval: int = 10, interval_ms: int = 1000, end_ns: int | None = None
    ) -> telemetry_pb2.SampleBatch:
        """``seconds * 1000 // interval_ms`` aggregates of every GPU (``GpuAggregate``, as the agent
        sends outside probes), each over ``samples_per_interval`` readings, the last interval ending
        at or before ``end_ns`` (default now) on a multiple of the interval; an interval already
        sent by this factory is not sent again.

        The agent's rules (proto/gpuprobe/v1/telemetry.proto): ``mean``, ``min``, ``max`` and
        ``last`` of every per-tick field, integer means rounded; the counter (``energy_j``) and the
        static ``mem_total_bytes`` as their last value in ``mean`` only; ``clock_event_reasons``
        OR-ed in ``mean``, its last value in ``last``. When every interval up to ``end_ns`` was sent
        already, the batch holds the next one (so a batch is never empty)."""
        if interval_ms < 1 or samples_per_interval < 1 or seconds < 1:
            raise ValueError("seconds, samples_per_interval and interval_ms must be at least 1")
        step_ns = interval_ms * 1_000_000
        end = (end_ns if end_ns is not None else time.time_ns()) // step_ns * step_ns
        intervals = max(1, seconds * 1000 // interval_ms)
        first = max(end - intervals * step_ns, self._last_aggregate_ns + step_ns)
        batch = telemetry_pb2.SampleBatch(created_unix_ns=time.time_ns(), gpus=self.refs)
        tick_ns = step_ns // samples_per_interval
        start = first
        while start < end or start == first:
            for index in range(self.spec.gpus):
                samples = [self.gpu_sample(index, start + k * tick_ns) for k in range(samples_per_interval)]
                batch.gpu_aggregates.append(aggregate(samples, start, interval_ms, index))
            self._last_aggregate_ns = start
            start += step_ns
        return batch


def aggregate(
    samples: Sequence[telemetry_pb2.GpuSample], start_ns: int, interval_ms: int, index: int
) -> telemetry_pb2.GpuAggregate:
    """The ``GpuAggregate`` of one GPU's per-tick ``samples`` over one interval, made by the agent's own
    :func:`gpuprobe.agent.resolution.aggregate_one` (see :meth:`SampleFactory.aggregate_batch` for the rules)."""
    rows = [{field.name: value for field, value in s.ListFields()} for s in samples]
    return aggregate_one(index, start_ns, interval_ms * 1_000_000, rows)


# What grpc.aio reports when a write fails because the stream ended under it: the client library
# makes this status up itself (it replaces the collector's, which is lost), see
# grpc.aio._call._StreamRequestMixin._write; the agent's uplink knows it by the same text.
WRITE_RACED_END = "Internal error from Core"


@dataclass
class StreamEvent:
    """An error that ended one stream: what the agent would log."""

    code: grpc.StatusCode
    details: str
    at_s: float

    @property
    def from_client_library(self) -> bool:
        """The status was made up by the client's gRPC library (a write raced the end of the
        stream), not sent by the collector."""
        return self.code == grpc.StatusCode.INTERNAL and self.details == WRITE_RACED_END


class SyntheticAgent:
    """A gRPC client that behaves like the agent (see the module docstring)."""

    def __init__(
        self,
        target: str | Sequence[str],
        spec: AgentSpec,
        *,
        credentials: grpc.ChannelCredentials | None = None,
        token: str | None = None,
        window: int = 32,
        seed: int = 0,
        reconnect_initial_s: float = 0.05,
        reconnect_max_s: float = 2.0,
        channel_options: Sequence[tuple[str, object]] = (),
        server_name: str | None = None,
        on_ack: Callable[[SyntheticAgent, int], None] | None = None,
    ) -> None:
        self.targets = [target] if isinstance(target, str) else list(target)
        if not self.targets:
            raise ValueError("a synthetic agent needs at least one collector address")
        self.spec = spec
        self.target = self.targets[first_choice(spec.id, len(self.targets))]  # the address in use
        self.factory = SampleFactory(spec, seed)
        self.credentials = credentials
        self.token = token
        self.window = window
        self.reconnect_initial_s = reconnect_initial_s
        self.reconnect_max_s = reconnect_max_s
        options = list(channel_options)
        if server_name:
            options.append(("grpc.ssl_target_name_override", server_name))
        self.channel_options = options
        self.on_ack = on_ack  # called with (self, durable_seq) on each Ack, as it arrives (benchmarks)
        self.spool: OrderedDict[int, bytes] = OrderedDict()  # seq -> serialized StreamRequest
        self.next_seq = 1
        self.acked_seq = 0
        self.rejections: list[telemetry_pb2.BatchRejection] = []
        self.errors: list[StreamEvent] = []
        self.welcomes: list[telemetry_pb2.Welcome] = []
        self.welcomed_at: list[tuple[float, str]] = []  # (time.monotonic(), address) of each Welcome
        self._failed_in_round = 0  # sessions that failed since the last Welcome
        self.streams = 0
        self.acks = 0
        self._changed = asyncio.Event()
        self._closing = False
        self._done = False
        self._run_error: BaseException | None = None

    # --- producing ---------------------------------------------------------------------------------

    def enqueue(self, batch: telemetry_pb2.SampleBatch) -> int:
        """Puts ``batch`` into the spool with the next ``seq``; returns it."""
        seq = self.next_seq
        self.next_seq += 1
        batch.agent_id = self.spec.id
        batch.seq = seq
        self.spool[seq] = telemetry_pb2.StreamRequest(batch=batch).SerializeToString()
        self._changed.set()
        return seq

    def enqueue_raw(self, seq: int, request: bytes) -> None:
        """A pre-serialized ``StreamRequest`` whose batch already carries ``seq`` (benchmarks)."""
        self.spool[seq] = request
        self.next_seq = max(self.next_seq, seq + 1)
        self._changed.set()

    async def close(self, timeout_s: float = 60.0) -> None:
        """Stops producing; returns once everything is acked and the stream is closed."""
        self._closing = True
        self._changed.set()
        deadline = time.monotonic() + timeout_s
        while not self._done:
            if self._run_error is not None:
                raise RuntimeError(
                    f"{self.spec.id}: run() ended before everything was acked ({len(self.spool)} batches"
                    f" unacked): {type(self._run_error).__name__}: {self._run_error}"
                ) from self._run_error
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.spec.id}: {len(self.spool)} batches still unacked after {timeout_s} s")
            await asyncio.sleep(0.02)

    async def wait_acked(self, seq: int, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.acked_seq < seq:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.spec.id}: seq {seq} not acked after {timeout_s} s (acked {self.acked_seq})")
            await asyncio.sleep(0.01)

    # --- the connection loop ---------------------------------------------------------------------

    async def run(self) -> None:
        """Streams until :meth:`close` finished; reconnects after every error.

        Any exception of a session, expected (the RPC's status) or not (a bug, a write into an RPC
        that ended), is recorded in :attr:`errors` and followed by a reconnect, as the agent does.
        """
        backoff = Backoff(self.reconnect_initial_s, self.reconnect_max_s)
        try:
            while True:
                try:
                    finished = await self._session()
                except grpc.aio.AioRpcError as exc:
                    self.errors.append(StreamEvent(exc.code(), exc.details() or "", time.monotonic()))
                    finished = False
                except Exception as exc:
                    self.errors.append(
                        StreamEvent(grpc.StatusCode.UNKNOWN, f"{type(exc).__name__}: {exc}", time.monotonic())
                    )
                    finished = False
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    # the caller cancelled run() while gRPC was setting up or ending a call, and gRPC raised
                    # an error of its own (or none) in place of the CancelledError: run() ends as asked,
                    # instead of reconnecting for ever with close() waiting on acks that cannot come
                    raise asyncio.CancelledError
                if finished:
                    self._done = True
                    return
                self._failed_in_round += 1
                if len(self.targets) > 1:  # fail over in the given order
                    self.target = self.targets[(self.targets.index(self.target) + 1) % len(self.targets)]
                if self._failed_in_round >= len(self.targets):
                    await backoff.wait()
        except BaseException as exc:
            self._run_error = exc  # close() reports it instead of waiting for acks that cannot come
            raise

    def _channel(self) -> grpc.aio.Channel:
        if self.credentials is None:
            return grpc.aio.insecure_channel(self.target, options=self.channel_options)
        return grpc.aio.secure_channel(self.target, self.credentials, options=self.channel_options)

    def hello(self) -> bytes:
        unacked = list(self.spool)
        return telemetry_pb2.StreamRequest(
            hello=telemetry_pb2.Hello(
                identity=self.spec.identity(),
                agent_version=f"synthetic/{__version__}",
                sample_interval_s=0.1,
                spool_id=self.spec.spool_id,
                oldest_unacked_seq=unacked[0] if unacked else 0,
                newest_unacked_seq=unacked[-1] if unacked else 0,
                time_unix_ns=time.time_ns(),
            )
        ).SerializeToString()

    async def _session(self) -> bool:
        metadata = (("authorization", f"Bearer {self.token}"),) if self.token else None
        async with self._channel() as channel:
            call = channel.stream_stream(METHOD)(metadata=metadata)
            self.streams += 1
            reader = asyncio.create_task(self._read(call))
            try:
                await self._write(call, self.hello())
                sent = 0
                while True:
                    if reader.done():
                        break
                    in_flight, following = self._window_state(sent)
                    if following is not None and in_flight < self.window:
                        await self._write(call, self.spool[following])
                        sent = following
                        continue
                    if self._closing and not self.spool:
                        await call.done_writing()
                        await reader
                        return True
                    self._changed.clear()
                    waiter = asyncio.ensure_future(self._changed.wait())
                    await asyncio.wait({waiter, reader}, return_when=asyncio.FIRST_COMPLETED)
                    waiter.cancel()
                await reader  # raises the RPC error
                return False
            except asyncio.CancelledError:
                call.cancel()
                raise
            finally:
                if not reader.done():
                    reader.cancel()
                with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                    await reader  # (also retrieves its error when the session ended on a write)

    async def _write(self, call: grpc.aio.StreamStreamCall, request: bytes) -> None:
        """Writes one request; a failed write ends the session with the RPC's own status.

        A write after the RPC received its final status does not raise ``AioRpcError`` (grpcio 1.85
        raises ``asyncio.InvalidStateError``), so the status is read from the call, as the agent's
        uplink does.
        """
        try:
            await call.write(request)
        except grpc.aio.AioRpcError:
            raise
        except Exception as exc:
            if not call.done():
                raise
            raise grpc.aio.AioRpcError(
                await call.code(), await call.initial_metadata(), await call.trailing_metadata(), await call.details()
            ) from exc

    def _window_state(self, sent: int) -> tuple[int, int | None]:
        """How many sent batches are unacked, and the next batch to send (None: all sent)."""
        in_flight = 0
        for seq in self.spool:
            if seq > sent:
                return in_flight, seq
            in_flight += 1
        return in_flight, None

    async def _read(self, call: grpc.aio.StreamStreamCall) -> None:
        async for raw in call:
            response = telemetry_pb2.StreamResponse.FromString(raw)
            if response.HasField("welcome"):
                self.welcomes.append(response.welcome)
                self.welcomed_at.append((time.monotonic(), self.target))
                self._failed_in_round = 0
            elif response.HasField("ack"):
                self.acks += 1
                durable = response.ack.durable_seq
                self.rejections.extend(response.ack.rejections)
                for seq in [s for s in self.spool if s <= durable]:
                    del self.spool[seq]
                self.acked_seq = max(self.acked_seq, durable)
                if self.on_ack is not None:
                    self.on_ack(self, durable)
                self._changed.set()
        code = await call.code()
        if code != grpc.StatusCode.OK:
            raise grpc.aio.AioRpcError(
                code, await call.initial_metadata(), await call.trailing_metadata(), await call.details()
            )
