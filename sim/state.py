"""Part: sim. The simulator's state directory: the one place the C library and Python agree on.

Layout (all text, so a person can read it)::

    sim.conf        key value lines, written once by ``create``: start_ns, period_ns, the driver
                    version, the uids the simulated driver treats as privileged (``admin_uids``:
                    only they may set power limits), every parameter of every GPU as
                    ``gpu.<index>.<key> <value>`` and the workload activity table as
                    ``workload.<id> <name> <ratio per GPM metric>``
    gpu<N>.events   append-only input history of GPU N, one line per event, always five fields:
                    ``<unix_ns> <kind> <value> <arg> <arg2>``
                    U = utilization in % (arg: the holding pid, arg2: its memory in bytes),
                    L = power limit in mW, F = 1 fails the GPU (GPU_IS_LOST; another
                    value: that nvmlReturn_t, e.g. 16 RESET_REQUIRED), 0 brings it back
                    (a GPU reset), W = the workload id of the U line that follows (written with
                    it), X = an XID error (value: the code), E = an ECC error (1 single-bit,
                    2 double-bit), R = a row-remap flag (1 pending, 2 failure), N = NVLink
                    errors (value: the count, arg: the link). Readers ignore kinds they do not know.

Every process that loads the library computes the state of a GPU as a pure function of sim.conf,
the events and the time, in fixed ticks of ``period_ns`` from ``start_ns``: so two processes reading
the same GPU at the same moment see the same values. An event takes effect at the first tick
boundary at or after its timestamp. Writers append one whole line under an exclusive ``flock`` and
take the timestamp while holding it; readers read under a shared lock and take their clock before
releasing it, so no reader can ever have computed a tick that a later-visible event should have
changed.
"""

from __future__ import annotations

import fcntl
import os
import time
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from gpuprobe.errors import ServiceError
from gpuprobe.sim.profiles import WORKLOAD_ACTIVITY, WORKLOAD_IDS, GpuProfile

STATE_DIR_ENV = "GPUPROBE_SIM_DIR"
CONF_NAME = "sim.conf"
DEFAULT_PERIOD_S = 0.1
# A driver of NVML API 13 (nvml.h's NVML_API_VERSION, the header the interface is held against): 580.65.06 is
# the first driver for CUDA 13.0
DRIVER_VERSION = "580.65.06"
CUDA_DRIVER_VERSION = 13000  # 13.0, as nvmlSystemGetCudaDriverVersion encodes it
FORMAT_VERSION = 1
# Event kinds (see the module docstring); the health kinds are injected by `gpuprobe sim fail`.
EVENT_KINDS = ("U", "L", "F", "W", "X", "E", "R", "N")
ECC_SINGLE_BIT = 1
ECC_DOUBLE_BIT = 2
REMAP_PENDING = 1
REMAP_FAILURE = 2
# The DVFS parameters that make the clock linear in the active power: the law of machines written
# before the curve existed (sim/native/nvml_sim.c applies the same to a sim.conf without them).
LEGACY_LINEAR_DVFS: dict[str, float] = {
    "uncore_power_share": 0.0,
    "voltage_floor": 1.0,
    "voltage_knee": 0.0,
    "voltage_exponent": 1.0,
}
# The thermal parameters a machine written before the two-stage model lacks, at the values that make the
# model the first-order RC it then was (sim/native/nvml_sim.c reads an absent key as the same value).
LEGACY_FIRST_ORDER_THERMAL: dict[str, float] = {
    "r_fast_c_per_w": 0.0,
    "tau_fast_s": 0.0,
    "inlet_c_per_w": 0.0,
    "inlet_tau_s": 0.0,
    "slot_offset_c": 0.0,
    "fan_conductance_floor": 1.0,
}
# The health parameters a machine written before they existed lacks, at the values the C library reads
# an absent key as: no NVLink (every counter supported where there is), no MIG (row_remapping it derives
# from the architecture, as the profiles do).
LEGACY_HEALTH: dict[str, int] = {"nvlink_links": 0, "nvlink_unsupported_counters": 0, "mig_instances": 0}
# Who may set power limits, like the driver: root. Tests that run unprivileged add their own uid.
DEFAULT_ADMIN_UIDS: tuple[int, ...] = (0,)


class SimStateError(ServiceError, RuntimeError):
    pass


@dataclass(frozen=True)
class SimGpu:
    index: int
    uuid: str
    serial: str
    pci_bus: int
    profile: GpuProfile


@dataclass(frozen=True)
class SimSettings:
    """One simulated machine (its clock origin, update period and GPUs), as ``sim run``'s options made it
    and its state directory's conf file holds it."""

    start_ns: int
    period_ns: int
    gpus: list[SimGpu]
    admin_uids: tuple[int, ...] = DEFAULT_ADMIN_UIDS  # effective uids allowed to set power limits

    def tick_start_ns(self, t_ns: int) -> int:
        """The start of the update period that contains ``t_ns``."""
        return self.start_ns + (t_ns - self.start_ns) // self.period_ns * self.period_ns

    def next_tick_ns(self, t_ns: int) -> int:
        """The first tick boundary at or after ``t_ns``: when an event written at t_ns takes effect."""
        k = -(-(t_ns - self.start_ns) // self.period_ns)
        return self.start_ns + k * self.period_ns


def _format_value(value: object) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def create(
    state_dir: Path,
    profiles: Iterable[GpuProfile],
    period_s: float = DEFAULT_PERIOD_S,
    start_ns: int | None = None,
    admin_uids: Iterable[int] = DEFAULT_ADMIN_UIDS,
) -> SimSettings:
    """Write a new simulated machine into ``state_dir`` (which must not hold one already).

    ``admin_uids`` are the effective uids the simulated driver lets set power limits (root only, as
    the driver does, unless a test grants its own uid)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    conf_path = state_dir / CONF_NAME
    if conf_path.exists():
        raise SimStateError(f"{state_dir} already holds a simulated machine ({conf_path})")
    if not 0.001 <= period_s <= 10.0:
        raise SimStateError(f"update period must be between 1 ms and 10 s, not {period_s} s")
    machine_id = uuid.uuid4()
    gpus = [
        SimGpu(
            index=i,
            uuid=f"GPU-{uuid.UUID(bytes=uuid.uuid5(machine_id, str(i)).bytes)}",
            serial=f"{(machine_id.int >> 64) % 10**10:010d}{i:03d}",
            pci_bus=0x18 + 0x10 * i,
            profile=p,
        )
        for i, p in enumerate(profiles)
    ]
    if not gpus:
        raise SimStateError("a simulated machine needs at least one GPU")
    # whole microseconds, so the driver's µs timestamps (field values, samples) fall exactly on ticks
    config = SimSettings(
        start_ns=(time.time_ns() if start_ns is None else start_ns) // 1000 * 1000,
        period_ns=round(period_s * 1e6) * 1000,
        gpus=gpus,
        admin_uids=tuple(sorted({int(uid) for uid in admin_uids})),
    )
    lines = [
        f"version {FORMAT_VERSION}",
        f"start_ns {config.start_ns}",
        f"period_ns {config.period_ns}",
        f"driver_version {DRIVER_VERSION}",
        f"cuda_driver_version {CUDA_DRIVER_VERSION}",
        f"gpu_count {len(gpus)}",
        f"admin_uids {','.join(str(uid) for uid in config.admin_uids)}",
    ]
    for gpu in gpus:
        lines += [f"gpu.{gpu.index}.uuid {gpu.uuid}", f"gpu.{gpu.index}.serial {gpu.serial}"]
        lines.append(f"gpu.{gpu.index}.pci_bus {gpu.pci_bus}")
        for key, value in asdict(gpu.profile).items():
            lines.append(f"gpu.{gpu.index}.{key} {_format_value(value)}")
    for name, ratios in WORKLOAD_ACTIVITY.items():
        lines.append(f"workload.{WORKLOAD_IDS[name]} {name} {' '.join(repr(r) for r in ratios)}")
    tmp = conf_path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    for gpu in gpus:
        (state_dir / f"gpu{gpu.index}.events").touch()
    tmp.rename(conf_path)
    return config


def load(state_dir: Path) -> SimSettings:
    """Read back what ``create`` wrote."""
    from gpuprobe.sim.profiles import PROFILES, parse_value

    conf_path = state_dir / CONF_NAME
    try:
        text = conf_path.read_text()
    except FileNotFoundError:
        raise SimStateError(f"no simulated machine in {state_dir} (missing {CONF_NAME})") from None
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        values[key] = value
    count = int(values["gpu_count"])
    gpus = []
    for i in range(count):
        base = PROFILES[values[f"gpu.{i}.name"]]
        params: dict[str, object] = {}
        for key, current in asdict(base).items():
            raw = values.get(f"gpu.{i}.{key}")
            if raw is None and key in LEGACY_HEALTH:
                params[key] = LEGACY_HEALTH[key]
                continue
            if raw is None and key in LEGACY_FIRST_ORDER_THERMAL:
                # as the C library reads an absent key: the first-order RC of the machine's time
                params[key] = LEGACY_FIRST_ORDER_THERMAL[key]
                continue
            # a machine written by an older gpuprobe lacks the newer parameters: the profile's values stand in
            params[key] = current if raw is None else parse_value(key, raw)
        if f"gpu.{i}.voltage_knee" not in values:
            # ... except the DVFS curve: the C library keeps such a machine's clock linear in the power,
            # as it was then, and so must everything that computes its ground truth
            params.update(LEGACY_LINEAR_DVFS)
        gpus.append(
            SimGpu(
                index=i,
                uuid=values[f"gpu.{i}.uuid"],
                serial=values[f"gpu.{i}.serial"],
                pci_bus=int(values[f"gpu.{i}.pci_bus"]),
                profile=GpuProfile(**params),  # type: ignore[arg-type]
            )
        )
    admin = values.get("admin_uids", "0")  # machines of an older gpuprobe: root only
    return SimSettings(
        start_ns=int(values["start_ns"]),
        period_ns=int(values["period_ns"]),
        gpus=gpus,
        admin_uids=tuple(int(uid) for uid in admin.split(",") if uid),
    )


def state_dir_from_env() -> Path | None:
    value = os.environ.get(STATE_DIR_ENV)
    return Path(value) if value else None


def append_event(state_dir: Path, gpu_index: int, kind: str, value: int, pid: int = 0, mem_bytes: int = 0) -> int:
    """Append one input event for a GPU; returns the event's timestamp (unix ns)."""
    return append_events(state_dir, gpu_index, [(kind, value, pid, mem_bytes)])


def append_events(state_dir: Path, gpu_index: int, events: list[tuple[str, int, int, int]]) -> int:
    """Append several events (kind, value, arg, arg2) for a GPU in one write under one lock, all with one
    timestamp, so they take effect in the same tick in this order; returns the timestamp (unix ns)."""
    for kind, *_ in events:
        if kind not in EVENT_KINDS:
            raise SimStateError(f"unknown event kind {kind!r}")
    path = state_dir / f"gpu{gpu_index}.events"
    if not path.exists():
        raise SimStateError(f"simulated GPU {gpu_index} does not exist in {state_dir}")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        # the timestamp is taken under the lock: see the module docstring
        t_ns = time.time_ns()
        text = "".join(f"{t_ns} {kind} {int(v)} {int(a)} {int(b)}\n" for kind, v, a, b in events)
        os.write(fd, text.encode())
        return t_ns
    finally:
        os.close(fd)  # releases the lock


def workload_id(workload: str | None) -> int | None:
    """The id a W event carries for ``workload`` (None: the load names none)."""
    if workload is None:
        return None
    if workload not in WORKLOAD_IDS:
        known = ", ".join(n for n in WORKLOAD_IDS if n != "generic")
        raise SimStateError(f"unknown workload {workload!r}; known workloads: {known}")
    return WORKLOAD_IDS[workload]


def _load_events(
    util_pct: float, pid: int, mem_used_bytes: int, workload: str | None
) -> list[tuple[str, int, int, int]]:
    wid = workload_id(workload)
    load = ("U", round(util_pct), int(pid), int(mem_used_bytes))
    # the W line goes first: the U line that follows takes its workload (older readers skip W)
    return [("W", wid, int(pid), 0), load] if wid is not None else [load]


def set_load(
    state_dir: Path,
    gpu_index: int,
    util_pct: float,
    pid: int = 0,
    mem_used_bytes: int = 0,
    workload: str | None = None,
) -> int:
    """Set a GPU's utilization (0-100 %) from now on; ``pid`` is listed as the process using it.

    ``workload`` (a row of ``profiles.WORKLOAD_ACTIVITY``) sets the GPM activity mix; None: generic."""
    if not 0 <= util_pct <= 100:
        raise SimStateError(f"utilization must be between 0 and 100 %, not {util_pct}")
    return append_events(state_dir, gpu_index, _load_events(util_pct, pid, mem_used_bytes, workload))


def set_load_if_holder(
    state_dir: Path,
    gpu_index: int,
    holder_pid: int,
    util_pct: float,
    pid: int = 0,
    mem_used_bytes: int = 0,
    workload: str | None = None,
) -> bool:
    """:func:`set_load`, but only while ``holder_pid`` is the process of the GPU's latest load event
    (checked and appended under one lock); False when another process has set a load since."""
    if not 0 <= util_pct <= 100:
        raise SimStateError(f"utilization must be between 0 and 100 %, not {util_pct}")
    path = state_dir / f"gpu{gpu_index}.events"
    if not path.exists():
        raise SimStateError(f"simulated GPU {gpu_index} does not exist in {state_dir}")
    with path.open("r+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        current_pid = 0
        for line in f.read().splitlines():
            parts = line.split()
            if len(parts) >= 5 and parts[1] == b"U":
                current_pid = int(parts[3])
        if current_pid != holder_pid:
            return False
        t_ns = time.time_ns()
        events = _load_events(util_pct, pid, mem_used_bytes, workload)
        f.write("".join(f"{t_ns} {k} {int(v)} {int(a)} {int(b)}\n" for k, v, a, b in events).encode())
        f.flush()
        return True


# The answers a failed GPU can give to every query (`gpuprobe sim fail --answer`), as nvml.h's nvmlReturn_t;
# F 1 in the history stands for GPU_IS_LOST (what older gpuprobe wrote), every other value is the code.
FAIL_ANSWERS: dict[str, int] = {
    "gpu_is_lost": 15,  # NVML_ERROR_GPU_IS_LOST: fallen off the bus
    "reset_required": 16,  # NVML_ERROR_RESET_REQUIRED
    "driver_not_loaded": 9,  # NVML_ERROR_DRIVER_NOT_LOADED
    "lib_rm_version_mismatch": 18,  # NVML_ERROR_LIB_RM_VERSION_MISMATCH: a driver upgraded under the library
    "unknown": 999,  # NVML_ERROR_UNKNOWN
}


def set_failed(state_dir: Path, gpu_index: int, failed: bool, answer: str = "gpu_is_lost") -> int:
    """Make a GPU answer ``answer`` (:data:`FAIL_ANSWERS`; GPU_IS_LOST: a GPU that fell off the bus) to every
    query, or bring it back.

    Bringing it back is a GPU reset: volatile ECC counters restart and pending remaps/retirements are done."""
    if answer not in FAIL_ANSWERS:
        raise SimStateError(f"a failed GPU answers one of {', '.join(FAIL_ANSWERS)}, not {answer!r}")
    code = FAIL_ANSWERS[answer]
    return append_event(
        state_dir, gpu_index, "F", (1 if code == FAIL_ANSWERS["gpu_is_lost"] else code) if failed else 0
    )


# XIDs the health injections raise, as the driver does (docs/simulator.md, "Health")
XID_DBE = 48  # double-bit ECC error
XID_REMAP_PENDING = 63  # row remapping: pending (ECC page retirement or row remap recording event)
XID_REMAP_FAILURE = 64  # row remapping failure
XID_FALLEN_OFF_BUS = 79  # the GPU has fallen off the bus


def inject_xid(state_dir: Path, gpu_index: int, xid: int) -> int:
    """An XID error event; XID 79 also makes the GPU lost right after it, in the same tick."""
    if not 0 < xid < 1 << 31:
        raise SimStateError(f"an XID is a positive number, not {xid}")
    events: list[tuple[str, int, int, int]] = [("X", xid, 0, 0)]
    if xid == XID_FALLEN_OFF_BUS:
        events.append(("F", 1, 0, 0))
    return append_events(state_dir, gpu_index, events)


def inject_ecc(state_dir: Path, gpu_index: int, double_bit: bool) -> int:
    """A single-bit (corrected) or double-bit (uncorrected, with XID 48) ECC error."""
    if double_bit:
        return append_events(state_dir, gpu_index, [("E", ECC_DOUBLE_BIT, 0, 0), ("X", XID_DBE, 0, 0)])
    return append_event(state_dir, gpu_index, "E", ECC_SINGLE_BIT)


def inject_remap(state_dir: Path, gpu_index: int, failure: bool) -> int:
    """The row remapper's pending flag (XID 63) or its failure flag (XID 64)."""
    flag, xid = (REMAP_FAILURE, XID_REMAP_FAILURE) if failure else (REMAP_PENDING, XID_REMAP_PENDING)
    return append_events(state_dir, gpu_index, [("R", flag, 0, 0), ("X", xid, 0, 0)])


def inject_nvlink_errors(state_dir: Path, gpu_index: int, link: int, count: int) -> int:
    """``count`` CRC flit errors on ``link``, each replayed (the replay counter moves with it)."""
    return append_event(state_dir, gpu_index, "N", count, link)
