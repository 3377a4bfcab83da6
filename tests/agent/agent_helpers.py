"""Helpers of the agent's tests (fixtures in conftest.py): simulated GPUs, a real gRPC receiver process, real
agent processes. A module of its own, not conftest.py, so that the tests import it by a name no other test
folder uses (``pytest tests/agent tests/control`` in one run: every folder's conftest is "conftest").

Nothing is mocked: the agent runs as ``gpuprobe agent`` in its own process against the GPU
simulator (pynvml loads the simulated ``libnvidia-ml.so.1``), streams to ``tests/agent/receiver.py``
(a real gRPC server in its own process, so it can be killed with SIGKILL) and is stopped with real
signals. Helpers read what the receiver stored and check it.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import struct
import subprocess
import sys
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from support import clean_env, gpuprobe_command, stays, wait_until

from gpuprobe.sim.profiles import PROFILES, GpuProfile, with_overrides
from gpuprobe.sim.runner import SimMachine, open_machine
from gpuprobe.v1 import telemetry_pb2

HERE = Path(__file__).resolve().parent
RECEIVER = HERE / "receiver.py"
RECORDER = HERE / "nvml_recorder.py"

T = TypeVar("T")


def read_records(path: Path) -> list[bytes]:
    """The length-prefixed records the receiver wrote (a record cut by SIGKILL is ignored)."""
    if not path.exists():
        return []
    data = path.read_bytes()
    out: list[bytes] = []
    i = 0
    while i + 4 <= len(data):
        (n,) = struct.unpack(">I", data[i : i + 4])
        if i + 4 + n > len(data):
            break
        out.append(data[i + 4 : i + 4 + n])
        i += 4 + n
    return out


def machine(
    root: Path, profiles: Sequence[GpuProfile | str], *, period_s: float = 0.1, **overrides: object
) -> SimMachine:
    """A simulated machine under ``root`` whose driver updates every ``period_s``; ``overrides`` (e.g.
    ``tau_s=2``) apply to every GPU."""
    resolved = [PROFILES[p] if isinstance(p, str) else p for p in profiles]
    if overrides:
        changes = {k: str(v) for k, v in overrides.items()}
        resolved = [with_overrides(p, changes) for p in resolved]
    return open_machine(root, resolved, period_s)


@dataclass
class Receiver:
    """``tests/agent/receiver.py`` as a process on a fixed port (so it can come back on the same one)."""

    out: Path
    port: int
    args: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Receiver:
        self.out.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        log = open(self.out / f"receiver-{self.starts}.log", "wb")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(
            [sys.executable, str(RECEIVER), "--port", str(self.port), "--out", str(self.out), *self.args],
            stdout=subprocess.PIPE,
            stderr=log,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        if not line.startswith("READY"):
            self.proc.kill()
            raise AssertionError(
                f"receiver did not start: {line!r} {(self.out / f'receiver-{self.starts}.log').read_text()}"
            )
        return self

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def requests(self) -> list[telemetry_pb2.StreamRequest]:
        return [telemetry_pb2.StreamRequest.FromString(r) for r in read_records(self.out / "batches.bin")]

    def batches(self) -> list[telemetry_pb2.SampleBatch]:
        """Every batch received, in arrival order, replays included."""
        return [r.batch for r in self.requests()]

    def hellos(self) -> list[telemetry_pb2.Hello]:
        return [telemetry_pb2.StreamRequest.FromString(r).hello for r in read_records(self.out / "hellos.bin")]


@dataclass
class Agent:
    """One ``gpuprobe agent`` process in a simulated machine's environment."""

    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Agent:
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    # a deadline, not a wait: on a loaded 2-core machine an agent's start (imports, NVML, PortAudio's device
    # scan) has taken over 20 s before its microphone line
    def wait_for_log(self, pattern: str, timeout: float = 60.0) -> re.Match[str]:
        def found() -> re.Match[str] | None:
            exited = self.proc is not None and self.proc.poll() is not None
            match = re.search(pattern, self.log())
            if match is None and exited:
                assert self.proc is not None
                raise AssertionError(f"the agent exited ({self.proc.returncode})")
            return match

        try:
            match = wait_until(found, timeout, f"agent log {pattern!r}", interval_s=0.1)
        except AssertionError as e:
            raise AssertionError(f"{e}\n--- agent log\n{self.log()}") from None
        assert match is not None  # wait_until returns only a truthy value
        return match

    def metrics(self) -> dict[str, float]:
        """The agent's Prometheus counters (started with ``--metrics-listen 127.0.0.1:0``), by name."""
        port = self.wait_for_log(r"Prometheus metrics on http://127\.0\.0\.1:(\d+)/metrics").group(1)
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(gpuprobe_agent_\w+) (\S+)$", body, re.M)}

    def runs_for(self, duration_s: float, what: str) -> None:
        """Let the agent run for ``duration_s`` (a phase whose length is what the test is about), failing
        at once, with its log, if it exits meanwhile."""
        stays(self.running, duration_s, f"the agent running ({what})", interval_s=0.1, describe=self.log)

    def terminate(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class AgentFactory:
    tmp: Path
    agents: list[Agent] = field(default_factory=list)

    def __call__(
        self,
        sim: SimMachine | None,
        collectors: Sequence[str],
        *args: str,
        spool: Path | None = None,
        env: dict[str, str] | None = None,
        start: bool = True,
    ) -> Agent:
        n = len(self.agents) + 1
        argv = [
            *gpuprobe_command(),
            "--log-level",
            "info",
            "agent",
            "--collector",
            ",".join(collectors),
            "--spool",
            str(spool or self.tmp / "spool"),
            "--host",
            "node-1",
            "--reconnect-min",
            "0.2",
            "--reconnect-max",
            "1",
            # these tests count every sample; the resolution policy has its own tests (test_resolution.py)
            *([] if "--resolution" in args else ["--resolution", "full"]),
            *args,
        ]
        base = sim.environ(clean_env()) if sim is not None else clean_env()
        agent = Agent(argv, {**base, **(env or {})}, self.tmp / f"agent-{n}.log")
        self.agents.append(agent)
        return agent.start() if start else agent

    def close(self) -> None:
        for agent in self.agents:
            if agent.running():
                assert agent.proc is not None
                agent.proc.kill()
                agent.proc.wait(10)


# ---------------------------------------------------------------------- checks on what was received


def unique_batches(batches: Sequence[telemetry_pb2.SampleBatch]) -> dict[int, telemetry_pb2.SampleBatch]:
    """seq -> batch; a batch received twice (a replay) must be byte-identical to the first copy."""
    out: dict[int, telemetry_pb2.SampleBatch] = {}
    for b in batches:
        if b.seq in out:
            assert out[b.seq].SerializeToString() == b.SerializeToString(), f"replayed batch {b.seq} differs"
        else:
            out[b.seq] = b
    return out


def wait_for_batches(
    receiver: Receiver,
    predicate: Callable[[dict[int, telemetry_pb2.SampleBatch]], T],
    what: str,
    timeout_s: float = 20.0,
    agent: Agent | None = None,
) -> T:
    """Wait until what ``receiver`` stored (seq -> batch, replays folded) satisfies ``predicate``; returns
    its value. The failure names what was awaited and how many batches had arrived, and with ``agent``
    fails at once if the agent exits, with its log."""

    def check() -> T:
        if agent is not None and not agent.running():
            raise AssertionError(f"the agent exited while waiting for {what}\n--- agent log\n{agent.log()}")
        return predicate(unique_batches(receiver.batches()))

    def seen() -> str:
        batches = unique_batches(receiver.batches())
        return f"{len(batches)} batches, seqs {min(batches, default=0)}..{max(batches, default=0)}"

    return wait_until(check, timeout_s, what, interval_s=0.1, describe=seen)


SAMPLE_FIELDS = (  # every repeated field of SampleBatch whose entries count as samples (samples_taken)
    "gpu_samples",
    "node_samples",
    "acoustic_samples",
    "trainer_samples",
    "probe_events",
    "gpu_events",
    "process_samples",
    "nvlink_samples",
    "mig_samples",
)


def batch_samples(batch: telemetry_pb2.SampleBatch) -> int:
    """The samples of one batch as the agent counts them (``samples taken``, the spool's count)."""
    return sum(len(getattr(batch, name)) for name in SAMPLE_FIELDS)


def gpu_points(batches: dict[int, telemetry_pb2.SampleBatch]) -> list[tuple[int, int]]:
    return [(s.gpu_index, s.time_unix_ns) for b in batches.values() for s in b.gpu_samples]


def assert_no_loss_no_duplicates(
    batches: dict[int, telemetry_pb2.SampleBatch],
    interval_s: float,
    gpus: int,
    first_seq: int = 1,
    check_gaps: bool = True,
) -> dict[int, list[int]]:
    """Contiguous seqs, unique (gpu, time) points, and per GPU no gap that the agent did not count as missed.

    Returns the sorted sample times of every GPU.
    """
    seqs = sorted(batches)
    assert seqs == list(range(first_seq, first_seq + len(seqs))), f"seq gaps: {seqs}"
    points = gpu_points(batches)
    assert len(points) == len(set(points)), "a (gpu, timestamp) pair arrived in two different batches"
    by_gpu: dict[int, list[int]] = {}
    for gpu, t in points:
        by_gpu.setdefault(gpu, []).append(t)
    assert sorted(by_gpu) == list(range(gpus))
    missed = sum(b.stats.missed_ticks for b in batches.values())
    for gpu, times in by_gpu.items():
        times.sort()
        if not check_gaps:
            continue
        ticks = tick_numbers(times, round(interval_s * 1e9))
        gaps = sum(max(0, b - a - 1) for a, b in itertools.pairwise(ticks))
        assert gaps <= missed, f"GPU {gpu}: {gaps} missing ticks but the agent counted {missed} missed"
    return by_gpu


# how much earlier than the schedule's common phase a sample may be stamped (clock noise) and still count
# as its tick's; a sample later than the phase by up to one interval less this is late, not in another tick
_PHASE_MARGIN_NS = 5_000_000


def tick_numbers(times_ns: Sequence[int], interval_ns: int) -> list[int]:
    """The tick of the agent's schedule each sorted sample time belongs to, counted from the first.

    Ticks are due every ``interval_ns`` from a fixed phase and a sample is stamped at or after its tick is
    due, late by however long the CPU kept the sampler waiting. Rounding the time between two samples to
    whole intervals takes a tick more than half an interval late for a missing one (a busy CPU wakes a
    sleeping thread that late); here the phase is that of the punctual ticks (the most common offset, in
    1 ms steps), and a sample belongs to the last tick due before it, so any lateness under one interval is
    told apart from a missing tick."""
    if not times_ns:
        return []
    offsets = Counter(((t - times_ns[0]) % interval_ns) // 1_000_000 for t in times_ns)
    phase_ns = offsets.most_common(1)[0][0] * 1_000_000 - _PHASE_MARGIN_NS
    return [(t - times_ns[0] - phase_ns) // interval_ns for t in times_ns]
