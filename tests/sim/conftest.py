"""Fixtures for the GPU simulator's tests.

Every NVML reading goes through the official pynvml in a *child* Python process started with the
simulated machine's environment (glibc reads ``LD_LIBRARY_PATH`` only when a process starts), or
through the real ``gpuprobe sim run`` command. A child runs :data:`CHILD_PRELUDE` followed by the
test's snippet and prints its result as one JSON line (``emit``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support import clean_env, gpuprobe_command

from gpuprobe.sim import state
from gpuprobe.sim.profiles import PROFILES, GpuProfile, with_overrides
from gpuprobe.sim.runner import SimMachine, open_machine

# What every child snippet can use. `same_tick` is the tool for attributing a reading to an update
# period: field 186's FieldValue timestamp is the start (unix us) of the tick being reported, and
# values only change at tick boundaries, so a read bracketed by two equal timestamps belongs to it.
CHILD_PRELUDE = '''
import json, os, subprocess, sys, time
import pynvml as N
N.nvmlInit()
COUNT = N.nvmlDeviceGetCount()
H = [N.nvmlDeviceGetHandleByIndex(i) for i in range(COUNT)]
STATE_DIR = os.environ["GPUPROBE_SIM_DIR"]

def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\\n")
    sys.stdout.flush()

def fval(f):
    """The value of one nvmlFieldValue_t, or the name of its error."""
    if f.nvmlReturn != 0:
        return "err%d" % f.nvmlReturn
    return {0: f.value.dVal, 1: f.value.uiVal, 2: f.value.ulVal, 3: f.value.ullVal,
            4: f.value.sllVal, 5: f.value.siVal, 6: f.value.usVal}[f.valueType]

def fields(h, ids):
    """{field id: value} for one GetFieldValues call, plus "ts": its timestamp (us)."""
    vals = N.nvmlDeviceGetFieldValues(h, list(ids))
    out = {int(f.fieldId): fval(f) for f in vals}
    out["ts"] = int(vals[0].timestamp)
    return out

def tick_us(h):
    return int(N.nvmlDeviceGetFieldValues(h, [186])[0].timestamp)

def same_tick(h, read):
    """(tick start in us, read()) where read() ran entirely inside that one update period."""
    while True:
        a = tick_us(h)
        v = read()
        if tick_us(h) == a:
            return a, v

def snapshot(h):
    """Every dynamic reading of one GPU, taken inside one tick: (tick start us, dict)."""
    def read():
        f = fields(h, [83, 186])
        u = N.nvmlDeviceGetUtilizationRates(h)
        return {
            "energy_mj": N.nvmlDeviceGetTotalEnergyConsumption(h),
            "energy_field_mj": f[83],
            "power_instant_mw": f[186],
            "power_usage_mw": N.nvmlDeviceGetPowerUsage(h),
            "temp_c": N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU),
            "util": u.gpu,
            "mem_util": u.memory,
            "sm_mhz": N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_SM),
            "mem_mhz": N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_MEM),
            "reasons": N.nvmlDeviceGetCurrentClocksEventReasons(h),
            "limit_mw": N.nvmlDeviceGetEnforcedPowerLimit(h),
        }
    return same_tick(h, read)

def set_load(gpu, util, pid=0, mem=0):
    """Writes a load event (as `gpuprobe sim load` does); returns its timestamp (unix ns)."""
    from pathlib import Path
    from gpuprobe.sim import state
    return state.set_load(Path(STATE_DIR), gpu, util, pid, mem)

def wait_ticks(h, n):
    """Return once n tick boundaries have passed."""
    t0 = tick_us(h)
    seen = 0
    last = t0
    while seen < n:
        time.sleep(0.005)
        t = tick_us(h)
        if t != last:
            seen += 1
            last = t
'''


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*gpuprobe_command(), *args], env=env, capture_output=True, text=True, timeout=timeout)


def child_script(code: str, prelude: bool = True) -> str:
    return (CHILD_PRELUDE if prelude else "") + textwrap.dedent(code)


def last_json(stdout: str) -> Any:
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert lines, "the child printed nothing"
    return json.loads(lines[-1])


@dataclass
class Sim:
    """Creates simulated machines under the test's tmp_path and runs pynvml children against them."""

    root: Path
    _children: list[subprocess.Popen[str]] = field(default_factory=list)
    _count: int = 0

    def machine(
        self,
        profiles: str | Sequence[GpuProfile] = "H100-SXM5-80GB",
        gpus: int = 1,
        period_s: float = 0.1,
        start_ns: int | None = None,
        **overrides: object,
    ) -> SimMachine:
        """A new machine; ``overrides`` (e.g. ``tau_s=1.0``) apply to every GPU's profile. The user running
        the tests may set its power limits even when not root (the simulated driver allows root only)."""
        if isinstance(profiles, str):
            profiles = [PROFILES[profiles]] * gpus
        changes = {k: str(v) for k, v in overrides.items()}
        profiles = [with_overrides(p, changes) if changes else p for p in profiles]
        self._count += 1
        state_dir = self.root / f"sim{self._count}"
        admin_uids = (0, os.geteuid())
        if start_ns is not None:
            state.create(state_dir, profiles, period_s, start_ns=start_ns, admin_uids=admin_uids)
        return open_machine(state_dir, profiles, period_s, admin_uids=admin_uids)

    def script(self, code: str) -> str:
        """The full child script for a snippet (for commands that run it themselves)."""
        return child_script(code)

    def run(
        self,
        machine: SimMachine | None,
        code: str,
        timeout: float = 60,
        prelude: bool = True,
        env: dict[str, str] | None = None,
    ) -> Any:
        """Run a snippet in a child with the machine's environment; its last JSON line."""
        proc = subprocess.run(
            [sys.executable, "-c", child_script(code, prelude)],
            env=env if env is not None else machine.environ() if machine else None,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0:
            pytest.fail(f"child exited {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
        return last_json(proc.stdout)

    def spawn(self, machine: SimMachine, code: str) -> subprocess.Popen[str]:
        """Start a child without waiting for it (collect it with :meth:`collect`)."""
        child = subprocess.Popen(
            [sys.executable, "-c", child_script(code)],
            env=machine.environ(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._children.append(child)
        return child

    def collect(self, child: subprocess.Popen[str], timeout: float = 60) -> Any:
        out, err = child.communicate(timeout=timeout)
        if child.returncode != 0:
            pytest.fail(f"child exited {child.returncode}\n--- stdout\n{out}\n--- stderr\n{err}")
        return last_json(out)

    def close(self) -> None:
        for child in self._children:
            if child.poll() is None:
                child.kill()
                child.communicate()


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[Sim]:
    helper = Sim(tmp_path)
    try:
        yield helper
    finally:
        helper.close()


@pytest.fixture
def cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Runs the real `gpuprobe` command: cli("sim", "run", ..., env=None, timeout=60)."""

    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, env=clean_env() if env is None else env, timeout=timeout)

    return run


@pytest.fixture
def gpuprobe_cmd() -> list[str]:
    """argv prefix of the `gpuprobe` command, for children that call it themselves."""
    return gpuprobe_command()


@pytest.fixture
def venv_bin() -> Path:
    """The folder of this interpreter's console scripts (gpustat, gpuprobe)."""
    return Path(sys.executable).parent
