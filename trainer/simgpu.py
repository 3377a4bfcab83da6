"""Part: trainer. Drives a simulated GPU's load, and reports its simulated progress, while the trainer runs its phases.

On a machine with simulated GPUs (``GPUPROBE_SIM_DIR`` set, see docs/simulator.md) there is no CUDA
device to compute on: the trainer computes real steps of the real model on the CPU (with a small
real batch) and, in parallel, plays the simulated GPU:

- :class:`SimGpuLoad` tells the simulator what the GPU would be doing: the utilization the
  simulator's performance model gives for the workload and batch size, the trainer's pid as the
  process holding the GPU, a plausible memory figure and the workload's name (its GPM activity
  mix). The simulated power, clocks and temperatures then follow the phases as a real GPU's would.
  :meth:`SimGpuLoad.release` sets the GPU back to 0 % with no process on every way out (end, error,
  SIGTERM), unless another trainer has taken the GPU over since (the next workload of a study).
- :class:`SimThroughput` is the simulated device's speed: samples/s from the performance model
  (``gpuprobe.sim.perf``) at the SM clock the simulated GPU reports through NVML *now*, so a lower
  power limit or a thermal slowdown slows the simulated training exactly as the clock says. The
  trainer integrates it over wall time; that is the progress it reports, tagged ``device=sim``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from gpuprobe.sim import state as sim_state
from gpuprobe.sim.profiles import WORKLOAD_IDS
from gpuprobe.workloads import WORKLOADS

log = logging.getLogger(__name__)

# What a CUDA context and the allocator's reserve take before any tensor (typical: 300-600 MiB).
CONTEXT_BYTES = 512 * 1024**2


@dataclass(frozen=True)
class SimGpuTarget:
    """One simulated GPU of the machine in ``state_dir``."""

    state_dir: Path
    config: sim_state.SimSettings
    index: int

    @property
    def profile_name(self) -> str:
        return self.config.gpus[self.index].profile.name


def find_sim_gpu(index: int) -> SimGpuTarget | None:
    """The simulated GPU ``index`` of the machine named by ``GPUPROBE_SIM_DIR``, if there is one."""
    state_dir = sim_state.state_dir_from_env()
    if state_dir is None:
        return None
    try:
        config = sim_state.load(state_dir)
    except (sim_state.SimStateError, OSError, KeyError, ValueError):
        return None
    if not 0 <= index < len(config.gpus):
        return None
    return SimGpuTarget(state_dir, config, index)


def memory_estimate_bytes(workload: str, size: str, params: int, batch_size: int, optimizer_states: int) -> int:
    """A plausible GPU memory footprint: CUDA context, fp32 weights, gradients and optimizer states,
    and activations (bf16) that grow with the batch. Tiny models' activations are scaled down."""
    spec = WORKLOADS[workload]
    if not spec.needs_torch:
        return 0
    weights = params * 4 * (2 + optimizer_states)  # weights + grads + states, fp32
    per_sample = spec.activation_bytes_per_sample if size == "full" else spec.activation_bytes_per_sample // 64
    return CONTEXT_BYTES + weights + per_sample * batch_size


class SimGpuLoad:
    """The load the trainer puts on one simulated GPU."""

    def __init__(self, target: SimGpuTarget, workload: str) -> None:
        self.state_dir = target.state_dir
        self.gpu_index = target.index
        self.workload = WORKLOADS[workload]
        profile = target.config.gpus[target.index].profile
        self.profile_name = profile.name
        self._max_bytes = int((profile.memory_total_bytes - profile.memory_reserved_bytes) * 0.95)
        self._pid = os.getpid()
        self._active = False

    def _set(self, util_pct: float, mem_bytes: int, pid: int) -> None:
        mem = max(0, min(mem_bytes, self._max_bytes))
        # the workload's name sets the simulated GPM activity mix (tensor, DRAM, SM occupancy)
        workload = self.workload.name if self.workload.name in WORKLOAD_IDS else None
        sim_state.set_load(self.state_dir, self.gpu_index, util_pct, pid, mem, workload=workload)
        log.debug("simulated GPU %d: %.0f %% utilization, %d bytes, pid %d", self.gpu_index, util_pct, mem, pid)

    def phase(self, phase: str, mem_bytes: int, steady_util_pct: float | None = None) -> None:
        """Set the load for ``phase`` (idle, warmup, steady, cooldown); ``mem_bytes`` while the model is loaded.

        ``steady_util_pct`` is the performance model's utilization at the current batch size (the
        catalog's figure when None); warm-up holds the catalog's share of it."""
        steady = self.workload.steady_util_pct if steady_util_pct is None else steady_util_pct
        warmup = steady * self.workload.warmup_util_pct / self.workload.steady_util_pct if steady else 0.0
        util = {"warmup": warmup, "steady": steady}.get(phase, 0.0)
        # outside warm-up and steady the model stays resident (weights, optimizer states) but idle
        self._set(util, mem_bytes, self._pid)
        self._active = True

    def release(self) -> None:
        """0 % utilization, no process, no memory: the GPU as it was before the trainer came.

        Left alone when another process holds the GPU by now: in a study the next workload's trainer
        starts its warm-up while this one finishes its last step."""
        if not self._active:
            return
        try:
            released = sim_state.set_load_if_holder(self.state_dir, self.gpu_index, self._pid, 0.0, 0, 0)
            if not released:
                log.debug("simulated GPU %d: another process holds it now; left as it is", self.gpu_index)
        except (OSError, sim_state.SimStateError) as e:  # the machine may be gone at the very end of a test
            log.warning("could not reset simulated GPU %d: %s", self.gpu_index, e)
        self._active = False


class SimThroughput:
    """The simulated GPU's training speed: the performance model at the SM clock NVML reports now.

    Runs in the trainer's own process, which sees the simulated NVML like every process of the
    machine (``LD_LIBRARY_PATH`` points at the simulator's library)."""

    def __init__(self, target: SimGpuTarget, workload: str, size: str) -> None:
        from gpuprobe.nvml.device import GpuDevice
        from gpuprobe.sim import perf

        self._perf = perf
        self.workload = workload
        self.size = size
        self.profile = target.config.gpus[target.index].profile
        self.virt_overhead_pct = perf.virt_overhead_pct(self.profile)
        self.device = GpuDevice(target.index)

    def util_pct(self, batch_size: int) -> float:
        return float(self._perf.utilization_pct(self.profile, self.workload, self.size, batch_size))

    def samples_per_s(self, batch_size: int) -> float:
        """Samples/s of the simulated device at ``batch_size`` and the clock it runs at now."""
        clock_mhz = self.device.sm_clock_mhz()
        return float(
            self._perf.samples_per_s(
                self.profile, self.workload, self.size, batch_size, clock_mhz, self.virt_overhead_pct
            )
        )

    def temp_slowdown_c(self) -> float | None:
        return self.device.temp_slowdown_c()
