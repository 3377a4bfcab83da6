"""The sampling loop: GPUs every ``interval_s`` (10 Hz by default, up to 50 Hz), host and acoustics every second.

It runs in its own thread on a drift-free schedule: tick ``n`` is due at ``t0 + n·interval`` on the
monotonic clock, whatever the previous ticks cost. A tick that is already due when the previous one
ends is skipped and counted (``missed_ticks``), so the schedule never slips. Samples carry the
agent's wall clock (``time.time_ns()``), taken just before each GPU is read.

PCIe throughput is read once per ``pcie_interval_s`` per GPU (on real GPUs each of the two reads
measures for ~20 ms), spread over the ticks so that at most ``ceil(GPUs / ticks per interval)`` GPUs
pay it on one tick; it is added to that GPU's sample of that tick.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any

from gpuprobe.agent.batcher import Batcher
from gpuprobe.agent.metrics import Counters
from gpuprobe.agent.sensors.acoustic import Microphone
from gpuprobe.agent.sensors.gpu import GpuSensor
from gpuprobe.agent.sensors.host import HostSensor
from gpuprobe.agent.sensors.proxy import AcousticProxy
from gpuprobe.agent.settings import MAX_INTERVAL_S, MIN_INTERVAL_S
from gpuprobe.v1 import telemetry_pb2

log = logging.getLogger(__name__)

SLOW_INTERVAL_S = 1.0  # host and acoustics


class Sampler:
    def __init__(
        self,
        batcher: Batcher,
        counters: Counters,
        interval_s: float,
        gpus: GpuSensor | None,
        host: HostSensor | None,
        proxy: AcousticProxy | None,
        mic: Microphone | None,
        pcie_interval_s: float = 1.0,
    ) -> None:
        if not MIN_INTERVAL_S <= interval_s <= MAX_INTERVAL_S:
            raise ValueError(
                f"the sampling interval must be between {MIN_INTERVAL_S} s (50 Hz) and {MAX_INTERVAL_S} s,"
                f" not {interval_s} s"
            )
        self.interval_s = interval_s
        self._batcher = batcher
        self._counters = counters
        self._gpus = gpus
        self._host = host
        self._proxy = proxy
        self._mic = mic
        self._pcie_every = max(1, round(pcie_interval_s / interval_s)) if pcie_interval_s > 0 else 1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuprobe-sampler", daemon=True)
        self.heartbeat_mono = time.monotonic()  # end of the last tick, for the watchdog
        self.ticks = 0
        self._last_read_errors = 0
        self._taken = 0  # samples taken since the counters were last updated (once per second)
        # the last tick's GPU samples (replaced, never changed, so other threads may read it: the
        # embedded control plane reads power, temperature and energy from it, gpuprobe.agent.fleet)
        self.latest: list[dict[str, Any]] = []

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        interval = self.interval_s
        t0 = time.monotonic()
        n = 0
        next_slow = t0
        try:
            while True:
                delay = t0 + n * interval - time.monotonic()
                if delay > 0:
                    # a plain sleep is the cheapest wait; long ones wait on the event to stop promptly
                    if delay < 1.0:
                        time.sleep(delay)
                    elif self._stop.wait(delay):
                        break
                if self._stop.is_set():
                    break
                latest = self._tick(n)
                now = time.monotonic()
                if now >= next_slow:
                    self._slow(latest)
                    next_slow += SLOW_INTERVAL_S * (1 + math.floor((now - next_slow) / SLOW_INTERVAL_S))
                self.ticks += 1
                now = time.monotonic()
                self.heartbeat_mono = now
                # the next tick runs, late, if it is less than half an interval overdue; else it is skipped
                following = n + 1
                first_runnable = math.ceil((now - t0) / interval - 0.5)
                if first_runnable > following:
                    self._counters.add(missed_ticks=first_runnable - following)
                    following = first_runnable
                n = following
        except Exception:
            log.exception("the sampling loop failed; the agent stops sampling")
            raise
        finally:
            self._publish()

    def _publish(self) -> None:
        """Hand the thread's own tallies to the shared counters (once per second: cheaper than per tick)."""
        errors = self._gpus.read_errors if self._gpus is not None else 0
        self._counters.add(samples_taken=self._taken, read_errors=errors - self._last_read_errors)
        self._taken = 0
        self._last_read_errors = errors

    def _tick(self, n: int) -> list[dict[str, Any]]:
        gpus = self._gpus
        if gpus is None:
            return []
        samples = gpus.read_all(self._pcie_every, n % self._pcie_every)
        self._batcher.add_gpu(samples)
        self._taken += len(samples)
        self.latest = samples
        return samples

    def _slow(self, latest: list[dict[str, Any]]) -> None:
        t_ns = time.time_ns()
        taken = 0
        if self._host is not None:
            try:
                self._batcher.add_node(self._host.read(t_ns))
                taken += 1
            except Exception as e:  # psutil errors must not stop GPU sampling
                self._counters.add(read_errors=1)
                log.warning("reading the host failed: %s", e)
        acoustic: list[telemetry_pb2.AcousticSample] = []
        if self._proxy is not None:
            acoustic.extend(self._proxy.estimate(latest, t_ns))
        if self._mic is not None:
            for w in self._mic.drain():
                acoustic.append(
                    telemetry_pb2.AcousticSample(
                        time_unix_ns=w.time_unix_ns,
                        source=telemetry_pb2.ACOUSTIC_SOURCE_MIC,
                        laeq_db=w.laeq_db,
                        laf_db=w.laf_db,
                    )
                )
        self._batcher.add_acoustic(acoustic)
        self._taken += taken + len(acoustic)
        self._publish()
