"""Part: sim. Runs a command against simulated GPUs.

glibc reads ``LD_LIBRARY_PATH`` only when a process starts, and pynvml loads exactly
``libnvidia-ml.so.1``, so the simulator has to be in the environment of a *new* process: this module
prepares that environment (library folder, state directory, the stand-in ``nvidia-smi``) and runs
the command as a child, forwarding signals and returning its exit status.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from gpuprobe.sim import state
from gpuprobe.sim.build import NATIVE_DIR, ensure_library
from gpuprobe.sim.profiles import GpuProfile


@dataclass(frozen=True)
class SimMachine:
    """A simulated machine: its state directory and the environment that makes NVML find it."""

    state_dir: Path
    lib_dir: Path
    bin_dir: Path

    def environ(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env[state.STATE_DIR_ENV] = str(self.state_dir)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in [str(self.lib_dir), env.get("LD_LIBRARY_PATH", "")] if p)
        env["PATH"] = os.pathsep.join(p for p in [str(self.bin_dir), env.get("PATH", "")] if p)
        return env

    def config(self) -> state.SimSettings:
        return state.load(self.state_dir)

    def set_load(
        self, gpu_index: int, util_pct: float, pid: int = 0, mem_used_bytes: int = 0, workload: str | None = None
    ) -> int:
        return state.set_load(self.state_dir, gpu_index, util_pct, pid, mem_used_bytes, workload)


def _install_stub(state_dir: Path) -> Path:
    bin_dir = state_dir / "bin"
    bin_dir.mkdir(exist_ok=True)
    target = bin_dir / "nvidia-smi"
    shutil.copyfile(NATIVE_DIR / "nvidia-smi", target)
    target.chmod(0o755)  # package data may lose its mode bits on install
    return bin_dir


def open_machine(
    state_dir: Path,
    profiles: Sequence[GpuProfile] | None = None,
    period_s: float = state.DEFAULT_PERIOD_S,
    admin_uids: Sequence[int] = state.DEFAULT_ADMIN_UIDS,
) -> SimMachine:
    """Attach to the machine in ``state_dir``, creating it from ``profiles`` if there is none yet
    (``admin_uids``: who may set its power limits, root unless given)."""
    if not (state_dir / state.CONF_NAME).exists():
        if not profiles:
            raise state.SimStateError(f"no simulated machine in {state_dir} and no profiles to create one")
        state.create(state_dir, profiles, period_s, admin_uids=admin_uids)
    lib_dir = ensure_library()
    return SimMachine(state_dir=state_dir, lib_dir=lib_dir, bin_dir=_install_stub(state_dir))


@contextmanager
def temporary_machine(profiles: Sequence[GpuProfile], period_s: float = state.DEFAULT_PERIOD_S) -> Iterator[SimMachine]:
    """A new machine in a temporary state directory, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="gpuprobe-sim-") as tmp:
        yield open_machine(Path(tmp), profiles, period_s)


def run_command(machine: SimMachine, command: Sequence[str]) -> int:
    """Run ``command`` in the simulated machine's environment; its exit status (128+N if killed)."""
    try:
        child = subprocess.Popen(list(command), env=machine.environ())
    except FileNotFoundError:
        raise state.SimStateError(f"command not found: {command[0]}") from None
    except PermissionError:
        raise state.SimStateError(f"command is not executable: {command[0]}") from None

    def forward(signum: int, _frame: FrameType | None) -> None:
        child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        returncode = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 128 - returncode if returncode < 0 else returncode
