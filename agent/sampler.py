"""The sampling loop: GPUs every ``interval_s`` (10 Hz by default, up to 50 Hz), host and acoustics every second.

It runs in its own thread on a drift-free schedule: tick ``n`` is due at ``t0 + n·interval`` on the
monotonic clock, whatever the previous ticks cost. A tick that is already due when the previous one
ends is skipped and counted (``missed_ticks``), so the schedule never slips. Samples carry the
agent's wall clock (``time.time_ns()``), taken just before each GPU is read.

PCIe throughput is read once per ``pcie_interval_s`` per GPU (on real GPUs each of the two reads
measures for ~20 ms), spread over the ticks so that at most ``ceil(GPUs / ticks per interval)`` GPUs
pay it on one tick; it is added to that GPU's sample of that tick.

The health reads (``health_interval_s``, 1 s by default; 0: none) are all made on one tick per interval,
every GPU in turn right after the hot path (the ticks ``n`` with ``n % k == 0``, ``k`` ticks per health
interval). Made together, their code and NVML's stay in the CPU's caches: half the CPU of one GPU per
tick. That tick runs longer (a few ms on real GPUs), after its samples were stamped and read, so no
sample's time moves. They add the health counters, GPM and NVLink totals to that tick's sample, make the
GPU's NVLink, MIG and process samples (a link's point when its error counters moved, else once a minute;
the GPU's NVLink throughput totals are in every health sample), feed the health tracker
(:mod:`gpuprobe.agent.health`) and put its verdict into the sample (``health``, ``health_reason``).
The other ticks stay the plain hot path.

GPU events reach :meth:`Sampler.gpu_event` from the events thread
(:mod:`gpuprobe.agent.sensors.events`) and from the GPU sensor's lost / recovered hook: each goes into
the open batch once and to the health tracker at once. :attr:`Sampler.health` is the tracker's
``dict[int, tuple[int, str]]`` (GPU index -> ``GpuHealth`` value, reason), replaced, never changed.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from gpuprobe.agent.batcher import Batcher
from gpuprobe.agent.health import HealthTracker, Verdict
from gpuprobe.agent.metrics import Counters
from gpuprobe.agent.sensors.acoustic import Microphone
from gpuprobe.agent.sensors.events import lost_event
from gpuprobe.agent.sensors.host import HostSensor
from gpuprobe.agent.sensors.processes import ProcessTracker
from gpuprobe.agent.sensors.proxy import AcousticProxy
from gpuprobe.agent.settings import MAX_INTERVAL_S, MIN_INTERVAL_S
from gpuprobe.nvml.sensor import GpuSensor
from gpuprobe.v1 import telemetry_pb2

log = logging.getLogger(__name__)

SLOW_INTERVAL_S = 1.0  # host and acoustics
NVLINK_LINK_INTERVAL_S = 60.0  # a link's point when its error counters did not move
NVLINK_LINK_INTERVAL_NS = int(NVLINK_LINK_INTERVAL_S * 1e9)
PCIE_FIELD = "pcie_tx_bytes_per_s"  # in the samples of the ticks that read PCIe (--pcie-interval)


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
        health_interval_s: float = 1.0,
        processes: ProcessTracker | None = None,
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
        # ticks per health interval (0: no health reads)
        self._health_every = max(1, round(health_interval_s / interval_s)) if health_interval_s > 0 else 0
        self._processes = processes if processes is not None else ProcessTracker()
        self._nvlink_sent: dict[tuple[int, int], tuple[int, tuple[int | None, ...]]] = {}  # (GPU, link) -> time, errors
        self.health_tracker = HealthTracker([i.index for i in gpus.infos] if gpus is not None else [])
        self._stop = threading.Event()
        #: Why the sampling loop ended by itself (an unexpected exception); None while it runs.
        self.failure: BaseException | None = None
        #: Called in the sampler's thread with :attr:`failure` when the loop dies of it: the agent
        #: exits rather than stream on with no samples.
        self.on_failure: Callable[[BaseException], None] | None = None
        self._thread = threading.Thread(target=self._run, name="gpuprobe-sampler", daemon=True)
        self.heartbeat_mono = time.monotonic()  # end of the last tick, for the watchdog
        self.ticks = 0
        self._last_read_errors = 0
        self._taken = 0  # samples taken since the counters were last updated (once per second)
        # the last tick's GPU samples (replaced, never changed, so other threads may read it: the
        # embedded control plane reads power, temperature and energy from it, gpuprobe.agent.fleet)
        self.latest: list[dict[str, Any]] = []
        #: GPU index -> its last samples that carried PCIe and health fields (read less often than the
        #: others), for the Prometheus page (gpuprobe.agent.prometheus); kept only after
        #: :meth:`keep_slow_fields`. Entries are replaced, never changed (other threads read them).
        self.latest_slow: dict[int, tuple[dict[str, Any], ...]] = {}
        self._keep_slow = False
        #: The last second's acoustic samples (proxy estimates per GPU, microphone windows); replaced.
        self.latest_acoustic: list[telemetry_pb2.AcousticSample] = []
        self._last_pcie: dict[int, dict[str, Any]] = {}
        self._last_health: dict[int, dict[str, Any]] = {}

    @property
    def health(self) -> dict[int, Verdict]:
        """GPU index -> (``GpuHealth`` value, reason); a new dict whenever a verdict changes."""
        return self.health_tracker.health

    def gpu_event(self, event: telemetry_pb2.GpuEvent) -> None:
        """One GPU event (any thread): into the open batch once, and to the health tracker at once."""
        self._batcher.add_gpu_events([event])
        self._counters.add(samples_taken=1)
        self.health_tracker.event(event)

    def keep_slow_fields(self) -> None:
        """Keep :attr:`latest_slow` (a look-up per GPU on each tick; off unless the page is served)."""
        self._keep_slow = True

    def _lost(self, index: int, lost: bool, reason: str) -> None:
        self.gpu_event(lost_event(index, lost, reason=reason))

    def start(self) -> None:
        if self._gpus is not None:
            self._gpus.set_lost_hook(self._lost)
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
        except Exception as e:
            log.exception("the sampling loop failed; the agent stops sampling")
            self.failure = e
            self._publish()
            if self.on_failure is not None:
                self.on_failure(e)
        else:
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
        every = self._health_every
        health_tick = bool(every and n % every == 0)
        if health_tick:
            for sample in samples:
                self._health(gpus, sample)
        if self._keep_slow:
            self._remember_slow(samples, health_tick)
        self._batcher.add_gpu(samples)
        self._taken += len(samples)
        self.latest = samples
        return samples

    def _remember_slow(self, samples: list[dict[str, Any]], health_tick: bool) -> None:
        for sample in samples:
            pcie = PCIE_FIELD in sample
            if not (pcie or health_tick):
                continue
            index = sample["gpu_index"]
            if pcie:
                self._last_pcie[index] = sample
            if health_tick:
                self._last_health[index] = sample
            self.latest_slow[index] = tuple(
                s for s in (self._last_pcie.get(index), self._last_health.get(index)) if s is not None
            )

    def _health(self, gpus: GpuSensor, sample: dict[str, Any]) -> None:
        """The health interval's reads of one GPU, into its sample of this tick and the batch."""
        index = sample["gpu_index"]
        extras = gpus.read_health(index, sample)
        if extras is None:
            return  # lost during the reads: the sample goes out as it was read
        t_ns = sample["time_unix_ns"]
        nvlinks = [
            telemetry_pb2.NvLinkSample(**r.values)
            for r in extras.nvlinks
            if self._nvlink_due(index, r.link, r.errors, t_ns)
        ]
        migs = [telemetry_pb2.MigSample(**r.values) for r in extras.migs]
        procs = gpus.read_processes(index)
        utilization = gpus.read_process_utilization(index) if procs else {}
        points = self._processes.update(index, t_ns, procs, utilization, sample.get("energy_j"))
        self._batcher.add_nvlink(nvlinks)
        self._batcher.add_mig(migs)
        self._batcher.add_processes(points)
        self._taken += len(nvlinks) + len(migs) + len(points)
        # CRC flit, CRC data and replay errors of the active links: what the health rule watches
        health, reason = self.health_tracker.observe(index, sample, extras.nvlink_errors)
        sample["health"] = health
        sample["health_reason"] = reason

    def _nvlink_due(self, index: int, link: int, errors: tuple[int | None, ...], t_ns: int) -> bool:
        """Whether one link's point goes out: at once when its error counters moved, else once per
        ``NVLINK_LINK_INTERVAL_S``. An SXM H100 has 18 links: a point per link per second would be more
        than twice the GPU's own points, for counters that almost never move (the GPU's totals of the
        throughput travel in its ``gpu`` points every health interval)."""
        last = self._nvlink_sent.get((index, link))
        # the sensor hands the same tuple while a link's counters stand still: `is` settles most calls
        if last is not None and (last[1] is errors or last[1] == errors) and t_ns - last[0] < NVLINK_LINK_INTERVAL_NS:
            return False
        self._nvlink_sent[(index, link)] = (t_ns, errors)
        return True

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
        self.latest_acoustic = acoustic
        self._taken += taken + len(acoustic)
        self._publish()
