"""Part: agent. Collects samples into the next ``SampleBatch``: closed when it holds ``max_samples`` or is
``flush_interval_s`` old.

The sampler thread, the GPU events thread and the event loop (trainer input) add samples (a GPU
event, process, NVLink or MIG sample counts as one sample); the service's flusher takes the
batch (:meth:`Batcher.take`) once per flush interval, or earlier when ``on_full`` tells it the batch
reached ``max_samples``. GPU samples wait as plain dicts (an append on the sampling hot path) and
become ``GpuSample`` messages in one go when the batch is taken, outside the sampler thread. The
batch leaves here without ``seq`` and without the spool's drop counters: the spool assigns those in
the same transaction that makes the batch durable.

The GPUs' static facts (``GpuInfo``, the ``gpu_info`` measurement) ride in the batches too, so they are
spooled, sent and acknowledged like every sample: every GPU's facts go into the first batch taken, and
a GPU's facts again into the next batch whenever they differ from what was last put into one (a GPU
that answers for the first time, or whose facts changed after it was lost). ``gpus`` is asked for the
current facts each time a batch is taken.

The GPU samples pass through the resolution policy (:mod:`gpuprobe.agent.resolution`) when a batch is
taken: outside a high-resolution window they leave as ``gpu_aggregates``, and their raw copy as a batch
of its own for the spool's flight recorder (:class:`Taken`); every other kind of sample is shipped as it
came.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuprobe.agent.metrics import Counters
from gpuprobe.agent.podresources import PodRef
from gpuprobe.agent.resolution import FAULT_EVENT_KINDS, ResolutionPolicy
from gpuprobe.v1 import common_pb2, telemetry_pb2

# the GPU events whose batch goes to the spool at once (the faults, and a lost GPU's return)
URGENT_EVENT_KINDS = FAULT_EVENT_KINDS | {telemetry_pb2.GPU_EVENT_KIND_RECOVERED}


@dataclass
class Taken:
    """One take: the batch to ship (None when everything taken waits for its interval or is recorded
    only), and the raw GPU samples for the flight recorder."""

    batch: telemetry_pb2.SampleBatch | None
    samples: int  # of ``batch``; an aggregate counts as one sample (it is one point)
    recorded: telemetry_pb2.SampleBatch | None = None
    recorded_samples: int = 0
    promote_since_ns: int | None = None  # a high-resolution window opened: ship the recorder since then
    hires: bool = True


class Batcher:
    def __init__(
        self,
        agent_id: str,
        gpus: Callable[[], Sequence[common_pb2.GpuInfo]],
        counters: Counters,
        max_samples: int = 2000,
        on_full: Callable[[], None] | None = None,
        policy: ResolutionPolicy | None = None,
        pods: Callable[[], Mapping[str, PodRef]] | None = None,
    ) -> None:
        if max_samples < 100:
            raise ValueError(f"a batch must be allowed at least 100 samples (wire contract), not {max_samples}")
        self.agent_id = agent_id
        self._gpus = gpus
        self._pods = pods  # GPU UUID -> (pod, namespace, container), the tags of its points where known
        self._sent_infos: dict[int, common_pb2.GpuInfo] = {}  # index -> the facts last put into a batch
        self._counters = counters
        self.max_samples = max_samples
        self.on_full = on_full
        self.policy = policy if policy is not None else ResolutionPolicy("full")
        self._lock = threading.Lock()
        self._gpu: list[dict[str, Any]] = []
        self._other: list[tuple[str, Any]] = []  # (repeated field name, message)
        self._count = 0
        self._first_mono = 0.0

    @property
    def count(self) -> int:
        return self._count

    def age_s(self) -> float:
        """Seconds since the first sample of the open batch arrived (0 when it is empty)."""
        return time.monotonic() - self._first_mono if self._count else 0.0

    def _added(self, n: int) -> None:
        # called with the lock held
        if not self._count:
            self._first_mono = time.monotonic()
        before = self._count
        self._count += n
        if before < self.max_samples <= self._count and self.on_full is not None:
            self.on_full()

    def add_gpu(self, samples: list[dict[str, Any]]) -> None:
        """GPU samples as ``GpuSample`` keyword arguments."""
        if samples:
            with self._lock:
                self._gpu.extend(samples)
                self._added(len(samples))

    def _add(self, kind: str, messages: Sequence[Any]) -> None:
        if messages:
            with self._lock:
                self._other.extend((kind, m) for m in messages)
                self._added(len(messages))

    def add_node(self, sample: telemetry_pb2.NodeSample) -> None:
        self._add("node_samples", [sample])

    def add_acoustic(self, samples: Sequence[telemetry_pb2.AcousticSample]) -> None:
        self._add("acoustic_samples", samples)

    def add_trainer(self, sample: telemetry_pb2.TrainerSample) -> None:
        self._add("trainer_samples", [sample])

    def add_probe_event(self, event: telemetry_pb2.ProbeEvent) -> None:
        self._add("probe_events", [event])

    def add_gpu_events(self, events: Sequence[telemetry_pb2.GpuEvent]) -> None:
        """GPU events (XID, ECC, lost / recovered...): each is put into exactly one batch. A fault's batch
        is flushed to the spool at once (``on_full``): NVML delivers an event once, so an agent killed
        before its next flush interval would lose it for good. Clock and power-source changes wait for the
        flush interval (they come up to once per second per GPU; a flush each would cost a spool fsync)."""
        self._add("gpu_events", events)
        if self.on_full is not None and any(e.kind in URGENT_EVENT_KINDS for e in events):
            self.on_full()

    def add_processes(self, samples: Sequence[telemetry_pb2.ProcessSample]) -> None:
        self._add("process_samples", samples)

    def add_nvlink(self, samples: Sequence[telemetry_pb2.NvLinkSample]) -> None:
        self._add("nvlink_samples", samples)

    def add_mig(self, samples: Sequence[telemetry_pb2.MigSample]) -> None:
        self._add("mig_samples", samples)

    def take(self, final: bool = False) -> Taken | None:
        """The open batch, passed through the resolution policy (a new batch is opened), or None when
        there is nothing to ship or record. ``final``: the agent stops; no interval waits any longer."""
        policy = self.policy
        with self._lock:
            if not self._count and not policy.pending:
                return None
            gpu, other, count = self._gpu, self._other, self._count
            self._gpu, self._other, self._count = [], [], 0
        now_ns = time.time_ns()
        if policy.full:
            decision = None
        else:
            gpu_events = [m for kind, m in other if kind == "gpu_events"]
            probe_events = [m for kind, m in other if kind == "probe_events"]
            decision = policy.take(gpu, gpu_events, probe_events, now_ns, final)
        refs = None
        recorded = None
        if decision is not None and decision.recorded:
            refs = self._refs()
            recorded = telemetry_pb2.SampleBatch(
                agent_id=self.agent_id, created_unix_ns=now_ns, gpus=refs, gpu_samples=decision.recorded
            )
        shipped = count
        if decision is not None:
            shipped = count - len(gpu) + len(decision.raw) + len(decision.aggregates)
        batch = None
        if shipped:
            if decision is None:
                batch = telemetry_pb2.SampleBatch(gpu_samples=gpu)
            else:
                batch = telemetry_pb2.SampleBatch(gpu_samples=decision.raw, gpu_aggregates=decision.aggregates)
            for kind, message in other:
                getattr(batch, kind).append(message)
            batch.agent_id = self.agent_id
            batch.created_unix_ns = now_ns
            infos = self._gpus()
            batch.gpus.extend(refs if refs is not None else self._refs(infos))
            for info in infos:
                if self._sent_infos.get(info.index) != info:
                    batch.gpu_info.append(info)
                    self._sent_infos[info.index] = info
            read_errors, missed_ticks, overwritten = self._counters.take_batch_deltas()
            batch.stats.read_errors = read_errors
            batch.stats.missed_ticks = missed_ticks
            batch.stats.dropped_samples = overwritten  # the spool adds its own drops
        if batch is None and recorded is None:
            return None
        return Taken(
            batch,
            shipped,
            recorded,
            len(decision.recorded) if decision is not None else 0,
            decision.promote_since_ns if decision is not None else None,
            decision.hires if decision is not None else True,
        )

    def _refs(self, infos: Sequence[common_pb2.GpuInfo] | None = None) -> list[telemetry_pb2.GpuRef]:
        pods = self._pods() if self._pods is not None else {}
        refs = []
        for g in self._gpus() if infos is None else infos:
            ref = telemetry_pb2.GpuRef(index=g.index, uuid=g.uuid, name=g.name)
            pod = pods.get(g.uuid)
            if pod is not None:
                ref.pod, ref.namespace, ref.container = pod
            refs.append(ref)
        return refs
