"""Part: control. One accepted probe on this node: trainers, progress, and the result.

The agent starts one ``gpuprobe train --format jsonl`` process per selected GPU *at once* (they
import torch and build their model while the probe is pending) with ``--start-at`` set to the
probe's start time, so the idle baseline starts on every node at the same wall-clock moment. The
trainers' JSON lines (phase changes, progress, result) give the node's progress, published about
once a second; a ``ReadingRecorder`` (control/gpus.py) keeps power, temperature and the energy
counter of each GPU every 100 ms from acceptance to the end. The result combines both over the steady phase (the trainer
reports its synchronized start and end): samples/s, energy from the counter, J/sample, mean and
peak power, peak temperature, and the idle baseline's mean power.

A *study* (``ProbeStart.points``) runs its points one after another in fixed slots of one schedule
(idle baseline, then per point a warm-up and a steady phase, then one cool-down). Consecutive points
of one workload are one trainer run per GPU (``--plan``); the runs of later workloads start with the
first (so their model is built in time) and stay pending until their first slot. When a trainer
enters a point's warm-up, the agent sets that point's power limit on the trainer's GPU
(:mod:`.powerlimit`); every limit is restored when the probe ends, however it ends. A point whose
limit was refused when the probe was accepted (not allowed, unprivileged, out of range) is passed to
the trainer as refused: its slot stays idle on that GPU and the result says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpuprobe import workloads
from gpuprobe.control.gpus import GpuReader, Reading, ReadingRecorder, describe_health
from gpuprobe.control.powerlimit import PowerLimits
from gpuprobe.control.settings import TRAINER_COMMAND
from gpuprobe.energy import window_energy
from gpuprobe.trainer.agent_socket import AgentReporter, probe_event_line
from gpuprobe.v1 import common_pb2, control_pb2
from gpuprobe.wire.vocabulary import PHASES, STATUSES

log = logging.getLogger(__name__)


STOP_GRACE_S = 10.0


@dataclass
class TrainerState:
    """What one trainer process has reported."""

    gpu: int | None
    segment: int = 0  # in a study: which run of consecutive points of one workload
    phase: str = "pending"
    step: int = 0
    samples_per_s: float | None = None
    fraction_done: float = 0.0
    result: dict[str, Any] | None = None
    returncode: int | None = None
    stderr_path: Path | None = None


@dataclass(frozen=True)
class PointLimit:
    """A study point's power limit on one GPU, as resolved when the probe was accepted."""

    label: str = ""  # "60%", "250W"; empty: the GPU's own limit
    limit_w: float | None = None  # what to set
    refused: str = ""  # why the GPU does not run the point


@dataclass(frozen=True)
class Segment:
    """Consecutive study points of one workload: one trainer run per GPU."""

    workload: str
    indices: tuple[int, ...]


@dataclass
class ProbePlan:
    """An accepted ``ProbeStart`` as this node runs it."""

    start: control_pb2.ProbeStart
    gpu_indices: list[int]  # empty: one copy on the CPU (a node without GPUs)
    anchor_unix_ns: int = field(default_factory=time.time_ns)  # the schedule's start (start_at, or acceptance)
    limits: dict[tuple[int, int], PointLimit] = field(default_factory=dict)  # (gpu, point) -> limit
    refused_gpus: dict[int, str] = field(default_factory=dict)  # selected but failed: GPU -> why, not run
    warnings: list[str] = field(default_factory=list)  # degraded GPUs that run anyway

    def __post_init__(self) -> None:
        if self.start.start_at_unix_ns:
            self.anchor_unix_ns = self.start.start_at_unix_ns

    def health_notes(self) -> list[str]:
        """What the reply and the result say about the GPUs' health: refused (failed) and degraded ones."""
        notes = [f"not run on {why}" for why in self.refused_gpus.values()]
        return notes + [f"warning: {why}" for why in self.warnings]

    @property
    def is_study(self) -> bool:
        return len(self.start.points) > 0

    @property
    def workloads(self) -> list[str]:
        if self.is_study:
            return list(dict.fromkeys(p.workload for p in self.start.points))
        return [self.start.workload]

    def segments(self) -> list[Segment]:
        """The study's points cut into runs of one workload (one segment for a plain probe)."""
        if not self.is_study:
            return [Segment(self.start.workload, ())]
        segments: list[Segment] = []
        for index, point in enumerate(self.start.points):
            if segments and segments[-1].workload == point.workload:
                segments[-1] = Segment(point.workload, (*segments[-1].indices, index))
            else:
                segments.append(Segment(point.workload, (index,)))
        return segments

    def limit(self, gpu: int | None, index: int) -> PointLimit:
        if gpu is None:
            label = limit_label(self.start.points[index].power_limit)
            return PointLimit(label, None, f"no GPU to set the power limit {label} on" if label else "")
        return self.limits.get((gpu, index), PointLimit())

    @property
    def probe_id(self) -> str:
        return self.start.probe_id

    @property
    def size(self) -> str:
        return "tiny" if self.start.size == control_pb2.WORKLOAD_SIZE_TINY else "full"

    def phase_s(self, name: str) -> float:
        defaults = {
            "idle_baseline_s": workloads.DEFAULT_IDLE_BASELINE_S,
            "warmup_s": workloads.DEFAULT_WARMUP_S,
            "cooldown_s": workloads.DEFAULT_COOLDOWN_S,
        }
        return float(getattr(self.start, name)) if self.start.HasField(name) else defaults[name]

    def planned_s(self) -> float:
        points = max(1, len(self.start.points))
        return (
            self.phase_s("idle_baseline_s")
            + points * (self.phase_s("warmup_s") + self.start.duration_s)
            + self.phase_s("cooldown_s")
        )

    def trainer_args(self, gpu: int | None, agent_socket: Path | None, segment: Segment | None = None) -> list[str]:
        s = self.start
        segment = segment or self.segments()[0]
        last = not self.is_study or segment.indices[-1] == len(s.points) - 1
        args = [
            "--format", "jsonl",
            "--workload", segment.workload,
            "--size", self.size,
            "--duration", repr(s.duration_s),
            "--device", "cpu" if gpu is None else f"cuda:{gpu}",
            "--probe-id", s.probe_id,
            "--start-at", str(self.anchor_unix_ns),
            "--idle-baseline", repr(self.phase_s("idle_baseline_s")),
            "--warmup", repr(self.phase_s("warmup_s")),
            # in a study only the run with the last point cools down: the others hand the GPU on
            "--cooldown", repr(self.phase_s("cooldown_s") if last else 0.0),
            "--no-sweep",  # one batch size per probe, whatever the node's environment or config says
        ]  # fmt: skip
        if self.is_study:
            plan = []
            for index in segment.indices:
                point, limit = s.points[index], self.limit(gpu, index)
                plan.append(
                    {
                        "index": index,
                        "batch_size": point.batch_size,
                        "power_limit": limit.label,
                        "power_limit_w": limit.limit_w,
                        "refused": limit.refused,
                    }
                )
            args += ["--plan", json.dumps(plan, separators=(",", ":"))]
        elif s.HasField("batch_size"):
            args += ["--batch-size", str(s.batch_size)]
        if agent_socket is not None:
            args += ["--agent-socket", str(agent_socket)]
        return args


def limit_label(limit: control_pb2.PowerLimit) -> str:
    """``60%``, ``250W``, or empty when the point leaves the limit as it is."""
    which = limit.WhichOneof("limit")
    if which == "percent_of_max":
        return f"{limit.percent_of_max:g}%"
    if which == "watts":
        return f"{limit.watts:g}W"
    return ""


ProgressCallback = Callable[[control_pb2.ProbeProgress], None]


@dataclass
class ProbeRun:
    """Runs one probe to its end; :meth:`run` returns the ``ProbeResult`` (it never raises)."""

    plan: ProbePlan
    host: str
    gpus: GpuReader
    work_dir: Path
    on_progress: ProgressCallback
    trainer_command: Sequence[str] = TRAINER_COMMAND
    agent_socket: Path | None = None
    sample_interval_s: float = 0.1
    progress_interval_s: float = 1.0
    accepted_unix_ns: int = field(default_factory=time.time_ns)
    power_limits: PowerLimits | None = None  # sets and restores a study's limits

    def __post_init__(self) -> None:
        targets: list[int | None] = list(self.plan.gpu_indices) or [None]
        self.segments = self.plan.segments()
        self.trainers = [TrainerState(g, n) for n in range(len(self.segments)) for g in targets]
        self._procs: list[asyncio.subprocess.Process] = []
        self._cancelled = asyncio.Event()
        self._started_unix_ns = 0
        self._limit_failures: dict[tuple[int, int], str] = {}  # (gpu, point) -> why setting it failed

    @property
    def probe_id(self) -> str:
        return self.plan.probe_id

    def cancel(self) -> None:
        self._cancelled.set()

    # --- progress -------------------------------------------------------------------------------------

    def _current(self) -> list[TrainerState]:
        """Per GPU, the trainer that has the GPU now: the first that is neither pending nor done (the
        last one once all are done, the first while all are pending)."""
        current: list[TrainerState] = []
        for gpu in dict.fromkeys(t.gpu for t in self.trainers):
            mine = [t for t in self.trainers if t.gpu == gpu]
            active = [t for t in mine if t.phase not in ("pending", "done")]
            if active:
                current.append(active[0])
            elif all(t.phase == "done" for t in mine):
                current.append(mine[-1])
            else:
                current.append(next(t for t in mine if t.phase == "pending"))
        return current

    def progress(self, status: str = "running") -> control_pb2.ProbeProgress:
        order = list(PHASES)
        trainers = self._current()
        phase = min((t.phase for t in trainers), key=order.index)
        msg = control_pb2.ProbeProgress(
            probe_id=self.probe_id,
            host=self.host,
            time_unix_ns=time.time_ns(),
            phase=PHASES[phase],
            status=STATUSES[status],
            step=min(t.step for t in trainers),
            started_unix_ns=self._started_unix_ns,
            workload=self.segments[trainers[0].segment].workload if self.plan.is_study else self.plan.start.workload,
        )
        rates = [t.samples_per_s for t in trainers if t.samples_per_s is not None]
        if rates and phase in ("warmup", "steady"):
            msg.samples_per_s = sum(rates)
        if status == "running" and self.plan.is_study:
            # one schedule for every trainer run of the study: the share of it that has passed
            elapsed_s = (time.time_ns() - self.plan.anchor_unix_ns) / 1e9
            msg.fraction_done = min(1.0, max(0.0, elapsed_s / self.plan.planned_s()))
        elif status == "running":
            msg.fraction_done = min(t.fraction_done for t in trainers)
        else:
            msg.fraction_done = 1.0
        return msg

    async def _publish_progress_every_second(self) -> None:
        while True:
            self.on_progress(self.progress())
            await asyncio.sleep(self.progress_interval_s)

    # --- the trainers ---------------------------------------------------------------------------------

    async def _read_trainer(self, proc: asyncio.subprocess.Process, state: TrainerState) -> None:
        assert proc.stdout is not None
        async for raw in proc.stdout:
            try:
                event = json.loads(raw)
            except ValueError:
                log.warning("probe %s: trainer printed a line that is not JSON: %r", self.probe_id, raw[:200])
                continue
            kind = event.get("type")
            if kind == "phase":
                state.phase = event["phase"]
                if event["phase"] == "idle" and not self._started_unix_ns:
                    self._started_unix_ns = event["time_unix_ns"]
                point = event.get("point")
                log.info(
                    "probe %s gpu %s: phase %s%s",
                    self.probe_id,
                    state.gpu,
                    event["phase"],
                    "" if point is None else f" of point {point}",
                )
                if event["phase"] == "warmup" and isinstance(point, int) and state.gpu is not None:
                    await self._set_limit(state.gpu, point)
                self.on_progress(self.progress())
            elif kind == "progress":
                state.step = int(event.get("step") or 0)
                state.samples_per_s = event.get("samples_per_s")
                state.fraction_done = float(event.get("fraction_done") or 0.0)
            elif kind == "result":
                state.result = event
        state.returncode = await proc.wait()

    async def _set_limit(self, gpu: int, index: int) -> None:
        """The point's power limit on ``gpu``, as its warm-up starts (the simulator and real GPUs take
        it within one update period, long before the steady phase). A point that leaves the limit "as
        is" gets the GPU's own limit back if an earlier point of the study changed it."""
        limit = self.plan.limit(gpu, index)
        if limit.refused or self.power_limits is None:
            return
        target_w = limit.limit_w
        if target_w is None:
            target_w = await asyncio.to_thread(self.power_limits.original_limit_w, gpu)
            if target_w is None:
                return
        try:
            await asyncio.to_thread(self.power_limits.apply, gpu, target_w)
            log.info(
                "probe %s gpu %d: point %d runs at %.0f W (%s)",
                self.probe_id,
                gpu,
                index,
                target_w,
                limit.label or "the GPU's own limit",
            )
        except Exception as e:  # the point runs at another limit: it is refused, in the result and in InfluxDB
            log.error("probe %s gpu %d: point %d: %s", self.probe_id, gpu, index, e)
            self._limit_failures[(gpu, index)] = str(e)
            self._report_refusal(gpu, index, str(e))

    def _report_refusal(self, gpu: int, index: int, message: str) -> None:
        """A ``point_refused`` event through the agent's trainer socket, as a trainer reports one, so the
        study report (which reads only InfluxDB) leaves the point out on this GPU."""
        if self.agent_socket is None:
            return
        point = self.plan.start.points[index]
        keys = {"point": index, "batch_size": point.batch_size, "power_limit": limit_label(point.power_limit)}
        reporter = AgentReporter(self.agent_socket)
        try:
            reporter.send(
                probe_event_line(
                    probe=self.probe_id,
                    workload=point.workload,
                    kind="point_refused",
                    phase="warmup",
                    status="running",
                    time_unix_ns=time.time_ns(),
                    message=message,
                    gpu=gpu,
                    study=keys,
                )
            )
        finally:
            reporter.close()

    async def _start_trainers(self) -> None:
        env = dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID", PYTHONUNBUFFERED="1")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        for state in self.trainers:
            segment = self.segments[state.segment]
            args = [*self.trainer_command, *self.plan.trainer_args(state.gpu, self.agent_socket, segment)]
            name = "cpu" if state.gpu is None else f"gpu{state.gpu}"
            if len(self.segments) > 1:
                name += f"-{state.segment}-{segment.workload}"
            state.stderr_path = self.work_dir / f"trainer-{name}.log"
            with state.stderr_path.open("wb") as err:
                proc = await asyncio.create_subprocess_exec(
                    *args,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=err,
                    env=env,
                    limit=1 << 20,  # a result line carries every phase and sweep point
                )
            log.info("probe %s: started trainer pid %d: %s", self.probe_id, proc.pid, " ".join(args))
            self._procs.append(proc)

    async def _stop_trainers(self) -> None:
        for proc in self._procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in self._procs:
            try:
                await asyncio.wait_for(proc.wait(), max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                log.warning("probe %s: trainer pid %d ignored SIGTERM; killing it", self.probe_id, proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()

    async def run(self) -> control_pb2.ProbeResult:
        recorder = ReadingRecorder(self.gpus, self.plan.gpu_indices, self.sample_interval_s)
        recorder.start()
        ticker: asyncio.Task[None] | None = None
        readers: asyncio.Future[Any] | None = None
        cancelled = False
        try:
            await self._start_trainers()
            ticker = asyncio.create_task(self._publish_progress_every_second())
            readers = asyncio.gather(
                *(self._read_trainer(p, s) for p, s in zip(self._procs, self.trainers, strict=True))
            )
            wait_cancel: asyncio.Future[Any] = asyncio.create_task(self._cancelled.wait())
            start_delay_s = max(0.0, (self.plan.start.start_at_unix_ns - time.time_ns()) / 1e9)
            limit_s = start_delay_s + self.plan.planned_s() * 1.5 + 300
            done, _ = await asyncio.wait({readers, wait_cancel}, timeout=limit_s, return_when=asyncio.FIRST_COMPLETED)
            if readers not in done:
                cancelled = wait_cancel in done
                if not cancelled:
                    log.error("probe %s: the trainers overran the plan by far; stopping them", self.probe_id)
                await self._stop_trainers()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(readers, 10)
            wait_cancel.cancel()
        except Exception as e:
            log.exception("probe %s failed to run", self.probe_id)
            await self._stop_trainers()
            return self._result(status="failed", message=f"{type(e).__name__}: {e}", readings={})
        finally:
            await self._wind_down(readers, ticker, recorder)
        return self._result(status="cancelled" if cancelled else None, message="", readings=recorder.readings)

    async def _wind_down(
        self, readers: asyncio.Future[Any] | None, ticker: asyncio.Task[None] | None, recorder: ReadingRecorder
    ) -> None:
        """However the probe ended: no trainer line is read any more (a late warm-up line must not set a
        limit after the restore), every power limit is restored, then the recorder stops."""
        if readers is not None and not readers.done():
            readers.cancel()
            with contextlib.suppress(BaseException):
                await readers
        if ticker is not None:
            ticker.cancel()
        try:
            if self.power_limits is not None:
                await asyncio.to_thread(self.power_limits.restore)  # never raises for one GPU
        finally:
            await asyncio.to_thread(recorder.stop)

    # --- the result -----------------------------------------------------------------------------------

    def _failed_during(self) -> list[str]:
        """GPUs of the probe that are failed now (they were not when it was accepted)."""
        try:
            health = self.gpus.health()
        except Exception:
            return []
        out = []
        for gpu in self.plan.gpu_indices:
            value, reason = health.get(gpu, (common_pb2.GPU_HEALTH_UNSPECIFIED, ""))
            if value == common_pb2.GPU_HEALTH_FAILED:
                out.append(f"{describe_health(gpu, value, reason)} (it failed during the probe)")
        return out

    def _trainer_failure(self, state: TrainerState) -> str:
        tail = ""
        if state.stderr_path is not None:
            with contextlib.suppress(OSError):
                lines = state.stderr_path.read_text(errors="replace").strip().splitlines()
                tail = " | ".join(lines[-3:])
        where = "cpu" if state.gpu is None else f"gpu {state.gpu}"
        return f"trainer on {where} exited with status {state.returncode} without a result" + (
            f": {tail}" if tail else ""
        )

    def _result(self, status: str | None, message: str, readings: dict[int, list[Reading]]) -> control_pb2.ProbeResult:
        statuses = []
        messages = [message] if message else []
        messages += self.plan.health_notes()
        messages += self._failed_during()
        for state in self.trainers:
            if state.result is None:
                statuses.append("failed")
                messages.append(self._trainer_failure(state))
            else:
                statuses.append(state.result["status"])
                if state.result.get("message"):
                    messages.append(state.result["message"])
        if status is None:
            status = next((s for s in ("failed", "cancelled") if s in statuses), "succeeded")
        result = control_pb2.ProbeResult(
            probe_id=self.probe_id,
            host=self.host,
            status=STATUSES[status],
            message="; ".join(dict.fromkeys(messages))[:4096],
            workload=",".join(self.plan.workloads),
            size=control_pb2.WORKLOAD_SIZE_TINY if self.plan.size == "tiny" else control_pb2.WORKLOAD_SIZE_FULL,
            ended_unix_ns=time.time_ns(),
        )
        results = [s.result for s in self.trainers if s.result is not None]
        starts = [r["started_unix_ns"] for r in results if r.get("started_unix_ns")]
        result.started_unix_ns = min(starts) if starts else 0
        # what computed the throughput: a simulated GPU's figures are its performance model's (marked everywhere)
        result.device = ",".join(sorted({str(r["device_kind"]) for r in results if r.get("device_kind")}))
        if self.plan.is_study:
            self._study_result(result, readings)
            return result
        points = [(s, s.result["points"][0]) for s in self.trainers if s.result and s.result.get("points")]
        if points:
            result.batch_size = int(points[0][1]["batch_size"])
            steady = [p for _, p in points if p["steady_end_unix_ns"]]
            if steady:
                result.steady_start_unix_ns = min(p["steady_start_unix_ns"] for p in steady)
                result.steady_end_unix_ns = max(p["steady_end_unix_ns"] for p in steady)
        elif self.plan.start.HasField("batch_size"):
            result.batch_size = self.plan.start.batch_size
        per_gpu: list[control_pb2.ProbeMetrics] = []
        for state, point in points:
            per_gpu.append(self._gpu_metrics(state, point, readings))
        result.gpus.extend(m for m in per_gpu if m.HasField("gpu_index"))
        result.total.CopyFrom(_total(per_gpu, readings, result.steady_start_unix_ns, result.steady_end_unix_ns))
        return result

    def _study_result(self, result: control_pb2.ProbeResult, readings: dict[int, list[Reading]]) -> None:
        """One ``PointResult`` per study point: per-GPU metrics over that point's steady phase."""
        ran: dict[int, list[tuple[TrainerState, dict[str, Any]]]] = {}
        for state in self.trainers:
            for point in (state.result or {}).get("points", []):
                ran.setdefault(int(point.get("index", 0)), []).append((state, point))
        steady_starts, steady_ends = [], []
        for index, spec in enumerate(self.plan.start.points):
            out = result.points.add(index=index, workload=spec.workload, batch_size=spec.batch_size)
            out.power_limit = limit_label(spec.power_limit)
            reasons: list[str] = []
            per_gpu: list[control_pb2.ProbeMetrics] = []
            window: list[tuple[int, int]] = []
            for state, point in ran.get(index, []):
                failure = self._limit_failures.get((state.gpu, index)) if state.gpu is not None else None
                where = "the CPU" if state.gpu is None else f"GPU {state.gpu}"
                if point.get("error") or failure:
                    reasons.append(f"{where}: {failure or point['error']}")
                    continue
                per_gpu.append(self._gpu_metrics(state, point, readings))
                if state.result and state.result.get("device_kind"):
                    out.device = str(state.result["device_kind"])
                if point.get("steady_end_unix_ns"):
                    window.append((int(point["steady_start_unix_ns"]), int(point["steady_end_unix_ns"])))
            if not ran.get(index) and result.status == common_pb2.PROBE_STATUS_SUCCEEDED:
                reasons.append("no trainer reported this point")
            out.refused = "; ".join(reasons)[:4096]
            out.gpus.extend(m for m in per_gpu if m.HasField("gpu_index"))
            start_ns = min((w[0] for w in window), default=0)
            end_ns = max((w[1] for w in window), default=0)
            out.total.CopyFrom(_total(per_gpu, readings, start_ns, end_ns))
            if window:
                steady_starts.append(start_ns)
                steady_ends.append(end_ns)
        if steady_starts:
            result.steady_start_unix_ns = min(steady_starts)
            result.steady_end_unix_ns = max(steady_ends)

    def _gpu_metrics(
        self, state: TrainerState, point: dict[str, Any], readings: dict[int, list[Reading]]
    ) -> control_pb2.ProbeMetrics:
        """One trainer's steady phase of one point, with its GPU's readings (none on the CPU)."""
        phases = state.result["phases"] if state.result else []
        metrics = _metrics(point, phases, readings.get(state.gpu, []) if state.gpu is not None else [])
        if state.gpu is not None:
            metrics.gpu_index = state.gpu
            uuid = self._uuid(state.gpu)
            if uuid:
                metrics.gpu_uuid = uuid
        return metrics

    def _uuid(self, gpu: int) -> str:
        infos = self.gpus.infos()
        return infos[gpu].uuid if gpu < len(infos) else ""


def _window(readings: list[Reading], start_ns: int, end_ns: int) -> list[Reading]:
    return [r for r in readings if start_ns <= r.time_unix_ns <= end_ns]


def _mean_power(readings: list[Reading], start_ns: int, end_ns: int) -> tuple[float | None, float | None]:
    """(energy in J, mean power in W) over the window by :func:`gpuprobe.energy.window_energy`, the
    formula ``gpuprobe model`` and ``study report`` use: the counter with resets bridged, else power."""
    if end_ns <= start_ns or not readings:
        return None, None
    t_ns = np.array([r.time_unix_ns for r in readings], dtype=np.int64)
    power_w = np.array([math.nan if r.power_w is None else r.power_w for r in readings], dtype=float)
    energy_j = np.array([math.nan if r.energy_j is None else r.energy_j for r in readings], dtype=float)
    energy = window_energy(t_ns, energy_j, power_w, start_ns, end_ns)
    return energy.energy_j, energy.mean_power_w


def _metrics(point: dict[str, Any], phases: list[dict[str, Any]], readings: list[Reading]) -> control_pb2.ProbeMetrics:
    m = control_pb2.ProbeMetrics()
    if point.get("samples_per_s") is not None:
        m.samples_per_s = float(point["samples_per_s"])
    m.samples = int(point.get("samples") or 0)
    start, end = int(point.get("steady_start_unix_ns") or 0), int(point.get("steady_end_unix_ns") or 0)
    if readings and end > start:
        energy, mean_power = _mean_power(readings, start, end)
        if energy is not None:
            m.energy_j = energy
            if m.samples:
                m.j_per_sample = energy / m.samples
        if mean_power is not None:
            m.mean_power_w = mean_power
        inside = _window(readings, start, end)
        powers = [r.power_w for r in inside if r.power_w is not None]
        temps = [r.temp_c for r in inside if r.temp_c is not None]
        if powers:
            m.peak_power_w = max(powers)
        if temps:
            m.peak_temp_c = max(temps)
    idle = next((p for p in phases if p["phase"] == "idle" and p["end_unix_ns"] > p["start_unix_ns"]), None)
    if readings and idle is not None:
        _, idle_power = _mean_power(readings, idle["start_unix_ns"], idle["end_unix_ns"])
        if idle_power is not None:
            m.idle_power_w = idle_power
    return m


def _total(
    per_gpu: list[control_pb2.ProbeMetrics], readings: dict[int, list[Reading]], start_ns: int, end_ns: int
) -> control_pb2.ProbeMetrics:
    total = control_pb2.ProbeMetrics()
    if not per_gpu:
        return total
    total.samples = sum(m.samples for m in per_gpu)

    def summed(name: str) -> None:
        if all(m.HasField(name) for m in per_gpu):
            setattr(total, name, sum(getattr(m, name) for m in per_gpu))

    for name in ("samples_per_s", "energy_j", "mean_power_w", "idle_power_w"):
        summed(name)
    if total.HasField("energy_j") and total.samples:
        total.j_per_sample = total.energy_j / total.samples
    temps = [m.peak_temp_c for m in per_gpu if m.HasField("peak_temp_c")]
    if temps:
        total.peak_temp_c = max(temps)
    # the peak of the node's summed power: the recorder reads every GPU in the same pass
    series = [_window(r, start_ns, end_ns) for r in readings.values()]
    if series and all(series):
        n = min(len(s) for s in series)
        sums = [sum(s[i].power_w or 0.0 for s in series) for i in range(n)]
        if sums and all(r.power_w is not None for s in series for r in s[:n]):
            total.peak_power_w = max(sums)
    return total
