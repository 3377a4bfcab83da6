"""Part: agent. The agent process: wires sensors -> sampler -> batcher -> spool -> uplink, and speaks to systemd.

Threads: the sampler (its own thread, the hot path), the GPU events thread (NVML's event set:
XIDs, ECC; started and stopped with the sampler), the spool (one executor thread, SQLite), an
optional microphone reader and the Prometheus endpoint; everything else (flushing batches, the gRPC
stream, the trainer socket, sd_notify) runs in one asyncio event loop.

Life cycle:

1. open the spool (fails fast if it is unusable), the sensors (no NVML: host and acoustics only),
   start sampling, the uplink, the trainer socket and the metrics endpoint; ``READY=1``;
2. every flush interval (or when a batch is full) the open batch is made durable in the spool and
   the uplink is told; ``WATCHDOG=1`` while the sampling loop keeps ticking; ``STATUS=`` every 10 s;
3. on SIGTERM / SIGINT: ``STOPPING=1``; with ``--broker`` the control plane stops first (a running
   probe is cancelled, its trainers report their end and its result is published, then OFFLINE);
   then stop sampling, spool the last partial batch, keep delivering for up to ``--grace`` seconds,
   half-close the stream; whatever is unacknowledged stays in the spool for the next start.

With ``--broker`` the fleet control plane (:mod:`gpuprobe.agent.embedded_control`) runs as one more task of the
event loop, with the agent's identity, trainer socket, uplink state and GPU samples.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gpuprobe import __version__
from gpuprobe.agent import identity, prometheus
from gpuprobe.agent.batcher import Batcher
from gpuprobe.agent.metrics import Counters, metrics_page, serve_metrics
from gpuprobe.agent.podresources import PodResources
from gpuprobe.agent.prometheus import GpuExporter
from gpuprobe.agent.resolution import ResolutionPolicy
from gpuprobe.agent.sampler import Sampler
from gpuprobe.agent.sensors.acoustic import Microphone
from gpuprobe.agent.sensors.events import EVENT_TYPES, EventThread
from gpuprobe.agent.sensors.host import HostSensor
from gpuprobe.agent.sensors.proxy import AcousticProxy
from gpuprobe.agent.settings import AgentSettings
from gpuprobe.agent.spool import Appended, AsyncSpool, Spool, SpoolError, SpoolState, Unspooled
from gpuprobe.agent.trainer_input import Message, TrainerInput
from gpuprobe.agent.uplink import Uplink
from gpuprobe.nvml.errors import GpuSensorError, NativeSamplerError
from gpuprobe.nvml.native import NativeSampler
from gpuprobe.nvml.sensor import GpuSensor
from gpuprobe.systemd import Notifier, watchdog_interval_s
from gpuprobe.v1 import common_pb2, telemetry_pb2

if TYPE_CHECKING:
    from gpuprobe.agent.embedded_control import EmbeddedControl

log = logging.getLogger("gpuprobe.agent")


#: what :meth:`Agent.run` returns when NVML answered after a start without it: the caller runs the agent
#: again (``agent/cli.py`` re-executes it), which opens the GPUs
RESTART = 75


def void(_value: object) -> None:
    """Discards a value (a callback's result nobody needs)."""


async def _cancel(tasks: Sequence[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


STATUS_EVERY_S = 10.0  # and whenever the stream to a collector opens or ends


class Agent:
    def __init__(self, settings: AgentSettings) -> None:
        self.settings = settings
        self.counters = Counters()
        self.notifier = Notifier()
        self._flush_now: asyncio.Event | None = None
        self._last_drop_log = 0.0
        self._unspooled = Unspooled(settings.spool_memory_max_bytes)
        # one flush at a time: the stop's last flush waits for the flusher's, which is never cut off
        # mid-append (the spool would have the batch while it is still held here: spooled twice)
        self._flush_lock = asyncio.Lock()
        self._spool_failing_since: float | None = None
        self._last_spool_error_log = 0.0
        self.events: EventThread | None = None
        self.pod_resources: PodResources | None = None
        # a high-resolution window opened: the recorder's batches since then still have to be promoted
        self._promote_since_ns: int | None = None

    def run(self) -> int:
        return asyncio.run(self._main())

    # ------------------------------------------------------------------ start

    async def _main(self) -> int:
        # every part started is stopped on every path (an early exit, an error), in reverse order
        async with contextlib.AsyncExitStack() as parts:
            return await self._serve(parts)

    async def _serve(self, parts: contextlib.AsyncExitStack) -> int:
        s = self.settings
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        parts.callback(self.notifier.close)
        try:
            recorder_s = s.flight_recorder_s if s.resolution == "auto" else 0.0
            spool = Spool(s.spool_dir, s.spool_max_bytes, s.spool_max_age_s, recorder_s)
        except SpoolError as e:
            log.error("%s", e)
            return 1
        self.spool = AsyncSpool(spool)
        parts.push_async_callback(self.spool.close)
        self._report_spool(spool.state())
        gpus = self._open_gpus()
        if gpus is not None:
            parts.callback(gpus.close)
        native: NativeSampler | None = None
        if gpus is not None:
            try:
                native = NativeSampler.load()
            except NativeSamplerError as e:  # no silent slower mode: the GPUs are read by it or not at all
                log.error("%s", e)
                return 2
        mic = self._start_microphone()
        if mic is not None:
            parts.callback(mic.stop)
        sampler = self._build_pipeline(gpus, mic, native)
        control: EmbeddedControl | None = None
        if s.control is not None:
            from gpuprobe.agent.embedded_control import AgentGpus, EmbeddedControl

            try:
                control = EmbeddedControl(
                    dataclasses.replace(s.control, identity=self.identity),
                    AgentGpus(self.infos, sampler),
                    self._control_status,
                )
            except OSError as e:
                log.error("control directory %s: %s", s.control.state_dir, e.strerror or e)
                return 1
        trainer = await self._start_trainer_input()
        if trainer is not None:
            parts.push_async_callback(trainer.stop)
        exporter = self._gpu_exporter(sampler)
        if self.pod_resources is not None:
            self.pod_resources.start()
            parts.callback(self.pod_resources.stop)
        self._serve_metrics(parts, exporter)

        sampler_died = asyncio.Event()
        sampler.on_failure = lambda _error: void(loop.call_soon_threadsafe(sampler_died.set))
        sampler.start()
        parts.callback(sampler.stop)
        events = self._start_events(gpus, sampler, exporter)
        if events is not None:
            parts.callback(events.join, 2.0)
            parts.callback(events.stop)
        self.uplink.start()
        parts.push_async_callback(self.uplink.stop)
        tasks = [
            asyncio.create_task(self._flusher(), name="gpuprobe-flusher"),
            asyncio.create_task(self._watchdog(sampler), name="gpuprobe-watchdog"),
            asyncio.create_task(self._status(), name="gpuprobe-status"),
        ]
        parts.push_async_callback(_cancel, tasks)
        if control is not None:
            control.start()
            parts.push_async_callback(control.stop)
        hz = 1 / s.interval_s
        log.info(
            "agent %s (gpuprobe %s): %d GPUs at %g Hz, host and acoustics at 1 Hz; collector %s; spool %s%s",
            self.identity.agent_id,
            __version__,
            len(self.infos),
            hz,
            ",".join(s.uplink.targets),
            s.spool_dir,
            f"; fleet probes over {s.control.broker.url}" if s.control is not None else "",
        )
        self.notifier.ready(status=f"sampling {len(self.infos)} GPUs at {hz:g} Hz")

        waits: list[asyncio.Task[Any]] = [asyncio.create_task(stop.wait()), asyncio.create_task(sampler_died.wait())]
        nvml_back = None
        if gpus is None and s.nvml_retry_s > 0:
            nvml_back = asyncio.create_task(self._nvml_answers(s.nvml_retry_s), name="gpuprobe-nvml-retry")
            waits.append(nvml_back)
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        restart = nvml_back is not None and nvml_back.done() and not stop.is_set()
        await _cancel(waits)
        code = RESTART if restart and sampler.failure is None else 0
        if sampler.failure is not None:
            # streaming on without samples would look healthy to the collector; under systemd the
            # watchdog would end it too, only later (Restart=on-failure starts it again either way)
            failure = sampler.failure
            log.critical(
                "the sampling thread died (%s: %s): stopping, exit status 1; what was sampled is"
                " spooled and delivered first",
                type(failure).__name__,
                failure,
            )
            code = 1
        await self._stop(sampler, mic, trainer, control, tasks)
        return code

    # ------------------------------------------------------------------ the parts

    def _report_spool(self, state: SpoolState) -> None:
        if state.batches:
            log.info(
                "spool %s holds %d batches (%d samples, seq %d-%d) from a previous run: they are sent first",
                self.settings.spool_dir,
                state.batches,
                state.samples,
                state.oldest_seq,
                state.newest_seq,
            )
        self.counters.set(
            spool_bytes=state.bytes,
            spool_batches=state.batches,
            recorder_batches=state.recorded_batches,
            recorder_samples=state.recorded_samples,
            recorder_bytes=state.recorded_bytes,
        )

    def _open_gpus(self) -> GpuSensor | None:
        """NVML's GPUs (None: the host and acoustics only), and the identity that they complete."""
        s = self.settings
        gpus: GpuSensor | None
        try:
            gpus = GpuSensor.open()
        except GpuSensorError as e:
            log.error("%s: sampling the host and acoustics only", e)
            gpus = None
        self.gpus = gpus
        self.infos = gpus.infos if gpus is not None else []
        ident = common_pb2.AgentIdentity()
        ident.CopyFrom(s.identity)
        ident.virtualization = (
            s.virt_override
            if s.virt_override is not None
            else identity.virtualization(gpus.virtualization if gpus else None, identity.hypervisor_present())
        )
        self.identity = ident
        return gpus

    async def _nvml_answers(self, every_s: float) -> None:
        """Returns once NVML answers (a driver loaded after the agent started, at boot): tried every
        ``every_s`` in a thread, the sensor closed again (the agent starts again to sample the GPUs)."""
        while True:
            await asyncio.sleep(every_s)
            try:
                found = await asyncio.to_thread(GpuSensor.open)
            except Exception:  # GpuSensorError, or NVML half there (a driver loading): the next try tells
                continue
            count = len(found.infos)
            found.close()
            log.warning("NVML answers now (%d GPUs): the agent starts again to sample them", count)
            return

    def _start_microphone(self) -> Microphone | None:
        s = self.settings
        if not s.mic_device:
            log.info("no microphone configured (--mic-device): acoustic values come from the proxy only")
            return None
        mic = Microphone(s.mic_device, s.mic_calibration_db, s.mic_samplerate_hz)
        return mic if mic.start() else None

    def _build_pipeline(self, gpus: GpuSensor | None, mic: Microphone | None, native: NativeSampler | None) -> Sampler:
        """sensors -> sampler -> batcher, and the uplink that reads the spool."""
        s = self.settings
        loop = asyncio.get_running_loop()
        self._flush_now = asyncio.Event()
        flush_now = self._flush_now
        if s.pod_resources_socket is not None:
            self.pod_resources = PodResources(s.pod_resources_socket, s.pod_resources_interval_s)
        self.batcher = Batcher(
            self.identity.agent_id,
            self._current_infos,
            self.counters,
            s.batch_max_samples,
            on_full=lambda: void(loop.call_soon_threadsafe(flush_now.set)),
            policy=ResolutionPolicy(s.resolution, s.aggregate_interval_s, s.hires_after_s, s.flight_recorder_s),
            pods=self.pod_resources.assignments if self.pod_resources is not None else None,
        )
        self.uplink = Uplink(s.uplink, self.spool, self._hello, self.counters)
        return Sampler(
            self.batcher,
            self.counters,
            s.interval_s,
            gpus,
            HostSensor(s.hwmon_dir),
            AcousticProxy(s.proxy, self.infos),
            mic,
            s.pcie_interval_s,
            s.health_interval_s,
            native=native,
        )

    def _start_events(
        self, gpus: GpuSensor | None, sampler: Sampler, exporter: GpuExporter | None
    ) -> EventThread | None:
        """NVML's GPU events (XID, ECC, clocks, power source) in their own thread, into the sampler."""
        if gpus is None or not self.settings.health_interval_s:
            return None
        source = gpus.open_events(EVENT_TYPES)
        if source is None:
            return None
        sink = sampler.gpu_event
        if exporter is not None:
            gpu_event, tally = sampler.gpu_event, exporter.event

            def sink(event: telemetry_pb2.GpuEvent) -> None:
                gpu_event(event)
                tally(event)

        events = EventThread(source, sink)
        events.start()
        self.events = events
        return events

    async def _start_trainer_input(self) -> TrainerInput | None:
        path = self.settings.trainer_socket
        if path is None:
            return None
        trainer = TrainerInput(path, self._trainer_message, lambda: self.counters.add(trainer_errors=1))
        try:
            await trainer.start()
        except OSError as e:
            log.error("trainer socket %s: %s; trainer progress is not collected", path, e)
            return None
        return trainer

    def _serve_metrics(self, parts: contextlib.AsyncExitStack, exporter: GpuExporter | None) -> None:
        """The counters' endpoint (--metrics-listen) and the GPUs' (--prometheus-listen): one server when
        both name the same address."""
        s = self.settings
        listen = s.metrics_listen
        shared = exporter is not None and s.prometheus_listen == listen
        if listen is not None and not shared:
            try:
                server = serve_metrics(self.counters, *listen)
            except OSError as e:
                log.error("metrics endpoint %s:%d: %s; continuing without it", *listen, e)
            else:
                parts.callback(server.shutdown)
        gpu_listen = s.prometheus_listen
        if exporter is None or gpu_listen is None:
            return
        pages = [exporter.render, metrics_page(self.counters)] if shared else [exporter.render]
        try:
            gpu_server = prometheus.serve(*gpu_listen, pages)
        except OSError as e:
            log.error("GPU metrics endpoint %s:%d: %s; continuing without it", *gpu_listen, e)
            return
        parts.callback(gpu_server.server_close)
        parts.callback(gpu_server.shutdown)
        host, port = gpu_server.server_address[:2]
        if shared:
            log.info("Prometheus metrics on http://%s:%d/metrics", host, port)
        log.info("GPU metrics under dcgm-exporter's names on http://%s:%d/metrics", host, port)

    def _gpu_exporter(self, sampler: Sampler) -> GpuExporter | None:
        s = self.settings
        if s.prometheus_listen is None:
            return None
        sampler.keep_slow_fields()
        pods = self.pod_resources.assignments if self.pod_resources is not None else None
        return GpuExporter(sampler, self._current_infos, self.identity.host, pods)

    # ------------------------------------------------------------------ stop

    async def _stop(
        self,
        sampler: Sampler,
        mic: Microphone | None,
        trainer: TrainerInput | None,
        control: EmbeddedControl | None,
        tasks: list[asyncio.Task[None]],
    ) -> None:
        """SIGTERM: the parts in the order that loses nothing; the exit stack then closes the rest."""
        s = self.settings
        loop = asyncio.get_running_loop()
        stop_started = loop.time()
        self.notifier.stopping()
        if control is not None:
            # first, while sampling and the trainer socket still run: a running probe is cancelled,
            # its trainers report their end, its result is published; then OFFLINE
            await control.stop()
        log.info("stopping: sampling ends; delivering spooled batches for up to %g s", s.grace_s)
        sampler.stop()
        events = self.events
        if events is not None:
            events.stop()  # its last events go into the last batch
            await loop.run_in_executor(None, events.join, 2.0)
        await loop.run_in_executor(None, sampler.join, 5.0)
        if mic is not None:
            mic.stop()
        if trainer is not None:
            await trainer.stop()
        await _cancel(tasks)
        await self._flush(final=True)
        if self._unspooled:
            held = self._unspooled
            log.error(
                "could not spool %d batches (%d samples) held in memory before stopping (the spool still"
                " takes none): they are lost, and counted as dropped",
                len(held),
                held.samples,
            )
            self.counters.add(samples_dropped=held.samples, batches_dropped=len(held))
        remaining = max(0.0, s.grace_s - (loop.time() - stop_started))
        delivered = await self.uplink.drain(remaining)
        await self.uplink.stop(timeout_s=2.0)
        final = await self.spool.state()
        totals = self.counters.snapshot()
        log.info(
            "stopped: %d samples taken, %d spooled, %d acknowledged, %d dropped by the spool cap; %s",
            totals.samples_taken,
            totals.samples_spooled,
            totals.samples_acked,
            totals.samples_dropped,
            "everything was delivered"
            if delivered
            else f"{final.batches} batches ({final.samples} samples) stay in the spool for the next start",
        )

    # ------------------------------------------------------------------ helpers

    def _control_status(self) -> dict[str, Any]:
        """The uplink and spool fields of the control plane's presence message."""
        return {
            "uplink_connected": self.uplink.connected_to is not None,
            "spool_bytes": self.counters.snapshot().spool_bytes,
            "last_ack_unix_ns": self.uplink.last_ack_unix_ns,
            "clock_offset_s": self.uplink.clock_offset_s,
        }

    def _current_infos(self) -> list[common_pb2.GpuInfo]:
        """Every known GPU's static facts as last read (a GPU lost at start joins when it answers)."""
        return self.gpus.infos if self.gpus is not None else []

    def _hello(self, state: SpoolState) -> telemetry_pb2.Hello:
        return telemetry_pb2.Hello(
            identity=self.identity,
            agent_version=__version__,
            sample_interval_s=self.settings.interval_s,
            gpus=self._current_infos(),
            spool_id=state.spool_id,
            oldest_unacked_seq=state.oldest_seq,
            newest_unacked_seq=state.newest_seq,
            time_unix_ns=time.time_ns(),
        )

    def _trainer_message(self, message: Message) -> None:
        if isinstance(message, telemetry_pb2.TrainerSample):
            self.batcher.add_trainer(message)
        else:
            self.batcher.add_probe_event(message)
        self.counters.add(trainer_messages=1, samples_taken=1)

    async def _flusher(self) -> None:
        assert self._flush_now is not None
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._flush_now.wait(), self.settings.flush_interval_s)
            self._flush_now.clear()
            # shielded: cancelling the flusher (at stop) must not abandon an append the spool's thread
            # completes anyway; the stop's own flush then waits for this one (the lock)
            await asyncio.shield(self._flush())

    async def _flush(self, final: bool = False) -> None:
        """Moves the open batch into the spool, after any batches that wait in memory for room."""
        async with self._flush_lock:
            await self._flush_locked(final)

    async def _flush_locked(self, final: bool = False) -> None:
        taken = self.batcher.take(final)
        record: tuple[telemetry_pb2.SampleBatch, int] | None = None
        if taken is not None:
            self.counters.set(high_resolution=int(taken.hires))
            if taken.promote_since_ns is not None and self._promote_since_ns is None:
                self._promote_since_ns = taken.promote_since_ns
            if taken.recorded is not None:
                record = (taken.recorded, taken.recorded_samples)
            if taken.batch is not None:
                self._unspooled.append(taken.batch, taken.samples)
                self.counters.add(gpu_aggregates=len(taken.batch.gpu_aggregates))
        if record is not None and not self._unspooled:
            await self._record(*record)
        while self._unspooled:
            batch, samples = self._unspooled.oldest()
            try:
                # the recorder's batch and a promotion ride in the first append's transaction
                appended = await self.spool.append(
                    batch,
                    samples,
                    protect=self.uplink.protected,
                    dropped_elsewhere=self._unspooled.dropped,
                    record=record,
                    promote_since_ns=self._promote_since_ns,
                )
            except Exception as e:  # disk full with nothing left to drop, I/O error: wait in memory
                self._spool_failed(e)  # (the recorder's batch is lost: it is a copy of what was shipped)
                return
            record = None
            self._promote_since_ns = None
            self._unspooled.spooled()
            self._spooled(appended, samples)

    async def _record(self, batch: telemetry_pb2.SampleBatch, samples: int) -> None:
        """The flight recorder's batch alone; a failure loses it (the aggregates of its samples are shipped)."""
        try:
            await self.spool.record(batch, samples)
        except Exception as e:
            log.debug("could not record raw samples in the spool's flight recorder: %s", e)
            return
        self._recorder_state()

    def _recorder_state(self) -> None:
        spool = self.spool.spool
        batches, samples, size = spool.recorded
        self.counters.set(
            recorder_batches=batches,
            recorder_samples=samples,
            recorder_bytes=size,
            recorder_trimmed_samples=spool.recorder_trimmed_samples,
        )

    def _spooled(self, appended: Appended, samples: int) -> None:
        spool = self.spool.spool
        if appended.promoted:
            promoted_samples = sum(p.samples for p in appended.promoted)
            self.counters.add(
                batches_spooled=len(appended.promoted),
                samples_spooled=promoted_samples,
                samples_promoted=promoted_samples,
            )
            log.info(
                "high-resolution window: the flight recorder's %d batches (%d samples, seq %d-%d) are shipped",
                len(appended.promoted),
                promoted_samples,
                appended.promoted[0].seq,
                appended.promoted[-1].seq,
            )
        self._recorder_state()
        self.counters.add(
            batches_spooled=1,
            samples_spooled=samples,
            batches_dropped=appended.dropped_batches,
            samples_dropped=appended.dropped_samples,
        )
        self.counters.set(spool_bytes=spool.bytes, spool_batches=spool.batches)
        if self._spool_failing_since is not None:
            log.warning(
                "the spool %s takes batches again after %.0f s",
                spool.directory,
                time.monotonic() - self._spool_failing_since,
            )
            self._spool_failing_since = None
        if appended.dropped_batches or appended.disk_full:
            now = time.monotonic()
            if now - self._last_drop_log >= 60.0:
                self._last_drop_log = now
                totals = self.counters.snapshot()
                log.warning(
                    "%s: dropped the oldest batches, %d samples so far (reported in AgentStats and the"
                    " samples_dropped counter)",
                    f"the spool's disk is full ({spool.directory}: ENOSPC), so room was made in the spool"
                    if appended.disk_full
                    else f"spool cap reached ({spool.max_bytes} bytes)",
                    totals.samples_dropped,
                )
        self.uplink.notify(appended.stored(), dropped=appended.dropped_batches > 0)

    def _spool_failed(self, error: Exception) -> None:
        """The spool cannot take a batch: keep sampling, hold batches in memory up to the bound."""
        dropped_samples, dropped_batches = self._unspooled.bound()
        if dropped_batches:
            self.counters.add(samples_dropped=dropped_samples, batches_dropped=dropped_batches)
        now = time.monotonic()
        if self._spool_failing_since is None:
            self._spool_failing_since = now
        elif now - self._last_spool_error_log < 60.0:
            return
        self._last_spool_error_log = now
        held = self._unspooled
        log.error(
            "could not spool a batch (%s); holding %d batches (%d samples, %d bytes) in memory, at most %d bytes:"
            " beyond that the oldest are dropped and counted (%d samples so far); sampling goes on",
            error,
            len(held),
            held.samples,
            held.bytes,
            held.max_bytes,
            self.counters.snapshot().samples_dropped,
        )

    async def _watchdog(self, sampler: Sampler) -> None:
        interval = watchdog_interval_s()
        if interval is None:
            return
        stale_after = max(5.0, 3 * sampler.interval_s + 5.0)
        complained = False
        while True:
            await asyncio.sleep(interval)
            age = time.monotonic() - sampler.heartbeat_mono
            if age < stale_after:
                self.notifier.watchdog()
                complained = False
            elif not complained:
                complained = True
                log.error("the sampling loop has not ticked for %.0f s: watchdog pings stop (systemd restarts)", age)

    async def _status(self) -> None:
        hz = 1 / self.settings.interval_s
        while True:
            totals = self.counters.snapshot()
            link = f"streaming to {self.uplink.connected_to}" if self.uplink.connected_to else "not connected"
            self.notifier.status(
                f"{len(self.infos)} GPUs at {hz:g} Hz; {link}; spool {totals.spool_batches} batches"
                f" ({totals.spool_bytes // 1024} KiB); acked seq {totals.acked_seq}"
            )
            changed = self.uplink.state_changed
            changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), STATUS_EVERY_S)
