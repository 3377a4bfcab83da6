"""Fixtures for the trainer's tests: the real ``gpuprobe train`` command, simulated GPUs, a fake agent socket.

Every training here is real (tiny models on the CPU, one torch thread each so that the suite fits on
two cores); a simulated GPU is the real simulator driven through its state directory and read back
through the official pynvml in a child process.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support import clean_env, gpuprobe_command, wait_until

from gpuprobe.sim.profiles import PROFILES, with_overrides
from gpuprobe.sim.runner import SimMachine, open_machine


@dataclass
class Train:
    """Runs ``gpuprobe train`` as a real process (one torch thread)."""

    base_env: dict[str, str]

    def env(self, extra: dict[str, str] | None = None, machine: SimMachine | None = None) -> dict[str, str]:
        env = machine.environ(self.base_env) if machine is not None else dict(self.base_env)
        env.update(extra or {})
        return env

    def run(
        self, *args: str, machine: SimMachine | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*gpuprobe_command(), "train", *args],
            env=self.env(machine=machine),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def popen(self, *args: str, machine: SimMachine | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [*gpuprobe_command(), "train", *args],
            env=self.env(machine=machine),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


@pytest.fixture
def train() -> Train:
    return Train(clean_env(GPUPROBE_THREADS="1"))


@pytest.fixture
def sim_machine(tmp_path: Path) -> Callable[..., SimMachine]:
    """A simulated machine with one fast-reacting L4 (thermal time constant 1 s) by default."""

    def make(profile: str = "L4", count: int = 1, tau_s: float = 1.0, name: str = "sim") -> SimMachine:
        gpu = with_overrides(PROFILES[profile], {"tau_s": str(tau_s)})
        return open_machine(tmp_path / name, [gpu] * count, period_s=0.05)

    return make


NVML_TRACE = """
import json, sys, time
import pynvml as N
N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(int(sys.argv[1]))
end = time.time() + float(sys.argv[2])
while time.time() < end:
    print(json.dumps({"t": time.time_ns(), "power_w": N.nvmlDeviceGetPowerUsage(h) / 1000,
                      "temp_c": N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU),
                      "util": N.nvmlDeviceGetUtilizationRates(h).gpu}), flush=True)
    time.sleep(0.05)
"""


@pytest.fixture
def nvml_trace() -> Iterator[Callable[[SimMachine, int, float], subprocess.Popen[str]]]:
    """Starts a child that prints one pynvml reading (power, temperature, utilization) every 50 ms."""
    children: list[subprocess.Popen[str]] = []

    def start(machine: SimMachine, gpu: int, seconds: float) -> subprocess.Popen[str]:
        child = subprocess.Popen(
            [sys.executable, "-c", NVML_TRACE, str(gpu), str(seconds)],
            env=machine.environ(),
            stdout=subprocess.PIPE,
            text=True,
        )
        children.append(child)
        return child

    yield start
    for child in children:
        if child.poll() is None:
            child.kill()
            child.wait()


@dataclass
class FakeAgentSocket:
    """A unix stream socket that records every JSON line it receives (the agent's trainer socket)."""

    path: Path
    lines: list[dict[str, Any]] = field(default_factory=list)
    raw: list[bytes] = field(default_factory=list)
    closed: int = 0

    def wait_closed(self, connections: int = 1, timeout_s: float = 5.0) -> None:
        """Wait until that many senders have closed their connection (all their lines are read)."""
        closed = f"{connections} trainer connection(s) to close"
        wait_until(lambda: self.closed >= connections, timeout_s, closed, interval_s=0.01, describe=lambda: self.closed)

    def __post_init__(self) -> None:
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(self.path))
        self._server.listen(4)
        self._server.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        buf = b""
        with conn:
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    self.closed += 1
                    return
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    self.raw.append(line)
                    self.lines.append(json.loads(line))

    def close(self) -> None:
        self._stop.set()
        self._server.close()
        self._thread.join(2)


@pytest.fixture
def agent_socket() -> Iterator[FakeAgentSocket]:
    # a short path: unix socket addresses are limited to 107 bytes, and tmp_path can be longer
    folder = Path(tempfile.mkdtemp(prefix="gpuprobe-sock-"))
    sock = FakeAgentSocket(folder / "trainer.sock")
    yield sock
    sock.close()
    shutil.rmtree(folder, ignore_errors=True)
