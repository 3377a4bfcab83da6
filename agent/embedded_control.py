"""Part: agent. The fleet control plane inside the agent: ``gpuprobe agent --broker URL`` (docs/agent.md, "Fleet
probes").

With ``--broker`` the agent runs :class:`gpuprobe.control.agent_side.ControlClient` in its own event
loop: presence (with the uplink's state), signed probe commands, the trainers, progress and results
over MQTT, while the trainers report to the agent's trainer socket, so their ``trainer`` and
``probe`` points travel the same way as every sample. One process, one identity (host, cluster,
cloud, instance type, region: the agent's own) and one NVML reader:

:class:`AgentGpus` gives the control plane what it reads of the GPUs (power, temperature, the energy
counter) from the samples the agent's sampling loop takes anyway, instead of opening NVML a second
time. The GPU sensor itself is used by the sampling thread only (its read buffers are not shared),
so the adapter reads :attr:`Sampler.recent` (the last two drains' ticks), which that thread replaces
(never changes) once a second. A probe's result is then computed from the very readings that are
stored in InfluxDB, every tick at the agent's ``--interval``. The GPUs' health is the sampler's own
verdict, :attr:`Sampler.health` (``{index: (GpuHealth, reason)}``, likewise replaced, never changed,
at once on an NVML event such as XID 79): the control plane republishes the presence when it changes
and refuses probes on failed GPUs.

This module imports the control plane (MQTT, cryptography) when it is imported: the agent imports
it only with ``--broker``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from gpuprobe.agent.sampler import Sampler
from gpuprobe.control.agent_side import ControlClient, PresenceStatus
from gpuprobe.control.gpus import GpuHealthMap, Reading
from gpuprobe.control.settings import ControlSettings
from gpuprobe.v1 import common_pb2

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 15.0  # on SIGTERM: cancel a running probe, publish its result and OFFLINE, at most this long


class AgentGpus:
    """The control plane's :class:`~gpuprobe.control.gpus.GpuReader` over the agent's own GPU samples."""

    def __init__(self, infos: Sequence[common_pb2.GpuInfo], sampler: Sampler) -> None:
        self._infos = list(infos)
        self._sampler = sampler

    @property
    def count(self) -> int:
        return len(self._infos)

    def infos(self) -> list[common_pb2.GpuInfo]:
        return list(self._infos)

    def read(self, index: int) -> Reading:
        for sample in self._sampler.latest:
            if sample["gpu_index"] == index:
                return Reading.from_sample(sample)
        # not sampled on the last tick (lost, or sampling has not started): nothing known
        return Reading.unknown()

    def read_since(self, index: int, after_ns: int) -> list[Reading]:
        ticks = self._sampler.recent
        found = [
            Reading.from_sample(s)
            for samples in ticks
            for s in samples
            if s["gpu_index"] == index and s["time_unix_ns"] > after_ns
        ]
        if not found and ticks and all(s["gpu_index"] != index for s in ticks[-1]):
            return [Reading.unknown()]  # not on the newest tick (lost): nothing known, as read() says
        return found

    def health(self) -> GpuHealthMap:
        """The sampler's verdicts, the very object it holds (it replaces it on a change); empty while unknown."""
        health = getattr(self._sampler, "health", None)
        return health if isinstance(health, dict) else _UNKNOWN


_UNKNOWN: GpuHealthMap = {}  # one object, so that pollers see no change


class EmbeddedControl:
    """The control plane's task in the agent's event loop."""

    def __init__(
        self,
        settings: ControlSettings,
        gpus: AgentGpus,
        status: PresenceStatus,
    ) -> None:
        # raises OSError when the control directory cannot be made
        self.client = ControlClient(settings, gpus=gpus, status=status)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="gpuprobe-control")

    async def _run(self) -> None:
        try:
            await self.client.run()
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug in the control plane must not take telemetry down with it
            log.exception("the control plane failed; telemetry goes on without it (restart the agent)")

    async def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """``request_stop`` (a running probe is cancelled and its result published, then OFFLINE) and wait."""
        task = self._task
        if task is None:
            return
        self.client.request_stop()
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout_s)
        except TimeoutError:
            log.warning("the control plane did not stop within %.0f s; leaving the broker without OFFLINE", timeout_s)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
