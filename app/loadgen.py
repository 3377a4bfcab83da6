"""Part: top floor. Synthetic agents: the agent's own uplink, fed by a sample factory instead of GPUs.

It sits on the top floor, beside the CLI and the demo, because it drives one part with another: it
loads the collector with the agent's uplink and resolution policy, and the collector may not import
the agent (docs/architecture.md, "Allowed imports").

Used by the collector's tests and benchmarks (and by end-to-end tests that need traffic without
GPUs). A :class:`SyntheticAgent` is :class:`gpuprobe.agent.uplink.Uplink` over a
:class:`gpuprobe.agent.spool.MemorySpool`: the Hello, the wait for the collector's acceptance, the
window of unacked batches, the failover over several addresses, the reconnects with backoff and the
replay are the agent's, so the collector is tested against what agents send. Values come from
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
import random
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpuprobe import __version__
from gpuprobe.agent.metrics import Counters
from gpuprobe.agent.resolution import aggregate_one
from gpuprobe.agent.settings import TlsSettings, UplinkSettings
from gpuprobe.agent.spool import MemorySpool, SpoolState
from gpuprobe.agent.uplink import SessionError, Uplink
from gpuprobe.v1 import common_pb2, telemetry_pb2

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


class SyntheticAgent:
    """The agent's uplink over an in-memory spool (see the module docstring)."""

    def __init__(
        self,
        target: str | Sequence[str],
        spec: AgentSpec,
        *,
        tls: TlsSettings | None = None,
        token: str | None = None,
        window: int = 32,
        seed: int = 0,
        reconnect_initial_s: float = 0.05,
        reconnect_max_s: float = 2.0,
        on_ack: Callable[[SyntheticAgent, int], None] | None = None,
    ) -> None:
        self.targets = [target] if isinstance(target, str) else list(target)
        self.spec = spec
        self.factory = SampleFactory(spec, seed)
        self.token = token
        self.on_ack = on_ack  # called with (self, durable_seq) on each Ack, as it arrives (benchmarks)
        self.spool = MemorySpool(spec.spool_id)
        self.rejections: list[telemetry_pb2.BatchRejection] = []
        self.errors: list[SessionError] = []  # of each stream that ended (its code, and str(): what happened)
        self.welcomes: list[telemetry_pb2.Welcome] = []
        self.welcomed_at: list[tuple[float, str]] = []  # (time.monotonic(), address) of each Welcome
        self.acks = 0
        settings = UplinkSettings(
            self.targets,
            agent_id=spec.id,
            tls=tls,
            token=token,
            max_in_flight_batches=window,
            reconnect_min_s=reconnect_initial_s,
            reconnect_max_s=reconnect_max_s,
        )
        self.uplink = Uplink(settings, self.spool, self._hello, Counters(), events=self)
        self._runner: asyncio.Task[None] | None = None

    @property
    def target(self) -> str:
        """The address in use (or tried next)."""
        return self.targets[self.uplink.target_index % len(self.targets)]

    @property
    def next_seq(self) -> int:
        return self.spool.last_seq + 1

    @property
    def acked_seq(self) -> int:
        return self.uplink.acked_through

    @property
    def unacked(self) -> int:
        """Batches spooled and not acknowledged (the spool deletes acknowledged ones in batches)."""
        return self.spool.last_seq - self.acked_seq

    @property
    def streams(self) -> int:
        return self.uplink.sessions

    # --- producing ---------------------------------------------------------------------------------

    def enqueue(self, batch: telemetry_pb2.SampleBatch) -> int:
        """Puts ``batch`` into the spool with the next ``seq``; returns it."""
        batch.agent_id, batch.seq = self.spec.id, self.next_seq
        self.enqueue_raw(batch.seq, batch.SerializeToString(), len(batch.gpu_samples) + len(batch.gpu_aggregates))
        return batch.seq

    def enqueue_raw(self, seq: int, payload: bytes, samples: int = 0) -> None:
        """A serialized ``SampleBatch`` that carries this agent's id and ``seq`` (benchmarks)."""
        self.uplink.notify(self.spool.append(seq, samples, payload))

    def _hello(self, state: SpoolState) -> telemetry_pb2.Hello:
        return telemetry_pb2.Hello(
            identity=self.spec.identity(),
            agent_version=f"synthetic/{__version__}",
            sample_interval_s=0.1,
            spool_id=state.spool_id,
            oldest_unacked_seq=state.oldest_seq,
            newest_unacked_seq=state.newest_seq,
            time_unix_ns=time.time_ns(),
        )

    # --- running -----------------------------------------------------------------------------------

    async def run(self) -> None:
        """Streams until :meth:`close` finished, reconnecting after every error (the uplink's loop)."""
        self._runner = asyncio.current_task()
        await self.uplink.run()

    async def close(self, timeout_s: float = 60.0) -> None:
        """Stops producing; returns once everything is acked and the stream is half-closed."""
        drained = asyncio.ensure_future(self.uplink.drain(timeout_s))
        await asyncio.wait({drained, *([self._runner] if self._runner else [])}, return_when=asyncio.FIRST_COMPLETED)
        if not drained.done():
            drained.cancel()
            raise RuntimeError(f"{self.spec.id}: run() ended before everything was acked ({self.unacked} left)")
        if not drained.result():
            raise TimeoutError(f"{self.spec.id}: {self.unacked} batches still unacked after {timeout_s} s")
        await self.uplink.stop()

    async def wait_acked(self, seq: int, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.acked_seq < seq:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.spec.id}: seq {seq} not acked after {timeout_s} s (acked {self.acked_seq})")
            await asyncio.sleep(0.01)

    # --- the uplink's events (gpuprobe.agent.uplink.UplinkEvents) ----------------------------------

    def welcomed(self, target: str, welcome: telemetry_pb2.Welcome) -> None:
        self.welcomes.append(welcome)
        self.welcomed_at.append((time.monotonic(), target))

    def acked(self, ack: telemetry_pb2.Ack) -> None:
        self.acks += 1
        self.rejections.extend(ack.rejections)
        if self.on_ack is not None:
            self.on_ack(self, ack.durable_seq)

    def ended(self, target: str, error: SessionError) -> None:
        self.errors.append(error)
