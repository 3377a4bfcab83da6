"""One training run in phases: idle baseline -> warm-up -> steady load -> cool-down.

Timeline (wall clock, ns since the Unix epoch; every boundary is reported with its timestamp)::

    pending   until --start-at (the model is already built, so a synchronized start is not delayed)
    idle      until start + idle baseline: the model is resident, the device does nothing
    warmup    until start + idle + warm-up (planned, absolute) and at least one step: excluded
    steady    --duration s of training: the results are computed over this phase only
    cooldown  --cooldown s: the device idles again, the temperatures decay
    done

With a batch-size sweep, warm-up and steady repeat for each batch size (one idle baseline before,
one cool-down after). Idle baseline and warm-up end at planned absolute times counted from
``--start-at``, so runs started together on many nodes enter their steady phase together (to within
one training step), even when one of them was late to start (its idle baseline is then shorter).

Each boundary is taken after the device has finished the queued work (``cuda.synchronize``), and so
are the progress windows: step time and samples/s are real, not launch rates.

Everything the run produces goes to ``emit`` as plain dicts (``type`` = ``phase``, ``progress``,
``result``): the CLI prints them, writes them as JSON lines for the control plane, and forwards
them to the local agent's trainer socket (:mod:`gpuprobe.trainer.report`).
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

from gpuprobe.errors import ServiceError
from gpuprobe.trainer import catalog, device, simgpu
from gpuprobe.trainer.report import AgentReporter, probe_event_line, progress_line

log = logging.getLogger(__name__)

Event = dict[str, Any]
Emit = Callable[[Event], None]

SLEEP_SLICE_S = 0.05


@dataclass(frozen=True)
class TrainSettings:
    workload: str
    size: str = "full"
    device: str = "auto"
    batch_sizes: tuple[int, ...] = ()  # empty: the workload's default for the size
    duration_s: float = catalog.DEFAULT_DURATION_S
    idle_baseline_s: float = catalog.DEFAULT_IDLE_BASELINE_S
    warmup_s: float = catalog.DEFAULT_WARMUP_S
    cooldown_s: float = catalog.DEFAULT_COOLDOWN_S
    probe_id: str = ""
    agent_socket: Path | None = None
    start_at_unix_ns: int = 0  # 0: now
    progress_interval_s: float = 1.0
    threads: int = 0  # torch intra-op threads; 0: torch's default
    seed: int = 0

    def validate(self) -> None:
        if self.workload not in catalog.WORKLOADS:
            raise ValueError(f"unknown workload {self.workload!r}; built in: {', '.join(catalog.WORKLOAD_NAMES)}")
        if self.size not in catalog.SIZES:
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
        return self.batch_sizes or (catalog.WORKLOADS[self.workload].default_batch[self.size],)

    def planned_s(self) -> float:
        """Planned length of all phases (warm-up and steady once per batch size)."""
        n = len(self.resolved_batch_sizes())
        return self.idle_baseline_s + n * (self.warmup_s + self.duration_s) + self.cooldown_s


@dataclass
class SteadyPoint:
    """The steady phase at one batch size."""

    batch_size: int
    start_unix_ns: int = 0
    end_unix_ns: int = 0
    steps: int = 0
    samples: int = 0
    first_loss: float | None = None  # the first step of this batch size (in warm-up)
    last_loss: float | None = None
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        seconds = (self.end_unix_ns - self.start_unix_ns) / 1e9 if self.end_unix_ns > self.start_unix_ns else 0.0
        return {
            "batch_size": self.batch_size,
            "steady_start_unix_ns": self.start_unix_ns,
            "steady_end_unix_ns": self.end_unix_ns,
            "steady_s": seconds,
            "steps": self.steps,
            "samples": self.samples,
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
    steps: int = 0
    samples: int = 0


@dataclass
class Run:
    config: TrainSettings
    emit: Emit
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.spec = catalog.WORKLOADS[self.config.workload]
        self.reporter = AgentReporter(self.config.agent_socket) if self.config.agent_socket else None
        self.phase = "pending"
        self.phases: list[dict[str, Any]] = []
        self.points: list[SteadyPoint] = []
        self.step = 0
        self.batch_size = self.config.resolved_batch_sizes()[0]
        self.trainable: Any = None
        self.placement: device.Placement | None = None
        self.sim: simgpu.SimGpuLoad | None = None
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
        if self.phases and self.phases[-1]["end_unix_ns"] == 0:
            self.phases[-1]["end_unix_ns"] = t_ns
        previous, self.phase = self.phase, phase
        if phase != "done":
            self.phases.append({"phase": phase, "batch_size": self.batch_size, "start_unix_ns": t_ns, "end_unix_ns": 0})
        if self.sim is not None and phase != "done":
            self.sim.phase(phase, self.mem_bytes)
        self.emit(
            {"type": "phase", "phase": phase, "previous": previous, "time_unix_ns": t_ns, "batch_size": self.batch_size}
        )
        if self.config.probe_id and phase != "done":
            kind = "start" if previous == "pending" else "phase_change"
            self._send_agent(
                probe_event_line(
                    probe=self.config.probe_id,
                    workload=self.config.workload,
                    kind=kind,
                    phase=phase,
                    status="running",
                    time_unix_ns=t_ns,
                )
            )
        self._window = _Window(t_ns)
        self._next_progress = time.monotonic() + self.config.progress_interval_s
        return t_ns

    def _progress(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now < self._next_progress:
            return
        self._next_progress = now + self.config.progress_interval_s
        if self.trainable is not None and self._window.steps:
            self.trainable.synchronize()
        t_ns = time.time_ns()
        seconds = (t_ns - self._window.t_ns) / 1e9
        samples_per_s = step_time_s = loss = None
        if self._window.steps and seconds > 0:
            samples_per_s = self._window.samples / seconds
            step_time_s = seconds / self._window.steps
        if self.last_loss is not None and self.phase in ("warmup", "steady"):
            loss = float(self.last_loss.item())
        elapsed = (t_ns - self.started_unix_ns) / 1e9 if self.started_unix_ns else 0.0
        planned = self.config.planned_s()
        event = {
            "type": "progress",
            "time_unix_ns": t_ns,
            "phase": self.phase,
            "step": self.step,
            "batch_size": self.batch_size,
            "samples_per_s": samples_per_s,
            "step_time_s": step_time_s,
            "loss": loss if loss is None or math.isfinite(loss) else None,
            "elapsed_s": elapsed,
            "fraction_done": min(1.0, elapsed / planned) if planned > 0 else 1.0,
        }
        self.emit(event)
        self._send_agent(
            progress_line(
                workload=self.config.workload,
                step=self.step,
                batch_size=self.batch_size if self.spec.needs_torch else 0,
                phase=self.phase,
                time_unix_ns=t_ns,
                samples_per_s=samples_per_s,
                step_time_s=step_time_s,
                loss=loss,
                gpu=self.placement.gpu_index if self.placement else None,
                probe=self.config.probe_id,
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

    def _train_until(self, deadline_ns: int, min_steps: int, point: SteadyPoint | None, batch: Any) -> int:
        """Train until ``deadline_ns`` (and at least ``min_steps``); returns the synchronized end time."""
        steps = 0
        while True:
            self._check_stop()
            if steps >= min_steps and time.time_ns() >= deadline_ns:
                break
            if self.trainable is None:  # idle workload: nothing to compute
                self._idle_until(deadline_ns)
                break
            loss = self.trainable.step(batch)
            self.last_loss = loss
            steps += 1
            self.step += 1
            self._window.steps += 1
            self._window.samples += self.batch_size
            if point is not None:
                point.steps += 1
                point.samples += self.batch_size
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
            self.trainable = Trainable(cfg.workload, cfg.size, torch.device(self.placement.torch_device), cfg.seed)
        if self.placement.sim is not None:
            self.sim = simgpu.SimGpuLoad(self.placement.sim, cfg.workload)
            self._update_memory(self.batch_size)

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
            t0 = self._enter("idle")
            self.started_unix_ns = t0
            # The schedule hangs on the requested start, not on this trainer's: one that was slow to
            # get ready (importing torch, building the model) has a shorter idle baseline, and still
            # enters its steady phase with the others.
            anchor = cfg.start_at_unix_ns or t0
            late_s = (t0 - anchor) / 1e9
            if late_s > 0.5:
                log.warning(
                    "started %.1f s after the requested start time; the idle baseline is %.1f s shorter",
                    late_s,
                    min(late_s, cfg.idle_baseline_s),
                )
            self._idle_until(anchor + int(cfg.idle_baseline_s * 1e9))
            warm_deadline = anchor + int((cfg.idle_baseline_s + cfg.warmup_s) * 1e9)
            boundary: int | None = None  # the end of the previous phase, where the next one starts
            for batch_size in cfg.resolved_batch_sizes():
                boundary = self._sweep_point(batch_size, warm_deadline, boundary)
                warm_deadline = boundary + int(cfg.warmup_s * 1e9)
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

    def _sweep_point(self, batch_size: int, warm_deadline: int, start_ns: int | None) -> int:
        """Warm-up and steady phase at one batch size, from ``start_ns``; returns the steady phase's end."""
        point = SteadyPoint(batch_size)
        self.batch_size = batch_size
        self._update_memory(batch_size)
        self._enter("warmup", start_ns)
        try:
            batch = self.trainable.make_batch(batch_size) if self.trainable is not None else None
            if self.trainable is not None:
                first = self.trainable.step(batch)
                point.first_loss = float(first.item())
                self.last_loss = first
                self.step += 1
                self._window.steps += 1
                self._window.samples += batch_size
            self._train_until(warm_deadline, 0, None, batch)
            point.start_unix_ns = self._enter("steady", self._sync_now())
            point.end_unix_ns = self._train_until(
                point.start_unix_ns + int(self.config.duration_s * 1e9), 1, point, batch
            )
            if self._window.steps:
                self._progress(force=True)  # the steady phase's last window
        except Cancelled:
            raise
        except Exception as e:
            if self.trainable is None:
                raise
            from gpuprobe.trainer.models import is_out_of_memory

            if not is_out_of_memory(e) or len(self.config.resolved_batch_sizes()) == 1:
                raise
            point.error = f"out of memory at batch size {batch_size}"
            log.warning("%s; continuing the sweep", point.error)
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        finally:
            if self.last_loss is not None and point.steps:
                loss = float(self.last_loss.item())
                point.last_loss = loss if math.isfinite(loss) else None
            self.points.append(point)
        return point.end_unix_ns or self._sync_now()

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
            "params": self.trainable.params if self.trainable is not None else 0,
            "started_unix_ns": self.started_unix_ns,
            "ended_unix_ns": t_end,
            "steps": self.step,
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
