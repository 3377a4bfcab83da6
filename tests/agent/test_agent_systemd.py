"""Running as a service: `gpuprobe install agent`, systemd-analyze, and sd_notify over a real socket."""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import subprocess
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
from agent_helpers import AgentFactory, Receiver, machine
from support import clean_env, gpuprobe_command

from gpuprobe.nvml import REALTIME_PRIORITY
from gpuprobe.systemd import staging_root

REPO = Path(__file__).resolve().parents[2]


def install(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*gpuprobe_command(), "install", "agent", *args], env=clean_env(), capture_output=True, text=True, timeout=60
    )


def test_install_writes_a_hardened_unit_that_systemd_analyze_accepts(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze is missing: apt-get install systemd")
    root = tmp_path / "root"
    done = install("--collector", "collector-1:7447,collector-2:7447", "--root", str(root), "--cluster", "lab")
    assert done.returncode == 0, done.stderr
    unit = root / "etc/systemd/system/gpuprobe-agent.service"
    config = root / "etc/gpuprobe/agent.toml"
    sysusers = root / "etc/sysusers.d/gpuprobe-agent.conf"
    assert "next steps" in done.stdout and "systemctl enable --now gpuprobe-agent" in done.stdout
    text = unit.read_text()
    for line in [
        "Type=notify",
        "WatchdogSec=30",
        "Restart=on-failure",
        "User=gpuprobe",
        "StateDirectory=gpuprobe/agent",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
        "TimeoutStopSec=30",
        # after NVIDIA's driver services where there are some (NVML answers at boot), without wanting them
        "After=network-online.target nvidia-persistenced.service nvidia-fabricmanager.service",
        "Wants=network-online.target",
        # the native sampler's SCHED_FIFO at its priority, by a resource limit and no capability (sched(7):
        # RLIMIT_RTPRIO lets an unprivileged thread ask for that much), bounded by LimitRTTIME
        "RestrictRealtime=no",
        f"LimitRTPRIO={REALTIME_PRIORITY}",
        "LimitRTTIME=1s",
        "CapabilityBoundingSet=",
        "AmbientCapabilities=",
    ]:
        assert line in text.splitlines(), f"{line} missing from the unit"
    assert "RestrictRealtime=yes" not in text
    exec_start = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    assert exec_start.endswith("--config /etc/gpuprobe/agent.toml agent")
    assert sysusers.read_text().startswith("u gpuprobe ")

    # systemd's own verifier accepts the unit (its ExecStart binary exists on this machine)
    verify = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    complaints = [line for line in verify.stderr.splitlines() if "gpuprobe-agent.service" in line]
    assert verify.returncode == 0 and not complaints, verify.stderr

    # the config is what the agent reads: its keys are agent options and it validates
    data = tomllib.loads(config.read_text())
    assert data["agent"]["collector"] == ["collector-1:7447", "collector-2:7447"]
    assert data["agent"]["spool"] == "/var/lib/gpuprobe/agent/spool"
    check = subprocess.run(
        [*gpuprobe_command(), "--config", str(config), "agent", "--check"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stderr
    assert "collector-1:7447, collector-2:7447" in check.stdout and "cluster=lab" in check.stdout


def test_install_with_a_broker_writes_the_control_plane_options_the_agent_accepts(tmp_path: Path) -> None:
    from gpuprobe.control import keys

    made = keys.generate(tmp_path / "keys", "operator")
    root = tmp_path / "root"
    done = install("--collector", "c1", "--root", str(root), "--broker", "mqtt://broker:1883", "--trusted-keys",
                   str(made.public))  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = tomllib.loads((root / "etc/gpuprobe/agent.toml").read_text())["agent"]
    assert data["broker"] == "mqtt://broker:1883" and data["trusted_keys"] == [str(made.public)]
    assert data["control_dir"] == "/var/lib/gpuprobe/agent/control"  # in the unit's StateDirectory
    unit = (root / "etc/systemd/system/gpuprobe-agent.service").read_text()
    assert "TimeoutStopSec=45" in unit.splitlines(), "the control plane stops first: 15 s more"
    check = subprocess.run(
        [*gpuprobe_command(), "--config", str(root / "etc/gpuprobe/agent.toml"), "agent", "--check"],
        env=clean_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr
    assert "collector        c1:7447" in check.stdout
    assert f"control plane    broker mqtt://broker:1883; trusted keys {made.key_id}" in check.stdout
    # the broker needs trusted keys, and broker options need the broker
    refused = install("--collector", "c1", "--root", str(tmp_path / "r2"), "--broker", "mqtt://broker")
    assert refused.returncode == 2 and "--trusted-keys" in refused.stderr
    refused = install("--collector", "c1", "--root", str(tmp_path / "r3"), "--trusted-keys", str(made.public))
    assert refused.returncode == 2 and "only apply with --broker" in refused.stderr
    assert not (tmp_path / "r2").exists() and not (tmp_path / "r3").exists()


def test_install_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    root = tmp_path / "root"
    assert install("--collector", "c:1", "--root", str(root)).returncode == 0
    config = root / "etc/gpuprobe/agent.toml"
    config.write_text("# edited by the operator\n")
    again = install("--collector", "other:2", "--root", str(root))
    assert again.returncode == 1
    assert "refusing to overwrite" in again.stderr and "--force" in again.stderr
    assert config.read_text() == "# edited by the operator\n"
    forced = install("--collector", "other:2", "--root", str(root), "--force")
    assert forced.returncode == 0
    assert "other:2" in config.read_text()


def test_install_without_a_collector_is_an_error(tmp_path: Path) -> None:
    done = install("--root", str(tmp_path))
    assert done.returncode == 2 and "--collector" in done.stderr
    assert not (tmp_path / "etc").exists()


def test_deploy_examples_match_what_install_writes(tmp_path: Path) -> None:
    """deploy/agent/ holds a rendered example; it must not drift from the installer."""
    root = tmp_path / "root"
    done = install(
        "--collector", "collector.example.net:7447", "--root", str(root),
        "--executable", "/usr/local/bin/gpuprobe", "--tls-ca", "/etc/gpuprobe/ca.pem",
        "--tls-cert", "/etc/gpuprobe/agent.pem", "--tls-key", "/etc/gpuprobe/agent.key",
        "--token-file", "/etc/gpuprobe/agent.token", "--cluster", "example",
        "--broker", "mqtts://broker.example.net:8883", "--trusted-keys", "/etc/gpuprobe/operators",
        "--mqtt-username", "example-node", "--mqtt-password-file", "/etc/gpuprobe/mqtt.password",
        "--mqtt-ca", "/etc/gpuprobe/ca.pem",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (REPO / "deploy/agent/gpuprobe-agent.service").read_text() == (
        root / "etc/systemd/system/gpuprobe-agent.service"
    ).read_text()
    assert (REPO / "deploy/agent/agent.toml").read_text() == (root / "etc/gpuprobe/agent.toml").read_text()


def test_agent_notifies_ready_watchdog_status_and_stopping_on_a_real_notify_socket(
    tmp_path: Path, receiver: Receiver, agent_factory: AgentFactory
) -> None:
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(0.5)
    messages: list[tuple[float, str]] = []

    def collect(done: Callable[[list[str]], bool], timeout_s: float, what: str) -> None:
        """Receive notifications until ``done(texts so far)``; fail after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not done([m for _, m in messages]):
            if time.monotonic() >= deadline:
                raise AssertionError(f"no {what} within {timeout_s:g} s: {[m for _, m in messages]}")
            try:
                messages.append((time.monotonic(), sock.recv(4096).decode()))
            except TimeoutError:
                continue

    def streaming_and_pinged(texts: list[str]) -> bool:
        streaming = any(m.startswith("STATUS=2 GPUs at 10 Hz; streaming to") for m in texts)
        return streaming and texts.count("WATCHDOG=1") >= 5

    try:
        sim = machine(tmp_path / "sim", ["H100-SXM5-80GB"] * 2)
        agent = agent_factory(
            sim, [receiver.address], env={"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "1000000"}
        )  # pings every 0.5 s
        # ready, streaming and 5 pings (2.5 s of them) before the stop; a stop before READY=1 would find the
        # agent without its signal handlers yet
        collect(streaming_and_pinged, 60, "READY=1, the streaming status and 5 watchdog pings")
        assert agent.proc is not None
        agent.proc.send_signal(15)
        collect(lambda texts: "STOPPING=1" in texts, 15, "STOPPING=1 after SIGTERM")
        assert agent.proc.wait(15) == 0
    finally:
        sock.close()
    texts = [m for _, m in messages]
    ready = [i for i, m in enumerate(texts) if "READY=1" in m.splitlines()]
    assert len(ready) == 1, texts
    assert "STATUS=sampling 2 GPUs at 10 Hz" in texts[ready[0]]
    pings = [t for t, m in messages if m == "WATCHDOG=1"]
    assert len(pings) >= 5, texts
    gaps = [round(b - a, 2) for a, b in itertools.pairwise(pings)]
    assert max(gaps) < 1.5, f"pinged about every WATCHDOG_USEC/2 (0.5 s): {gaps}"
    assert any(m.startswith("STATUS=2 GPUs at 10 Hz; streaming to") for m in texts), texts
    stopping = [i for i, m in enumerate(texts) if m == "STOPPING=1"]
    assert stopping and stopping[0] > ready[0]


def test_agent_without_notify_socket_runs_normally(
    tmp_path: Path, receiver: Receiver, agent_factory: AgentFactory
) -> None:
    sim = machine(tmp_path / "sim", ["L4"])
    agent = agent_factory(sim, [receiver.address])
    agent.wait_for_log("streaming to collector")
    assert "NOTIFY_SOCKET" not in os.environ
    assert agent.terminate() == 0


def test_docs_describe_every_agent_option() -> None:
    from gpuprobe.agent.options import AGENT_OPTIONS

    text = (REPO / "docs/agent.md").read_text()
    missing = [o.flag for o in AGENT_OPTIONS if f"`{o.flag}`" not in text or f"`{o.env_var}`" not in text]
    assert not missing, f"docs/agent.md does not describe {missing}"


def test_install_refuses_what_the_agent_would_refuse_with_the_agents_own_message(tmp_path: Path) -> None:
    """A config the agent refuses makes systemd restart it without end: the installer refuses it first."""
    root = tmp_path / "root"
    url = install("--collector", "https://collector.example.net:7447", "--root", str(root))
    assert url.returncode == 2, url.stdout
    # the cause is the URL scheme, not the IPv6 hint that the colons used to trigger
    assert "is a URL" in url.stderr and "https://" in url.stderr and "IPv6" not in url.stderr, url.stderr
    assert "'collector.example.net:7447'" in url.stderr
    # the agent itself says the same
    agent = subprocess.run(
        [*gpuprobe_command(), "agent", "--collector", "https://collector.example.net:7447", "--check"],
        env=clean_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert agent.returncode == 2 and "is a URL" in agent.stderr and "IPv6" not in agent.stderr, agent.stderr
    empty_token = tmp_path / "agent.token"
    empty_token.write_text("\n")
    for args, expected in [
        (["--token-file", str(empty_token)], "is empty"),
        (["--metrics-listen", "9100"], "--metrics-listen"),
        (["--broker", "mqtt://broker:99999", "--trusted-keys", str(tmp_path / "keys")], "has a bad port"),
        (["--broker", "http://broker:1883", "--trusted-keys", str(tmp_path / "keys")], "mqtt://"),
    ]:
        done = install("--collector", "c1:7447", "--root", str(root), *args)
        assert done.returncode == 2, (args, done.stdout)
        assert "the agent would refuse this configuration" in done.stderr and expected in done.stderr, done.stderr
    assert not root.exists(), "nothing is written when the agent would refuse it"


def test_install_accepts_files_not_there_yet_and_lists_each_with_its_owner_and_mode(tmp_path: Path) -> None:
    root = tmp_path / "root"
    token = tmp_path / "agent.token"
    token.write_text("t" * 32 + "\n")
    token.chmod(0o644)
    done = install(
        "--collector", "c1:7447", "--root", str(root), "--tls-ca", str(tmp_path / "ca.pem"),
        "--tls-cert", str(tmp_path / "agent.pem"), "--tls-key", str(tmp_path / "agent.key"),
        "--token-file", str(token), "--broker", "mqtts://broker:8883", "--trusted-keys", str(tmp_path / "ops"),
        "--mqtt-username", "node", "--mqtt-password-file", str(tmp_path / "mqtt.password"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()

    def line_of(path: Path) -> str:
        return next(line for line in lines if line.strip().startswith(f"{path} "))

    assert "0640 root:gpuprobe" in line_of(tmp_path / "agent.key") and "missing" in line_of(tmp_path / "agent.key")
    assert "0640 root:gpuprobe" in line_of(tmp_path / "mqtt.password")
    assert "0644" in line_of(tmp_path / "ca.pem") and "(--trusted-keys)" in line_of(tmp_path / "ops")
    assert "readable by everyone" in line_of(token), "a secret others can read is pointed out"


def test_install_warns_for_a_program_under_any_path_the_unit_hides(tmp_path: Path) -> None:
    root = tmp_path / "root"
    venv_python = tmp_path / "venv/bin/python"  # tmp_path is under /tmp, which PrivateTmp=yes hides
    assert str(tmp_path).startswith("/tmp/"), "this test needs pytest's tmp_path under /tmp"
    done = install("--collector", "c1", "--root", str(root), "--executable", str(tmp_path / "venv/bin/gpuprobe"))
    assert done.returncode == 0, done.stderr
    assert "warning:" in done.stdout and "PrivateTmp=yes" in done.stdout and "203/EXEC" in done.stdout, done.stdout
    home = install("--collector", "c1", "--root", str(tmp_path / "r2"), "--executable", "/home/alice/bin/gpuprobe")
    assert "ProtectHome=yes" in home.stdout, home.stdout
    # a script outside the hidden paths whose interpreter is hidden (a venv under /tmp) fails the same way;
    # /opt, not the repository, which may itself be checked out under /tmp or /home
    if not os.access("/opt", os.W_OK):
        pytest.skip("needs to write a script under /opt, outside every path the unit hides (CI runs as root)")
    outside = Path("/opt") / f"gpuprobe-install-test-{os.getpid()}"
    outside.mkdir()
    try:
        script = outside / "hidden-interpreter"
        script.write_text(f"#!{venv_python}\n")
        shebang = install("--collector", "c1", "--root", str(tmp_path / "r3"), "--executable", str(script))
        assert f"{venv_python} ({script} runs it) is under /tmp" in shebang.stdout, shebang.stdout
        # a program outside every hidden path, run by an interpreter outside them too, gets no warning
        program = outside / "gpuprobe"
        program.write_text("#!/usr/bin/python3\n")
        program.chmod(0o755)
        fine = install("--collector", "c1", "--root", str(tmp_path / "r4"), "--executable", str(program))
    finally:
        shutil.rmtree(outside)
    assert fine.returncode == 0 and "warning:" not in fine.stdout, fine.stdout


def test_a_root_of_slash_is_the_machine_itself(tmp_path: Path) -> None:
    # docs/setup.md's production blocks pass --root "$ROOT/", which is / on the node itself: no staging
    assert staging_root(Path("/")) is None and staging_root(Path("//")) is None and staging_root(None) is None
    assert staging_root(tmp_path) == tmp_path
