"""Drives a simulated GPU's load while the trainer runs its phases.

On a machine with simulated GPUs (``GPUPROBE_SIM_DIR`` set, see docs/simulator.md) there is no CUDA
device to compute on: the trainer computes on the CPU for real and, in parallel, tells the simulator
what the GPU would be doing: utilization per phase and workload, the trainer's pid as the process
holding the GPU and a plausible memory figure. The simulated power, clocks and temperatures then
follow the phases exactly as a real GPU's would. :meth:`SimGpuLoad.release` sets the GPU back to
0 % with no process; the trainer calls it on every way out (end, error, SIGTERM).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from gpuprobe.sim import state as sim_state
from gpuprobe.trainer.catalog import WORKLOADS

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
        sim_state.set_load(self.state_dir, self.gpu_index, util_pct, pid, mem)
        log.debug("simulated GPU %d: %.0f %% utilization, %d bytes, pid %d", self.gpu_index, util_pct, mem, pid)

    def phase(self, phase: str, mem_bytes: int) -> None:
        """Set the load for ``phase`` (idle, warmup, steady, cooldown); ``mem_bytes`` while the model is loaded."""
        util = {"warmup": self.workload.warmup_util_pct, "steady": self.workload.steady_util_pct}.get(phase, 0.0)
        # outside warm-up and steady the model stays resident (weights, optimizer states) but idle
        self._set(util, mem_bytes, self._pid)
        self._active = True

    def release(self) -> None:
        """0 % utilization, no process, no memory: the GPU as it was before the trainer came."""
        if not self._active:
            return
        try:
            self._set(0.0, 0, 0)
        except (OSError, sim_state.SimStateError) as e:  # the machine may be gone at the very end of a test
            log.warning("could not reset simulated GPU %d: %s", self.gpu_index, e)
        self._active = False
