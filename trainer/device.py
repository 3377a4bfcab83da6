"""Part: trainer. Where a workload runs: ``--device auto|cpu|cuda[:N]``, real CUDA or a simulated GPU.

==========  ======================================  =================================================
``--device``  CUDA available (torch)                  no CUDA
==========  ======================================  =================================================
``cpu``       the CPU                                 the CPU
``cuda:N``    CUDA device N                           simulated GPU N when ``GPUPROBE_SIM_DIR`` has one
                                                      (compute on the CPU, load on the simulator);
                                                      otherwise an error
``auto``      ``cuda:0``                              simulated GPU 0 if there is one, else the CPU
==========  ======================================  =================================================

CUDA device numbers follow ``CUDA_DEVICE_ORDER``; the control plane starts trainers with
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so that ``cuda:N`` is NVML's GPU N.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuprobe.errors import ConfigError
from gpuprobe.trainer import simgpu

_CUDA = re.compile(r"^cuda(?::(\d+))?$")


class DeviceError(ConfigError):
    """The requested device does not exist here."""


@dataclass(frozen=True)
class Placement:
    """The resolved device: ``torch_device`` computes, ``gpu_index`` is the `gpu` tag (None on the CPU),
    ``sim`` the simulated GPU whose load the trainer drives (None when the GPU is real or absent)."""

    torch_device: str
    gpu_index: int | None
    sim: simgpu.SimGpuTarget | None

    def describe(self) -> str:
        if self.sim is not None:
            return f"simulated GPU {self.gpu_index} ({self.sim.profile_name}), computing on the CPU"
        return self.torch_device


def cuda_device_count(need_torch: bool) -> int:
    """Real CUDA devices visible to torch; 0 without torch (or when the workload needs none)."""
    if not need_torch:
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve(spec: str, need_torch: bool = True) -> Placement:
    """Turn ``--device`` into a placement; :class:`DeviceError` says why one is impossible."""
    spec = spec.strip().lower()
    if spec == "cpu":
        return Placement("cpu", None, None)
    if spec == "auto":
        if cuda_device_count(need_torch) > 0:
            return Placement("cuda:0", 0, None)
        target = simgpu.find_sim_gpu(0)
        return Placement("cpu", 0, target) if target is not None else Placement("cpu", None, None)
    match = _CUDA.match(spec)
    if match is None:
        raise DeviceError(f"--device must be auto, cpu, cuda or cuda:N, not {spec!r}")
    index = int(match.group(1) or 0)
    count = cuda_device_count(need_torch)
    if count > 0:
        if index >= count:
            raise DeviceError(f"cuda:{index} does not exist: torch sees {count} CUDA device(s)")
        return Placement(f"cuda:{index}", index, None)
    target = simgpu.find_sim_gpu(index)
    if target is not None:
        return Placement("cpu", index, target)
    raise DeviceError(
        f"cuda:{index} is not available: no CUDA device (torch.cuda.is_available() is false) and no simulated "
        "GPU with that index (GPUPROBE_SIM_DIR)"
    )
