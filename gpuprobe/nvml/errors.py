"""Part: nvml (ground floor). NVML's return codes and errors, translated once for every caller.

The sensor's hot path compares the return codes of NVML's C functions with the constants here; the
calls made through pynvml's wrappers outside the sampler (:mod:`gpuprobe.nvml.device`) raise
:class:`NvmlCallError`, which keeps NVML's code so that a caller can tell "not permitted" from "not
supported" without importing pynvml.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pynvml

from gpuprobe.errors import ServiceError

# nvml.h's nvmlReturn_t values the sensor tells apart
NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_UNKNOWN = 999

# The answers after which a GPU gives nothing until it answers again (nvml.h: the GPU fell off the bus, it
# needs a reset, the driver is gone or was replaced under the library, an internal driver error): the
# sensor treats each as a lost GPU, not as a failed read to count on every tick. Code -> (name, meaning).
GONE: dict[int, tuple[str, str]] = {
    NVML_ERROR_GPU_IS_LOST: ("GPU_IS_LOST", "the GPU fell off the bus or stopped answering"),
    NVML_ERROR_RESET_REQUIRED: ("RESET_REQUIRED", "the GPU needs a reset before it can be used again"),
    NVML_ERROR_DRIVER_NOT_LOADED: ("DRIVER_NOT_LOADED", "the NVIDIA driver is not loaded"),
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: (
        "LIB_RM_VERSION_MISMATCH",
        "the NVIDIA kernel module and the NVML library are of different versions",
    ),
    NVML_ERROR_UNKNOWN: ("UNKNOWN", "an internal driver error"),
}


def gone_reason(code: int) -> str:
    """Why a GPU gives nothing, in the words of the health state (``RESET_REQUIRED: the GPU needs ...``)."""
    name, meaning = GONE.get(code, GONE[NVML_ERROR_GPU_IS_LOST])
    return f"{name}: {meaning}"


class GpuSensorError(ServiceError, RuntimeError):
    """NVML cannot be used at all (no library, no driver): the agent runs without GPUs."""


class NativeSamplerError(ServiceError, RuntimeError):
    """The native GPU sampler (``nvml/native/sampler.c``) cannot be built, loaded or started; the message
    says how to build it. The agent exits 2 rather than sample GPUs without it."""


def error_name(code: int) -> str:
    """NVML's own words for a return code (``Not Supported``, ``GPU is lost``)."""
    try:
        return str(pynvml.NVMLError(code))
    except Exception:  # pragma: no cover - pynvml formats every code it knows
        return f"NVML error {code}"


def text(value: str | bytes) -> str:
    """An NVML string (older pynvml versions return bytes)."""
    return value.decode() if isinstance(value, bytes) else value


class NvmlCallError(ServiceError, RuntimeError):
    """An NVML call outside the sampler failed; ``code`` is NVML's return code."""

    def __init__(self, what: str, code: int) -> None:
        super().__init__(f"{what}: {error_name(code)}")
        self.code = code

    @property
    def no_permission(self) -> bool:
        return bool(self.code == pynvml.NVML_ERROR_NO_PERMISSION)

    @property
    def not_supported(self) -> bool:
        return self.code in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)


def call(what: str, function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)`` (a pynvml wrapper), its NVMLError raised as :class:`NvmlCallError` naming ``what``."""
    try:
        return function(*args)
    except pynvml.NVMLError as e:
        raise NvmlCallError(what, int(e.value)) from None
