"""The agent process: wires sensors -> sampler -> batcher -> spool -> uplink, and speaks to systemd.

Threads: the sampler (its own thread, the hot path), the spool (one executor thread, SQLite), an
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

With ``--broker`` the fleet control plane (:mod:`gpuprobe.agent.fleet`) runs as one more task of the
event loop, with the agent's identity, trainer socket, uplink state and GPU samples.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import time
from typing import TYPE_CHECKING, Any

from gpuprobe.agent import identity
from gpuprobe.agent.batcher import Batcher
from gpuprobe.agent.metrics import Counters, serve_metrics
from gpuprobe.agent.sampler import Sampler
from gpuprobe.agent.sensors.acoustic import Microphone
from gpuprobe.agent.sensors.gpu import GpuSensor, GpuSensorError
from gpuprobe.agent.sensors.host import HostSensor
from gpuprobe.agent.sensors.proxy import AcousticProxy
from gpuprobe.agent.settings import AgentSettings
from gpuprobe.agent.spool import AsyncSpool, Spool, SpoolError, SpoolState
from gpuprobe.agent.trainer_input import Message, TrainerInput
from gpuprobe.agent.uplink import Uplink

from gpuprobe import __version__
from gpuprobe.systemd import Notifier, watchdog_interval_s
from gpuprobe.v1 import common_pb2, telemetry_pb2

if TYPE_CHECKING:
    from gpuprobe.agent.fleet import EmbeddedControl

log = logging.getLogger("gpuprobe.agent")


def void(_value: object) -> None:
    """Discards a value (a callback's result nobody needs)."""


STATUS_EVERY_S = 10.0  # and whenever the stream to a collector opens or ends


class Agent:
    def __init__(self, settings: AgentSettings) -> None:
        self.settings = settings
        self.counters = Counters()
        self.notifier = Notifier()
        self._flush_now: asyncio.Event | None = None
        self._last_drop_log = 0.0

    def run(self) -> int:
        return asyncio.run(self._main())

    # ------------------------------------------------------------------ start

    async def _main(self) -> int:
        s = self.settings
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            spool = Spool(s.spool_dir, s.spool_max_bytes, s.spool_max_age_s)
        except SpoolError as e:
            log.error("%s", e)
            return 1
        self.spool = AsyncSpool(spool)
        state = spool.state()
        if state.batches:
            log.info(
                "spool %s holds %d batches (%d samples, seq %d-%d) from a previous run: they are sent first",
                s.spool_dir,
                state.batches,
                state.samples,
                state.oldest_seq,
                state.newest_seq,
            )
        self.counters.set(spool_bytes=state.bytes, spool_batches=state.batches)

        gpus: GpuSensor | None
        try:
            gpus = GpuSensor.open()
        except GpuSensorError as e:
            log.error("%s: sampling the host and acoustics only", e)
            gpus = None
        infos = gpus.infos if gpus is not None else []
        ident = common_pb2.AgentIdentity()
        ident.CopyFrom(s.identity)
        virt = (
            s.virt_override
            if s.virt_override is not None
            else identity.virtualization(gpus.virtualization if gpus else None, identity.hypervisor_present())
        )
        ident.virtualization = virt
        self.identity = ident
        self.infos = infos

        mic: Microphone | None = None
        if s.mic_device:
            mic = Microphone(s.mic_device, s.mic_calibration_db, s.mic_samplerate_hz)
            if not mic.start():
                mic = None
        else:
            log.info("no microphone configured (--mic-device): acoustic values come from the proxy only")

        self._flush_now = asyncio.Event()
        flush_now = self._flush_now
        self.batcher = Batcher(
            ident.agent_id,
            infos,
            self.counters,
            s.batch_max_samples,
            on_full=lambda: void(loop.call_soon_threadsafe(flush_now.set)),
        )
        self.uplink = Uplink(s.uplink, self.spool, self._hello, self.counters)
        sampler = Sampler(
            self.batcher,
            self.counters,
            s.interval_s,
            gpus,
            HostSensor(s.hwmon_dir),
            AcousticProxy(s.proxy, infos),
            mic,
            s.pcie_interval_s,
        )
        control: EmbeddedControl | None = None
        if s.control is not None:
            from gpuprobe.agent.fleet import AgentGpus, EmbeddedControl

            try:
                control = EmbeddedControl(
                    dataclasses.replace(s.control, identity=ident),
                    AgentGpus(infos, sampler),
                    self._control_status,
                )
            except OSError as e:
                log.error("control directory %s: %s", s.control.state_dir, e.strerror or e)
                await self.spool.close()
                if gpus is not None:
                    gpus.close()
                return 1
        trainer: TrainerInput | None = None
        if s.trainer_socket is not None:
            trainer = TrainerInput(s.trainer_socket, self._trainer_message, lambda: self.counters.add(trainer_errors=1))
            try:
                await trainer.start()
            except OSError as e:
                log.error("trainer socket %s: %s; trainer progress is not collected", s.trainer_socket, e)
                trainer = None
        metrics: Any = None
        if s.metrics_listen is not None:
            try:
                metrics = serve_metrics(self.counters, *s.metrics_listen)
            except OSError as e:
                log.error("metrics endpoint %s:%d: %s; continuing without it", *s.metrics_listen, e)

        sampler.start()
        self.uplink.start()
        if control is not None:
            control.start()
        tasks = [
            asyncio.create_task(self._flusher(), name="gpuprobe-flusher"),
            asyncio.create_task(self._watchdog(sampler), name="gpuprobe-watchdog"),
            asyncio.create_task(self._status(), name="gpuprobe-status"),
        ]
        hz = 1 / s.interval_s
        log.info(
            "agent %s (gpuprobe %s): %d GPUs at %g Hz, host and acoustics at 1 Hz; collector %s; spool %s%s",
            ident.agent_id,
            __version__,
            len(infos),
            hz,
            ",".join(s.uplink.targets),
            s.spool_dir,
            f"; fleet probes over {s.control.broker.url}" if s.control is not None else "",
        )
        self.notifier.ready(status=f"sampling {len(infos)} GPUs at {hz:g} Hz")

        await stop.wait()

        # ------------------------------------------------------------------ stop
        stop_started = loop.time()
        self.notifier.stopping()
        if control is not None:
            # first, while sampling and the trainer socket still run: a running probe is cancelled,
            # its trainers report their end, its result is published; then OFFLINE
            await control.stop()
        log.info("stopping: sampling ends; delivering spooled batches for up to %g s", s.grace_s)
        sampler.stop()
        await loop.run_in_executor(None, sampler.join, 5.0)
        if mic is not None:
            mic.stop()
        if trainer is not None:
            await trainer.stop()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._flush()
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
        await self.spool.close()
        if gpus is not None:
            gpus.close()
        if metrics is not None:
            metrics.shutdown()
        self.notifier.close()
        return 0

    # ------------------------------------------------------------------ helpers

    def _control_status(self) -> dict[str, Any]:
        """The uplink and spool fields of the control plane's presence message."""
        return {
            "uplink_connected": self.uplink.connected_to is not None,
            "spool_bytes": self.counters.snapshot().spool_bytes,
            "last_ack_unix_ns": self.uplink.last_ack_unix_ns,
        }

    def _hello(self, state: SpoolState) -> telemetry_pb2.Hello:
        return telemetry_pb2.Hello(
            identity=self.identity,
            agent_version=__version__,
            sample_interval_s=self.settings.interval_s,
            gpus=self.infos,
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
            await self._flush()

    async def _flush(self) -> None:
        taken = self.batcher.take()
        if taken is None:
            return
        batch, samples = taken
        try:
            appended = await self.spool.append(batch, samples, protect=self.uplink.protected)
        except Exception as e:  # disk full, I/O error: the batch is lost, the agent keeps going
            log.error("could not spool a batch of %d samples (%s): they are lost", samples, e)
            self.counters.add(samples_dropped=samples, batches_dropped=1)
            return
        spool = self.spool.spool
        self.counters.add(
            batches_spooled=1,
            samples_spooled=samples,
            batches_dropped=appended.dropped_batches,
            samples_dropped=appended.dropped_samples,
        )
        self.counters.set(spool_bytes=spool.bytes, spool_batches=spool.batches)
        if appended.dropped_batches:
            now = time.monotonic()
            if now - self._last_drop_log >= 60.0:
                self._last_drop_log = now
                totals = self.counters.snapshot()
                log.warning(
                    "spool cap reached (%d bytes): dropped the oldest batches, %d samples so far"
                    " (reported in AgentStats and the samples_dropped counter)",
                    spool.max_bytes,
                    totals.samples_dropped,
                )
        self.uplink.notify(appended.stored(), dropped=appended.dropped_batches > 0)

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
