"""Part: agent. The sampling: GPUs every ``interval_s`` (10 Hz by default, up to 50 Hz), host and acoustics every
second.

The per-tick GPU reads are the native sampler's (:mod:`gpuprobe.nvml.native`, a C thread started through
:meth:`GpuSensor.start_sampling`): tick ``n`` is due at ``t0 + n·interval`` on the monotonic clock,
whatever the previous ticks cost, and a tick that is more than half an interval overdue when the previous
one ends is skipped and counted (``missed_ticks``), so the schedule never slips. Samples carry the agent's
wall clock, taken just before each GPU is read. Its ticks wait in a bounded ring (:data:`RING_S` of them);
when this thread falls that far behind, the oldest are overwritten and counted as dropped samples
(``AgentStats.dropped_samples``, the ``samples_overwritten`` counter), never silently.

This thread wakes once per second (:data:`SLOW_INTERVAL_S`), half an interval after a tick, drains the ring
(:meth:`GpuSensor.drain` gives the samples, the errors translated once), makes the health reads and
hands everything to the batcher, then reads the host and acoustics.

PCIe throughput is read once per ``pcie_interval_s`` per GPU (on real GPUs each of the two reads
measures for ~20 ms), spread over the ticks so that at most ``ceil(GPUs / ticks per interval)`` GPUs
pay it on one tick; it is added to that GPU's sample of that tick.

The health reads (``health_interval_s``, 1 s by default; 0: none) are made for one tick per interval (the
ticks ``n`` with ``n % k == 0``, ``k`` ticks per health interval), every GPU in turn, when that tick is
drained: they are read then, in this thread, and added to that tick's sample (the health counters, GPM and
NVLink totals); they make the GPU's NVLink, MIG and process samples (a link's point when its error
counters moved, else once a minute; the GPU's NVLink throughput totals are in every health sample), feed
the health tracker (:mod:`gpuprobe.agent.health`) and put its verdict into the sample (``health``,
``health_reason``). The other ticks' samples are the per-tick reads alone.

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
from gpuprobe.nvml import REALTIME_PRIORITY
from gpuprobe.nvml.native import NativeSampler
from gpuprobe.nvml.sensor import GpuSensor
from gpuprobe.v1 import telemetry_pb2

log = logging.getLogger(__name__)

SLOW_INTERVAL_S = 1.0  # host and acoustics
NVLINK_LINK_INTERVAL_S = 60.0  # a link's point when its error counters did not move
NVLINK_LINK_INTERVAL_NS = int(NVLINK_LINK_INTERVAL_S * 1e9)
RING_S = 5.0  # the native sampler's ring holds this many seconds of ticks
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
        native: NativeSampler | None = None,
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
        self._native = native  # the C thread that reads the GPUs on their ticks (needed with GPUs)
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
        self.heartbeat_mono = time.monotonic()  # the last drain that found new ticks, for the watchdog
        self.ticks = 0
        self._last_read_errors = 0
        self._last_missed = 0
        self._last_overwritten = 0
        self._realtime_said: bool | None = None
        self._taken = 0  # samples taken since the counters were last updated (once per second)
        # the newest tick's GPU samples, at most a second old (replaced, never changed, so other threads may
        # read it: the embedded control plane, gpuprobe.agent.embedded_control, reads power, temperature and energy)
        self.latest: list[dict[str, Any]] = []
        # the GPU samples of the last two drains' ticks, oldest first (replaced, never changed): every tick
        # of a probe's window for the embedded control plane, which polls more often than the drains come
        self.recent: tuple[list[dict[str, Any]], ...] = ()
        self._last_drain: tuple[list[dict[str, Any]], ...] = ()
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
        interval_ns = round(self.interval_s * 1e9)
        per_drain = max(1, round(SLOW_INTERVAL_S / self.interval_s))  # ticks between two drains
        t0_ns = time.monotonic_ns()
        gpus = self._gpus
        try:
            if gpus is not None:
                if self._native is None:
                    raise RuntimeError("GPUs to sample but no native sampler")
                ring_ticks = max(8, math.ceil(RING_S / self.interval_s))
                gpus.start_sampling(self._native, self.interval_s, self._pcie_every, ring_ticks, t0_ns, realtime=True)
            m = 0  # the drain number: drain m comes half an interval after tick m·per_drain
            while True:
                delay_s = (t0_ns + m * per_drain * interval_ns + interval_ns // 2 - time.monotonic_ns()) / 1e9
                if delay_s > 0:
                    # a plain sleep (at most a second): a timed Event.wait hangs under libfaketime with a faked
                    # monotonic clock (the skewed-node test), and a stop waits at most that second
                    time.sleep(delay_s)
                if self._stop.is_set():
                    break
                ticks = self.ticks
                latest = self._drain()
                self._slow(latest)
                if gpus is None or self.ticks > ticks:
                    # the watchdog's heartbeat: the native sampler made ticks (one stuck in an NVML call
                    # makes none, and the watchdog has systemd restart the agent, as before)
                    self.heartbeat_mono = time.monotonic()
                # a late drain does not catch up: the next one is the next due in the future
                m = max(m + 1, (time.monotonic_ns() - t0_ns) // (per_drain * interval_ns) + 1)
        except Exception as e:
            log.exception("the sampling loop failed; the agent stops sampling")
            self.failure = e
            self._publish()
            if self.on_failure is not None:
                self.on_failure(e)
        else:
            if gpus is not None:
                gpus.stop_sampling()
                self._drain()  # the ticks made since the last drain go out with the last batch
            self._publish()
        finally:
            if gpus is not None:
                gpus.stop_sampling()

    def _publish(self) -> None:
        """Hand the thread's own tallies to the shared counters (once per second)."""
        gpus = self._gpus
        errors = gpus.read_errors if gpus is not None else 0
        missed = gpus.missed_ticks if gpus is not None else 0
        self._counters.add(
            samples_taken=self._taken,
            read_errors=errors - self._last_read_errors,
            missed_ticks=missed - self._last_missed,
        )
        self._taken = 0
        self._last_read_errors = errors
        self._last_missed = missed

    def _drain(self) -> list[dict[str, Any]]:
        """Every tick the native sampler made since the last drain: into the batcher, oldest first; the
        newest tick's samples."""
        gpus = self._gpus
        if gpus is None:
            return []
        ticks = gpus.drain()
        if self._realtime_said is None or self._realtime_said != gpus.realtime:
            self._realtime_said = gpus.realtime
            if gpus.realtime:
                log.info(
                    "the native sampler's thread runs under SCHED_FIFO (priority %d): its ticks wake on time",
                    REALTIME_PRIORITY,
                )
            else:
                log.info(
                    "the native sampler's thread runs at normal priority (SCHED_FIFO %d needs an RLIMIT_RTPRIO that"
                    " high, as the installed unit's LimitRTPRIO= gives, or CAP_SYS_NICE): with every core busy its"
                    " ticks may wake late",
                    REALTIME_PRIORITY,
                )
        overwritten = gpus.overwritten_ticks - self._last_overwritten
        if overwritten:
            self._last_overwritten = gpus.overwritten_ticks
            lost = overwritten * gpus.count  # a tick is a sample per GPU
            self._counters.add(samples_overwritten=lost)
            log.warning(
                "the native sampler's ring overwrote %d ticks (%d samples) before they were read: the agent"
                " fell %.0f s behind (counted as dropped samples)",
                overwritten,
                lost,
                RING_S,
            )
        every = self._health_every
        for n, samples in ticks:
            health_tick = bool(every and n % every == 0)
            if health_tick:
                for sample in samples:
                    self._health(gpus, sample)
            if self._keep_slow:
                self._remember_slow(samples, health_tick)
            self._batcher.add_gpu(samples)
            self._taken += len(samples)
            self.ticks += 1
        if ticks:
            drained = tuple(samples for _, samples in ticks)
            self.recent, self._last_drain = (*self._last_drain, *drained), drained
            self.latest = ticks[-1][1]
        return self.latest

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
