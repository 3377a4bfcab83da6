"""The simulator's state directory: the one place the C library and Python agree on.

Layout (all text, so a person can read it)::

    sim.conf        key value lines, written once by ``create``: start_ns, period_ns, the driver
                    version, the uids the simulated driver treats as privileged (``admin_uids``:
                    only they may set power limits), and every parameter of every GPU as
                    ``gpu.<index>.<key> <value>``
    gpu<N>.events   append-only input history of GPU N, one line per event:
                    ``<unix_ns> <kind> <value> <pid> <mem_bytes>``
                    kind U = utilization in %, L = power limit in mW, F = 1 fails the GPU
                    (GPU_IS_LOST), 0 brings it back

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
from gpuprobe.sim.profiles import GpuProfile

STATE_DIR_ENV = "GPUPROBE_SIM_DIR"
CONF_NAME = "sim.conf"
DEFAULT_PERIOD_S = 0.1
DRIVER_VERSION = "570.133.20"
CUDA_DRIVER_VERSION = 12080  # 12.8, as nvmlSystemGetCudaDriverVersion encodes it
FORMAT_VERSION = 1
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
    if kind not in ("U", "L", "F"):
        raise SimStateError(f"unknown event kind {kind!r}")
    path = state_dir / f"gpu{gpu_index}.events"
    if not path.exists():
        raise SimStateError(f"simulated GPU {gpu_index} does not exist in {state_dir}")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        # the timestamp is taken under the lock: see the module docstring
        t_ns = time.time_ns()
        os.write(fd, f"{t_ns} {kind} {int(value)} {int(pid)} {int(mem_bytes)}\n".encode())
        return t_ns
    finally:
        os.close(fd)  # releases the lock


def set_load(state_dir: Path, gpu_index: int, util_pct: float, pid: int = 0, mem_used_bytes: int = 0) -> int:
    """Set a GPU's utilization (0-100 %) from now on; ``pid`` is listed as the process using it."""
    if not 0 <= util_pct <= 100:
        raise SimStateError(f"utilization must be between 0 and 100 %, not {util_pct}")
    return append_event(state_dir, gpu_index, "U", round(util_pct), pid, mem_used_bytes)


def set_load_if_holder(
    state_dir: Path, gpu_index: int, holder_pid: int, util_pct: float, pid: int = 0, mem_used_bytes: int = 0
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
            if len(parts) == 5 and parts[1] == b"U":
                current_pid = int(parts[3])
        if current_pid != holder_pid:
            return False
        t_ns = time.time_ns()
        f.write(f"{t_ns} U {round(util_pct)} {int(pid)} {int(mem_used_bytes)}\n".encode())
        f.flush()
        return True


def set_failed(state_dir: Path, gpu_index: int, failed: bool) -> int:
    """Make a GPU answer GPU_IS_LOST to every query (as a GPU that fell off the bus), or bring it back."""
    return append_event(state_dir, gpu_index, "F", 1 if failed else 0)
