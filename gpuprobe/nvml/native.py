"""Part: nvml. The native sampler (``native/sampler.c``): the per-tick NVML reads on their schedule, in C.

The C side owns the 10 Hz schedule and the raw calls only: one thread on an absolute monotonic grid,
per tick and GPU a wall-clock stamp and the calls of a plan given at :meth:`NativeSampler.start`, every
tick one fixed-size record in a bounded ring (the oldest overwritten and counted when nobody drains it).
This module loads it (ctypes), hands it the plan and unpacks the drained records into
:class:`Record` tuples of raw answers. What the answers mean (units, not supported, lost) is
:mod:`gpuprobe.nvml.sensor`'s, which builds the plan from the reads it prepared for each GPU.

Built by ``make sim`` (``python -m gpuprobe.nvml.native``), with the C compiler the simulator needs, and
on first use where the package folder or ``~/.cache/gpuprobe/sampler`` is writable.
"""

from __future__ import annotations

import argparse
import ctypes
import struct
import sys
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

from gpuprobe.cbuild import CLibrary
from gpuprobe.nvml import REALTIME_PRIORITY
from gpuprobe.nvml.errors import NativeSamplerError

NATIVE_DIR = Path(__file__).resolve().parent / "native"
SOURCE = NATIVE_DIR / "sampler.c"
SONAME = "libgpuprobe-sampler.so"
LIB_ENV = "GPUPROBE_SAMPLER_LIB_DIR"
BUILD_COMMAND = "python -m gpuprobe.nvml.native"  # (or `make sim` in a checkout)
NVML_LIBRARY = "libnvidia-ml.so.1"  # the library pynvml loaded: the C side binds the same one
ABI = 2  # sampler.c's GS_ABI
NOT_READ = -1  # a call's status on a tick it was not made (off its period, GPU skipped, disabled)

LIBRARY = CLibrary(
    what="the native GPU sampler",
    source=SOURCE,
    soname=SONAME,
    ldflags=(f"-Wl,-soname,{SONAME}", "-ldl", "-lpthread"),
    env_dir=LIB_ENV,
    cache_name="sampler",
    error=NativeSamplerError,
)


class Kind(IntEnum):
    """sampler.c's ``gs_kind``: which NVML call, and what its record's ``a``/``b`` hold."""

    FIELD = 0  # nvmlDeviceGetFieldValues, arg = field id: a = the value's 8 bytes, b = valueType
    UTILIZATION = 1  # a = gpu %, b = memory %
    MEMORY_V2 = 2  # arg = the struct's version: a = used, b = total bytes
    MEMORY = 3  # a = used, b = total bytes
    POWER = 4  # nvmlDeviceGetPowerUsage: a = mW
    TEMPERATURE_V = 5  # arg = the struct's version, GPU sensor: a = °C (signed, two's complement)
    TEMPERATURE = 6  # arg = sensor: a = °C
    FANS = 7  # nvmlDeviceGetFanSpeed_v2 of fans 0..arg-1: a = sum of %, b = fans read
    CLOCK = 8  # nvmlDeviceGetClockInfo, arg = clock type: a = MHz
    EVENT_REASONS = 9  # nvmlDeviceGetCurrentClocksEventReasons: a = bitmask
    THROTTLE_REASONS = 10  # nvmlDeviceGetCurrentClocksThrottleReasons (older drivers)
    ENFORCED_LIMIT = 11  # nvmlDeviceGetEnforcedPowerLimit: a = mW
    PCIE = 12  # nvmlDeviceGetPcieThroughput, arg = counter: a = KB/s (made after every GPU's other calls)


@dataclass(frozen=True)
class NativeCall:
    kind: Kind
    arg: int = 0
    every: int = 1  # made on the ticks n with n % every == phase
    phase: int = 0


@dataclass(frozen=True)
class NativeGpu:
    handle: int  # the nvmlDevice_t's address
    calls: tuple[NativeCall, ...]


@dataclass(frozen=True)
class Record:
    """One tick: ``stamps[g]`` the wall clock (ns) just before GPU ``g`` of the plan was read (0: not read),
    ``values`` (rc, a, b) per call of the plan, in its order (rc :data:`NOT_READ`: not made)."""

    tick: int
    due_mono_ns: int
    start_mono_ns: int
    end_mono_ns: int
    stamps: tuple[int, ...]
    values: tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class Stats:
    written: int  # records written since start
    overwritten: int  # records overwritten before they were drained
    missed_ticks: int  # ticks skipped because the previous one overran by more than half an interval
    running: bool
    error: int  # the errno that stopped the thread (its clock_nanosleep failed); 0 while it runs
    realtime: bool  # the thread runs under SCHED_FIFO (asked for, and the process may: REALTIME_PRIORITY)


class _GsGpu(ctypes.Structure):
    _fields_ = (("handle", ctypes.c_void_p), ("first", ctypes.c_uint32), ("count", ctypes.c_uint32))


class _GsCall(ctypes.Structure):
    _fields_ = (
        ("kind", ctypes.c_uint32),
        ("arg", ctypes.c_uint32),
        ("every", ctypes.c_uint32),
        ("phase", ctypes.c_uint32),
    )


class _GsStats(ctypes.Structure):
    _fields_ = (
        ("written", ctypes.c_uint64),
        ("overwritten", ctypes.c_uint64),
        ("missed_ticks", ctypes.c_uint64),
        ("running", ctypes.c_int32),
        ("error", ctypes.c_int32),
        ("realtime", ctypes.c_int32),
        ("pad", ctypes.c_int32),
    )


_START_ERRORS = {
    -1: "NVML is not bound",
    -2: "it is running already",
    -3: "a call of the plan has no NVML function in this driver",
    -4: "no memory or no thread",
    -5: "a bad argument",
}


class NativeSampler:
    """The loaded library. One per process: the C side holds one schedule."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        lib.gs_open.argtypes = (ctypes.c_char_p,)
        lib.gs_start.argtypes = (
            ctypes.POINTER(_GsGpu),
            ctypes.c_uint32,
            ctypes.POINTER(_GsCall),
            ctypes.c_uint32,
            ctypes.POINTER(ctypes.c_int),
            ctypes.c_uint32,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_uint32,
            ctypes.c_uint32,
            ctypes.c_uint64,
            ctypes.c_int,
        )
        lib.gs_drain.argtypes = (ctypes.c_void_p, ctypes.c_uint32, ctypes.POINTER(_GsStats))
        lib.gs_drain.restype = ctypes.c_uint32
        lib.gs_disable.argtypes = (ctypes.c_uint32,)
        lib.gs_sizeof_value.restype = ctypes.c_size_t
        lib.gs_sizeof_header.restype = ctypes.c_size_t
        if lib.gs_abi() != ABI or lib.gs_sizeof_value() != 24 or lib.gs_sizeof_header() != 32:
            raise NativeSamplerError(f"the native sampler library is of another gpuprobe: rebuild it ({BUILD_COMMAND})")
        if lib.gs_open(NVML_LIBRARY.encode()) != 0:
            raise NativeSamplerError(f"the native sampler cannot open {NVML_LIBRARY}")
        self._record: struct.Struct | None = None
        self._ngpus = 0
        self._buffer: ctypes.Array[ctypes.c_char] | None = None
        self._capacity = 0

    @classmethod
    def load(cls, build: bool = True) -> NativeSampler:
        """The library, built first if needed and ``build``; NativeSamplerError (saying how to build it)
        when it cannot be loaded."""
        try:
            lib_dir = LIBRARY.ensure() if build else LIBRARY.built()
        except NativeSamplerError as e:
            raise NativeSamplerError(
                f"the native GPU sampler cannot be built: {e}\nbuild it with: {BUILD_COMMAND}"
            ) from None
        if lib_dir is None:
            raise NativeSamplerError(f"the native GPU sampler is not built: build it with {BUILD_COMMAND}")
        try:
            lib = ctypes.CDLL(str(lib_dir / SONAME))
        except OSError as e:
            raise NativeSamplerError(
                f"the native GPU sampler cannot be loaded ({e}): rebuild it with {BUILD_COMMAND}"
            ) from None
        return cls(lib)

    def start(
        self,
        gpus: list[NativeGpu],
        stop_codes: list[int],
        t0_mono_ns: int,
        interval_ns: int,
        retry_ticks: int,
        capacity: int,
        first_tick: int = 0,
        realtime: bool = False,
    ) -> None:
        """Start the thread: tick n (from ``first_tick``) at ``t0_mono_ns + n * interval_ns`` (CLOCK_MONOTONIC, as
        ``time.monotonic_ns``); a GPU whose call answers one of ``stop_codes`` is skipped for
        ``retry_ticks`` ticks; ``capacity`` records in the ring; ``realtime``: the thread asks for SCHED_FIFO at
        :data:`REALTIME_PRIORITY` (:attr:`Stats.realtime` says whether it was granted)."""
        calls = [c for g in gpus for c in g.calls]
        gs_gpus = (_GsGpu * max(1, len(gpus)))()
        first = 0
        for i, g in enumerate(gpus):
            gs_gpus[i].handle = g.handle
            gs_gpus[i].first = first
            gs_gpus[i].count = len(g.calls)
            first += len(g.calls)
        gs_calls = (_GsCall * max(1, len(calls)))()
        for i, c in enumerate(calls):
            gs_calls[i].kind, gs_calls[i].arg, gs_calls[i].every, gs_calls[i].phase = (
                int(c.kind),
                c.arg,
                c.every,
                c.phase,
            )
        codes = (ctypes.c_int * max(1, len(stop_codes)))(*stop_codes)
        rc = self._lib.gs_start(
            gs_gpus,
            len(gpus),
            gs_calls,
            len(calls),
            codes,
            len(stop_codes),
            t0_mono_ns,
            interval_ns,
            retry_ticks,
            capacity,
            first_tick,
            REALTIME_PRIORITY if realtime else 0,
        )
        if rc != 0:
            raise NativeSamplerError(f"the native GPU sampler did not start: {_START_ERRORS.get(rc, rc)}")
        self._ngpus = len(gpus)
        self._record = struct.Struct("=Qqqq" + "q" * len(gpus) + "iIQQ" * len(calls))
        self._capacity = capacity
        self._buffer = ctypes.create_string_buffer(self._record.size * capacity)

    def disable(self, call: int) -> None:
        """Leave call number ``call`` of the plan (in its order over all GPUs) out of every later tick."""
        self._lib.gs_disable(call)

    def drain(self) -> tuple[list[Record], Stats]:
        """The records not drained yet, oldest first, and the counters."""
        stats = _GsStats()
        record, buffer = self._record, self._buffer
        if record is None or buffer is None:
            self._lib.gs_drain(None, 0, ctypes.byref(stats))
            return [], _stats(stats)
        n = self._lib.gs_drain(buffer, self._capacity, ctypes.byref(stats))
        g = self._ngpus
        out: list[Record] = []
        for fields in record.iter_unpack(memoryview(buffer)[: n * record.size]):
            rest = fields[4 + g :]
            values = tuple((rest[i], rest[i + 2], rest[i + 3]) for i in range(0, len(rest), 4))
            out.append(Record(fields[0], fields[1], fields[2], fields[3], fields[4 : 4 + g], values))
        return out, _stats(stats)

    def stop(self) -> None:
        """Stop the thread (at most one interval later); the records not drained yet can still be drained."""
        self._lib.gs_stop()


def _stats(stats: _GsStats) -> Stats:
    return Stats(
        int(stats.written),
        int(stats.overwritten),
        int(stats.missed_ticks),
        bool(stats.running),
        int(stats.error),
        bool(stats.realtime),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog=BUILD_COMMAND, description="Compiles the native GPU sampler."
    )
    parser.add_argument("--out", type=Path, help=f"folder to write {SONAME} into (default: a cache)")
    args = parser.parse_args(argv)
    try:
        lib_dir = LIBRARY.build(args.out) if args.out else LIBRARY.ensure()
    except NativeSamplerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(lib_dir / SONAME)
    return 0


if __name__ == "__main__":
    sys.exit(main())
