"""Collects samples into the next ``SampleBatch``: closed when it holds ``max_samples`` or is ``flush_interval_s`` old.

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
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from gpuprobe.agent.metrics import Counters
from gpuprobe.v1 import common_pb2, telemetry_pb2

# the GPU events whose batch goes to the spool at once (the faults)
URGENT_EVENT_KINDS = frozenset(
    {
        telemetry_pb2.GPU_EVENT_KIND_XID,
        telemetry_pb2.GPU_EVENT_KIND_ECC_SINGLE_BIT,
        telemetry_pb2.GPU_EVENT_KIND_ECC_DOUBLE_BIT,
        telemetry_pb2.GPU_EVENT_KIND_LOST,
        telemetry_pb2.GPU_EVENT_KIND_RECOVERED,
    }
)


class Batcher:
    def __init__(
        self,
        agent_id: str,
        gpus: Callable[[], Sequence[common_pb2.GpuInfo]],
        counters: Counters,
        max_samples: int = 2000,
        on_full: Callable[[], None] | None = None,
    ) -> None:
        if max_samples < 100:
            raise ValueError(f"a batch must be allowed at least 100 samples (wire contract), not {max_samples}")
        self.agent_id = agent_id
        self._gpus = gpus
        self._sent_infos: dict[int, common_pb2.GpuInfo] = {}  # index -> the facts last put into a batch
        self._counters = counters
        self.max_samples = max_samples
        self.on_full = on_full
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

    def take(self) -> tuple[telemetry_pb2.SampleBatch, int] | None:
        """The open batch and its sample count (a new one is opened), or None when it is empty."""
        with self._lock:
            if not self._count:
                return None
            gpu, other, count = self._gpu, self._other, self._count
            self._gpu, self._other, self._count = [], [], 0
        batch = telemetry_pb2.SampleBatch(gpu_samples=gpu)
        for kind, message in other:
            getattr(batch, kind).append(message)
        batch.agent_id = self.agent_id
        batch.created_unix_ns = time.time_ns()
        infos = self._gpus()
        batch.gpus.extend(telemetry_pb2.GpuRef(index=g.index, uuid=g.uuid, name=g.name) for g in infos)
        for info in infos:
            if self._sent_infos.get(info.index) != info:
                batch.gpu_info.append(info)
                self._sent_infos[info.index] = info
        read_errors, missed_ticks = self._counters.take_batch_deltas()
        batch.stats.read_errors = read_errors
        batch.stats.missed_ticks = missed_ticks
        return batch, count
