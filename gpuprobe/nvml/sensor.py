"""Part: nvml (ground floor). GPU sensor: every field of the ``gpu`` measurement, read through NVML.

The agent's sampler reads it (:meth:`GpuSensor.start_sampling`, :meth:`GpuSensor.drain`), and so does
the control plane of a node that runs ``gpuprobe control-agent`` (:meth:`GpuSensor.read_gpu`, through
``gpuprobe.control.gpus``):
one NVML boundary (``gpuprobe/nvml/``, the only package that imports pynvml), one translation of
NVML's errors (:mod:`gpuprobe.nvml.errors`; ``tests/test_module_graph.py`` checks the boundary).
It sits below the agent and the control plane so that neither imports the other to read a GPU.

Static facts (:class:`~gpuprobe.v1.common_pb2.GpuInfo`) are read once per GPU when the sensor opens,
through pynvml's ordinary wrappers. The per-tick reads (10-50 per GPU per second) are made by the native
sampler (:mod:`gpuprobe.nvml.native`, a C thread on its own absolute schedule, each tick a record in a
bounded ring) from the plan :meth:`GpuSensor.start_sampling` hands it; :meth:`GpuSensor.drain` turns the
records into samples, here, so that what each answer means is written once (the :data:`Decode` functions,
which :meth:`GpuSensor.read_gpu` and the probe at start apply to their own reads of the same C functions,
with buffers allocated once per GPU). Four fields go into one ``nvmlDeviceGetFieldValues`` call:

=====================  ===================================================  ==========================
sample key             NVML source                                          unit conversion
=====================  ===================================================  ==========================
util_pct, mem_util_pct nvmlDeviceGetUtilizationRates (gpu, memory)          %
mem_used_bytes,        nvmlDeviceGetMemoryInfo_v2 (used, total);            bytes
mem_total_bytes        v1 where v2 is missing
power_w                nvmlDeviceGetPowerUsage (1 s average on Ampere       mW / 1000
                       non-GA100 and newer, instantaneous before)
power_instant_w        field 186 POWER_INSTANT                              mW / 1000
energy_j               field 83 TOTAL_ENERGY_CONSUMPTION                    mJ / 1000
temp_c                 nvmlDeviceGetTemperatureV (GetTemperature if absent) °C
mem_temp_c             field 82 MEMORY_TEMP                                 °C
fan_pct                nvmlDeviceGetFanSpeed_v2, mean over the GPU's fans   %
sm_clock_mhz,          nvmlDeviceGetClockInfo (SM, MEM)                     MHz
mem_clock_mhz
power_limit_w          field 190 POWER_CURRENT_LIMIT (enforced limit where  mW / 1000
                       the field is missing)
clock_event_reasons    nvmlDeviceGetCurrentClocksEventReasons               bitmask
pcie_tx_bytes_per_s,   nvmlDeviceGetPcieThroughput (TX, RX), on its own     KB/s * 1024
pcie_rx_bytes_per_s    slower schedule (:meth:`GpuSensor.read_pcie`)
=====================  ===================================================  ==========================

The slow reads of the health interval (:meth:`GpuSensor.read_health`, once per ``--health-interval``
per GPU, spread over the ticks like PCIe) call the C functions with buffers prepared once where the
call has a fixed shape (ECC, remapped rows, PCIe replays, violation time, GPM, NVLink), pynvml's
wrappers elsewhere; their keys are added to the same sample:

=====================================  ===========================================  ====================
sample key                             NVML source                                  unit conversion
=====================================  ===========================================  ====================
ecc_{corrected,uncorrected}_           nvmlDeviceGetTotalEccErrors (corrected /     count
{volatile,aggregate}                   uncorrected x volatile / aggregate)
retired_pages_sbe, retired_pages_dbe   nvmlDeviceGetRetiredPages (multiple SBE,     pages
                                       DBE): the number of pages
retired_pages_pending                  nvmlDeviceGetRetiredPagesPendingStatus       bool
remapped_rows_{correctable,            nvmlDeviceGetRemappedRows                    rows, bool
uncorrectable}, remap_pending,
remap_failure
pcie_replay_count                      nvmlDeviceGetPcieReplayCounter               count
{power,thermal,sync_boost}_            nvmlDeviceGetViolationStatus (POWER,         ns / 1000
violation_us                           THERMAL, SYNC_BOOST).violationTime
fan_rpm                                nvmlDeviceGetFanSpeedRPM, mean over fans     RPM
sm_active_pct, sm_occupancy_pct,       NVML GPM between the previous and this       %
tensor_active_pct, dram_bw_util_pct,   interval's nvmlGpmSampleGet: SM_UTIL,
fp16/fp32/fp64_active_pct              SM_OCCUPANCY, ANY_TENSOR_UTIL, DRAM_BW_UTIL,
                                       FP16/FP32/FP64_UTIL (Hopper and newer)
nvlink_tx/rx_bytes_per_s               fields 138/139 NVLINK_THROUGHPUT_DATA_TX/RX  KiB delta * 1024 / s
                                       per active link, summed (per link:
                                       ``NvLinkSample`` with the error counters of
                                       nvmlDeviceGetNvLinkErrorCounter, read again
                                       only when the link's fields 38/45/52/59
                                       (their totals, scope = link, same call)
                                       moved, or after 60 s)
=====================================  ===========================================  ====================

MIG GPU instances (:class:`MigRead`, MIG-enabled GPUs only: each instance's memory and SMs, and its GPM
metrics under the same keys as the GPU's, from nvmlGpmMigSampleGet on the parent's handle with the
instance's id, as DCGM samples a MIG-enabled GPU), the compute processes
(:meth:`GpuSensor.read_processes`, :meth:`GpuSensor.read_process_utilization`) and NVML's event set
(:class:`EventSource`, waited on by :mod:`gpuprobe.agent.sensors.events` in its own thread) are read
here too, so that NVML stays behind one boundary. ``GpuInfo.mig_enabled`` and
``GpuInfo.gpm_supported`` are static facts.

Errors are translated here, once:

- ``NOT_SUPPORTED`` (or a missing function), and ``NO_PERMISSION`` (nvml.h: a MIG-enabled GPU's memory
  and process lists for an unprivileged caller; its MIG instances' memory is read instead): the field is
  absent from every later sample of that GPU (never a fake zero), dropped from the per-tick reads (also when
  it stops being possible later, as when MIG is switched on), not counted as a read error, and the
  fact is logged once per GPU and field.
- ``GPU_IS_LOST``, and the other answers after which a GPU gives nothing (``RESET_REQUIRED``,
  ``DRIVER_NOT_LOADED``, ``LIB_RM_VERSION_MISMATCH``, ``UNKNOWN``: :data:`~gpuprobe.nvml.errors.GONE`):
  the GPU yields no samples, is counted once as a read error and is logged as lost (and :attr:`GpuSensor.on_lost`
  is told, as it is when the GPU answers again); it is retried once per
  ``lost_retry_s`` and logged again when it answers, and its static facts are read again then (an
  outage can have hidden some; :attr:`GpuSensor.infos` shows the new ones). A GPU that is already
  lost when the sensor opens is kept as *not yet known*: it is in no ``infos`` and yields no samples
  until it answers, and then joins like the others. The other GPUs are not affected.
- anything else: the field is left out of that sample, the read error is counted, and logged once
  per GPU, field and error code.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pynvml

from gpuprobe.nvml.errors import (
    GONE,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_TIMEOUT,
    NVML_SUCCESS,
    GpuSensorError,
    error_name,
    gone_reason,
    text,
)
from gpuprobe.nvml.native import NOT_READ, Kind, NativeCall, NativeGpu, NativeSampler, Record
from gpuprobe.v1 import common_pb2

log = logging.getLogger(__name__)

Sample = dict[str, Any]  # keyword arguments of gpuprobe.v1.GpuSample

# Answers after which a read is left out of that GPU's samples from then on, logged once and never counted:
# the read is not supported, its function is missing, or the agent may not make it (nvml.h: a MIG-enabled
# GPU's memory and process lists for an unprivileged caller; the MIG instances' own memory is read instead)
LEFT_OUT = frozenset({NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_NO_PERMISSION})

FIELD_MEMORY_TEMP = 82
FIELD_TOTAL_ENERGY_CONSUMPTION = 83
FIELD_POWER_INSTANT = 186
FIELD_POWER_CURRENT_LIMIT = 190
FIELD_NVLINK_TX_KIB = 138  # NVLINK_THROUGHPUT_DATA_TX, per link (scope), KiB since the driver loaded
FIELD_NVLINK_RX_KIB = 139

NVLINK_ERROR_COUNTERS = (  # NvLinkSample key, nvmlNvLinkErrorCounter_t
    ("replay_errors", 0),
    ("recovery_errors", 1),
    ("crc_flit_errors", 2),
    ("crc_data_errors", 3),
)
# The same counters as fields (NVLINK_REPLAY / RECOVERY / CRC_FLIT / CRC_DATA_ERROR_COUNT_TOTAL): per link,
# the total over its lanes (nvml.h: "Link ID needs to be specified in the scopeId field"), read for every
# link with the throughput fields in one call. While a link's totals stand still its counters did not move,
# so its per-link counters (4 calls per link, 72 on an H100) are not read again, at most
# NVLINK_ERRORS_REREAD_S old; the GPU's total is the sum over its links of the counters.
FIELD_NVLINK_ERROR_TOTALS = (52, 59, 38, 45)
NVLINK_ERRORS_REREAD_S = 60.0
NVLINK_HEALTH_COUNTERS = frozenset({"crc_flit_errors", "crc_data_errors", "replay_errors"})  # the health rule's

GPM_METRICS = (  # GpuSample key, nvmlGpmMetricId_t
    ("sm_active_pct", 2),  # SM_UTIL
    ("sm_occupancy_pct", 3),  # SM_OCCUPANCY
    ("tensor_active_pct", 5),  # ANY_TENSOR_UTIL (HMMA, IMMA or DFMA pipes: what dcgm calls PIPE_TENSOR_ACTIVE)
    ("dram_bw_util_pct", 10),  # DRAM_BW_UTIL
    ("fp64_active_pct", 11),
    ("fp32_active_pct", 12),
    ("fp16_active_pct", 13),
)

ARCHITECTURES = {
    2: "kepler",
    3: "maxwell",
    4: "pascal",
    5: "volta",
    6: "turing",
    7: "ampere",
    8: "ada",
    9: "hopper",
    10: "blackwell",
    11: "dla",
    12: "dla2",
    13: "rubin",
    15: "npu3",
}

VIRTUALIZATION_MODES: dict[int, common_pb2.Virtualization] = {
    0: common_pb2.VIRTUALIZATION_BARE_METAL,  # NONE; refined with the hypervisor flag by the caller
    1: common_pb2.VIRTUALIZATION_PASSTHROUGH,
    2: common_pb2.VIRTUALIZATION_VGPU,
    3: common_pb2.VIRTUALIZATION_HOST_VGPU,
    4: common_pb2.VIRTUALIZATION_HOST_VGPU,
}


@functools.cache
def _plain(cls: type) -> Any:
    """A plain ctypes copy of one of pynvml's structures: the same memory layout, without the Python-level
    ``__getattribute__`` that pynvml gives its structures (to decode bytes), which every field read pays
    (17 per GPU and tick on the hot path)."""
    base = ctypes.Union if issubclass(cls, ctypes.Union) else ctypes.Structure
    namespace: dict[str, Any] = {"_fields_": cls._fields_}  # type: ignore[attr-defined]
    if hasattr(cls, "_pack_"):
        namespace["_pack_"] = cls._pack_
    plain = type(f"Plain{cls.__name__}", (base,), namespace)
    assert ctypes.sizeof(plain) == ctypes.sizeof(cls)
    return plain


@functools.cache
def _gpm_request_type() -> Any:
    """``nvmlGpmMetricsGet_t`` with plain metrics (see :func:`_plain`)."""
    metric = _plain(pynvml.c_nvmlGpmMetric_t)
    fields = [
        (name, metric * pynvml.NVML_GPM_METRIC_MAX if name == "metrics" else kind)
        for name, kind in pynvml.c_nvmlGpmMetricsGet_t._fields_
    ]
    plain = type("PlainGpmMetricsGet", (ctypes.Structure,), {"_fields_": fields})
    assert ctypes.sizeof(plain) == ctypes.sizeof(pynvml.c_nvmlGpmMetricsGet_t)
    return plain


# nvmlFieldValue_t: fieldId, scopeId, timestamp, latencyUsec, valueType, nvmlReturn, value (a union of 8 bytes)
_FIELD_VALUE = struct.Struct("=IIqqiiQ")
# one field's nvmlReturn and value's 8 raw bytes only (the rest skipped), for the NVLink error totals, which
# are only compared with what they were
_FIELD_ANSWER = "=24x4xiQ"


# nvmlValueType_t (nvml.h's NVML_VALUE_TYPE_*, checked against it by tests/sim/test_nvml_header.py)
VALUE_DOUBLE, VALUE_UNSIGNED_INT, VALUE_UNSIGNED_LONG, VALUE_UNSIGNED_LONG_LONG = 0, 1, 2, 3
VALUE_SIGNED_LONG_LONG, VALUE_SIGNED_INT, VALUE_UNSIGNED_SHORT = 4, 5, 6
VALUE_TYPES = {
    VALUE_DOUBLE: "DOUBLE",
    VALUE_UNSIGNED_INT: "UNSIGNED_INT",
    VALUE_UNSIGNED_LONG: "UNSIGNED_LONG",
    VALUE_UNSIGNED_LONG_LONG: "UNSIGNED_LONG_LONG",
    VALUE_SIGNED_LONG_LONG: "SIGNED_LONG_LONG",
    VALUE_SIGNED_INT: "SIGNED_INT",
    VALUE_UNSIGNED_SHORT: "UNSIGNED_SHORT",
}


def _raw_value(vt: int, raw: int) -> float | int:
    """The value of an nvmlValue_t from its valueType and its 8 raw bytes read as one unsigned integer (a
    narrower member is its first bytes, the low ones on a little-endian host): a double is a float."""
    if vt in (VALUE_UNSIGNED_LONG_LONG, VALUE_UNSIGNED_LONG):  # (unsigned long: 8 bytes on Linux)
        return raw
    if vt == VALUE_DOUBLE:
        return float(struct.unpack("=d", raw.to_bytes(8, sys.byteorder))[0])
    if vt == VALUE_SIGNED_LONG_LONG:
        return raw - (1 << 64) if raw >> 63 else raw
    bits = 16 if vt == VALUE_UNSIGNED_SHORT else 32  # unsigned short; unsigned / signed int
    low = raw & ((1 << bits) - 1) if sys.byteorder == "little" else raw >> (64 - bits)
    if vt == VALUE_SIGNED_INT and low >> 31:
        return low - (1 << 32)
    return low


def _unpacked_int(f: tuple[int, ...]) -> int:
    """The integer value of one :data:`_FIELD_VALUE` tuple, by its valueType."""
    return int(_raw_value(f[4], f[6]))


@dataclass
class _FieldSpec:
    key: str
    field_id: int
    divisor: int  # the raw value divided by this (exactly, as a reader of the raw value would)
    value_type: int = -1  # nvmlValueType_t, learnt from the probe read


# What one answer means: its raw (a, b) -- as the native sampler's record holds them, and as a _Call's
# buffer gives them -- into the sample's keys, in their units. Written once, for both readers.
Decode = Callable[[Sample, int, int], None]


def _pair(first: str, second: str) -> Decode:
    def decode(s: Sample, a: int, b: int) -> None:
        s[first] = a
        s[second] = b

    return decode


def _plain_value(key: str) -> Decode:
    def decode(s: Sample, a: int, b: int) -> None:
        s[key] = a

    return decode


def _milli(key: str) -> Decode:  # mW -> W
    def decode(s: Sample, a: int, b: int) -> None:
        s[key] = a / 1000

    return decode


def _signed(key: str) -> Decode:  # a C int, sign-extended to 64 bits
    def decode(s: Sample, a: int, b: int) -> None:
        s[key] = a - (1 << 64) if a >> 63 else a

    return decode


def _kb_per_s(key: str) -> Decode:  # NVML's PCIe "KB" are KiB
    def decode(s: Sample, a: int, b: int) -> None:
        s[key] = a * 1024

    return decode


def _fans(fans: int) -> Decode:  # the sum over the fans -> their mean
    def decode(s: Sample, a: int, b: int) -> None:
        s["fan_pct"] = a / fans

    return decode


@dataclass
class _Call:
    """One NVML getter of the per-tick reads: ``fn(*args)`` fills a buffer, ``raw()`` gives its answer as the
    native sampler's (a, b), ``decode`` puts it into a sample; ``native`` is the same read for the native
    sampler (:mod:`gpuprobe.nvml.native`)."""

    key: str  # the sample key it provides (for logging and the unsupported set)
    fn: Any
    args: tuple[Any, ...]
    raw: Callable[[], tuple[int, int]]
    decode: Decode
    native: NativeCall

    def store(self, sample: Sample) -> None:
        self.decode(sample, *self.raw())


# nvmlDeviceGetNvLinkState, nvmlDeviceGetNvLinkErrorCounter, and per link: (link, state call's
# arguments, state buffer, [(NvLinkSample key, error counter call's arguments, buffer)])
_NvLinkCalls = tuple[Any, Any, list[tuple[int, tuple[Any, ...], Any, list[tuple[str, tuple[Any, ...], Any]]]]]


# (group, C function, its arguments, what stores its answer into the sample)
_HealthCall = tuple[str, Callable[..., int], tuple[Any, ...], Callable[[dict[str, Any]], None]]


@dataclass
class _GpmState:
    """The GPM reads of one source, the whole GPU or one MIG GPU instance: two sample buffers used in turn,
    ``take(buffer)`` filling one (nvmlGpmSampleGet or nvmlGpmMigSampleGet, called directly), and the two
    metrics requests over them, allocated once (building one per read, with pynvml's structures, had cost
    more than the NVML calls)."""

    take: Callable[[Any], int]
    samples: list[Any]
    requests: list[Any]  # [i]: the metrics request whose second sample is buffer i
    current: int = -1  # which buffer holds the last sample (-1: none yet)


@dataclass
class _SlowState:
    """What the health reads keep per GPU between intervals."""

    nvlinks: list[int] | None = None  # the links NVML answers for (None: not discovered yet)
    nvlink_prev: dict[int, tuple[int, int, float]] = field(default_factory=dict)  # link -> tx KiB, rx KiB, s
    gpm: _GpmState | None = None  # the whole GPU's GPM (None: not prepared yet)
    gpm_migs: dict[int, _GpmState] = field(default_factory=dict)  # GPU instance id -> its GPM (MIG-enabled GPUs)
    health_calls: list[_HealthCall] | None = None  # GpuSensor._health_calls, prepared at the first health read
    process_seen_us: int = 0  # the newest process utilization sample's timestamp
    nvlink_calls: _NvLinkCalls | None = None
    nvlink_fields: Any = None  # the throughput fields (TX, RX) of every link, then every link's error totals
    nvlink_answers: struct.Struct | None = None  # every link's totals' (nvmlReturn, raw value), in one unpack
    # link -> its error totals' (nvmlReturn, raw value) pairs when its counters were last read, flat (absent:
    # read them next time)
    nvlink_totals: dict[int, tuple[int, ...]] = field(default_factory=dict)
    nvlink_errors: dict[int, tuple[int | None, ...]] = field(default_factory=dict)  # link -> its counters
    nvlink_errors_mono: dict[int, float] = field(default_factory=dict)  # link -> when its counters were read
    nvlink_unsupported: set[str] = field(default_factory=set)  # NVLINK_ERROR_COUNTERS keys NVML does not support


class NvLinkRead:
    """One active NVLink's reading. ``rates``: (TX, RX) bytes/s since the previous read (None: no rate yet);
    ``errors``: its error counters in :data:`NVLINK_ERROR_COUNTERS` order (None: not read), the same tuple
    while they do not move. A plain class: 18 of them per H100 per health read, and their
    ``NvLinkSample`` keyword arguments (:attr:`values`) are needed only for the links whose point is due."""

    __slots__ = ("errors", "gpu_index", "link", "rates", "time_unix_ns")

    def __init__(
        self,
        gpu_index: int,
        link: int,
        time_unix_ns: int,
        rates: tuple[float, float] | None = None,
        errors: tuple[int | None, ...] = (),
    ) -> None:
        self.gpu_index = gpu_index
        self.link = link
        self.time_unix_ns = time_unix_ns
        self.rates = rates
        self.errors = errors

    @property
    def values(self) -> dict[str, Any]:
        """``NvLinkSample`` keyword arguments."""
        values: dict[str, Any] = {"time_unix_ns": self.time_unix_ns, "gpu_index": self.gpu_index, "link": self.link}
        if self.rates is not None:
            values["tx_bytes_per_s"], values["rx_bytes_per_s"] = self.rates
        for (key, _), count in zip(NVLINK_ERROR_COUNTERS, self.errors, strict=False):
            if count is not None:
                values[key] = count
        return values

    def __repr__(self) -> str:
        return f"NvLinkRead({self.values!r})"


@dataclass(frozen=True)
class MigRead:
    """One MIG GPU instance: ``MigSample`` keyword arguments."""

    values: dict[str, Any]


@dataclass(frozen=True)
class HealthExtras:
    """What a health read yields beside the sample's own keys."""

    nvlinks: list[NvLinkRead]
    migs: list[MigRead]
    nvlink_errors: int | None = None  # CRC flit + CRC data + replay errors of the active links (None: not read)


@dataclass(frozen=True)
class ProcessRead:
    pid: int
    used_memory_bytes: int | None


@dataclass(frozen=True)
class RawEvent:
    """One event of NVML's event set: the GPU's index, NVML's event type bit and data."""

    gpu_index: int
    event_type: int
    data: int
    gpu_instance_id: int | None


@dataclass
class _Gpu:
    index: int
    handle: Any
    info: common_pb2.GpuInfo
    fields: list[_FieldSpec] = field(default_factory=list)
    field_array: Any = None
    field_count: int = 0
    calls: list[_Call] = field(default_factory=list)
    pcie_calls: list[_Call] = field(default_factory=list)
    unsupported: set[str] = field(default_factory=set)
    denied: set[str] = field(default_factory=set)  # the unsupported keys NVML answered NO_PERMISSION for
    logged_errors: set[tuple[str, int]] = field(default_factory=set)
    limit_fallback: bool = False  # field 190 is missing: read the enforced power limit instead
    lost: bool = False
    lost_code: int = NVML_ERROR_GPU_IS_LOST  # which of the GONE codes it answered, while lost
    retry_at: float = 0.0
    known: bool = True  # False: lost when the sensor opened, its static facts not read yet
    slow: _SlowState = field(default_factory=lambda: _SlowState())

    @property
    def label(self) -> str:
        return f"GPU {self.index} ({self.info.name}, {self.info.uuid})"


class GpuSensor:
    """All GPUs of the node. ``start_sampling``, ``drain`` and ``read_health`` are called by one thread (the
    agent's sampler)."""

    def __init__(
        self, gpus: list[_Gpu], driver_version: str, virtualization: common_pb2.Virtualization, lost_retry_s: float
    ) -> None:
        self._gpus = gpus
        self.driver_version = driver_version
        self.virtualization = virtualization
        self._lost_retry_s = lost_retry_s
        self.read_errors = 0  # NVML errors other than "not supported" (the sampler reads the total)
        self._fv = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
        self._by_index = {g.index: g for g in gpus}
        # the native sampler's run (start_sampling): its plan, per GPU in it: the reads of its calls, in order
        self._native: NativeSampler | None = None
        self._plan: list[tuple[_Gpu, list[_FieldSpec | _Call]]] = []
        self._interval_ns = 1
        self._pcie_every = 1
        self._ring_ticks = 1
        self._t0_ns = 0
        self._run_overwritten = 0  # the run's counters at the last drain
        self._run_missed = 0
        self._replan = False
        self.overwritten_ticks = 0  # ticks the native sampler overwrote before they were drained
        self.missed_ticks = 0  # ticks it skipped (the previous one overran by more than half an interval)
        self._want_realtime = False
        self.realtime = False  # its thread runs under SCHED_FIFO (as of the last drain)
        # told (index, lost, reason) when a GPU stops answering (one of the GONE codes) and when it answers
        # again; called in the thread that reads (the sampler's); set it with set_lost_hook
        self.on_lost: Callable[[int, bool, str], None] | None = None

    def set_lost_hook(self, hook: Callable[[int, bool, str], None]) -> None:
        """``hook(index, lost, reason)`` on every change from now on, and at once for the GPUs lost already;
        ``reason`` names NVML's answer (:func:`~gpuprobe.nvml.errors.gone_reason`), "" when it answers again."""
        self.on_lost = hook
        for gpu in self._gpus:
            if gpu.lost:
                hook(gpu.index, True, gone_reason(gpu.lost_code))

    def _tell(self, gpu: _Gpu, lost: bool) -> None:
        hook = self.on_lost
        if hook is not None:
            try:
                hook(gpu.index, lost, gone_reason(gpu.lost_code) if lost else "")
            except Exception:  # a hook's failure must not stop sampling
                log.exception("the lost-GPU hook failed")

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(cls, lost_retry_s: float = 1.0) -> GpuSensor:
        """Initialise NVML and read every GPU's static facts; raises GpuSensorError without NVML."""
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise GpuSensorError(f"NVML is not available: {e}") from None
        try:
            driver = text(pynvml.nvmlSystemGetDriverVersion())
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as e:
            raise GpuSensorError(f"NVML is not usable: {e}") from None
        gpus: list[_Gpu] = []
        virtualization = common_pb2.VIRTUALIZATION_UNSPECIFIED
        for index in range(count):
            handle = None
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                info = _static_info(index, handle, driver)
            except pynvml.NVMLError as e:
                if handle is not None and int(e.value) in GONE:
                    log.error("GPU %d is lost (%s): it joins when it answers; the other GPUs are sampled", index, e)
                    info = common_pb2.GpuInfo(index=index)
                    gpus.append(
                        _Gpu(index=index, handle=handle, info=info, lost=True, lost_code=int(e.value), known=False)
                    )
                else:
                    log.error(
                        "GPU %d: cannot read its identity (%s); it is left out until the agent restarts", index, e
                    )
                continue
            if virtualization == common_pb2.VIRTUALIZATION_UNSPECIFIED:
                try:
                    mode = pynvml.nvmlDeviceGetVirtualizationMode(handle)
                    virtualization = VIRTUALIZATION_MODES.get(mode, common_pb2.VIRTUALIZATION_UNSPECIFIED)
                except pynvml.NVMLError:
                    pass
            gpus.append(_Gpu(index=index, handle=handle, info=info))
        sensor = cls(gpus, driver, virtualization, lost_retry_s)
        for gpu in gpus:
            if gpu.known:
                sensor._bind(gpu)
                sensor._probe(gpu)
        return sensor

    def close(self) -> None:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()

    @property
    def infos(self) -> list[common_pb2.GpuInfo]:
        """The static facts of every GPU known so far, as last read (a new object whenever they change)."""
        return [g.info for g in self._gpus if g.known]

    def _identify(self, gpu: _Gpu) -> bool:
        """A GPU that was lost when the sensor opened: read its static facts and prepare its reads."""
        try:
            info = _static_info(gpu.index, gpu.handle, self.driver_version)
        except pynvml.NVMLError:
            gpu.retry_at = time.monotonic() + self._lost_retry_s
            return False
        gpu.info = info
        gpu.known = True
        gpu.lost = False
        errors = self.read_errors
        self._bind(gpu)
        self._probe(gpu)
        self.read_errors = errors  # the probe forgets errors; the other GPUs' count stays
        log.warning("%s answers: sampling it begins", gpu.label)
        self._tell(gpu, False)
        return True

    def _refresh_info(self, gpu: _Gpu) -> None:
        """Reads a recovered GPU's static facts again; replaces them where they differ."""
        try:
            info = _static_info(gpu.index, gpu.handle, self.driver_version)
        except pynvml.NVMLError:
            return
        if info != gpu.info:
            gpu.info = info

    def _function(self, name: str) -> Any | None:
        try:
            return pynvml._nvmlGetFunctionPointer(name)
        except pynvml.NVMLError:
            return None

    def _bind(self, gpu: _Gpu) -> None:
        """Prepare the buffers and calls of the per-tick reads for one GPU."""
        h = gpu.handle
        specs = [
            _FieldSpec("mem_temp_c", FIELD_MEMORY_TEMP, 1),
            _FieldSpec("energy_j", FIELD_TOTAL_ENERGY_CONSUMPTION, 1000),
            _FieldSpec("power_instant_w", FIELD_POWER_INSTANT, 1000),
            _FieldSpec("power_limit_w", FIELD_POWER_CURRENT_LIMIT, 1000),
        ]
        if gpu.limit_fallback:
            specs = [s for s in specs if s.key != "power_limit_w"]
        self._set_fields(gpu, [s for s in specs if s.key not in gpu.unsupported])
        calls: list[_Call] = []

        def add(
            key: str,
            name: str | None,
            native: NativeCall,
            raw: Callable[[], tuple[int, int]],
            decode: Decode,
            *args: Any,
        ) -> None:
            fn = self._function(name) if name else None
            if fn is not None:
                calls.append(_Call(key, fn, (h, *args), raw, decode, native))
            elif key not in gpu.unsupported:
                self._unsupported(gpu, key, f"{name or 'its function'} is missing", NVML_ERROR_FUNCTION_NOT_FOUND)

        def uint(buffer: Any) -> Callable[[], tuple[int, int]]:
            return lambda: (int(buffer.value), 0)

        util = _plain(pynvml.c_nvmlUtilization_t)()
        add("util_pct", "nvmlDeviceGetUtilizationRates", NativeCall(Kind.UTILIZATION),
            lambda: (int(util.gpu), int(util.memory)), _pair("util_pct", "mem_util_pct"),
            ctypes.byref(util))  # fmt: skip

        memory = _pair("mem_used_bytes", "mem_total_bytes")
        mem2 = _plain(pynvml.c_nvmlMemory_v2_t)()
        mem2.version = pynvml.nvmlMemory_v2
        fn = self._function("nvmlDeviceGetMemoryInfo_v2")
        if fn is not None and fn(h, ctypes.byref(mem2)) == NVML_SUCCESS:
            add("mem_used_bytes", "nvmlDeviceGetMemoryInfo_v2", NativeCall(Kind.MEMORY_V2, pynvml.nvmlMemory_v2),
                lambda: (int(mem2.used), int(mem2.total)), memory, ctypes.byref(mem2))  # fmt: skip
        else:
            mem1 = _plain(pynvml.c_nvmlMemory_t)()
            add("mem_used_bytes", "nvmlDeviceGetMemoryInfo", NativeCall(Kind.MEMORY),
                lambda: (int(mem1.used), int(mem1.total)), memory, ctypes.byref(mem1))  # fmt: skip

        power = ctypes.c_uint()
        add("power_w", "nvmlDeviceGetPowerUsage", NativeCall(Kind.POWER), uint(power), _milli("power_w"),
            ctypes.byref(power))  # fmt: skip

        temp_v = _plain(pynvml.c_nvmlTemperature_v1_t)()
        temp_v.version = pynvml.nvmlTemperature_v1
        temp_v.sensorType = 0  # NVML_TEMPERATURE_GPU
        fn = self._function("nvmlDeviceGetTemperatureV")
        if fn is not None and fn(h, ctypes.byref(temp_v)) == NVML_SUCCESS:
            add("temp_c", "nvmlDeviceGetTemperatureV", NativeCall(Kind.TEMPERATURE_V, pynvml.nvmlTemperature_v1),
                lambda: (int(temp_v.temperature) % (1 << 64), 0), _signed("temp_c"), ctypes.byref(temp_v))  # fmt: skip
        else:
            temp = ctypes.c_uint()
            add("temp_c", "nvmlDeviceGetTemperature", NativeCall(Kind.TEMPERATURE, 0), uint(temp),
                _plain_value("temp_c"), 0, ctypes.byref(temp))  # fmt: skip

        fans = gpu.info.fan_count if gpu.info.HasField("fan_count") else 0
        fan_fn = self._function("nvmlDeviceGetFanSpeed_v2")
        if fans and fan_fn is not None:
            calls.append(self._fan_call(fan_fn, h, fans))
        elif not gpu.info.HasField("fan_count"):
            gpu.unsupported.add("fan_pct")  # logged when the static facts were read

        for key, clock_type in (("sm_clock_mhz", 1), ("mem_clock_mhz", 2)):
            clock = ctypes.c_uint()
            add(key, "nvmlDeviceGetClockInfo", NativeCall(Kind.CLOCK, clock_type), uint(clock), _plain_value(key),
                clock_type, ctypes.byref(clock))  # fmt: skip

        reasons = ctypes.c_ulonglong()
        name, kind = next(
            ((n, k) for n, k in (("nvmlDeviceGetCurrentClocksEventReasons", Kind.EVENT_REASONS),
                                 ("nvmlDeviceGetCurrentClocksThrottleReasons", Kind.THROTTLE_REASONS))
             if self._function(n) is not None),
            (None, Kind.EVENT_REASONS),
        )  # fmt: skip
        add("clock_event_reasons", name, NativeCall(kind), uint(reasons), _plain_value("clock_event_reasons"),
            ctypes.byref(reasons))  # fmt: skip

        if gpu.limit_fallback:
            limit = ctypes.c_uint()
            add("power_limit_w", "nvmlDeviceGetEnforcedPowerLimit", NativeCall(Kind.ENFORCED_LIMIT), uint(limit),
                _milli("power_limit_w"), ctypes.byref(limit))  # fmt: skip

        gpu.calls = [c for c in calls if c.key not in gpu.unsupported]
        pcie: list[_Call] = []
        fn = self._function("nvmlDeviceGetPcieThroughput")
        for key, counter in (("pcie_tx_bytes_per_s", 0), ("pcie_rx_bytes_per_s", 1)):
            kb_per_s = ctypes.c_uint()
            if fn is not None and key not in gpu.unsupported:
                pcie.append(_Call(key, fn, (h, counter, ctypes.byref(kb_per_s)), uint(kb_per_s), _kb_per_s(key),
                                  NativeCall(Kind.PCIE, counter)))  # fmt: skip
        gpu.pcie_calls = pcie

    def _set_fields(self, gpu: _Gpu, specs: list[_FieldSpec]) -> None:
        gpu.fields = specs
        gpu.field_count = len(specs)
        gpu.field_array = (_plain(pynvml.c_nvmlFieldValue_t) * max(1, len(specs)))()
        for i, spec in enumerate(specs):
            gpu.field_array[i].fieldId = spec.field_id
            gpu.field_array[i].scopeId = 0

    def _fan_call(self, fn: Any, h: Any, fans: int) -> _Call:
        outs = [ctypes.c_uint() for _ in range(fans)]
        refs = [ctypes.byref(o) for o in outs]

        def read_fans(handle: Any) -> int:
            for i, ref in enumerate(refs):
                rc = fn(handle, i, ref)
                if rc:
                    return int(rc)
            return NVML_SUCCESS

        return _Call(
            "fan_pct", read_fans, (h,), lambda: (sum(int(o.value) for o in outs), fans), _fans(fans),
            NativeCall(Kind.FANS, fans),
        )  # fmt: skip

    def _probe(self, gpu: _Gpu) -> None:
        """Reads at start: find what this GPU does not support and drop it from the per-tick reads."""
        for _ in range(2):  # a second round checks the power-limit fallback
            before = set(gpu.unsupported)
            self._read(gpu, 0, probing=True)
            self._read_pcie(gpu, {}, probing=True)
            if gpu.lost or gpu.unsupported == before:
                break
            if "power_limit_w" in gpu.unsupported and not gpu.limit_fallback:
                gpu.limit_fallback = True
                gpu.unsupported.discard("power_limit_w")
            self._bind(gpu)
        # the probe's errors are not sampling errors
        self.read_errors = 0

    # ------------------------------------------------------------------ errors

    def _unsupported(self, gpu: _Gpu, key: str, what: str, code: int) -> None:
        gpu.unsupported.add(key)
        if key == "power_limit_w" and not gpu.limit_fallback:
            return  # the enforced power limit is tried instead
        if code == NVML_ERROR_NO_PERMISSION:
            gpu.denied.add(key)
            log.warning(
                "%s: %s may not be read by this user (%s: %s; on a MIG-enabled GPU the MIG instances' memory "
                "is read instead); it is left out",
                gpu.label,
                key,
                what,
                error_name(code),
            )
            return
        log.info("%s: %s is not supported (%s: %s); the field is left out", gpu.label, key, what, error_name(code))

    def _lose(self, gpu: _Gpu, what: str, code: int = NVML_ERROR_GPU_IS_LOST) -> None:
        """The GPU answered one of the :data:`GONE` codes: no samples until it answers again. Counted and
        logged once per outage (its retries, once per ``lost_retry_s``, are not new errors)."""
        gpu.retry_at = time.monotonic() + self._lost_retry_s
        if not gpu.lost or code != gpu.lost_code:
            self.read_errors += 1
            gpu.lost = True
            gpu.lost_code = code
            log.error(
                "%s is lost (%s answered %s): no samples from it until it answers again; "
                "the other GPUs keep being sampled",
                gpu.label,
                what,
                GONE[code][0],
            )
            self._tell(gpu, True)

    def _error(self, gpu: _Gpu, key: str, code: int) -> None:
        self.read_errors += 1
        if (key, code) not in gpu.logged_errors:
            gpu.logged_errors.add((key, code))
            log.warning(
                "%s: reading %s failed (%s); the field is left out of that sample", gpu.label, key, error_name(code)
            )

    # ------------------------------------------------------------------ the per-tick reads (native sampler)

    def start_sampling(
        self,
        sampler: NativeSampler,
        interval_s: float,
        pcie_every: int = 1,
        ring_ticks: int = 64,
        t0_mono_ns: int | None = None,
        realtime: bool = False,
    ) -> None:
        """Hand the per-tick reads of every known GPU to the native sampler (:mod:`gpuprobe.nvml.native`):
        tick ``n`` at ``t0_mono_ns + n * interval_s`` (``time.monotonic_ns``'s clock; now by default), the
        GPU at position ``p`` reading PCIe on the ticks with ``n % pcie_every == p % pcie_every``, at most
        ``ring_ticks`` ticks kept until :meth:`drain` takes them (older ones are overwritten and counted in
        :attr:`overwritten_ticks`); ``realtime``: its thread asks for SCHED_FIFO (:attr:`realtime` says, after
        a drain, whether it got it)."""
        self._native = sampler
        self._interval_ns = max(1, round(interval_s * 1e9))
        self._pcie_every = max(1, pcie_every)
        self._ring_ticks = ring_ticks
        self._t0_ns = time.monotonic_ns() if t0_mono_ns is None else t0_mono_ns
        self._want_realtime = realtime
        self._start_plan(0)

    def _start_plan(self, first_tick: int) -> None:
        native = self._native
        assert native is not None
        plan: list[NativeGpu] = []
        slots: list[tuple[_Gpu, list[_FieldSpec | _Call]]] = []
        for position, gpu in enumerate(self._gpus):
            if not gpu.known:
                continue  # joins (a new plan) when it answers: drain() looks once per lost_retry_s
            what: list[_FieldSpec | _Call] = [*gpu.fields, *gpu.calls, *gpu.pcie_calls]
            calls = [NativeCall(Kind.FIELD, s.field_id) for s in gpu.fields] + [c.native for c in gpu.calls]
            phase = position % self._pcie_every
            calls += [replace(c.native, every=self._pcie_every, phase=phase) for c in gpu.pcie_calls]
            plan.append(NativeGpu(_address(gpu.handle), tuple(calls)))
            slots.append((gpu, what))
        retry_ticks = max(1, round(self._lost_retry_s * 1e9 / self._interval_ns))
        native.start(
            plan,
            sorted(GONE),
            self._t0_ns,
            self._interval_ns,
            retry_ticks,
            self._ring_ticks,
            first_tick,
            self._want_realtime,
        )
        self._plan = slots
        self._run_overwritten = 0
        self._run_missed = 0
        self._replan = False

    def stop_sampling(self) -> None:
        """Stop the native sampler's thread (at most one interval later); :meth:`drain` still gives its last ticks."""
        if self._native is not None:
            self._native.stop()

    def drain(self) -> list[tuple[int, list[Sample]]]:
        """The ticks the native sampler made since the last call, oldest first: (tick number, one sample per
        GPU that answered, each stamped (agent clock, ns) just before its GPU was read). Called by one
        thread only (the agent's sampler); the errors are translated here, as the module says."""
        native = self._native
        assert native is not None, "start_sampling first"
        records, stats = native.drain()
        out = [self._tick_samples(r) for r in records]
        self.overwritten_ticks += stats.overwritten - self._run_overwritten
        self.missed_ticks += stats.missed_ticks - self._run_missed
        self._run_overwritten, self._run_missed = stats.overwritten, stats.missed_ticks
        self.realtime = stats.realtime
        if stats.error:  # its thread stopped: no more ticks will come (the caller decides what that means)
            raise OSError(stats.error, os.strerror(stats.error))
        now = time.monotonic()
        for gpu in self._gpus:
            if not gpu.known and now >= gpu.retry_at and self._identify(gpu):
                self._replan = True
        if self._replan:  # a GPU joins, or a read changed: the plan again, from the next tick on the same grid
            native.stop()
            records, stats = native.drain()
            out += [self._tick_samples(r) for r in records]
            self.overwritten_ticks += stats.overwritten - self._run_overwritten
            self.missed_ticks += stats.missed_ticks - self._run_missed
            last = out[-1][0] if out else 0
            first = max(last + 1, (time.monotonic_ns() - self._t0_ns) // self._interval_ns + 1)
            self._start_plan(first)
        return out

    def _tick_samples(self, record: Record) -> tuple[int, list[Sample]]:
        samples: list[Sample] = []
        k = 0  # the GPU's first call in the plan's order over all GPUs
        for position, (gpu, what) in enumerate(self._plan):
            stamp = record.stamps[position]
            if stamp:
                sample = self._answer(gpu, stamp, what, record.values, k)
                if sample is not None:
                    samples.append(sample)
            k += len(what)
        return record.tick, samples

    def _answer(
        self, gpu: _Gpu, t_ns: int, what: list[_FieldSpec | _Call], values: tuple[tuple[int, int, int], ...], k: int
    ) -> Sample | None:
        """One GPU's sample from its answers in one record; None when it is lost."""
        sample: Sample = {"time_unix_ns": t_ns, "gpu_index": gpu.index}
        for j, item in enumerate(what):
            rc, a, b = values[k + j]
            if rc == NVML_SUCCESS:
                if isinstance(item, _FieldSpec):
                    value = _raw_value(b, a)
                    sample[item.key] = value / item.divisor if item.divisor != 1 else value
                else:
                    item.decode(sample, a, b)
                continue
            if rc == NOT_READ:
                continue
            where = f"NVML field {item.field_id}" if isinstance(item, _FieldSpec) else "NVML"
            if rc in GONE:
                self._lose(gpu, item.key if isinstance(item, _Call) else f"field {item.field_id}", rc)
                return None
            if rc in LEFT_OUT:
                if item.key in gpu.unsupported:
                    continue  # a tick made before the call was disabled
                self._unsupported(gpu, item.key, where, rc)
                assert self._native is not None
                self._native.disable(k + j)  # out of the per-tick reads, as at the probe
                if item.key == "power_limit_w" and not gpu.limit_fallback:
                    gpu.limit_fallback = True  # the enforced power limit instead, in a new plan
                    gpu.unsupported.discard("power_limit_w")
                    self._bind(gpu)
                    self._replan = True
            else:
                self._error(gpu, item.key, rc)
        if gpu.lost:
            self._answers_again(gpu)
        return sample

    @property
    def count(self) -> int:
        return len(self._gpus)

    def read_gpu(self, index: int) -> Sample | None:
        """One sample of the GPU with NVML index ``index``, without PCIe, read now in the calling thread;
        None when it is lost or unknown.

        For a reader that wants some GPUs on its own schedule (the control plane's probe sampler in
        ``gpuprobe control-agent``). It must not run in two threads at once: the read buffers are the
        GPU's own.
        """
        gpu = next((g for g in self._gpus if g.index == index), None)
        if gpu is None or not gpu.known or (gpu.lost and time.monotonic() < gpu.retry_at):
            return None
        return self._read(gpu, time.time_ns())

    def _read(self, gpu: _Gpu, t_ns: int, probing: bool = False) -> Sample | None:
        sample: Sample = {"time_unix_ns": t_ns, "gpu_index": gpu.index}
        if gpu.field_count:
            rc = self._fv(gpu.handle, gpu.field_count, gpu.field_array)
            if rc in GONE:
                self._lose(gpu, "nvmlDeviceGetFieldValues", rc)
                return None
            if rc:
                for spec in gpu.fields:
                    self._error(gpu, spec.key, rc)
            else:
                arr = gpu.field_array
                for i, spec in enumerate(gpu.fields):
                    f = arr[i]
                    frc = f.nvmlReturn
                    if frc == NVML_SUCCESS:
                        value = _raw_value(int(f.valueType), int(f.value.ullVal))
                        sample[spec.key] = value / spec.divisor if spec.divisor != 1 else value
                    elif frc in GONE:
                        self._lose(gpu, f"field {spec.field_id}", frc)
                        return None
                    elif frc in LEFT_OUT:
                        self._unsupported(gpu, spec.key, f"NVML field {spec.field_id}", frc)
                    else:
                        self._error(gpu, spec.key, frc)
        for call in gpu.calls:
            rc = call.fn(*call.args)
            if rc == NVML_SUCCESS:
                call.store(sample)
            elif rc in GONE:
                self._lose(gpu, call.key, rc)
                return None
            elif rc in LEFT_OUT:
                self._unsupported(gpu, call.key, "NVML", rc)
            else:
                self._error(gpu, call.key, rc)
        if not probing and (
            any(s.key in gpu.unsupported for s in gpu.fields) or any(c.key in gpu.unsupported for c in gpu.calls)
        ):
            # a read that stopped being possible (MIG switched on, say): left out from now on, as at the probe
            self._set_fields(gpu, [s for s in gpu.fields if s.key not in gpu.unsupported])
            gpu.calls = [c for c in gpu.calls if c.key not in gpu.unsupported]
        if gpu.lost:
            self._answers_again(gpu)
        return sample

    def _answers_again(self, gpu: _Gpu) -> None:
        gpu.lost = False
        log.warning("%s answers again; sampling it resumes", gpu.label)
        self._refresh_info(gpu)
        # interval reads start afresh after an outage
        for gpm in [gpu.slow.gpm, *gpu.slow.gpm_migs.values()]:
            if gpm is not None:
                gpm.current = -1
        gpu.slow.nvlink_prev.clear()
        gpu.slow.nvlink_totals.clear()  # a reset may have zeroed the counters: read every link again
        self._tell(gpu, False)

    def _read_pcie(self, gpu: _Gpu, sample: Sample, probing: bool = False) -> None:
        for call in gpu.pcie_calls:
            rc = call.fn(*call.args)
            if rc == NVML_SUCCESS:
                call.store(sample)
            elif rc in GONE:
                self._lose(gpu, call.key, rc)
                return
            elif rc in LEFT_OUT:
                self._unsupported(gpu, call.key, "NVML", rc)
            else:
                self._error(gpu, call.key, rc)
        if probing or any(c.key in gpu.unsupported for c in gpu.pcie_calls):
            gpu.pcie_calls = [c for c in gpu.pcie_calls if c.key not in gpu.unsupported]

    # ------------------------------------------------------------------ the health interval (slow reads)

    def _slow_call(self, gpu: _Gpu, key: str, function: Callable[..., Any], *args: Any) -> Any | None:
        """``function(*args)`` with the sensor's error translation; None when there is no value.

        NOT_SUPPORTED or a missing function: ``key`` is absent from then on for this GPU (logged once);
        a GONE code (GPU_IS_LOST, RESET_REQUIRED, ...): the GPU is lost (check ``gpu.lost``); anything else:
        counted, logged once.
        """
        if key in gpu.unsupported:
            return None
        try:
            return function(*args)
        except pynvml.NVMLError as e:
            code = int(e.value)
            if code in LEFT_OUT:
                self._unsupported(gpu, key, getattr(function, "__name__", "NVML"), code)
            elif code in GONE:
                self._lose(gpu, key, code)
            else:
                self._error(gpu, key, code)
            return None

    def read_health(self, index: int, sample: Sample) -> HealthExtras | None:
        """The health interval's reads of GPU ``index``, added to ``sample`` (its tick's sample).

        None when the GPU is lost (also when it is lost during these reads). Called by the sampler
        thread only, like :meth:`drain`.
        """
        gpu = self._by_index.get(index)
        if gpu is None or gpu.lost or not gpu.known:
            return None
        h = gpu.handle
        call = self._slow_call
        if gpu.slow.health_calls is None:
            gpu.slow.health_calls = self._health_calls(h)
        for group, fn, args, store in gpu.slow.health_calls:
            if group in gpu.unsupported:
                continue
            rc = fn(*args)
            if rc == NVML_SUCCESS:
                store(sample)
            else:
                call(gpu, group, _raise, rc)  # NOT_SUPPORTED: left out from now on; lost; else counted
        for key, cause in (("retired_pages_sbe", 0), ("retired_pages_dbe", 1)):
            pages = call(gpu, "retired_pages", pynvml.nvmlDeviceGetRetiredPages, h, cause)
            if pages is not None:
                sample[key] = len(pages)
        pending = call(gpu, "retired_pages_pending", pynvml.nvmlDeviceGetRetiredPagesPendingStatus, h)
        if pending is not None:
            sample["retired_pages_pending"] = bool(pending)
        fans = gpu.info.fan_count if gpu.info.HasField("fan_count") else 0
        if fans:
            rpm: list[int] = []
            for fan in range(fans):
                value = call(gpu, "fan_rpm", _fan_rpm, h, fan)
                if value is None:
                    break
                rpm.append(int(value))
            else:
                sample["fan_rpm"] = sum(rpm) / len(rpm)
        if gpu.lost:
            return None
        nvlinks = self._read_nvlinks(gpu, sample)
        if gpu.info.gpm_supported:
            self._read_gpm(gpu, sample)
        migs = self._read_migs(gpu, sample["time_unix_ns"]) if gpu.info.mig_enabled else []
        if gpu.lost:
            return None
        nvlink_errors: int | None = None
        for r in nvlinks:
            for (key, _), count in zip(NVLINK_ERROR_COUNTERS, r.errors, strict=False):
                if count is not None and key in NVLINK_HEALTH_COUNTERS:
                    nvlink_errors = (nvlink_errors or 0) + count
        return HealthExtras(nvlinks, migs, nvlink_errors)

    def _health_calls(self, h: Any) -> list[_HealthCall]:
        """The health reads of every GPU that have a fixed shape (ECC counts, remapped rows, PCIe replays,
        violation time): the C functions called directly with buffers allocated once, as on the hot path
        (through pynvml's wrappers they had cost three times as much). Each is (group, function, arguments,
        store); a group is logged and left out as a whole (a part without ECC says so once, not four times)."""
        calls: list[_HealthCall] = []

        def function(name: str) -> Callable[..., int]:
            return self._function(name) or _missing_function  # FUNCTION_NOT_FOUND: left out as unsupported

        def value_of(key: str, buffer: Any) -> Callable[[Sample], None]:
            def store(sample: Sample) -> None:
                sample[key] = int(buffer.value)

            return store

        def violation_of(key: str, violation: Any) -> Callable[[Sample], None]:
            def store(sample: Sample) -> None:
                sample[key] = int(violation.violationTime) // 1000  # NVML: ns

            return store

        ecc = function("nvmlDeviceGetTotalEccErrors")
        for key, group, error_type, counter_type in (
            ("ecc_corrected_volatile", "ecc_volatile", 0, 0),
            ("ecc_uncorrected_volatile", "ecc_volatile", 1, 0),
            ("ecc_corrected_aggregate", "ecc_aggregate", 0, 1),
            ("ecc_uncorrected_aggregate", "ecc_aggregate", 1, 1),
        ):
            count = ctypes.c_ulonglong()
            args: tuple[Any, ...] = (h, ctypes.c_uint(error_type), ctypes.c_uint(counter_type), ctypes.byref(count))
            calls.append((group, ecc, args, value_of(key, count)))

        rows = [ctypes.c_uint() for _ in range(4)]  # correctable, uncorrectable, pending, failure

        def store_rows(sample: Sample) -> None:
            sample["remapped_rows_correctable"] = int(rows[0].value)
            sample["remapped_rows_uncorrectable"] = int(rows[1].value)
            sample["remap_pending"] = bool(rows[2].value)
            sample["remap_failure"] = bool(rows[3].value)

        args = (h, *(ctypes.byref(r) for r in rows))
        calls.append(("remapped_rows", function("nvmlDeviceGetRemappedRows"), args, store_rows))
        replay = ctypes.c_uint()
        calls.append(
            (
                "pcie_replay_count",
                function("nvmlDeviceGetPcieReplayCounter"),
                (h, ctypes.byref(replay)),
                value_of("pcie_replay_count", replay),
            )
        )
        violation_fn = function("nvmlDeviceGetViolationStatus")
        for key, policy in (
            ("power_violation_us", pynvml.NVML_PERF_POLICY_POWER),
            ("thermal_violation_us", pynvml.NVML_PERF_POLICY_THERMAL),
            ("sync_boost_violation_us", pynvml.NVML_PERF_POLICY_SYNC_BOOST),
        ):
            violation = _plain(pynvml.c_nvmlViolationTime_t)()
            args = (h, ctypes.c_uint(policy), ctypes.byref(violation))
            calls.append((key, violation_fn, args, violation_of(key, violation)))
        return calls

    def _read_nvlinks(self, gpu: _Gpu, sample: Sample) -> list[NvLinkRead]:
        slow = gpu.slow
        h = gpu.handle
        if "nvlink" in gpu.unsupported:
            return []
        if slow.nvlinks is None:
            links: list[int] = []
            code = NVML_ERROR_NOT_SUPPORTED
            for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
                try:
                    pynvml.nvmlDeviceGetNvLinkState(h, link)
                except pynvml.NVMLError as e:
                    code = int(e.value)
                    if code in GONE:
                        self._lose(gpu, "nvlink", code)
                        return []
                    continue
                links.append(link)
            if not links:
                self._unsupported(gpu, "nvlink", "nvmlDeviceGetNvLinkState", code)
                return []
            slow.nvlinks = links
            slow.nvlink_calls = self._nvlink_calls(h, links)
            totals_per_link = len(FIELD_NVLINK_ERROR_TOTALS)
            slow.nvlink_fields = (_plain(pynvml.c_nvmlFieldValue_t) * ((2 + totals_per_link) * len(links)))()
            slow.nvlink_answers = struct.Struct("=" + _FIELD_ANSWER[1:] * (totals_per_link * len(links)))
            for i, link in enumerate(links):
                for j, field_id in enumerate((FIELD_NVLINK_TX_KIB, FIELD_NVLINK_RX_KIB)):
                    slow.nvlink_fields[2 * i + j].fieldId = field_id
                    slow.nvlink_fields[2 * i + j].scopeId = link
                for j, field_id in enumerate(FIELD_NVLINK_ERROR_TOTALS):
                    slow.nvlink_fields[2 * len(links) + totals_per_link * i + j].fieldId = field_id
                    slow.nvlink_fields[2 * len(links) + totals_per_link * i + j].scopeId = link
        if slow.nvlink_calls is None:
            return []
        state_fn, error_fn, per_link = slow.nvlink_calls
        active: set[int] = set()
        for link, state_args, state, _ in per_link:
            rc = state_fn(*state_args)
            if rc == NVML_SUCCESS:
                if state.value == 1:
                    active.add(link)
            elif rc in GONE:
                self._lose(gpu, "nvlink_state", rc)
                return []
            else:
                self._error(gpu, "nvlink_state", rc)
        if gpu.lost or not active:
            return []
        t_ns = sample["time_unix_ns"]
        out: list[NvLinkRead] = []
        rates: dict[int, tuple[float, float]] = {}
        totals: dict[int, tuple[int, ...]] = {}  # link -> its error totals' (nvmlReturn, raw value) pairs now
        if "nvlink_throughput" not in gpu.unsupported:
            array = slow.nvlink_fields
            count = len(per_link) * 2
            totals_per_link = len(FIELD_NVLINK_ERROR_TOTALS)
            with_totals = "nvlink_error_totals" not in gpu.unsupported
            rc = self._fv(h, count + totals_per_link * len(per_link) if with_totals else count, array)
            if rc in GONE:
                self._lose(gpu, "nvlink_throughput", rc)
                return []
            if rc in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND):
                self._unsupported(gpu, "nvlink_throughput", "nvmlDeviceGetFieldValues", rc)
            elif rc:
                self._error(gpu, "nvlink_throughput", rc)
            else:
                now_s = t_ns / 1e9
                # every field unpacked in one go: indexing the ctypes array makes an object per field
                raw = bytes(array)
                fields = list(_FIELD_VALUE.iter_unpack(raw[: count * _FIELD_VALUE.size]))
                for i, (link, _, _, _) in enumerate(per_link):
                    if link not in active:
                        continue
                    tx, rx = fields[2 * i], fields[2 * i + 1]
                    if tx[5] or rx[5]:  # nvmlReturn
                        continue
                    tx_kib, rx_kib = _unpacked_int(tx), _unpacked_int(rx)
                    prev = slow.nvlink_prev.get(link)
                    slow.nvlink_prev[link] = (tx_kib, rx_kib, now_s)
                    if prev is not None and now_s > prev[2] and tx_kib >= prev[0] and rx_kib >= prev[1]:
                        dt = now_s - prev[2]
                        rates[link] = ((tx_kib - prev[0]) * 1024 / dt, (rx_kib - prev[1]) * 1024 / dt)
                if with_totals and slow.nvlink_answers is not None:
                    answers = slow.nvlink_answers.unpack_from(raw, count * _FIELD_VALUE.size)
                    codes = answers[0::2]
                    if codes.count(NVML_ERROR_NOT_SUPPORTED) == len(codes):
                        # an older driver: every link's counters are read every interval, as before
                        gpu.unsupported.add("nvlink_error_totals")
                    pairs = 2 * totals_per_link
                    for i, (link, _, _, _) in enumerate(per_link):
                        if link in active:
                            totals[link] = answers[pairs * i : pairs * (i + 1)]
        errors_read = "nvlink_errors" not in gpu.unsupported
        now_mono = time.monotonic()
        cached = slow.nvlink_errors
        for link, _, _, counters in per_link:
            if link not in active:
                continue
            errors: tuple[int | None, ...] = ()
            link_totals = totals.get(link)
            reuse = (
                errors_read
                and link_totals is not None
                and link_totals == slow.nvlink_totals.get(link)  # only totals that stand for the counters are kept
                and now_mono - slow.nvlink_errors_mono.get(link, 0.0) < NVLINK_ERRORS_REREAD_S
                and link in cached
            )
            if reuse:
                errors = cached[link]
            elif errors_read:
                complete = True
                read: list[int | None] = []
                for key, args, buffer in counters:
                    if key in slow.nvlink_unsupported:
                        read.append(None)
                        continue
                    rc = error_fn(*args)
                    if rc == NVML_SUCCESS:
                        read.append(int(buffer.value))
                        continue
                    read.append(None)
                    if rc in GONE:
                        self._lose(gpu, "nvlink_errors", rc)
                        slow.nvlink_totals.clear()
                        return []
                    elif rc in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND):
                        # that counter only (nvml.h: the DL counters are unsupported on Blackwell and newer);
                        # the others are kept. A counter no link has is left out for good, logged once.
                        slow.nvlink_unsupported.add(key)
                        self._unsupported(gpu, f"nvlink {key}", "nvmlDeviceGetNvLinkErrorCounter", rc)
                        if len(slow.nvlink_unsupported) == len(NVLINK_ERROR_COUNTERS):
                            gpu.unsupported.add("nvlink_errors")
                            errors_read = False
                    else:
                        complete = False
                        self._error(gpu, "nvlink_errors", rc)
                errors = tuple(read)
                previous = cached.get(link)
                if previous is not None and previous == errors:
                    errors = previous  # unchanged: the same tuple, which the sampler compares by identity
                cached[link] = errors
                # the link's totals stand for its counters only when every one of them was read and each total
                # answered (or is the total of a counter NVML does not support: it answers NOT_SUPPORTED too)
                if complete and link_totals is not None and self._totals_usable(slow, link_totals):
                    slow.nvlink_totals[link] = link_totals
                else:
                    slow.nvlink_totals.pop(link, None)
                slow.nvlink_errors_mono[link] = now_mono
            out.append(NvLinkRead(gpu.index, link, t_ns, rates.get(link), errors))
        if rates:
            sample["nvlink_tx_bytes_per_s"] = sum(r[0] for r in rates.values())
            sample["nvlink_rx_bytes_per_s"] = sum(r[1] for r in rates.values())
        return out

    @staticmethod
    def _totals_usable(slow: _SlowState, answers: tuple[int, ...]) -> bool:
        """Whether one link's error totals (nvmlReturn, raw value pairs in :data:`NVLINK_ERROR_COUNTERS`
        order) stand for its counters: each answered, or is the total of a counter NVML does not support."""
        return all(
            rc == NVML_SUCCESS or (rc == NVML_ERROR_NOT_SUPPORTED and key in slow.nvlink_unsupported)
            for rc, (key, _) in zip(answers[0::2], NVLINK_ERROR_COUNTERS, strict=True)
        )

    def _nvlink_calls(self, h: Any, links: list[int]) -> _NvLinkCalls | None:
        """The NVML C functions and argument buffers of the per-link reads (about 5 per link per
        interval: called directly, as the hot path does, not through pynvml's wrappers)."""
        state_fn = self._function("nvmlDeviceGetNvLinkState")
        error_fn = self._function("nvmlDeviceGetNvLinkErrorCounter")
        if state_fn is None:
            return None
        if error_fn is None:
            error_fn = _missing_function
        per_link: list[tuple[int, tuple[Any, ...], Any, list[tuple[str, tuple[Any, ...], Any]]]] = []
        for link in links:
            state = ctypes.c_uint()
            counters = []
            for key, counter in NVLINK_ERROR_COUNTERS:
                value = ctypes.c_ulonglong()
                counters.append((key, (h, ctypes.c_uint(link), ctypes.c_int(counter), ctypes.byref(value)), value))
            per_link.append((link, (h, ctypes.c_uint(link), ctypes.byref(state)), state, counters))
        return state_fn, error_fn, per_link

    def _read_gpm(self, gpu: _Gpu, sample: Sample) -> None:
        """The whole GPU's GPM metrics over the last interval, into ``sample``."""
        slow = gpu.slow
        if slow.gpm is None:
            sample_get = self._gpm_functions[0]
            handle = gpu.handle
            slow.gpm = self._gpm_state(gpu, "gpm", functools.partial(sample_get, handle))
        if slow.gpm is not None:
            self._gpm_metrics(gpu, "gpm", slow.gpm, sample)

    def _gpm_state(self, gpu: _Gpu, key: str, take: Callable[[Any], int]) -> _GpmState | None:
        """Two sample buffers and their requests for one GPM source; None when ``key`` is left out."""
        if key in gpu.unsupported:
            return None
        allocated = [self._slow_call(gpu, key, pynvml.nvmlGpmSampleAlloc) for _ in range(2)]
        if any(a is None for a in allocated):
            return None
        requests = []
        for nxt in (0, 1):
            request = _gpm_request_type()()
            request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(GPM_METRICS)
            request.sample1 = allocated[1 - nxt]
            request.sample2 = allocated[nxt]
            for i, (_, metric) in enumerate(GPM_METRICS):
                request.metrics[i].metricId = metric
            requests.append(request)
        return _GpmState(take, allocated, requests)

    def _gpm_metrics(self, gpu: _Gpu, key: str, gpm: _GpmState, out: dict[str, Any]) -> None:
        """Takes ``gpm``'s next sample and puts the metrics between it and the previous one into ``out``."""
        if key in gpu.unsupported:
            return
        metrics_get = self._gpm_functions[1]
        nxt = 0 if gpm.current != 0 else 1
        rc = gpm.take(gpm.samples[nxt])
        if rc != NVML_SUCCESS:
            self._slow_call(gpu, key, _raise, rc)
            gpm.current = -1
            return
        previous, gpm.current = gpm.current, nxt
        if previous < 0:
            return
        request = gpm.requests[nxt]
        rc = metrics_get(ctypes.byref(request))
        if rc != NVML_SUCCESS:
            self._slow_call(gpu, key, _raise, rc)
            return
        metrics = request.metrics
        for i, (name, _) in enumerate(GPM_METRICS):
            m = metrics[i]
            if m.nvmlReturn == NVML_SUCCESS:
                out[name] = float(m.value)

    def _read_mig_gpm(self, gpu: _Gpu, instances: dict[int, dict[str, Any]]) -> None:
        """Each GPU instance's GPM metrics over the last interval into its values: nvmlGpmMigSampleGet on
        the parent's handle with the instance's id, as DCGM samples a MIG-enabled GPU's instances (the whole
        GPU's GPM, when it answers, goes into the GPU's own sample as on any GPU)."""
        slow = gpu.slow
        for gi in [gi for gi in slow.gpm_migs if gi not in instances]:  # an instance that is gone
            for buffer in slow.gpm_migs.pop(gi).samples:
                _optional(functools.partial(pynvml.nvmlGpmSampleFree, buffer))
        mig_get = self._gpm_functions[2]
        handle = gpu.handle
        for gi, values in instances.items():
            gpm = slow.gpm_migs.get(gi)
            if gpm is None:
                gpm = self._gpm_state(gpu, "gpm_mig", functools.partial(mig_get, handle, ctypes.c_uint(gi)))
                if gpm is None:
                    return
                slow.gpm_migs[gi] = gpm
            self._gpm_metrics(gpu, "gpm_mig", gpm, values)
            if gpu.lost:
                return

    @functools.cached_property
    def _gpm_functions(self) -> tuple[Callable[..., int], Callable[..., int], Callable[..., int]]:
        """nvmlGpmSampleGet, nvmlGpmMetricsGet and nvmlGpmMigSampleGet, called directly (a missing one
        answers FUNCTION_NOT_FOUND, so its GPM is left out as unsupported)."""
        return (
            self._function("nvmlGpmSampleGet") or _missing_function,
            self._function("nvmlGpmMetricsGet") or _missing_function,
            self._function("nvmlGpmMigSampleGet") or _missing_function,
        )

    def _read_migs(self, gpu: _Gpu, t_ns: int) -> list[MigRead]:
        count = self._slow_call(gpu, "mig", pynvml.nvmlDeviceGetMaxMigDeviceCount, gpu.handle)
        if not count:
            return []
        instances: dict[int, dict[str, Any]] = {}
        for i in range(int(count)):
            try:
                mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, i)
                gi = int(pynvml.nvmlDeviceGetGpuInstanceId(mig))
            except pynvml.NVMLError as e:
                if int(e.value) in GONE:
                    self._lose(gpu, "mig", int(e.value))
                    return []
                continue  # NOT_FOUND: no MIG device in this slot
            attributes = _optional(functools.partial(pynvml.nvmlDeviceGetAttributes, mig))
            sms = int(attributes.multiprocessorCount) if attributes is not None else None
            values = instances.get(gi)
            if values is not None:  # another compute instance of the same GPU instance
                if sms is not None and "multiprocessor_count" in values:
                    values["multiprocessor_count"] += sms
                continue
            values = {"time_unix_ns": t_ns, "gpu_index": gpu.index, "gpu_instance_id": gi}
            uuid = _optional(functools.partial(pynvml.nvmlDeviceGetUUID, mig))
            values["mig_uuid"] = text(uuid) if uuid is not None else ""
            name = _optional(functools.partial(pynvml.nvmlDeviceGetName, mig))
            values["name"] = text(name) if name is not None else ""
            memory = _optional(functools.partial(pynvml.nvmlDeviceGetMemoryInfo, mig))
            if memory is not None:
                values["mem_used_bytes"] = int(memory.used)
                values["mem_total_bytes"] = int(memory.total)
            if sms is not None:
                values["multiprocessor_count"] = sms
            instances[gi] = values
        if gpu.info.gpm_supported:
            self._read_mig_gpm(gpu, instances)
            if gpu.lost:
                return []
        return [MigRead(v) for _, v in sorted(instances.items())]

    def read_processes(self, index: int) -> list[ProcessRead] | None:
        """The compute processes on GPU ``index``; None when unknown (lost, unsupported, an error)."""
        gpu = self._by_index.get(index)
        if gpu is None or gpu.lost or not gpu.known:
            return None
        procs = self._slow_call(gpu, "processes", pynvml.nvmlDeviceGetComputeRunningProcesses, gpu.handle)
        if procs is None and "processes" in gpu.denied and gpu.info.mig_enabled:
            procs = self._mig_processes(gpu)  # the whole GPU's list needs privileges, each instance's does not
        if procs is None:
            return None
        return [ProcessRead(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory)) for p in procs]

    def _mig_processes(self, gpu: _Gpu) -> list[Any] | None:
        """The compute processes of every MIG instance of ``gpu``; None when NVML lists none of them."""
        count = self._slow_call(gpu, "mig", pynvml.nvmlDeviceGetMaxMigDeviceCount, gpu.handle)
        procs: list[Any] = []
        listed = False
        for i in range(int(count or 0)):
            try:
                mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, i)
                procs.extend(pynvml.nvmlDeviceGetComputeRunningProcesses(mig))
                listed = True
            except pynvml.NVMLError as e:
                if int(e.value) in GONE:
                    self._lose(gpu, "mig processes", int(e.value))
                    return None
                continue  # NOT_FOUND: no MIG device in this slot
        return procs if listed else None

    def read_process_utilization(self, index: int) -> dict[int, tuple[float, float]]:
        """pid -> (SM %, memory %) over the samples NVML took since the last call (mean per pid)."""
        gpu = self._by_index.get(index)
        if gpu is None or gpu.lost or not gpu.known or "process_utilization" in gpu.unsupported:
            return {}
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(gpu.handle, gpu.slow.process_seen_us)
        except pynvml.NVMLError as e:
            code = int(e.value)
            if code in (NVML_SUCCESS, NVML_ERROR_NOT_FOUND):
                return {}  # no samples in the window
            self._slow_call(gpu, "process_utilization", _raise, code)
            return {}
        sums: dict[int, list[float]] = {}
        for p in samples:
            acc = sums.setdefault(int(p.pid), [0.0, 0.0, 0])
            acc[0] += float(p.smUtil)
            acc[1] += float(p.memUtil)
            acc[2] += 1
            gpu.slow.process_seen_us = max(gpu.slow.process_seen_us, int(p.timeStamp))
        return {pid: (a[0] / a[2], a[1] / a[2]) for pid, a in sums.items()}

    def open_events(self, event_types: int) -> EventSource | None:
        """An NVML event set with ``event_types`` (a mask) registered on every known GPU, as far as
        each supports them; None when no GPU supports any of them (or NVML has no event sets)."""
        mig = {g.index for g in self._gpus if g.info.mig_enabled}
        # not registered: a GPU lost now (its outage is seen by the sampler: LOST / RECOVERED)
        source = EventSource([g for g in self._gpus if g.known and not g.lost], event_types, mig, self._lost_retry_s)
        return source if source.open() else None


class EventSource:
    """An NVML event set over some GPUs; :meth:`wait` runs in the events thread (NVML is thread safe).

    A wait may answer GPU_IS_LOST (or another :data:`GONE` code) for the whole set when one registered
    GPU is lost (nvml.h, ``nvmlEventSetWait_v2``), and NVML cannot unregister a GPU: the set is then made
    again without the GPUs that no longer answer, so the others keep their XID and ECC events, and with
    them again once they answer (looked at once per ``retry_s``). A new set receives only events that
    happen after it is made, as any set does.
    """

    def __init__(self, gpus: list[_Gpu], event_types: int, mig_gpus: set[int], retry_s: float = 1.0) -> None:
        self._candidates = gpus
        self._types = event_types
        self._mig_gpus = mig_gpus
        self._retry_s = retry_s
        self._set: Any = None
        self._handles: dict[int, int] = {}  # device handle address -> index
        self._out: dict[int, _Gpu] = {}  # index -> a GPU taken out of the set while it does not answer
        self._retry_at = 0.0
        self.gpus: list[int] = []
        self._logged: set[int] = set()

    def open(self) -> bool:
        """Makes the set; False when NVML has none or no GPU supports any of the types."""
        try:
            event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as e:
            log.info("NVML events are not available (%s): no XID or ECC events", e)
            return False
        handles: dict[int, int] = {}
        for gpu in self._candidates:
            if gpu.index in self._out:
                continue
            try:
                supported = int(pynvml.nvmlDeviceGetSupportedEventTypes(gpu.handle)) & self._types
            except pynvml.NVMLError as e:
                if not self._out:  # said once, when the set is first made
                    log.info("%s: NVML events are not supported (%s)", gpu.label, e)
                continue
            registered = 0
            for bit in (1 << b for b in range(64) if supported >> b & 1):
                try:
                    pynvml.nvmlDeviceRegisterEvents(gpu.handle, bit, event_set)
                    registered |= bit
                except pynvml.NVMLError as e:
                    log.info("%s: cannot register NVML event 0x%x (%s)", gpu.label, bit, e)
            if registered:
                handles[_address(gpu.handle)] = gpu.index
                log.info("%s: NVML events 0x%x registered", gpu.label, registered)
        if not handles and not self._out:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlEventSetFree(event_set)
            return False
        self._set, self._handles = event_set, handles
        self.gpus = sorted(handles.values())
        return True

    def _remake(self) -> None:
        """The set again, over the GPUs that answer (the others are taken out until they do)."""
        taken: list[tuple[_Gpu, int]] = []
        back: list[_Gpu] = []
        for gpu in self._candidates:
            try:
                pynvml.nvmlDeviceGetSupportedEventTypes(gpu.handle)
            except pynvml.NVMLError as e:
                if int(e.value) in GONE and gpu.index not in self._out:
                    self._out[gpu.index] = gpu
                    taken.append((gpu, int(e.value)))
                continue
            if self._out.pop(gpu.index, None) is not None:
                back.append(gpu)
        self.close()
        self._handles = {}
        self.open()
        self._retry_at = time.monotonic() + self._retry_s
        others = ", ".join(str(i) for i in self.gpus) or "none"
        for gpu, code in taken:  # said once the new set is registered: events from here on reach it
            log.warning(
                "%s is taken out of the NVML event set (it answers %s); the events of GPUs %s go on",
                gpu.label,
                GONE[code][0],
                others,
            )
        for gpu in back:
            log.warning("%s answers again: its NVML events are registered again", gpu.label)

    def wait(self, timeout_ms: int) -> RawEvent | None:
        """The next event, or None when none came within ``timeout_ms`` (or the wait failed)."""
        if self._out and time.monotonic() >= self._retry_at:
            self._retry_at = time.monotonic() + self._retry_s
            if any(_answers(gpu.handle) for gpu in self._out.values()):
                self._remake()  # a GPU taken out answers again: the set over all of them
        if self._set is None:
            time.sleep(timeout_ms / 1000)  # every GPU is out: nothing to wait on until one answers
            return None
        try:
            data = pynvml.nvmlEventSetWait_v2(self._set, timeout_ms)
        except pynvml.NVMLError as e:
            code = int(e.value)
            if code in GONE:
                out = set(self._out)
                self._remake()
                if set(self._out) != out:
                    return None  # the lost GPU is out: wait on the others at once
            if code != NVML_ERROR_TIMEOUT:
                if code not in self._logged:
                    self._logged.add(code)
                    log.warning("waiting for NVML events failed (%s); waiting goes on", e)
                time.sleep(timeout_ms / 1000)  # no busy loop on a failing wait
            return None
        index = self._handles.get(_address(data.device))
        if index is None:
            return None
        gi = int(data.gpuInstanceId)
        return RawEvent(
            index,
            int(data.eventType),
            int(data.eventData),
            gi if index in self._mig_gpus and gi != 0xFFFFFFFF else None,
        )

    def close(self) -> None:
        if self._set is not None:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlEventSetFree(self._set)
            self._set = None


def _answers(handle: Any) -> bool:
    try:
        pynvml.nvmlDeviceGetSupportedEventTypes(handle)
    except pynvml.NVMLError:
        return False
    return True


def _address(handle: Any) -> int:
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


def _missing_function(*_args: Any) -> int:
    return NVML_ERROR_FUNCTION_NOT_FOUND


def _raise(code: int) -> None:
    raise pynvml.NVMLError(code)


def _fan_rpm(handle: Any, fan: int) -> int:
    """nvmlDeviceGetFanSpeedRPM of one fan (pynvml's wrapper reads fan 0 only)."""
    info = pynvml.c_nvmlFanSpeedInfo_t()
    info.version = pynvml.nvmlFanSpeedInfo_v1
    info.fan = fan
    rc = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetFanSpeedRPM")(handle, ctypes.byref(info))
    if rc:
        raise pynvml.NVMLError(rc)
    return int(info.speed)


def _optional(read: Callable[[], Any]) -> Any | None:
    try:
        return read()
    except pynvml.NVMLError:
        return None


def _static_info(index: int, handle: Any, driver_version: str) -> common_pb2.GpuInfo:
    """GpuInfo for one GPU; identity must be readable, everything else is optional (absent when not)."""
    info = common_pb2.GpuInfo(
        index=index,
        uuid=text(pynvml.nvmlDeviceGetUUID(handle)),
        name=text(pynvml.nvmlDeviceGetName(handle)),
        driver_version=driver_version,
    )
    pci = _optional(lambda: pynvml.nvmlDeviceGetPciInfo_v3(handle))
    if pci is not None:
        info.pci_bus_id = text(pci.busId)
    memory = _optional(lambda: pynvml.nvmlDeviceGetMemoryInfo(handle))
    if memory is not None:
        info.memory_total_bytes = int(memory.total)
    limits = _optional(lambda: pynvml.nvmlDeviceGetPowerManagementLimitConstraints(handle))
    if limits is not None:
        info.power_limit_min_w = limits[0] / 1000.0
        info.power_limit_max_w = limits[1] / 1000.0
    default_mw = _optional(lambda: pynvml.nvmlDeviceGetPowerManagementDefaultLimit(handle))
    if default_mw is not None:
        info.power_limit_default_w = default_mw / 1000.0
    for attr, threshold in (
        ("temp_shutdown_c", pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
        ("temp_slowdown_c", pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
        ("temp_mem_max_c", pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX),
        ("temp_gpu_max_c", pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX),
    ):
        value = _optional(functools.partial(pynvml.nvmlDeviceGetTemperatureThreshold, handle, threshold))
        if value is not None:
            setattr(info, attr, float(value))
    arch = _optional(lambda: pynvml.nvmlDeviceGetArchitecture(handle))
    if arch is not None:
        info.architecture = ARCHITECTURES.get(int(arch), "")
    cc = _optional(lambda: pynvml.nvmlDeviceGetCudaComputeCapability(handle))
    if cc is not None:
        info.compute_capability = f"{cc[0]}.{cc[1]}"
    vbios = _optional(lambda: pynvml.nvmlDeviceGetVbiosVersion(handle))
    if vbios is not None:
        info.vbios_version = text(vbios)
    pcie_gen = _optional(lambda: pynvml.nvmlDeviceGetMaxPcieLinkGeneration(handle))
    if pcie_gen is not None:
        info.pcie_gen_max = int(pcie_gen)
    pcie_width = _optional(lambda: pynvml.nvmlDeviceGetMaxPcieLinkWidth(handle))
    if pcie_width is not None:
        info.pcie_width_max = int(pcie_width)
    mig = _optional(lambda: pynvml.nvmlDeviceGetMigMode(handle))
    if mig is not None:
        info.mig_enabled = bool(mig[0])
    gpm = _optional(lambda: pynvml.nvmlGpmQueryDeviceSupport(handle))
    if gpm is not None:
        info.gpm_supported = bool(gpm.isSupportedDevice)
    try:
        info.fan_count = int(pynvml.nvmlDeviceGetNumFans(handle))
        info.passive_cooling = info.fan_count == 0
    except pynvml.NVMLError as e:
        if isinstance(e, pynvml.NVMLError_NotSupported | pynvml.NVMLError_FunctionNotFound):
            # no fans of its own that NVML knows of: a passively cooled part (or a VM that hides them)
            info.passive_cooling = True
            log.info(
                "GPU %d (%s): fan speed is not supported (%s); fan_pct is left out and the acoustic proxy "
                "treats it as passively cooled",
                index,
                info.name,
                e,
            )
    return info
