"""Part: control. The agent's side of the control plane: presence, signed commands, probes, progress and results.

:class:`ControlClient` is self-contained: an agent embeds it with one call in its event loop::

    settings = control.settings.control_settings(values, identity, control_dir=..., agent_socket=...)
    client = ControlClient(settings, gpus=..., status=lambda: {...})
    task = asyncio.create_task(client.run())      # ... and on shutdown: client.request_stop(); await task

``gpuprobe agent --broker URL`` does exactly that (``gpuprobe.agent.embedded_control``); ``gpuprobe
control-agent`` runs it on its own, for hosts that run only the control plane (docs/control.md).

Connection (aiomqtt 2.x has no automatic reconnect): connect with a retained ``LOST`` presence as
the last will; subscribe to commands; publish ``ONLINE`` (retained) and again every
``presence_interval_s``; republish the retained results of recent probes (a broker restarted
without persistence has lost them) and any replies that could not be sent; on any ``MqttError``
reconnect with exponential backoff and jitter (a refused login waits ``auth_retry_s``). Probes run
independently of the connection: a broker restart loses only progress messages (QoS 0), never a
result. On :meth:`request_stop` a running probe is cancelled, its result published, then
``OFFLINE`` and a clean disconnect.

Each command is handled in the contract's order (docs/wire.md), refusing at the first failing step
with a logged reason and a ``CommandReply`` on ``gpuprobe/v1/replies/{command_id}/{host}``:
trusted key and signature, well-formed, not expired or from the future, not seen before (ids are
remembered on disk, :mod:`.replay`), selected, and then possible (built-in workload, trainer
installed, valid arguments, not busy).

GPU health (:meth:`GpuReader.health <gpuprobe.control.gpus.GpuReader.health>`): every presence
carries ``gpu_health``; the presence task polls the reader every ``HEALTH_POLL_S`` (an identity check,
then equality) and republishes the presence at once when a verdict changes. A probe (or study) runs
only on GPUs that are not ``FAILED``: failed GPUs among the selected ones are left out and named in
the reply and the result; when no selected GPU is left, the command is refused (``gpu_failed``,
``GPU 3 is failed: XID 79: ...``). ``DEGRADED`` GPUs run, with a warning in the reply and the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError

from gpuprobe import workloads
from gpuprobe.backoff import Backoff
from gpuprobe.control import mqtt, replay, selector, signing, topics
from gpuprobe.control.gpus import GpuHealthMap, GpuReader, SensorGpus, describe_health, health_name
from gpuprobe.control.powerlimit import FILE_NAME as POWER_LIMITS_FILE
from gpuprobe.control.powerlimit import PowerLimitRefused, PowerLimits, parse_limit
from gpuprobe.control.probe_run import PointLimit, ProbePlan, ProbeRun, limit_label
from gpuprobe.control.settings import MAX_STUDY_POINTS, ControlSettings
from gpuprobe.v1 import common_pb2, control_pb2

log = logging.getLogger(__name__)

R = control_pb2  # refusal reasons are control_pb2.REFUSAL_REASON_*
MAX_PHASE_S = 86400.0
PresenceStatus = Callable[[], dict[str, Any]]
HEALTH_POLL_S = 0.25  # how often the presence task looks at the GPUs' health


class _RateLimit:
    """A token bucket: ``burst`` at once, then one per ``every_s``."""

    def __init__(self, burst: int = 10, every_s: float = 1.0) -> None:
        self.burst, self.every_s = burst, every_s
        self.tokens = float(burst)
        self.t = time.monotonic()

    def allow(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.t) / self.every_s)
        self.t = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


@dataclass
class _Outgoing:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    message_name: str


class ControlClient:
    def __init__(
        self,
        settings: ControlSettings,
        *,
        gpus: GpuReader | None = None,
        status: PresenceStatus | None = None,
    ) -> None:
        self.settings = settings
        topics.check_segment(settings.host, "host name")
        self.gpus: GpuReader = gpus if gpus is not None else SensorGpus()
        self.status = status
        self.replay = replay.ReplayStore(settings.state_dir)
        # GPU power limits that probes set (and always restore: the state file survives a SIGKILL)
        self.power_limits = PowerLimits(settings.state_dir / POWER_LIMITS_FILE, settings.allow_power_limits)
        self.results_dir = settings.state_dir / "results"
        self.results_dir.mkdir(parents=True, exist_ok=True)
        self.started_unix_ns = time.time_ns()
        self.workloads = workloads.runnable_workloads()
        self.probe: ProbeRun | None = None
        self._probe_task: asyncio.Task[None] | None = None
        self._client: Any = None
        self._stopping = asyncio.Event()
        self._pending: deque[_Outgoing] = deque(maxlen=200)
        self._background: set[asyncio.Task[Any]] = set()
        self._refusal_replies = _RateLimit()
        self._health: GpuHealthMap = {}  # as last polled (and published)
        self.connected = asyncio.Event()

    # --- lifecycle ------------------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop: cancel a running probe (its result is still published), go OFFLINE, disconnect."""
        self._stopping.set()

    async def run(self) -> None:
        """Stay connected (reconnecting as needed) until :meth:`request_stop`."""
        log.info(
            "control agent %s: broker %s, %d GPU(s), %d trusted key(s) (%s), workloads %s",
            self.settings.host,
            self.settings.broker.url,
            self.gpus.count,
            len(self.settings.trusted_keys),
            ", ".join(sorted(self.settings.trusted_keys)) or "none",
            ", ".join(self.workloads),
        )
        log.info("%s", self.power_limits.describe())
        # limits that an agent killed during a probe left set: restored before anything else (logged)
        await asyncio.to_thread(self.power_limits.restore_leftovers)
        backoff = Backoff(self.settings.reconnect_min_s, self.settings.reconnect_max_s)
        while not self._stopping.is_set():
            try:
                await self._session()
                backoff.reset()
                delay = backoff.next_delay_s()
            except Exception as e:
                if self._stopping.is_set():
                    break
                message = mqtt.describe_error(e, self.settings.broker)
                if mqtt.is_auth_error(e):
                    delay = self.settings.auth_retry_s
                    log.error("%s; retrying in %.0f s", message, delay)
                else:
                    delay = backoff.next_delay_s()
                    log.warning("%s; reconnecting in %.1f s", message, delay)
            finally:
                self._client = None
                self.connected.clear()
            if self._stopping.is_set():
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)
        await self._finish_probe_offline()

    async def _finish_probe_offline(self) -> None:
        """Stopped while disconnected: still end a running probe and keep its result for the next start."""
        if self._probe_task is not None and not self._probe_task.done():
            assert self.probe is not None
            self.probe.cancel()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._probe_task), 30)

    async def _session(self) -> None:
        import aiomqtt

        await self._poll_health()
        will = aiomqtt.Will(
            topics.presence(self.settings.host),
            self._presence(control_pb2.AGENT_STATE_LOST).SerializeToString(),
            qos=1,
            retain=True,
            properties=mqtt.will_properties("AgentPresence"),
        )
        client = mqtt.make_client(
            self.settings.broker,
            identifier=f"gpuprobe-agent-{self.settings.host}"[:64],
            will=will,
            keepalive=self.settings.keepalive_s,
        )
        async with client:
            self._client = client
            await client.subscribe(topics.COMMANDS, qos=1)
            await self._publish_presence(control_pb2.AGENT_STATE_ONLINE)
            log.info("connected to %s as %s", self.settings.broker.url, self.settings.host)
            self.connected.set()
            await self._flush()
            receiver = asyncio.create_task(self._receive(client))
            heartbeat = asyncio.create_task(self._heartbeat())
            stopping = asyncio.create_task(self._stopping.wait())
            try:
                done, _ = await asyncio.wait({receiver, heartbeat, stopping}, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task is not stopping and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
            finally:
                for task in (receiver, heartbeat, stopping):
                    task.cancel()
            # a clean stop: end the probe (its result goes out on this connection), then OFFLINE
            if self._probe_task is not None and not self._probe_task.done():
                assert self.probe is not None
                self.probe.cancel()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(self._probe_task), 30)
            await self._publish_presence(control_pb2.AGENT_STATE_OFFLINE)
            log.info("disconnecting from %s (offline)", self.settings.broker.url)

    async def _heartbeat(self) -> None:
        """ONLINE every ``presence_interval_s``, and at once when a GPU's health changes."""
        due = time.monotonic() + self.settings.presence_interval_s
        while True:
            await asyncio.sleep(max(0.0, min(HEALTH_POLL_S, due - time.monotonic())))
            changed = await self._poll_health()
            if changed or time.monotonic() >= due:
                await self._publish_presence(control_pb2.AGENT_STATE_ONLINE)
                due = time.monotonic() + self.settings.presence_interval_s

    async def _read_health(self) -> GpuHealthMap:
        try:
            return await asyncio.to_thread(self.gpus.health)  # SensorGpus may read NVML
        except Exception as e:  # a reader that fails says nothing about the GPUs
            log.warning("reading the GPUs' health failed: %s", e)
            return self._health

    async def _poll_health(self) -> bool:
        """Read the GPUs' health; True when it changed since the last poll (each change is logged)."""
        health = await self._read_health()
        if health is self._health:
            return False
        before, self._health = self._health, health
        if health == before:
            return False
        for index in sorted(set(health) | set(before)):
            if health.get(index) != before.get(index):
                value, reason = health.get(index, (common_pb2.GPU_HEALTH_UNSPECIFIED, ""))
                if index not in before and value == common_pb2.GPU_HEALTH_HEALTHY:
                    log.debug("GPU %d is healthy", index)
                    continue
                (log.warning if value == common_pb2.GPU_HEALTH_FAILED else log.info)(
                    "%s (was %s); publishing the presence",
                    describe_health(index, value, reason),
                    health_name(before[index][0]) if index in before else "unknown",
                )
        return True

    async def _receive(self, client: Any) -> None:
        async for message in client.messages:
            payload = message.payload
            if isinstance(payload, bytes | bytearray):
                await self.handle_command(bytes(payload))

    # --- publishing -----------------------------------------------------------------------------------

    async def _publish(self, out: _Outgoing, keep: bool) -> bool:
        client = self._client
        if client is not None:
            try:
                await client.publish(
                    out.topic,
                    out.payload,
                    qos=out.qos,
                    retain=out.retain,
                    properties=mqtt.publish_properties(out.message_name),
                    timeout=10,
                )
                return True
            except Exception as e:
                log.debug("publish to %s failed: %s", out.topic, e)
        if keep:
            self._pending.append(out)
        return False

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _flush(self) -> None:
        """After a (re)connect: recent results (retained, idempotent) and replies that were not sent."""
        cutoff = time.time() - self.settings.result_retention_s
        for path in sorted(self.results_dir.glob("*.pb")):
            if path.stat().st_mtime < cutoff:
                path.unlink(missing_ok=True)
                continue
            try:
                result = control_pb2.ProbeResult.FromString(path.read_bytes())
            except (OSError, DecodeError) as e:
                log.warning("cannot read the stored result %s: %s", path, e)
                continue
            await self._publish(self._result_message(result), keep=False)
        while self._pending:
            out = self._pending.popleft()
            if not await self._publish(out, keep=False):
                self._pending.appendleft(out)
                return

    def _presence(self, state: int) -> control_pb2.AgentPresence:
        presence = control_pb2.AgentPresence(
            state=state,  # type: ignore[arg-type]
            identity=self.settings.identity,
            agent_version=self.settings.agent_version,
            gpus=self.gpus.infos(),
            last_seen_unix_ns=time.time_ns(),
            started_unix_ns=self.started_unix_ns,
            workloads=self.workloads,
            probe_id=self.probe.probe_id if self.probe is not None and not self._probe_done() else "",
            sample_interval_s=self.settings.telemetry_interval_s,
            gpu_health=[
                control_pb2.GpuHealthStatus(index=index, health=value, reason=reason)  # type: ignore[arg-type]
                for index, (value, reason) in sorted(self._health.items())
            ],
        )
        if self.status is not None:
            extra = self.status()
            presence.uplink_connected = bool(extra.get("uplink_connected", False))
            presence.spool_bytes = int(extra.get("spool_bytes", 0))
            presence.last_ack_unix_ns = int(extra.get("last_ack_unix_ns", 0))
            if extra.get("clock_offset_s") is not None:
                presence.clock_offset_s = float(extra["clock_offset_s"])
        return presence

    def _probe_done(self) -> bool:
        return self._probe_task is None or self._probe_task.done()

    async def _publish_presence(self, state: int) -> None:
        out = _Outgoing(
            topics.presence(self.settings.host), self._presence(state).SerializeToString(), 1, True, "AgentPresence"
        )
        await self._publish(out, keep=False)

    def _result_message(self, result: control_pb2.ProbeResult) -> _Outgoing:
        return _Outgoing(
            topics.results(result.probe_id, self.settings.host), result.SerializeToString(), 1, True, "ProbeResult"
        )

    def _progress(self, progress: control_pb2.ProbeProgress) -> None:
        out = _Outgoing(
            topics.progress(progress.probe_id, self.settings.host),
            progress.SerializeToString(),
            0,
            True,
            "ProbeProgress",
        )
        self._spawn(self._publish(out, keep=False))

    async def _reply(self, command_id: str, probe_id: str, accepted: bool, reason: int = 0, message: str = "") -> None:
        if not command_id:
            return
        try:
            topics.check_segment(command_id, "command id")
        except topics.TopicError:
            log.warning("not replying to a command whose id cannot be a topic segment: %r", command_id[:64])
            return
        reply = control_pb2.CommandReply(
            command_id=command_id,
            host=self.settings.host,
            accepted=accepted,
            reason=reason,  # type: ignore[arg-type]
            message=message,
            time_unix_ns=time.time_ns(),
            probe_id=probe_id,
        )
        out = _Outgoing(
            topics.replies(command_id, self.settings.host), reply.SerializeToString(), 1, False, "CommandReply"
        )
        await self._publish(out, keep=True)

    # --- commands -------------------------------------------------------------------------------------

    async def handle_command(self, payload: bytes) -> None:
        """One message from ``gpuprobe/v1/commands``: check it, reply, and act on it."""
        try:
            signed = control_pb2.SignedCommand.FromString(payload)
        except DecodeError:
            log.warning("refused a message on %s: not a SignedCommand (%d bytes)", topics.COMMANDS, len(payload))
            return
        try:
            command = signing.verify(signed, self.settings.trusted_keys)
        except signing.Refusal as refusal:
            log.warning(
                "refused command %s: %s (%s)",
                refusal.command_id or "(unreadable)",
                refusal.reason_name,
                refusal.message,
            )
            if self._refusal_replies.allow():
                await self._reply(refusal.command_id, refusal.probe_id, False, refusal.reason, refusal.message)
            return
        try:
            await self._decide(command, signed.key_id)
        except signing.Refusal as refusal:
            log.warning(
                "refused command %s (probe %s, key %s, issuer %r): %s (%s)",
                command.command_id,
                refusal.probe_id or "-",
                signed.key_id,
                command.issuer,
                refusal.reason_name,
                refusal.message,
            )
            if refusal.reason in (R.REFUSAL_REASON_MALFORMED,) and not self._refusal_replies.allow():
                return
            await self._reply(
                refusal.command_id or command.command_id, refusal.probe_id, False, refusal.reason, refusal.message
            )

    async def _decide(self, command: control_pb2.Command, key_id: str) -> None:
        now = time.time_ns()
        signing.check_times(command, now, self.settings.max_command_lifetime_s, self.settings.clock_skew_s)
        probe_id = signing.probe_id_of(command)
        if command.command_id in self.replay:
            raise signing.Refusal(
                R.REFUSAL_REASON_REPLAYED, "this command was already received", command.command_id, probe_id
            )
        await asyncio.to_thread(self.replay.remember, command.command_id, command.expires_at_unix_ns)
        action = command.WhichOneof("action")
        if action == "probe_start":
            await self._start_probe(command, key_id)
        elif action == "probe_cancel":
            await self._cancel_probe(command)

    def _selected(self, command: control_pb2.Command, node_selector: control_pb2.NodeSelector, probe_id: str) -> bool:
        selected, named = selector.match(node_selector, self.settings.identity)
        if selected:
            return True
        if named:
            raise signing.Refusal(
                R.REFUSAL_REASON_NOT_SELECTED,
                f"the selector names this host but excludes it ({selector.describe(node_selector)})",
                command.command_id,
                probe_id,
            )
        log.debug("command %s does not select this agent", command.command_id)
        return False

    def _plan(self, command: control_pb2.Command, health: GpuHealthMap | None = None) -> ProbePlan:
        """The probe as this node runs it, or a Refusal; ``health`` (the GPUs' health now) leaves
        failed GPUs out (refusing the command when none of the selected GPUs is left)."""
        start = command.probe_start

        def refuse(reason: int, message: str) -> signing.Refusal:
            return signing.Refusal(reason, message, command.command_id, start.probe_id)

        if len(start.points) > MAX_STUDY_POINTS:
            raise refuse(
                R.REFUSAL_REASON_INVALID_ARGUMENT, f"{len(start.points)} study points; at most {MAX_STUDY_POINTS}"
            )
        for workload in dict.fromkeys([p.workload for p in start.points] or [start.workload]):
            if workloads.WORKLOADS.get(workload) is None:
                raise refuse(
                    R.REFUSAL_REASON_UNKNOWN_WORKLOAD,
                    f"workload {workload!r} is not built in ({', '.join(workloads.WORKLOAD_NAMES)})",
                )
            if workload not in self.workloads:
                raise refuse(
                    R.REFUSAL_REASON_TRAINER_UNAVAILABLE,
                    f"{workload} needs the trainer extra (torch) on this node: pip install 'gpuprobe[trainer]'",
                )
        for index, point in enumerate(start.points):
            if point.batch_size == 0:
                raise refuse(R.REFUSAL_REASON_INVALID_ARGUMENT, f"study point {index}: batch size 0")
            try:
                parse_limit(limit_label(point.power_limit))
            except ValueError as e:
                raise refuse(R.REFUSAL_REASON_INVALID_ARGUMENT, f"study point {index}: {e}") from None
        try:
            topics.check_probe_id(start.probe_id)
        except topics.TopicError as e:
            raise refuse(R.REFUSAL_REASON_INVALID_ARGUMENT, str(e)) from None
        if not 0 < start.duration_s <= MAX_PHASE_S:
            raise refuse(
                R.REFUSAL_REASON_INVALID_ARGUMENT, f"duration {start.duration_s} s is not in (0, {MAX_PHASE_S:.0f}]"
            )
        for name in ("idle_baseline_s", "warmup_s", "cooldown_s"):
            if start.HasField(name) and not 0 <= getattr(start, name) <= MAX_PHASE_S:
                raise refuse(
                    R.REFUSAL_REASON_INVALID_ARGUMENT, f"{name} {getattr(start, name)} is not in [0, {MAX_PHASE_S:.0f}]"
                )
        if start.HasField("batch_size") and start.batch_size == 0:
            raise refuse(R.REFUSAL_REASON_INVALID_ARGUMENT, "batch size 0")
        missing = [i for i in start.gpu_indices if i >= self.gpus.count]
        if missing:
            raise refuse(
                R.REFUSAL_REASON_INVALID_ARGUMENT, f"GPU(s) {missing} do not exist here ({self.gpus.count} GPU(s))"
            )
        if not self._probe_done():
            assert self.probe is not None
            raise refuse(R.REFUSAL_REASON_BUSY, f"probe {self.probe.probe_id} is running or pending here")
        if (self.results_dir / f"{start.probe_id}.pb").exists():
            raise refuse(R.REFUSAL_REASON_INVALID_ARGUMENT, f"probe id {start.probe_id} already ran here")
        gpu_indices = sorted(set(start.gpu_indices)) or list(range(self.gpus.count))
        health = self._health if health is None else health
        refused: dict[int, str] = {}
        warnings: list[str] = []
        for i in gpu_indices:
            value, reason = health.get(i, (common_pb2.GPU_HEALTH_UNSPECIFIED, ""))
            if value == common_pb2.GPU_HEALTH_FAILED:
                refused[i] = describe_health(i, value, reason)
            elif value == common_pb2.GPU_HEALTH_DEGRADED:
                warnings.append(describe_health(i, value, reason))
        if refused and len(refused) == len(gpu_indices):
            raise refuse(R.REFUSAL_REASON_GPU_FAILED, "; ".join(refused.values()))
        plan = ProbePlan(start, [i for i in gpu_indices if i not in refused])
        plan.refused_gpus = refused
        plan.warnings = warnings
        return plan

    async def _start_probe(self, command: control_pb2.Command, key_id: str) -> None:
        start = command.probe_start
        if not self._selected(command, start.selector, start.probe_id):
            return
        plan = self._plan(command, await self._read_health())
        if plan.is_study and plan.gpu_indices:
            plan.limits = await asyncio.to_thread(self._resolve_limits, plan)
        probe = ProbeRun(
            plan=plan,
            host=self.settings.host,
            gpus=self.gpus,
            work_dir=self.settings.state_dir / "probes" / start.probe_id,
            on_progress=self._progress,
            trainer_command=self.settings.trainer_command,
            agent_socket=self.settings.agent_socket,
            sample_interval_s=self.settings.sample_interval_s,
            power_limits=self.power_limits,
        )
        self.probe = probe
        self._probe_task = asyncio.create_task(self._run_probe(probe))
        in_s = (start.start_at_unix_ns - time.time_ns()) / 1e9 if start.start_at_unix_ns else 0.0
        where = ", ".join(f"GPU {i}" for i in plan.gpu_indices) or "the CPU"
        when = f"starts in {in_s:.1f} s" if in_s > 0 else "starts now"
        log.info(
            "accepted command %s (key %s, issuer %r): probe %s, %s %s for %.0f s on %s, %s",
            command.command_id,
            key_id,
            command.issuer,
            start.probe_id,
            start.workload,
            plan.size,
            start.duration_s,
            where,
            when,
        )
        what = f"{start.workload} {plan.size}"
        if plan.is_study:
            refused = sum(1 for limit in plan.limits.values() if limit.refused)
            what = f"study of {len(start.points)} points ({', '.join(plan.workloads)}, {plan.size})"
            if refused:
                first = next(limit.refused for limit in plan.limits.values() if limit.refused)
                what += f"; {refused} point(s) refused here, e.g. {first}"
        notes = "".join(f"; {note}" for note in plan.health_notes())
        await self._reply(command.command_id, start.probe_id, True, message=f"{what} on {where}, {when}{notes}")
        await self._publish_presence(control_pb2.AGENT_STATE_ONLINE)

    def _resolve_limits(self, plan: ProbePlan) -> dict[tuple[int, int], PointLimit]:
        """Every study point's power limit on every GPU, checked before anything runs: a limit that is
        not allowed, unprivileged or out of the GPU's range refuses that point on that GPU only."""
        limits: dict[tuple[int, int], PointLimit] = {}
        for index, point in enumerate(plan.start.points):
            label = limit_label(point.power_limit)
            if not label:
                continue
            request = parse_limit(label)
            for gpu in plan.gpu_indices:
                try:
                    limits[(gpu, index)] = PointLimit(label, self.power_limits.resolve(gpu, request))
                except PowerLimitRefused as e:
                    limits[(gpu, index)] = PointLimit(label, None, str(e))
        return limits

    async def _run_probe(self, probe: ProbeRun) -> None:
        self._progress(probe.progress())
        result = await probe.run()
        status = common_pb2.ProbeStatus.Name(result.status).removeprefix("PROBE_STATUS_").lower()
        log.info("probe %s ended: %s %s", probe.probe_id, status, result.message)
        final = probe.progress(status=status)
        final.phase = common_pb2.PROBE_PHASE_DONE
        self._progress(final)
        path = self.results_dir / f"{probe.probe_id}.pb"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(result.SerializeToString())
        tmp.replace(path)
        await self._publish(self._result_message(result), keep=False)  # republished on every reconnect
        await self._publish_presence(control_pb2.AGENT_STATE_ONLINE)

    async def _cancel_probe(self, command: control_pb2.Command) -> None:
        """``ProbeCancel`` has no selector: it concerns the agents that know the probe. One that never
        ran it stays silent (like an agent a selector does not mention); one whose run has ended
        refuses with UNKNOWN_PROBE."""
        probe_id = command.probe_cancel.probe_id
        running = self.probe is not None and self.probe.probe_id == probe_id and not self._probe_done()
        if not running:
            if (self.results_dir / f"{probe_id}.pb").exists():
                raise signing.Refusal(
                    R.REFUSAL_REASON_UNKNOWN_PROBE,
                    f"probe {probe_id} has already ended here",
                    command.command_id,
                    probe_id,
                )
            log.debug("cancel %s: probe %s never ran here", command.command_id, probe_id)
            return
        assert self.probe is not None
        log.info("cancelling probe %s (command %s, issuer %r)", probe_id, command.command_id, command.issuer)
        self.probe.cancel()
        await self._reply(command.command_id, probe_id, True, message=f"cancelling probe {probe_id}")


@dataclass
class IdentityValues:
    host: str = field(default_factory=socket.gethostname)
    cluster: str = ""
    cloud: str = ""
    instance_type: str = ""
    region: str = ""

    def to_proto(self) -> common_pb2.AgentIdentity:
        return common_pb2.AgentIdentity(
            agent_id=self.host,
            host=self.host,
            cluster=self.cluster,
            cloud=self.cloud,
            instance_type=self.instance_type,
            region=self.region,
        )
