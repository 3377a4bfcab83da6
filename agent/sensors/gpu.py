"""GPU sensor: every field of the ``gpu`` measurement, read through NVML. The only module that imports pynvml.

The agent's sampler reads it (:meth:`GpuSensor.read_all`), and so does the control plane of a node
that runs ``gpuprobe control-agent`` (:meth:`GpuSensor.read_gpu`, through ``gpuprobe.control.gpus``):
one NVML boundary, one translation of NVML's errors (``tests/test_module_graph.py`` checks it).

Static facts (:class:`~gpuprobe.v1.common_pb2.GpuInfo`) are read once per GPU when the sensor opens,
through pynvml's ordinary wrappers. The per-sample path is the hot path (10-50 reads per GPU per
second), so it calls the NVML C functions that pynvml loaded directly, with output buffers allocated
once per GPU, and batches four fields into one ``nvmlDeviceGetFieldValues`` call:

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

Errors are translated here, once:

- ``NOT_SUPPORTED`` (or a missing function): the field is absent from every later sample of that GPU
  (never a fake zero) and the fact is logged once per GPU and field.
- ``GPU_IS_LOST``: the GPU yields no samples and is logged as lost; it is retried once per
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
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml

from gpuprobe.errors import ServiceError
from gpuprobe.v1 import common_pb2

log = logging.getLogger(__name__)

Sample = dict[str, Any]  # keyword arguments of gpuprobe.v1.GpuSample

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25

FIELD_MEMORY_TEMP = 82
FIELD_TOTAL_ENERGY_CONSUMPTION = 83
FIELD_POWER_INSTANT = 186
FIELD_POWER_CURRENT_LIMIT = 190

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
}

VIRTUALIZATION_MODES: dict[int, common_pb2.Virtualization] = {
    0: common_pb2.VIRTUALIZATION_BARE_METAL,  # NONE; refined with the hypervisor flag by the caller
    1: common_pb2.VIRTUALIZATION_PASSTHROUGH,
    2: common_pb2.VIRTUALIZATION_VGPU,
    3: common_pb2.VIRTUALIZATION_HOST_VGPU,
    4: common_pb2.VIRTUALIZATION_HOST_VGPU,
}


class GpuSensorError(ServiceError, RuntimeError):
    """NVML cannot be used at all (no library, no driver): the agent runs without GPUs."""


def _error_name(code: int) -> str:
    try:
        return str(pynvml.NVMLError(code))
    except Exception:  # pragma: no cover - pynvml formats every code it knows
        return f"NVML error {code}"


def _field_value(f: Any) -> float | int:
    """The value of one nvmlFieldValue_t, by its valueType."""
    vt = f.valueType
    v = f.value
    if vt == 1:
        return int(v.uiVal)
    if vt == 3:
        return int(v.ullVal)
    if vt == 0:
        return float(v.dVal)
    if vt == 5:
        return int(v.siVal)
    if vt == 2:
        return int(v.ulVal)
    if vt == 4:
        return int(v.sllVal)
    return int(v.usVal)


VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


@dataclass
class _FieldSpec:
    key: str
    field_id: int
    divisor: int  # the raw value divided by this (exactly, as a reader of the raw value would)
    value_type: int = -1  # nvmlValueType_t, learnt from the probe read


@dataclass
class _Call:
    """One NVML getter of the hot path: ``fn(*args)`` fills ``buffer``; ``outputs`` says what goes into the sample.

    ``outputs`` maps sample keys to Python expressions over the buffer, written with ``{b}`` for it
    (``"{b}.value / 1000"``); they are compiled once into ``store`` and into the GPU's fast reader.
    """

    key: str  # the sample key it provides (for logging and the unsupported set)
    fn: Any
    args: tuple[Any, ...]
    buffer: Any
    outputs: dict[str, str]
    store: Callable[[Sample], None] = field(init=False)

    def __post_init__(self) -> None:
        body = "".join(f"    s[{k!r}] = {e.format(b='b')}\n" for k, e in self.outputs.items())
        namespace: dict[str, Any] = {"b": self.buffer}
        exec(f"def store(s):\n{body}", namespace)
        self.store = namespace["store"]


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
    logged_errors: set[tuple[str, int]] = field(default_factory=set)
    limit_fallback: bool = False  # field 190 is missing: read the enforced power limit instead
    fast: Callable[[int], Sample | None] | None = None  # the straight-line reader (None while probing)
    lost: bool = False
    retry_at: float = 0.0
    known: bool = True  # False: lost when the sensor opened, its static facts not read yet

    @property
    def label(self) -> str:
        return f"GPU {self.index} ({self.info.name}, {self.info.uuid})"


class GpuSensor:
    """All GPUs of the node. ``read_all`` is called by the sampler thread only."""

    def __init__(
        self, gpus: list[_Gpu], driver_version: str, virtualization: common_pb2.Virtualization, lost_retry_s: float
    ) -> None:
        self._gpus = gpus
        self.driver_version = driver_version
        self.virtualization = virtualization
        self._lost_retry_s = lost_retry_s
        self.read_errors = 0  # NVML errors other than "not supported" (the sampler reads the total)
        self._fv = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(cls, lost_retry_s: float = 1.0) -> GpuSensor:
        """Initialise NVML and read every GPU's static facts; raises GpuSensorError without NVML."""
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise GpuSensorError(f"NVML is not available: {e}") from None
        try:
            driver = _text(pynvml.nvmlSystemGetDriverVersion())
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
                if handle is not None and isinstance(e, pynvml.NVMLError_GpuIsLost):
                    log.error("GPU %d is lost (%s): it joins when it answers; the other GPUs are sampled", index, e)
                    gpus.append(
                        _Gpu(index=index, handle=handle, info=common_pb2.GpuInfo(index=index), lost=True, known=False)
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
        """Prepare the buffers and calls of the hot path for one GPU."""
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

        def add(key: str, name: str | None, buffer: Any, outputs: dict[str, str], *args: Any) -> None:
            fn = self._function(name) if name else None
            if fn is not None:
                calls.append(_Call(key, fn, (h, *args), buffer, outputs))
            elif key not in gpu.unsupported:
                self._unsupported(gpu, key, f"{name or 'its function'} is missing", NVML_ERROR_FUNCTION_NOT_FOUND)

        util = pynvml.c_nvmlUtilization_t()
        add("util_pct", "nvmlDeviceGetUtilizationRates", util, {"util_pct": "{b}.gpu", "mem_util_pct": "{b}.memory"},
            ctypes.byref(util))  # fmt: skip

        memory_outputs = {"mem_used_bytes": "{b}.used", "mem_total_bytes": "{b}.total"}
        mem2 = pynvml.c_nvmlMemory_v2_t()
        mem2.version = pynvml.nvmlMemory_v2
        fn = self._function("nvmlDeviceGetMemoryInfo_v2")
        if fn is not None and fn(h, ctypes.byref(mem2)) == NVML_SUCCESS:
            add("mem_used_bytes", "nvmlDeviceGetMemoryInfo_v2", mem2, memory_outputs, ctypes.byref(mem2))
        else:
            mem1 = pynvml.c_nvmlMemory_t()
            add("mem_used_bytes", "nvmlDeviceGetMemoryInfo", mem1, memory_outputs, ctypes.byref(mem1))

        power = ctypes.c_uint()
        add("power_w", "nvmlDeviceGetPowerUsage", power, {"power_w": "{b}.value / 1000"}, ctypes.byref(power))

        temp_v = pynvml.c_nvmlTemperature_v1_t()
        temp_v.version = pynvml.nvmlTemperature_v1
        temp_v.sensorType = 0  # NVML_TEMPERATURE_GPU
        fn = self._function("nvmlDeviceGetTemperatureV")
        if fn is not None and fn(h, ctypes.byref(temp_v)) == NVML_SUCCESS:
            add("temp_c", "nvmlDeviceGetTemperatureV", temp_v, {"temp_c": "{b}.temperature"}, ctypes.byref(temp_v))
        else:
            temp = ctypes.c_uint()
            add("temp_c", "nvmlDeviceGetTemperature", temp, {"temp_c": "{b}.value"}, 0, ctypes.byref(temp))

        fans = gpu.info.fan_count if gpu.info.HasField("fan_count") else 0
        fan_fn = self._function("nvmlDeviceGetFanSpeed_v2")
        if fans and fan_fn is not None:
            calls.append(self._fan_call(fan_fn, h, fans))
        elif not gpu.info.HasField("fan_count"):
            gpu.unsupported.add("fan_pct")  # logged when the static facts were read

        for key, clock_type in (("sm_clock_mhz", 1), ("mem_clock_mhz", 2)):
            clock = ctypes.c_uint()
            add(key, "nvmlDeviceGetClockInfo", clock, {key: "{b}.value"}, clock_type, ctypes.byref(clock))

        reasons = ctypes.c_ulonglong()
        name = next(
            (n for n in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
             if self._function(n) is not None),
            None,
        )  # fmt: skip
        add("clock_event_reasons", name, reasons, {"clock_event_reasons": "{b}.value"}, ctypes.byref(reasons))

        if gpu.limit_fallback:
            limit = ctypes.c_uint()
            add("power_limit_w", "nvmlDeviceGetEnforcedPowerLimit", limit, {"power_limit_w": "{b}.value / 1000"},
                ctypes.byref(limit))  # fmt: skip

        gpu.calls = [c for c in calls if c.key not in gpu.unsupported]
        pcie: list[_Call] = []
        fn = self._function("nvmlDeviceGetPcieThroughput")
        for key, counter in (("pcie_tx_bytes_per_s", 0), ("pcie_rx_bytes_per_s", 1)):
            kb_per_s = ctypes.c_uint()
            if fn is not None and key not in gpu.unsupported:
                pcie.append(_Call(key, fn, (h, counter, ctypes.byref(kb_per_s)), kb_per_s, {key: "{b}.value * 1024"}))
        gpu.pcie_calls = pcie
        gpu.fast = None

    def _set_fields(self, gpu: _Gpu, specs: list[_FieldSpec]) -> None:
        gpu.fields = specs
        gpu.field_count = len(specs)
        gpu.field_array = (pynvml.c_nvmlFieldValue_t * max(1, len(specs)))()
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

        mean = "(" + " + ".join(f"{{b}}[{i}].value" for i in range(fans)) + f") / {fans}"
        return _Call("fan_pct", read_fans, (h,), outs, {"fan_pct": mean})

    def _compile_fast(self, gpu: _Gpu) -> None:
        """The GPU's hot-path reader as one straight-line function (about half the cost of a generic loop).

        It returns None as soon as any call or field answers anything but SUCCESS (or a field's value
        type differs from the probe's); the careful path (:meth:`_read`) then reads the GPU again and
        deals with the error.
        """
        ns: dict[str, Any] = {"h": gpu.handle, "fv": self._fv, "arr": gpu.field_array}
        checks: list[str] = []
        items = ['"time_unix_ns": t_ns', f'"gpu_index": {gpu.index}']
        if gpu.field_count:
            checks.append(f"fv(h, {gpu.field_count}, arr)")
            for i, spec in enumerate(gpu.fields):
                if spec.value_type not in VALUE_MEMBERS:
                    return  # never read successfully: no fast path
                ns[f"f{i}"] = gpu.field_array[i]
                checks.append(f"f{i}.nvmlReturn or f{i}.valueType != {spec.value_type}")
                value = f"f{i}.value.{VALUE_MEMBERS[spec.value_type]}"
                items.append(f"{spec.key!r}: {value}" + (f" / {spec.divisor}" if spec.divisor != 1 else ""))
        for j, call in enumerate(gpu.calls):
            ns[f"c{j}"] = call.fn
            ns[f"b{j}"] = call.buffer
            for k, arg in enumerate(call.args):
                ns[f"c{j}a{k}"] = arg
            checks.append(f"c{j}({', '.join(f'c{j}a{k}' for k in range(len(call.args)))})")
            items.extend(f"{key!r}: {expr.format(b=f'b{j}')}" for key, expr in call.outputs.items())
        source = (
            "def read(t_ns):\n"
            f"    if {' or '.join(checks) or 'False'}:\n"
            "        return None\n"
            f"    return {{{', '.join(items)}}}\n"
        )
        exec(source, ns)
        gpu.fast = ns["read"]

    def _probe(self, gpu: _Gpu) -> None:
        """Reads at start: find what this GPU does not support and drop it from the hot path."""
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
        if not gpu.lost:
            for i, spec in enumerate(gpu.fields):
                if gpu.field_array[i].nvmlReturn == NVML_SUCCESS:
                    spec.value_type = int(gpu.field_array[i].valueType)
            self._compile_fast(gpu)
        # the probe's errors are not sampling errors
        self.read_errors = 0

    # ------------------------------------------------------------------ errors

    def _unsupported(self, gpu: _Gpu, key: str, what: str, code: int) -> None:
        gpu.unsupported.add(key)
        if key == "power_limit_w" and not gpu.limit_fallback:
            return  # the enforced power limit is tried instead
        log.info("%s: %s is not supported (%s: %s); the field is left out", gpu.label, key, what, _error_name(code))

    def _lose(self, gpu: _Gpu, what: str) -> None:
        self.read_errors += 1
        gpu.retry_at = time.monotonic() + self._lost_retry_s
        if not gpu.lost:
            gpu.lost = True
            log.error(
                "%s is lost (%s answered GPU_IS_LOST): no samples from it until it answers again; "
                "the other GPUs keep being sampled",
                gpu.label,
                what,
            )

    def _error(self, gpu: _Gpu, key: str, code: int) -> None:
        self.read_errors += 1
        if (key, code) not in gpu.logged_errors:
            gpu.logged_errors.add((key, code))
            log.warning(
                "%s: reading %s failed (%s); the field is left out of that sample", gpu.label, key, _error_name(code)
            )

    # ------------------------------------------------------------------ the hot path

    def read_all(self, pcie_every: int = 1, pcie_slot: int = 0) -> list[Sample]:
        """One sample per GPU that answers, each stamped (agent clock, ns) just before its GPU is read.

        The GPUs at positions ``p`` with ``p % pcie_every == pcie_slot`` also get PCIe throughput, read
        after every GPU's sample (each PCIe read can block ~20 ms on real GPUs).
        """
        out: list[Sample] = []
        pcie: list[tuple[_Gpu, Sample]] = []
        time_ns = time.time_ns
        for position, gpu in enumerate(self._gpus):
            fast = gpu.fast
            if gpu.lost:
                if time.monotonic() < gpu.retry_at or (not gpu.known and not self._identify(gpu)):
                    continue
                fast = None
            t_ns = time_ns()
            sample = fast(t_ns) if fast is not None else None
            if sample is None:
                sample = self._read(gpu, t_ns)  # a call failed (or no fast path): read carefully
                if sample is not None and gpu.fast is None and not gpu.lost:
                    self._compile_fast(gpu)  # a GPU that was lost at the probe
            if sample is not None:
                out.append(sample)
                if position % pcie_every == pcie_slot and gpu.pcie_calls:
                    pcie.append((gpu, sample))
        for gpu, sample in pcie:
            self._read_pcie(gpu, sample)
        return out

    @property
    def count(self) -> int:
        return len(self._gpus)

    def read_gpu(self, index: int) -> Sample | None:
        """One sample of the GPU with NVML index ``index``, without PCIe; None when it is lost or unknown.

        For a reader that wants some GPUs on its own schedule (the control plane's probe sampler in
        ``gpuprobe control-agent``). Like :meth:`read_all` it must not run in two threads at once:
        the read buffers are the GPU's own. It repeats :meth:`read_all`'s per-GPU steps rather than
        sharing them, so that the hot path keeps no extra call per GPU.
        """
        gpu = next((g for g in self._gpus if g.index == index), None)
        if gpu is None or not gpu.known or (gpu.lost and time.monotonic() < gpu.retry_at):
            return None
        t_ns = time.time_ns()
        sample = gpu.fast(t_ns) if gpu.fast is not None and not gpu.lost else None
        if sample is None:
            sample = self._read(gpu, t_ns)  # a call failed (or no fast path): read carefully
            if sample is not None and gpu.fast is None and not gpu.lost:
                self._compile_fast(gpu)  # a GPU that was lost at the probe
        return sample

    def _read(self, gpu: _Gpu, t_ns: int, probing: bool = False) -> Sample | None:
        sample: Sample = {"time_unix_ns": t_ns, "gpu_index": gpu.index}
        if gpu.field_count:
            rc = self._fv(gpu.handle, gpu.field_count, gpu.field_array)
            if rc == NVML_ERROR_GPU_IS_LOST:
                self._lose(gpu, "nvmlDeviceGetFieldValues")
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
                        sample[spec.key] = _field_value(f) / spec.divisor if spec.divisor != 1 else _field_value(f)
                        if spec.value_type < 0:
                            spec.value_type = int(f.valueType)
                    elif frc == NVML_ERROR_GPU_IS_LOST:
                        self._lose(gpu, f"field {spec.field_id}")
                        return None
                    elif frc == NVML_ERROR_NOT_SUPPORTED and probing:
                        self._unsupported(gpu, spec.key, f"NVML field {spec.field_id}", frc)
                    else:
                        self._error(gpu, spec.key, frc)
        for call in gpu.calls:
            rc = call.fn(*call.args)
            if rc == NVML_SUCCESS:
                call.store(sample)
            elif rc == NVML_ERROR_GPU_IS_LOST:
                self._lose(gpu, call.key)
                return None
            elif probing and rc in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND):
                self._unsupported(gpu, call.key, "NVML", rc)
            else:
                self._error(gpu, call.key, rc)
        if gpu.lost:
            gpu.lost = False
            log.warning("%s answers again; sampling it resumes", gpu.label)
            self._refresh_info(gpu)
        return sample

    def _read_pcie(self, gpu: _Gpu, sample: Sample, probing: bool = False) -> None:
        for call in gpu.pcie_calls:
            rc = call.fn(*call.args)
            if rc == NVML_SUCCESS:
                call.store(sample)
            elif rc == NVML_ERROR_GPU_IS_LOST:
                self._lose(gpu, call.key)
                return
            elif probing and rc in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND):
                self._unsupported(gpu, call.key, "NVML", rc)
            else:
                self._error(gpu, call.key, rc)
        if probing:
            gpu.pcie_calls = [c for c in gpu.pcie_calls if c.key not in gpu.unsupported]


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _optional(read: Callable[[], Any]) -> Any | None:
    try:
        return read()
    except pynvml.NVMLError:
        return None


def _static_info(index: int, handle: Any, driver_version: str) -> common_pb2.GpuInfo:
    """GpuInfo for one GPU; identity must be readable, everything else is optional (absent when not)."""
    info = common_pb2.GpuInfo(
        index=index,
        uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
        name=_text(pynvml.nvmlDeviceGetName(handle)),
        driver_version=driver_version,
    )
    pci = _optional(lambda: pynvml.nvmlDeviceGetPciInfo_v3(handle))
    if pci is not None:
        info.pci_bus_id = _text(pci.busId)
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
        info.vbios_version = _text(vbios)
    pcie_gen = _optional(lambda: pynvml.nvmlDeviceGetMaxPcieLinkGeneration(handle))
    if pcie_gen is not None:
        info.pcie_gen_max = int(pcie_gen)
    pcie_width = _optional(lambda: pynvml.nvmlDeviceGetMaxPcieLinkWidth(handle))
    if pcie_width is not None:
        info.pcie_width_max = int(pcie_width)
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


class NvmlCallError(ServiceError, RuntimeError):
    """An NVML call outside the sampler failed; ``code`` is NVML's return code."""

    def __init__(self, what: str, code: int) -> None:
        super().__init__(f"{what}: {_error_name(code)}")
        self.code = code

    @property
    def no_permission(self) -> bool:
        return bool(self.code == pynvml.NVML_ERROR_NO_PERMISSION)

    @property
    def not_supported(self) -> bool:
        return self.code in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)


class GpuDevice:
    """One GPU for the few calls made outside the sampler: a trainer reading the SM clock of the
    simulated GPU it plays, and the control plane reading and setting power limits. Calls block (NVML
    is synchronous); NVML's errors become :class:`NvmlCallError`."""

    def __init__(self, index: int) -> None:
        self.index = index
        self._call("nvmlInit", pynvml.nvmlInit)
        self._handle = self._call(f"GPU {index}", pynvml.nvmlDeviceGetHandleByIndex, index)

    @staticmethod
    def _call(what: str, function: Callable[..., Any], *args: Any) -> Any:
        try:
            return function(*args)
        except pynvml.NVMLError as e:
            raise NvmlCallError(what, int(e.value)) from None

    @staticmethod
    def count() -> int:
        GpuDevice._call("nvmlInit", pynvml.nvmlInit)
        return int(GpuDevice._call("device count", pynvml.nvmlDeviceGetCount))

    @property
    def uuid(self) -> str:
        return _text(self._call(f"GPU {self.index} UUID", pynvml.nvmlDeviceGetUUID, self._handle))

    def sm_clock_mhz(self) -> float:
        return float(
            self._call(f"GPU {self.index} SM clock", pynvml.nvmlDeviceGetClockInfo, self._handle, pynvml.NVML_CLOCK_SM)
        )

    def temp_slowdown_c(self) -> float | None:
        """The slowdown threshold, None where the GPU does not say."""
        try:
            return float(
                self._call(
                    f"GPU {self.index} slowdown threshold",
                    pynvml.nvmlDeviceGetTemperatureThreshold,
                    self._handle,
                    pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
                )
            )
        except NvmlCallError:
            return None

    def power_limit_w(self) -> float:
        mw = self._call(f"GPU {self.index} power limit", pynvml.nvmlDeviceGetPowerManagementLimit, self._handle)
        return float(mw) / 1000.0

    def power_limit_constraints_w(self) -> tuple[float, float]:
        low, high = self._call(
            f"GPU {self.index} power limit range", pynvml.nvmlDeviceGetPowerManagementLimitConstraints, self._handle
        )
        return float(low) / 1000.0, float(high) / 1000.0

    def set_power_limit_w(self, limit_w: float) -> None:
        self._call(
            f"GPU {self.index} set power limit {limit_w:.0f} W",
            pynvml.nvmlDeviceSetPowerManagementLimit,
            self._handle,
            round(limit_w * 1000),
        )

    def close(self) -> None:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
