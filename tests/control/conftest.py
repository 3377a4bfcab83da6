"""Fixtures for the control plane's tests: real Mosquitto, real ``gpuprobe control-agent`` processes on
simulated GPUs, the real operator commands, and a library-level operator for hand-made (bad) commands."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import support
from support import gpuprobe_command

from gpuprobe.control import keys, mqtt, operator_side, signing
from gpuprobe.sim.profiles import PROFILES, with_overrides
from gpuprobe.sim.runner import SimMachine, open_machine
from gpuprobe.v1 import control_pb2


def clean_env() -> dict[str, str]:
    """The trainers get one torch thread each: the suite runs on two cores."""
    return support.clean_env(GPUPROBE_THREADS="1")


@dataclass
class OperatorKeys:
    private: Path
    public: Path
    key_id: str


@pytest.fixture
def operator_key(tmp_path: Path) -> OperatorKeys:
    made = keys.generate(tmp_path / "keys", "operator")
    return OperatorKeys(made.private, made.public, made.key_id)


@dataclass
class ControlAgent:
    """One ``gpuprobe control-agent`` process, on its own simulated machine (or without GPUs)."""

    host: str
    broker_url: str
    trusted: list[Path]
    base: Path
    machine: SimMachine | None
    extra_args: list[str] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def control_dir(self) -> Path:
        return self.base / "control"

    @property
    def log_path(self) -> Path:
        return self.base / "agent.log"

    def start(self, wait_connected: bool = True) -> ControlAgent:
        env = self.machine.environ(clean_env()) if self.machine is not None else clean_env()
        env.update(self.extra_env)
        args = [
            *gpuprobe_command(), "control-agent", "--broker", self.broker_url, "--host", self.host,
            "--control-dir", str(self.control_dir), "--presence-interval", "1", "--reconnect-max", "1",
            *[a for key in self.trusted for a in ("--trusted-keys", str(key))], *self.extra_args,
        ]  # fmt: skip
        self.starts += 1
        connected_before = self.log().count("connected to")
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(args, env=env, stdout=log, stderr=log)
        if wait_connected:
            self.wait_log("connected to", count=connected_before + 1)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_log(self, text: str, timeout_s: float = 60.0, count: int = 1) -> str:
        def written() -> str | None:
            log = self.log()
            if log.count(text) >= count:
                return log
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"control agent {self.host} exited ({self.proc.returncode}):\n{log}")
            return None

        return support.wait_until(
            written, timeout_s, f"{text!r} in control agent {self.host}'s log", describe=lambda: self.log()[-4000:]
        )

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout_s)


@dataclass
class Fleet:
    """Makes control agents and stops the ones still running at the end of the test."""

    root: Path
    trusted: list[Path]
    agents: list[ControlAgent] = field(default_factory=list)

    def agent(
        self,
        broker_url: str,
        host: str | None = None,
        *,
        gpus: int = 1,
        tau_s: float = 2.0,
        extra_args: list[str] | None = None,
        extra_env: dict[str, str] | None = None,
        trusted: list[Path] | None = None,
        start: bool = True,
    ) -> ControlAgent:
        host = host or f"node-{uuid.uuid4().hex[:6]}"
        base = self.root / host
        base.mkdir(parents=True)
        machine = None
        if gpus:
            gpu = with_overrides(PROFILES["L4"], {"tau_s": str(tau_s)})
            machine = open_machine(base / "sim", [gpu] * gpus, period_s=0.1)
        agent = ControlAgent(
            host, broker_url, trusted or self.trusted, base, machine, list(extra_args or []), dict(extra_env or {})
        )
        self.agents.append(agent)
        return agent.start() if start else agent

    def close(self) -> None:
        for agent in self.agents:
            if agent.proc is not None and agent.proc.poll() is None:
                agent.proc.kill()
                agent.proc.wait()


@pytest.fixture
def fleet(tmp_path: Path, operator_key: OperatorKeys) -> Iterator[Fleet]:
    made = Fleet(tmp_path / "fleet", [operator_key.public])
    yield made
    made.close()


@dataclass
class Cli:
    """The real operator commands."""

    broker_url: str
    extra: list[str] = field(default_factory=list)

    def __call__(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*gpuprobe_command(), *args, "--broker", self.broker_url, *self.extra],
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )


@pytest.fixture
def cli(mqtt_broker: Any) -> Cli:
    return Cli(mqtt_broker.url)


@pytest.fixture
def make_cli() -> type[Cli]:
    """``make_cli(broker_url, extra=[...])``: the operator commands against another broker."""
    return Cli


@dataclass
class Operator:
    """Library-level operator for commands the CLI would never make (unsigned, expired, replayed)."""

    broker_url: str
    options: dict[str, Any] = field(default_factory=dict)  # mqtt_username, mqtt_password, mqtt_ca...

    def settings(self) -> mqtt.BrokerSettings:
        return mqtt.BrokerSettings.from_values({"broker": self.broker_url, **self.options})

    def publish(self, topic: str, payload: bytes, retain: bool = False) -> None:
        async def main() -> None:
            async with operator_side.Session(self.settings()) as session:
                await session._client.publish(topic, payload, qos=1, retain=retain, timeout=10)

        asyncio.run(main())

    def send_raw(
        self, payload: bytes, command_id: str, expect: set[str], wait_s: float = 5.0
    ) -> list[control_pb2.CommandReply]:
        async def main() -> list[control_pb2.CommandReply]:
            async with operator_side.Session(self.settings()) as session:
                from gpuprobe.control import topics

                await session.subscribe(topics.replies(command_id))
                await session.publish(topics.COMMANDS, payload, "SignedCommand")
                return await operator_side.collect_replies(session, command_id, expect, wait_s)

        return asyncio.run(main())

    def send(
        self, signed: control_pb2.SignedCommand, command: control_pb2.Command, expect: set[str], wait_s: float = 5.0
    ) -> list[control_pb2.CommandReply]:
        return self.send_raw(signed.SerializeToString(), command.command_id, expect, wait_s)

    def retained(self, *filters: str) -> list[operator_side.Received]:
        async def main() -> list[operator_side.Received]:
            async with operator_side.Session(self.settings()) as session:
                return await session.snapshot(*filters)

        return asyncio.run(main())


@pytest.fixture
def operator(mqtt_broker: Any) -> Operator:
    return Operator(mqtt_broker.url)


@pytest.fixture
def make_operator() -> type[Operator]:
    """``make_operator(broker_url, {"mqtt_username": ...})``: a library operator elsewhere or as someone else."""
    return Operator


def probe_start_command(
    *,
    probe_id: str | None = None,
    workload: str = "idle",
    hosts: list[str] | None = None,
    duration_s: float = 1.0,
    start_in_s: float = 0.0,
    lifetime_s: float = 60.0,
    now_ns: int | None = None,
    phases_s: float = 0.0,
) -> control_pb2.Command:
    """A ProbeStart for a tiny run with zero idle/warm-up/cool-down unless told otherwise."""
    now = time.time_ns() if now_ns is None else now_ns
    command = signing.new_command(issuer="tests", lifetime_s=lifetime_s, now_ns=now)
    start = command.probe_start
    start.probe_id = probe_id or f"p-{uuid.uuid4().hex[:8]}"
    start.workload = workload
    start.size = control_pb2.WORKLOAD_SIZE_TINY
    start.duration_s = duration_s
    start.idle_baseline_s = phases_s
    start.warmup_s = phases_s
    start.cooldown_s = phases_s
    if start_in_s:
        start.start_at_unix_ns = now + int(start_in_s * 1e9)
    start.selector.hosts.extend(hosts or [])
    return command


@pytest.fixture
def make_start() -> Callable[..., control_pb2.Command]:
    return probe_start_command


@pytest.fixture
def gpuprobe() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Runs any ``gpuprobe`` command (no broker added)."""

    def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*gpuprobe_command(), *args], env=clean_env(), capture_output=True, text=True, timeout=timeout
        )

    return run
