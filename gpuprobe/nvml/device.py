"""Part: nvml (ground floor). One GPU for the few NVML calls made outside the sampler.

The control plane reads and sets power limits through it (:mod:`gpuprobe.control.powerlimit`, the
one actuator), and a trainer reads the SM clock of the simulated GPU it plays
(:mod:`gpuprobe.trainer.simgpu`). Calls block (NVML is synchronous); NVML's errors become
:class:`~gpuprobe.nvml.errors.NvmlCallError`.
"""

from __future__ import annotations

import contextlib

import pynvml

from gpuprobe.nvml.errors import NvmlCallError, call, text


class GpuDevice:
    """One GPU by NVML index: its UUID, SM clock, slowdown threshold and power limit (read and set)."""

    def __init__(self, index: int) -> None:
        self.index = index
        call("nvmlInit", pynvml.nvmlInit)
        self._handle = call(f"GPU {index}", pynvml.nvmlDeviceGetHandleByIndex, index)

    @staticmethod
    def count() -> int:
        call("nvmlInit", pynvml.nvmlInit)
        return int(call("device count", pynvml.nvmlDeviceGetCount))

    @property
    def uuid(self) -> str:
        return text(call(f"GPU {self.index} UUID", pynvml.nvmlDeviceGetUUID, self._handle))

    def sm_clock_mhz(self) -> float:
        return float(
            call(f"GPU {self.index} SM clock", pynvml.nvmlDeviceGetClockInfo, self._handle, pynvml.NVML_CLOCK_SM)
        )

    def temp_slowdown_c(self) -> float | None:
        """The slowdown threshold, None where the GPU does not say."""
        try:
            return float(
                call(
                    f"GPU {self.index} slowdown threshold",
                    pynvml.nvmlDeviceGetTemperatureThreshold,
                    self._handle,
                    pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
                )
            )
        except NvmlCallError:
            return None

    def power_limit_w(self) -> float:
        mw = call(f"GPU {self.index} power limit", pynvml.nvmlDeviceGetPowerManagementLimit, self._handle)
        return float(mw) / 1000.0

    def power_limit_constraints_w(self) -> tuple[float, float]:
        low, high = call(
            f"GPU {self.index} power limit range", pynvml.nvmlDeviceGetPowerManagementLimitConstraints, self._handle
        )
        return float(low) / 1000.0, float(high) / 1000.0

    def set_power_limit_w(self, limit_w: float) -> None:
        call(
            f"GPU {self.index} set power limit {limit_w:.0f} W",
            pynvml.nvmlDeviceSetPowerManagementLimit,
            self._handle,
            round(limit_w * 1000),
        )

    def close(self) -> None:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
