"""The control plane's view of this node's GPUs through NVML (the only module here that imports pynvml).

What a probe result needs: the GPUs' static description for the presence message, and readings of
power (W), temperature (°C) and the energy counter (J) to compute energy per sample, mean and peak
power and peak temperature over the steady phase. Without NVML (no driver, no `agent` extra) the
node has no GPUs: probes run on the CPU and their results carry no energy figures.
A reading the GPU does not support is ``None`` (absent), never 0.

:class:`GpuReader` is what the control plane needs from a node's GPUs; :class:`NvmlGpus` is its own
NVML reader (``gpuprobe control-agent``). ``gpuprobe agent --broker`` passes an adapter over the
readings its own sampler already takes (``gpuprobe.agent.fleet.AgentGpus``), so NVML is read once.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

from gpuprobe.v1 import common_pb2

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reading:
    time_unix_ns: int
    power_w: float | None
    temp_c: float | None
    energy_j: float | None


class GpuReader(Protocol):
    """The node's GPUs as the control plane sees them: ``read`` must be safe from any thread."""

    @property
    def count(self) -> int: ...

    def infos(self) -> list[common_pb2.GpuInfo]: ...

    def read(self, index: int) -> Reading: ...


class NvmlGpus:
    """NVML, initialised once; every call is short and thread-safe (NVML is)."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: list[Any] = []
        self._warned: set[tuple[int, str]] = set()
        self._infos: list[common_pb2.GpuInfo] | None = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self._nvml = pynvml
        except Exception as e:  # no library, no driver: a node without GPUs
            log.info("NVML is not available (%s): probes run on the CPU without energy figures", e)
            self._handles = []

    @property
    def count(self) -> int:
        return len(self._handles)

    def _query(self, index: int, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(self._handles[index], *args)
        except Exception as e:
            if (index, what) not in self._warned:
                self._warned.add((index, what))
                log.warning("GPU %d: cannot read %s: %s", index, what, e)
            return None

    def infos(self) -> list[common_pb2.GpuInfo]:
        """Static description of every GPU (read once)."""
        if self._infos is None:
            self._infos = self._read_infos()
        return self._infos

    def _read_infos(self) -> list[common_pb2.GpuInfo]:
        nv = self._nvml
        out = []
        for i in range(self.count):
            info = common_pb2.GpuInfo(index=i)
            name = self._query(i, "name", nv.nvmlDeviceGetName) if nv else None
            uuid = self._query(i, "uuid", nv.nvmlDeviceGetUUID) if nv else None
            memory = self._query(i, "memory", nv.nvmlDeviceGetMemoryInfo) if nv else None
            info.name = name.decode() if isinstance(name, bytes) else (name or "")
            info.uuid = uuid.decode() if isinstance(uuid, bytes) else (uuid or "")
            if memory is not None:
                info.memory_total_bytes = int(memory.total)
            out.append(info)
        return out

    def read(self, index: int) -> Reading:
        nv = self._nvml
        t_ns = time.time_ns()
        power_mw = self._query(index, "power", nv.nvmlDeviceGetPowerUsage)
        temp = self._query(index, "temperature", nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU)
        energy_mj = self._query(index, "the energy counter", nv.nvmlDeviceGetTotalEnergyConsumption)
        return Reading(
            time_unix_ns=t_ns,
            power_w=None if power_mw is None else power_mw / 1000.0,
            temp_c=None if temp is None else float(temp),
            energy_j=None if energy_mj is None else energy_mj / 1000.0,
        )


class Sampler:
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
            reading = self.gpus.read(i)
            kept = self.readings[i]
            if kept and kept[-1].time_unix_ns == reading.time_unix_ns:
                continue  # a reader that returns its latest sample: the same one again
            kept.append(reading)

    def _loop(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            self.sample_once()
            next_t += self.interval_s
            self._stop.wait(max(0.0, next_t - time.monotonic()))


def energy_at(readings: list[Reading], t_ns: int) -> float | None:
    """The energy counter at ``t_ns`` (J), linearly interpolated between the readings around it."""
    points = [(r.time_unix_ns, r.energy_j) for r in readings if r.energy_j is not None]
    if not points or t_ns < points[0][0] - 500_000_000 or t_ns > points[-1][0] + 500_000_000:
        return None
    before = [p for p in points if p[0] <= t_ns]
    after = [p for p in points if p[0] >= t_ns]
    if not before:
        return after[0][1]
    if not after:
        return before[-1][1]
    (t0, e0), (t1, e1) = before[-1], after[0]
    if t1 == t0:
        return e0
    return e0 + (e1 - e0) * (t_ns - t0) / (t1 - t0)
