"""Part: control. What the control plane reads of this node's GPUs, through the GPU sensor of ``gpuprobe/nvml/``.

What a probe result needs: the GPUs' static description for the presence message, and readings of
power (W), temperature (°C) and the energy counter (J) to compute energy per sample, mean and peak
power and peak temperature over the steady phase. Without NVML (no driver, no `agent` extra) the
node has no GPUs: probes run on the CPU and their results carry no energy figures.
A reading the GPU does not support is ``None`` (absent), never 0.

:class:`GpuReader` is what the control plane needs from a node's GPUs. NVML itself is read in one
place, ``gpuprobe.nvml.sensor`` (the NVML boundary below the agent and the control plane, so
neither imports the other to read a GPU): ``gpuprobe agent
--broker`` passes an adapter over the samples its own sampler already takes
(``gpuprobe.agent.embedded_control.AgentGpus``), so NVML is read once; ``gpuprobe control-agent``, which runs
without the agent, opens the same sensor for itself (:class:`SensorGpus`).

Health (:meth:`GpuReader.health`): each GPU's verdict as ``{index: (GpuHealth value, reason)}``, the
same mapping object for as long as nothing changes (a reader replaces it, never changes it, so a
caller can poll it with an identity check); empty when unknown. ``AgentGpus`` hands on the agent's
own verdicts (``gpuprobe.agent.health``: XID events, ECC, remapping, thermal slowdown). ``SensorGpus``
has only what its reads show: a GPU that does not answer NVML (``GPU_IS_LOST``) is ``FAILED``, every
other GPU ``HEALTHY`` ("nothing wrong is known"); it never reports ``DEGRADED``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gpuprobe.v1 import common_pb2

if TYPE_CHECKING:
    from gpuprobe.nvml.sensor import GpuSensor

log = logging.getLogger(__name__)

GpuHealthMap = dict[int, tuple[int, str]]  # GPU index -> (common_pb2.GpuHealth value, reason)
HEALTHY: tuple[int, str] = (common_pb2.GPU_HEALTH_HEALTHY, "")
LOST_REASON = "the GPU does not answer NVML (GPU_IS_LOST: fallen off the bus or lost)"
HEALTH_CHECK_S = 0.5  # SensorGpus: a GPU not read for this long is read again when health is asked


def health_name(value: int) -> str:
    """``healthy``, ``degraded``, ``failed`` (``unknown`` for anything else)."""
    try:
        name = str(common_pb2.GpuHealth.Name(value))
    except ValueError:
        return "unknown"
    return name.removeprefix("GPU_HEALTH_").lower().replace("unspecified", "unknown")


def describe_health(index: int, value: int, reason: str) -> str:
    """``GPU 3 is failed: XID 79: GPU has fallen off the bus`` (the words of refusals and warnings)."""
    return f"GPU {index} is {health_name(value)}" + (f": {reason}" if reason else "")


@dataclass(frozen=True)
class Reading:
    time_unix_ns: int
    power_w: float | None
    temp_c: float | None
    energy_j: float | None

    @classmethod
    def from_sample(cls, sample: Mapping[str, Any]) -> Reading:
        """From one sample of the GPU sensor (``gpuprobe.nvml.sensor``: keys of the ``gpu`` measurement)."""
        temp = sample.get("temp_c")
        return cls(
            time_unix_ns=sample["time_unix_ns"],
            power_w=sample.get("power_w"),
            temp_c=None if temp is None else float(temp),
            energy_j=sample.get("energy_j"),
        )

    @classmethod
    def unknown(cls) -> Reading:
        """Nothing known now (the GPU is lost, or has not been read yet)."""
        return cls(time_unix_ns=time.time_ns(), power_w=None, temp_c=None, energy_j=None)


class GpuReader(Protocol):
    """The node's GPUs as the control plane sees them: ``read`` must be safe from any thread."""

    @property
    def count(self) -> int: ...

    def infos(self) -> list[common_pb2.GpuInfo]: ...

    def read(self, index: int) -> Reading: ...

    def read_since(self, index: int, after_ns: int) -> list[Reading]:
        """Every reading of GPU ``index`` newer than ``after_ns`` the reader still holds, oldest first (one
        that reads on demand: a new reading); a lost GPU's is :meth:`Reading.unknown`."""
        ...

    def health(self) -> GpuHealthMap:
        """Each GPU's health; the same object while nothing changes (never mutated); empty when unknown."""
        ...


class SensorGpus:
    """The agent's GPU sensor opened for the control plane alone (``gpuprobe control-agent``)."""

    def __init__(self) -> None:
        self._sensor: GpuSensor | None = None
        # the sensor's read buffers are per GPU, not per thread: one read at a time
        self._lock = threading.Lock()
        self._health: GpuHealthMap = {}
        self._health_lock = threading.Lock()
        self._read_at: dict[int, float] = {}  # monotonic time of each GPU's last read
        try:
            from gpuprobe.nvml.sensor import GpuSensor

            self._sensor = GpuSensor.open()
        except Exception as e:  # no pynvml, no library, no driver: a node without GPUs
            log.info("NVML is not available (%s): probes run on the CPU without energy figures", e)

    @property
    def count(self) -> int:
        return self._sensor.count if self._sensor is not None else 0

    def infos(self) -> list[common_pb2.GpuInfo]:
        """Static description of every GPU (read once, when the sensor opened)."""
        return list(self._sensor.infos) if self._sensor is not None else []

    def read(self, index: int) -> Reading:
        if self._sensor is None:
            return Reading.unknown()
        with self._lock:
            sample = self._sensor.read_gpu(index)
        self._answered(index, sample is not None)
        return Reading.from_sample(sample) if sample is not None else Reading.unknown()

    def read_since(self, index: int, after_ns: int) -> list[Reading]:
        reading = self.read(index)
        return [reading] if reading.time_unix_ns > after_ns else []

    def health(self) -> GpuHealthMap:
        """From the reads alone: a GPU that answers no read (lost) is failed, the others healthy.

        Reads the GPUs that nobody read for ``HEALTH_CHECK_S`` (a probe's sampler reads its GPUs
        every 100 ms anyway); call it from a worker thread, it may block on NVML."""
        if self._sensor is None:
            return {}
        now = time.monotonic()
        for info in self.infos():
            if now - self._read_at.get(info.index, -HEALTH_CHECK_S) >= HEALTH_CHECK_S:
                with self._lock:
                    sample = self._sensor.read_gpu(info.index)
                self._answered(info.index, sample is not None)
        return self._health

    def _answered(self, index: int, answered: bool) -> None:
        self._read_at[index] = time.monotonic()
        verdict = HEALTHY if answered else (common_pb2.GPU_HEALTH_FAILED, LOST_REASON)
        if self._health.get(index) == verdict:
            return
        with self._health_lock:
            if self._health.get(index) != verdict:
                self._health = {**self._health, index: verdict}  # replaced, never changed


class ReadingRecorder:
    """Reads some GPUs every ``interval_s`` in a thread, keeping every reading, until stopped."""

    def __init__(self, gpus: GpuReader, indices: list[int], interval_s: float = 0.1) -> None:
        self.gpus = gpus
        self.indices = indices
        self.interval_s = interval_s
        self.readings: dict[int, list[Reading]] = {i: [] for i in indices}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpuprobe-probe-sampler", daemon=True)

    def start(self) -> None:
        if self.indices:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def sample_once(self) -> None:
        for i in self.indices:
            kept = self.readings[i]
            kept.extend(self.gpus.read_since(i, kept[-1].time_unix_ns if kept else 0))

    def _loop(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            self.sample_once()
            next_t += self.interval_s
            self._stop.wait(max(0.0, next_t - time.monotonic()))
