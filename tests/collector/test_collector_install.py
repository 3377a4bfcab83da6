"""``gpuprobe install collector``: a hardened unit systemd accepts, a config the collector accepts."""

from __future__ import annotations

import contextlib
import itertools
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from collector_helpers import CollectorProcess

from gpuprobe.devservices.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def install(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuprobe.app", "install", "collector", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_install_collector_writes_a_hardened_unit_that_systemd_analyze_verify_accepts(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze is missing: apt-get install systemd")
    root = tmp_path / "root"
    done = install("--root", str(root), "--tokens-file", "/etc/gpuprobe/collector-tokens")
    assert done.returncode == 0, done.stderr
    unit = root / "etc/systemd/system/gpuprobe-collector.service"
    lines = unit.read_text().splitlines()
    for expected in [
        "Type=notify",
        "WatchdogSec=30",
        "Restart=on-failure",
        "User=gpuprobe",
        "StateDirectory=gpuprobe/collector",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
        "CapabilityBoundingSet=",
        "RestrictRealtime=yes",  # only the agent's sampler may ask for real-time scheduling
        "EnvironmentFile=-/etc/gpuprobe/collector.env",
    ]:
        assert expected in lines, f"{expected} missing from the unit"
    assert not any(line.startswith("LimitRT") for line in lines)
    exec_start = next(line for line in lines if line.startswith("ExecStart="))
    assert exec_start.endswith("--config /etc/gpuprobe/collector.toml collector")
    assert "systemctl enable --now gpuprobe-collector" in done.stdout
    assert (root / "etc/sysusers.d/gpuprobe-collector.conf").read_text().startswith("u gpuprobe ")

    verify = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    complaints = [line for line in verify.stderr.splitlines() if "gpuprobe-collector.service" in line]
    assert verify.returncode == 0 and not complaints, verify.stderr


def test_the_installed_config_is_understood_by_gpuprobe_collector(tmp_path: Path) -> None:
    root = tmp_path / "root"
    assert install("--root", str(root)).returncode == 0
    config = root / "etc/gpuprobe/collector.toml"
    text = config.read_text()
    assert 'tls_client_ca = "/etc/gpuprobe/tls/agents-ca.crt"' in text and 'wal = "/var/lib/gpuprobe/collector"' in text
    assert 'metrics_listen = "127.0.0.1:9447"' in text  # no authentication: this host only unless told
    # every key is a collector option; with the TLS files absent here it stops at reading them
    started = subprocess.run(
        [sys.executable, "-m", "gpuprobe.app", "--config", str(config), "collector", "--wal", str(tmp_path / "wal")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode == 2
    assert "cannot read the TLS files" in started.stderr, started.stderr


def test_install_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    root = tmp_path / "root"
    assert install("--root", str(root)).returncode == 0
    config = root / "etc/gpuprobe/collector.toml"
    config.write_text("# edited by the operator\n")
    again = install("--root", str(root), "--influx-url", "http://influx.example:8086")
    assert again.returncode == 1 and "refusing to overwrite" in again.stderr and "--force" in again.stderr
    assert config.read_text() == "# edited by the operator\n"
    forced = install("--root", str(root), "--influx-url", "http://influx.example:8086", "--force")
    assert forced.returncode == 0
    assert 'influx_url = "http://influx.example:8086"' in config.read_text()


def test_deploy_examples_match_what_install_writes(tmp_path: Path) -> None:
    """deploy/collector/ holds a rendered example; it must not drift from the installer."""
    root = tmp_path / "root"
    done = install(
        "--root", str(root), "--executable", "/usr/local/bin/gpuprobe",
        "--tokens-file", "/etc/gpuprobe/collector-tokens", "--influx-url", "http://influxdb.example.net:8086",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    deploy = ROOT / "deploy/collector"
    assert (deploy / "gpuprobe-collector.service").read_text() == (
        root / "etc/systemd/system/gpuprobe-collector.service"
    ).read_text()
    assert (deploy / "collector.toml").read_text() == (root / "etc/gpuprobe/collector.toml").read_text()


@pytest.mark.parametrize("workers", [1, 2])
def test_the_service_tells_systemd_ready_pings_the_watchdog_and_says_stopping(
    tmp_path: Path, collector_process: Callable[..., CollectorProcess], workers: int
) -> None:
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(0.1)
    messages: list[tuple[float, str]] = []

    def collect(until: float) -> None:
        while time.monotonic() < until:
            with contextlib.suppress(TimeoutError):
                messages.append((time.monotonic(), sock.recv(4096).decode()))

    try:
        process = collector_process(
            "--insecure", "--workers", str(workers), "--wal", str(tmp_path / "wal"),
            "--influx-url", f"http://127.0.0.1:{free_port()}",
            env={"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "1000000"},
        )  # fmt: skip
        process.start()
        collect(time.monotonic() + 4)
        assert process.proc is not None
        process.proc.send_signal(signal.SIGTERM)
        collect(time.monotonic() + 2)
        assert process.proc.wait(20) == 0
    finally:
        sock.close()
    texts = [m for _, m in messages]
    ready = [i for i, m in enumerate(texts) if "READY=1" in m.splitlines()]
    assert len(ready) == 1, texts  # with several workers: the main process, once all serve
    pings = [t for t, m in messages if m == "WATCHDOG=1"]
    assert len(pings) >= 4, texts
    assert max(b - a for a, b in itertools.pairwise(pings)) < 1.5
    stopping = [i for i, m in enumerate(texts) if m == "STOPPING=1"]
    assert stopping and stopping[0] > ready[0]


def test_install_refuses_what_the_collector_would_refuse_with_the_collectors_own_message(tmp_path: Path) -> None:
    root = tmp_path / "root"
    bad_tokens = tmp_path / "tokens"
    bad_tokens.write_text("node-1\n")  # no token: the collector refuses the file at start
    for args, expected in [
        (["--influx-url", "influx:8086"], "--influx-url must start with http:// or https://, not 'influx:8086'"),
        (["--listen", "0.0.0.0:99999"], "--listen: port 99999 is out of range"),
        (["--metrics-listen", "9447"], "--metrics-listen must be HOST:PORT"),
        (["--tokens-file", str(bad_tokens)], "expected 'AGENT_ID TOKEN'"),
    ]:
        done = install("--root", str(root), *args)
        assert done.returncode == 2, (args, done.stdout)
        assert "the collector would refuse this configuration" in done.stderr and expected in done.stderr, done.stderr
    assert not root.exists(), "nothing is written when the collector would refuse it"


def test_install_collector_lists_the_files_it_reads_and_warns_for_a_hidden_program(tmp_path: Path) -> None:
    done = install("--root", str(tmp_path / "root"), "--executable", str(tmp_path / "venv/bin/gpuprobe"))
    assert done.returncode == 0, done.stderr
    key_line = next(
        line for line in done.stdout.splitlines() if "/etc/gpuprobe/tls/collector.key" in line and "(--" in line
    )
    assert "0640 root:gpuprobe" in key_line and "missing" in key_line
    assert "PrivateTmp=yes" in done.stdout and "203/EXEC" in done.stdout, done.stdout
