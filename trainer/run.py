"""Part: trainer. One training run in phases: idle baseline -> warm-up -> steady load -> cool-down.

Timeline (wall clock, ns since the Unix epoch; every boundary is reported with its timestamp)::

    pending   until --start-at (the model is already built, so a synchronized start is not delayed)
    idle      until start + idle baseline: the model is resident, the device does nothing
    warmup    until start + idle + warm-up (planned, absolute) and at least one step: excluded
    steady    --duration s of training: the results are computed over this phase only
    cooldown  --cooldown s: the device idles again, the temperatures decay
    done

With a batch-size sweep, warm-up and steady repeat for each batch size (one idle baseline before,
one cool-down after). In a study (``--plan``, set by the control plane) they repeat for each of the
run's *points*, and point k occupies a fixed slot of the study's schedule; a point the node does not
run (its power limit was refused) is reported as ``point_refused`` and its slot is idle. The idle
baseline and every warm-up end at planned absolute times counted from ``--start-at`` (slot k starts
at start + idle baseline + k x (warm-up + steady)), so runs started together on many nodes enter each
steady phase together (to within one training step), even when one of them was late to start (its
idle baseline is then shorter); a steady phase lasts ``--duration``, and a late step only shortens
the next warm-up, so a run never drifts from the plan.

On a simulated GPU the progress (samples, steps, samples/s, step time) is the simulated device's:
the simulator's performance model at the SM clock the GPU reports, integrated over wall time, while
real steps of the real model run on the CPU with a small real batch (:mod:`.simgpu`). Everything
reported says ``device`` = ``sim``, ``cuda`` or ``cpu``.

Each boundary is taken after the device has finished the queued work (``cuda.synchronize``), and so
are the progress windows: step time and samples/s are real, not launch rates.

Everything the run produces goes to ``emit`` as plain dicts (``type`` = ``phase``, ``progress``,
``result``): the CLI prints them, writes them as JSON lines for the control plane, and forwards
them to the local agent's trainer socket (:mod:`gpuprobe.trainer.agent_socket`).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuprobe import workloads
from gpuprobe.errors import ServiceError
from gpuprobe.trainer import device, simgpu
from gpuprobe.trainer.agent_socket import AgentReporter, probe_event_line, progress_line

log = logging.getLogger(__name__)

Event = dict[str, Any]
Emit = Callable[[Event], None]

SLEEP_SLICE_S = 0.05


# On a simulated GPU the CPU computes real steps with at most this many samples (full-size models);
# the reported progress is the simulated device's at the requested batch size.
SIM_REAL_BATCH_FULL = 2
# ... and rests this many times each real step's length after it, on one torch thread: the real steps
# only prove the training loop (the progress is the simulated device's), and a machine of several
# simulated GPUs has one such trainer per GPU beside its agent, collector and InfluxDB. Unpaced, eight
# trainers took both cores of a 2-core machine, each with two threads spinning for a core the other
# held; paced, each takes at most a quarter of a core.
SIM_REST_PER_STEP = 3.0


@dataclass(frozen=True)
class PlanPoint:
    """One point of a study as this run executes it: a slot of the study's schedule."""

    index: int  # the point's index in the study: its slot
    batch_size: int
    power_limit: str = ""  # the requested limit's label ("60%"), for the reports
    power_limit_w: float | None = None  # what the agent set for this GPU
    refused: str = ""  # why this node does not run the point (then its slot is idle)

    @classmethod
    def from_dict(cls, item: dict[str, Any]) -> PlanPoint:
        try:
            limit_w = item.get("power_limit_w")
            point = cls(
                index=int(item["index"]),
                batch_size=int(item["batch_size"]),
                power_limit=str(item.get("power_limit", "")),
                power_limit_w=None if limit_w is None else float(limit_w),
                refused=str(item.get("refused", "")),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"a plan point needs an integer index and batch_size: {item!r} ({e})") from None
        if point.index < 0 or point.batch_size <= 0:
            raise ValueError(f"a plan point needs index >= 0 and batch_size > 0: {item!r}")
        return point


def parse_plan(text: str) -> tuple[PlanPoint, ...]:
    """``--plan``: a JSON list of points ``{"index", "batch_size", "power_limit", "power_limit_w", "refused"}``."""
    import json

    try:
        items = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--plan is not JSON: {e}") from None
    if not isinstance(items, list) or not items or not all(isinstance(i, dict) for i in items):
        raise ValueError("--plan must be a non-empty JSON list of objects")
    plan = tuple(PlanPoint.from_dict(item) for item in items)
    indices = [p.index for p in plan]
    if indices != sorted(set(indices)):
        raise ValueError(f"--plan point indices must increase: {indices}")
    return plan


@dataclass(frozen=True)
class TrainSettings:
    workload: str
    size: str = "full"
    device: str = "auto"
    batch_sizes: tuple[int, ...] = ()  # empty: the workload's default for the size
    duration_s: float = workloads.DEFAULT_DURATION_S
    idle_baseline_s: float = workloads.DEFAULT_IDLE_BASELINE_S
    warmup_s: float = workloads.DEFAULT_WARMUP_S
    cooldown_s: float = workloads.DEFAULT_COOLDOWN_S
    probe_id: str = ""
    agent_socket: Path | None = None
    start_at_unix_ns: int = 0  # 0: now
    progress_interval_s: float = 1.0
    threads: int = 0  # torch intra-op threads; 0: torch's default
    seed: int = 0
    plan: tuple[PlanPoint, ...] = ()  # a study's points for this run (empty: the batch sizes, in order)

    def validate(self) -> None:
        if self.workload not in workloads.WORKLOADS:
            raise ValueError(f"unknown workload {self.workload!r}; built in: {', '.join(workloads.WORKLOAD_NAMES)}")
        if self.size not in workloads.SIZES:
            raise ValueError(f"size must be tiny or full, not {self.size!r}")
        if not self.duration_s > 0 or not math.isfinite(self.duration_s):
            raise ValueError(f"the steady phase needs a positive duration, not {self.duration_s}")
        for name in ("idle_baseline_s", "warmup_s", "cooldown_s"):
            value = getattr(self, name)
            if not 0 <= value < 86400:
                raise ValueError(f"{name} must be between 0 and 86400 s, not {value}")
        if any(b <= 0 for b in self.batch_sizes):
            raise ValueError(f"batch sizes must be positive, not {list(self.batch_sizes)}")
        if not self.progress_interval_s > 0:
            raise ValueError("the progress interval must be positive")

    def resolved_batch_sizes(self) -> tuple[int, ...]:
        if self.plan:
            return tuple(p.batch_size for p in self.plan)
        return self.batch_sizes or (workloads.WORKLOADS[self.workload].default_batch[self.size],)

    def points(self) -> tuple[PlanPoint, ...]:
        """What this run executes: the plan, or one point per batch size in slots 0, 1, ..."""
        return self.plan or tuple(PlanPoint(i, b) for i, b in enumerate(self.resolved_batch_sizes()))

    @property
    def slot_s(self) -> float:
        return self.warmup_s + self.duration_s

    def slot_start_ns(self, anchor_ns: int, index: int) -> int:
        """When point ``index`` starts its warm-up, given the schedule's start ``anchor_ns``."""
        return anchor_ns + int((self.idle_baseline_s + index * self.slot_s) * 1e9)

    def planned_s(self) -> float:
        """Planned length of all phases from the start time (to the end of this run's last slot)."""
        last = self.points()[-1].index
        return self.idle_baseline_s + (last + 1) * self.slot_s + self.cooldown_s


@dataclass
class SteadyPoint:
    """The steady phase at one batch size."""

    batch_size: int
    index: int = 0
    power_limit: str = ""
    power_limit_w: float | None = None
    start_unix_ns: int = 0
    end_unix_ns: int = 0
    steps: float = 0  # on a simulated GPU the simulated device's, which need not be whole
    samples: float = 0
    first_loss: float | None = None  # the first step of this batch size (in warm-up)
    last_loss: float | None = None
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        seconds = (self.end_unix_ns - self.start_unix_ns) / 1e9 if self.end_unix_ns > self.start_unix_ns else 0.0
        return {
            "index": self.index,
            "batch_size": self.batch_size,
            "power_limit": self.power_limit,
            "power_limit_w": self.power_limit_w,
            "steady_start_unix_ns": self.start_unix_ns,
            "steady_end_unix_ns": self.end_unix_ns,
            "steady_s": seconds,
            "steps": int(self.steps),
            "samples": round(self.samples),
            "samples_per_s": self.samples / seconds if seconds > 0 and self.steps else None,
            "step_time_s": seconds / self.steps if self.steps else None,
            "first_loss": self.first_loss,
            "last_loss": self.last_loss,
            "error": self.error,
        }


class Cancelled(ServiceError):
    """The run was asked to stop (SIGTERM, SIGINT, a probe cancel)."""


@dataclass
class _Window:
    """Progress since the last report."""

    t_ns: int
    steps: float = 0
    samples: float = 0


@dataclass
class Run:
    config: TrainSettings
    emit: Emit
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.spec = workloads.WORKLOADS[self.config.workload]
        self.reporter = AgentReporter(self.config.agent_socket) if self.config.agent_socket else None
        self.phase = "pending"
        self.phases: list[dict[str, Any]] = []
        self.points: list[SteadyPoint] = []
        self.step = 0
        self.batch_size = self.config.resolved_batch_sizes()[0]
        self.trainable: Any = None
        self.placement: device.Placement | None = None
        self.sim: simgpu.SimGpuLoad | None = None
        self.throughput: simgpu.SimThroughput | None = None  # the simulated device's speed
        self.device_label = "cpu"  # the `device` tag: cuda, cpu or sim
        self.point: PlanPoint | None = None  # the study point being run (in a study)
        self._accounted_ns = 0  # simulated progress is counted up to here
        self._steady_point: SteadyPoint | None = None
        # the point whose steady phase just ended, until the event of the next phase carries its count
        self._ended_point: SteadyPoint | None = None
        self._temp_slowdown_c: float | None = None
        self._anchor_ns = 0  # the schedule's start (--start-at, or when the run began)
        self._sim_steps = 0.0  # the simulated device's optimizer steps
        self.mem_bytes = 0
        self.last_loss: Any = None  # tensor of the last step
        self.started_unix_ns = 0
        self._next_progress = 0.0
        self._window = _Window(time.time_ns())

    # --- reporting -------------------------------------------------------------------------------------

    def _send_agent(self, message: dict[str, Any]) -> None:
        if self.reporter is not None:
            self.reporter.send(message)

    def _enter(self, phase: str, t_ns: int | None = None) -> int:
        t_ns = time.time_ns() if t_ns is None else t_ns
        self._account(t_ns)  # the previous phase's simulated progress ends here
        if self.phases and self.phases[-1]["end_unix_ns"] == 0:
            self.phases[-1]["end_unix_ns"] = t_ns
        previous, self.phase = self.phase, phase
        if phase != "done":
            self.phases.append({"phase": phase, "batch_size": self.batch_size, "start_unix_ns": t_ns, "end_unix_ns": 0})
        if self.sim is not None and phase != "done":
            util = self.throughput.util_pct(self.batch_size) if self.throughput is not None else None
            self.sim.phase(phase, self.mem_bytes, util)
        event: Event = {
            "type": "phase",
            "phase": phase,
            "previous": previous,
            "time_unix_ns": t_ns,
            "batch_size": self.batch_size,
        }
        if self.config.plan and self.point is not None:
            event["point"] = self.point.index
        self.emit(event)
        if self.config.probe_id and phase != "done":
            kind = "start" if previous == "pending" else "phase_change"
            ended, self._ended_point = (self._ended_point if previous == "steady" else None), None
            self._send_agent(
                probe_event_line(
                    probe=self.config.probe_id,
                    workload=self.config.workload,
                    kind=kind,
                    phase=phase,
                    status="running",
                    time_unix_ns=t_ns,
                    gpu=self.placement.gpu_index if self.placement else None,
                    study=self._study_fields(phase),
                    # the steady phase that ends here: its count, as the result's point has it (round)
                    steady_samples=round(ended.samples) if ended is not None else None,
                )
            )
        self._window = _Window(t_ns)
        self._next_progress = time.monotonic() + self.config.progress_interval_s
        return t_ns

    @property
    def steps_done(self) -> int:
        """Optimizer steps so far: the simulated device's on a simulated GPU, else the real ones."""
        return int(self._sim_steps) if self.throughput is not None else self.step

    def _study_fields(self, phase: str) -> dict[str, Any] | None:
        """A study point's keys for a probe event (None outside a study, and outside its points)."""
        if not self.config.plan or self.point is None or phase not in ("warmup", "steady"):
            return None
        return {
            "point": self.point.index,
            "batch_size": self.point.batch_size,
            "power_limit": self.point.power_limit,
            "power_limit_w": self.point.power_limit_w,
            "temp_slowdown_c": self._temp_slowdown_c,
        }

    def _account(self, t_ns: int) -> None:
        """Count the simulated device's progress up to ``t_ns`` (at the SM clock it runs at now).

        Only in warm-up and steady: the GPU does no training in the other phases."""
        if self.throughput is None:
            return
        since = self._accounted_ns
        if t_ns <= since:
            return
        self._accounted_ns = t_ns
        if self.phase not in ("warmup", "steady") or since == 0:
            return
        samples = self.throughput.samples_per_s(self.batch_size) * (t_ns - since) / 1e9
        self._count(samples)

    def _count(self, samples: float) -> None:
        steps = samples / self.batch_size
        if self.throughput is not None:
            self._sim_steps += steps
        self._window.steps += steps
        self._window.samples += samples
        if self._steady_point is not None and self.phase == "steady":
            self._steady_point.steps += steps
            self._steady_point.samples += samples

    def _progress(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now < self._next_progress:
            return
        self._next_progress = now + self.config.progress_interval_s
        if self.trainable is not None and self._window.steps:
            self.trainable.synchronize()
        t_ns = time.time_ns()
        self._account(t_ns)
        seconds = (t_ns - self._window.t_ns) / 1e9
        samples_per_s = step_time_s = loss = None
        if self._window.steps and seconds > 0:
            samples_per_s = self._window.samples / seconds
            step_time_s = seconds / self._window.steps
        if self.last_loss is not None and self.phase in ("warmup", "steady"):
            loss = float(self.last_loss.item())
        # from the schedule's start, as planned_s counts (a later workload of a study starts mid-way)
        elapsed = max(0.0, (t_ns - self._anchor_ns) / 1e9) if self._anchor_ns else 0.0
        planned = self.config.planned_s()
        event = {
            "type": "progress",
            "time_unix_ns": t_ns,
            "phase": self.phase,
            "step": self.steps_done,
            "batch_size": self.batch_size,
            "samples_per_s": samples_per_s,
            "step_time_s": step_time_s,
            "loss": loss if loss is None or math.isfinite(loss) else None,
            "elapsed_s": elapsed,
            "fraction_done": min(1.0, elapsed / planned) if planned > 0 else 1.0,
            "device": self.device_label,
        }
        if self.config.plan and self.point is not None:
            event["point"] = self.point.index
        self.emit(event)
        self._send_agent(
            progress_line(
                workload=self.config.workload,
                step=self.steps_done,
                batch_size=self.batch_size if self.spec.needs_torch else 0,
                phase=self.phase,
                time_unix_ns=t_ns,
                samples_per_s=samples_per_s,
                step_time_s=step_time_s,
                loss=loss,
                gpu=self.placement.gpu_index if self.placement else None,
                probe=self.config.probe_id,
                device=self.device_label,
                point=self.point.index if self.config.plan and self.point is not None else None,
            )
        )
        self._window = _Window(t_ns)

    # --- time ------------------------------------------------------------------------------------------

    def _check_stop(self) -> None:
        if self.stop.is_set():
            raise Cancelled()

    def _idle_until(self, t_ns: int) -> None:
        """Do nothing on the device until ``t_ns``, reporting progress as usual."""
        while True:
            self._check_stop()
            if self.phase != "pending":
                self._progress()
            left = (t_ns - time.time_ns()) / 1e9
            if left <= 0:
                return
            self.stop.wait(min(left, SLEEP_SLICE_S))

    def _train_until(self, deadline_ns: int, min_steps: int, batch: Any) -> int:
        """Train until ``deadline_ns`` (and at least ``min_steps`` real steps); returns the synchronized end time."""
        steps = 0
        while True:
            self._check_stop()
            if steps >= min_steps and time.time_ns() >= deadline_ns:
                break
            if self.trainable is None:  # idle workload: nothing to compute
                self._idle_until(deadline_ns)
                break
            step_start_ns = time.monotonic_ns()
            loss = self.trainable.step(batch)
            self.last_loss = loss
            steps += 1
            self.step += 1
            if self.throughput is None:
                self._count(self.batch_size)
            else:
                self.trainable.synchronize()
                rest_ns = int((time.monotonic_ns() - step_start_ns) * SIM_REST_PER_STEP)
                self._idle_until(min(deadline_ns, time.time_ns() + rest_ns))
            self._progress()
        if self.trainable is not None:
            self.trainable.synchronize()
        return time.time_ns()

    # --- the run -------------------------------------------------------------------------------------

    def prepare(self) -> None:
        """Resolve the device and build the model (before the start time, so the start is not delayed)."""
        cfg = self.config
        self.placement = device.resolve(cfg.device, need_torch=self.spec.needs_torch)
        if self.spec.needs_torch:
            import torch

            from gpuprobe.trainer.models import Trainable

            if cfg.threads > 0:
                torch.set_num_threads(cfg.threads)
            elif self.placement.sim is not None:
                torch.set_num_threads(1)  # see SIM_REST_PER_STEP
            self.trainable = Trainable(cfg.workload, cfg.size, torch.device(self.placement.torch_device), cfg.seed)
        if self.placement.sim is not None:
            self.sim = simgpu.SimGpuLoad(self.placement.sim, cfg.workload)
            self.device_label = "sim"
            if self.spec.needs_torch:
                self.throughput = simgpu.SimThroughput(self.placement.sim, cfg.workload, cfg.size)
                self._temp_slowdown_c = self.throughput.temp_slowdown_c()
            self._update_memory(self.batch_size)
        elif self.placement.torch_device.startswith("cuda"):
            self.device_label = "cuda"

    def _update_memory(self, batch_size: int) -> None:
        if self.trainable is not None:
            self.mem_bytes = simgpu.memory_estimate_bytes(
                self.config.workload,
                self.config.size,
                self.trainable.params,
                batch_size,
                self.trainable.optimizer_states,
            )

    def execute(self) -> dict[str, Any]:
        """Run every phase; returns the result (also emitted). Never raises for a failed or cancelled run."""
        cfg = self.config
        status, message = "succeeded", ""
        try:
            if cfg.start_at_unix_ns and cfg.start_at_unix_ns > time.time_ns():
                self._idle_until(cfg.start_at_unix_ns)
            # The schedule hangs on the requested start, not on this trainer's: one that was slow to
            # get ready (importing torch, building the model) has a shorter idle baseline, and still
            # enters its steady phase with the others.
            anchor = self._anchor_ns = cfg.start_at_unix_ns or time.time_ns()
            if cfg.points()[0].index == 0:  # the study's first slot: this run has the idle baseline
                t0 = self.started_unix_ns = self._enter("idle")
                late_s = (t0 - anchor) / 1e9
                if late_s > 0.5:
                    log.warning(
                        "started %.1f s after the requested start time; the idle baseline is %.1f s shorter",
                        late_s,
                        min(late_s, cfg.idle_baseline_s),
                    )
            # a later workload of a study stays pending (the GPU is another trainer's) until its first slot
            points = cfg.points()
            boundary: int | None = None  # the end of the previous phase, where the next one starts
            for point in points:
                boundary = self._run_point(point, anchor, boundary)
            t_cool = self._enter("cooldown", boundary)
            self._idle_until(t_cool + int(cfg.cooldown_s * 1e9))
        except Cancelled:
            status, message = "cancelled", "stopped by a signal or a probe cancel"
        except Exception as e:  # a crash of the workload is a failed run, reported like any other
            log.exception("the workload failed")
            status, message = "failed", f"{type(e).__name__}: {e}"
        finally:
            if self.sim is not None:
                self.sim.release()
        return self.finish(status, message)

    def _run_point(self, plan: PlanPoint, anchor_ns: int, start_ns: int | None) -> int:
        """Warm-up and steady phase of one point in its slot; returns the steady phase's end.

        The warm-up starts where the previous phase ended (``start_ns``), or at the slot's start when
        the run is not yet there; it ends at the slot's start + warm-up, the steady phase --duration
        later (each after at least one step)."""
        cfg = self.config
        slot_ns = cfg.slot_start_ns(anchor_ns, plan.index)
        self.point = plan
        point = SteadyPoint(plan.batch_size, plan.index, plan.power_limit, plan.power_limit_w)
        if plan.refused:
            return self._skip_point(plan, point, slot_ns, start_ns)
        if start_ns is None or start_ns < slot_ns:  # not there yet: pending, idle baseline, or a refused slot
            self._idle_until(slot_ns)
            start_ns = None
        self.batch_size = plan.batch_size
        self._update_memory(plan.batch_size)
        self._enter("warmup", start_ns)
        if self.started_unix_ns == 0:
            self.started_unix_ns = self.phases[-1]["start_unix_ns"]
        try:
            batch = self.trainable.make_batch(self._real_batch(plan.batch_size)) if self.trainable is not None else None
            if self.trainable is not None:
                first = self.trainable.step(batch)
                point.first_loss = float(first.item())
                self.last_loss = first
                self.step += 1
                if self.throughput is None:
                    self._count(plan.batch_size)
            self._train_until(slot_ns + int(cfg.warmup_s * 1e9), 0, batch)
            self._steady_point = point
            point.start_unix_ns = self._enter("steady", self._sync_now())
            # the full --duration even when the steady phase started late (the next warm-up is then
            # shorter: the schedule does not drift)
            steady_end_ns = max(slot_ns + int(cfg.slot_s * 1e9), point.start_unix_ns + int(cfg.duration_s * 1e9))
            point.end_unix_ns = self._train_until(steady_end_ns, 1, batch)
            self._account(point.end_unix_ns)
            if self._window.steps:
                self._progress(force=True)  # the steady phase's last window
        except Cancelled:
            raise
        except Exception as e:
            if self.trainable is None:
                raise
            from gpuprobe.trainer.models import is_out_of_memory

            if not is_out_of_memory(e) or len(cfg.points()) == 1:
                raise
            point.error = f"out of memory at batch size {plan.batch_size}"
            log.warning("%s; continuing the sweep", point.error)
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        finally:
            # the count goes out with the next phase's event (entered after this returns); not with an error
            self._ended_point = None if point.error else point
            self._steady_point = None
            if self.last_loss is not None and point.steps:
                loss = float(self.last_loss.item())
                point.last_loss = loss if math.isfinite(loss) else None
            self.points.append(point)
        return point.end_unix_ns or self._sync_now()

    def _skip_point(self, plan: PlanPoint, point: SteadyPoint, slot_ns: int, start_ns: int | None) -> int:
        """A point this node does not run: say why, and rest through its slot."""
        point.error = plan.refused
        self.points.append(point)
        log.warning(
            "point %d (batch %d, power limit %s) not run: %s",
            plan.index,
            plan.batch_size,
            plan.power_limit or "as is",
            plan.refused,
        )
        t_ns = time.time_ns()
        self.emit({"type": "point_refused", "point": plan.index, "time_unix_ns": t_ns, "message": plan.refused})
        if self.config.probe_id:
            self._send_agent(
                probe_event_line(
                    probe=self.config.probe_id,
                    workload=self.config.workload,
                    kind="point_refused",
                    phase=self.phase,
                    status="running",
                    time_unix_ns=t_ns,
                    message=plan.refused,
                    gpu=self.placement.gpu_index if self.placement else None,
                    study={"point": plan.index, "batch_size": plan.batch_size, "power_limit": plan.power_limit},
                )
            )
        if start_ns is not None and self.phase in ("warmup", "steady"):
            self._enter("idle", start_ns)
        self._idle_until(slot_ns + int(self.config.slot_s * 1e9))
        # this GPU's own clock, not the planned time: the next phase event of every GPU of the node
        # would otherwise carry the same timestamp (and overwrite each other in the `probe` series)
        return time.time_ns()

    def _real_batch(self, batch_size: int) -> int:
        """What the CPU computes per real step: on a simulated GPU a full-size model takes a small batch."""
        if self.throughput is not None and self.config.size == "full":
            return min(batch_size, SIM_REAL_BATCH_FULL)
        return batch_size

    def _sync_now(self) -> int:
        if self.trainable is not None:
            self.trainable.synchronize()
        return time.time_ns()

    def finish(self, status: str, message: str) -> dict[str, Any]:
        """End the run with ``status`` (also when it never started): emit and return the result."""
        t_end = time.time_ns()
        self._enter("done", t_end)
        cfg = self.config
        placement = self.placement
        result = {
            "type": "result",
            "status": status,
            "message": message,
            "workload": cfg.workload,
            "size": cfg.size,
            "probe": cfg.probe_id,
            "device": placement.describe() if placement else cfg.device,
            "gpu": placement.gpu_index if placement else None,
            "simulated": bool(placement and placement.sim is not None),
            "device_kind": self.device_label,
            "params": self.trainable.params if self.trainable is not None else 0,
            "started_unix_ns": self.started_unix_ns,
            "ended_unix_ns": t_end,
            "steps": self.steps_done,
            "real_steps": self.step,
            "phases": self.phases,
            "points": [p.as_dict() for p in self.points],
        }
        self.emit(result)
        if cfg.probe_id:
            self._send_agent(
                probe_event_line(
                    probe=cfg.probe_id,
                    workload=cfg.workload,
                    kind="end",
                    phase="done",
                    status=status,
                    time_unix_ns=t_end,
                    message=message,
                    gpu=placement.gpu_index if placement else None,
                )
            )
        if self.reporter is not None:
            self.reporter.close()
        return result


def run(config: TrainSettings, emit: Emit, stop: threading.Event | None = None) -> dict[str, Any]:
    """Validate, build, run every phase; the result dict (``status`` succeeded, failed or cancelled)."""
    config.validate()
    job = Run(config, emit, stop or threading.Event())
    job.prepare()
    return job.execute()
