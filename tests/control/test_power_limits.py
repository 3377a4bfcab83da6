"""GPU power limits as a probe parameter (gpuprobe.control.powerlimit, docs/control.md "Power limits").

Every NVML call runs in a *child* process started with a simulated machine's environment (glibc reads
``LD_LIBRARY_PATH`` only at start), and limits are read back through pynvml in yet another process.
The machine has an L4 (limits 40-72 W, default 72 W) and an RTX 4090 (150-600 W, default 450 W: the
default is not the maximum, so percentages of the maximum are visible). Its folder is reachable by the
user ``nobody`` for the unprivileged cases (a child that drops root's privileges before it loads NVML).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuprobe.control.powerlimit import (
    FILE_NAME,
    LimitRequest,
    PowerLimitRefused,
    PowerLimits,
    parse_limit,
)
from gpuprobe.sim import state
from gpuprobe.sim.profiles import PROFILES
from gpuprobe.sim.runner import SimMachine, open_machine

NOBODY = 65534
L4_DEFAULT_MW, RTX_DEFAULT_MW = 72_000, 450_000
FAKE_UUID = "GPU-00000000-dead-beef-0000-000000000000"

PRELUDE = """
import json, logging, os, sys, time
from pathlib import Path
import pynvml as N
from gpuprobe.control.powerlimit import LimitRequest, PowerLimitRefused, PowerLimits, parse_limit
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
STATE = Path(os.environ["PL_STATE"])

def emit(obj):
    print(json.dumps(obj), flush=True)

def refusal(call):
    try:
        return {"ok": call()}
    except PowerLimitRefused as e:
        return {"reason": e.reason, "message": str(e)}
"""


def _env_without_gpuprobe() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")}


def _gpuprobe() -> list[str]:
    script = Path(sys.executable).parent / "gpuprobe"
    return [str(script)] if script.exists() else [sys.executable, "-m", "gpuprobe.app"]


@dataclass
class Node:
    """A simulated machine and a control directory, in a folder that ``nobody`` may enter."""

    base: Path
    machine: SimMachine

    @property
    def control_dir(self) -> Path:
        return self.base / "control"

    @property
    def state_file(self) -> Path:
        return self.control_dir / FILE_NAME

    def env(self) -> dict[str, str]:
        env = self.machine.environ(_env_without_gpuprobe())
        env["PL_STATE"] = str(self.state_file)
        env["HOME"] = str(self.base)
        return env

    def _args(self, code: str) -> list[str]:
        return [sys.executable, "-c", PRELUDE + textwrap.dedent(code)]

    def run(self, code: str, *, as_nobody: bool = False, timeout: float = 60) -> Any:
        """Run a snippet in a child process; its last JSON line. ``as_nobody``: the child becomes the user
        nobody (real, effective and saved ids; no groups, no capabilities left) before it loads NVML.
        It starts as root and drops its privileges itself, rather than ``subprocess.run(user=...)``,
        because this interpreter may live where nobody cannot execute it (under /root)."""
        if as_nobody:
            # what the child needs loads first: nobody cannot read this interpreter's standard library either
            code = (
                "import binascii, pwd, gpuprobe.nvml.sensor, gpuprobe.nvml.device\n"
                f"os.setgroups([]); os.setgid({NOBODY}); os.setuid({NOBODY})\n" + textwrap.dedent(code)
            )
        done = subprocess.run(self._args(code), env=self.env(), capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"child exited {done.returncode}\n{done.stdout}\n{done.stderr}"
        lines = [line for line in done.stdout.splitlines() if line.strip()]
        assert lines, f"the child printed nothing\n{done.stderr}"
        return json.loads(lines[-1])

    def spawn(self, code: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self._args(code),
            env=self.env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def limits_mw(self) -> list[int]:
        """Every GPU's power limit, read through NVML in a new process once the last change is in force
        (a new limit takes effect at the next update boundary: 50 ms here)."""
        return list(
            self.run(
                """
                time.sleep(0.15)
                N.nvmlInit()
                emit([N.nvmlDeviceGetPowerManagementLimit(N.nvmlDeviceGetHandleByIndex(i))
                      for i in range(N.nvmlDeviceGetCount())])
                """
            )
        )

    def uuids(self) -> list[str]:
        return list(
            self.run(
                """
                N.nvmlInit()
                emit([N.nvmlDeviceGetUUID(N.nvmlDeviceGetHandleByIndex(i)) for i in range(N.nvmlDeviceGetCount())])
                """
            )
        )

    def set_limit_behind_our_back(self, index: int, mw: int) -> None:
        """What a probe of a killed agent left: a limit set directly through NVML."""
        self.run(
            f"N.nvmlInit()\nN.nvmlDeviceSetPowerManagementLimit(N.nvmlDeviceGetHandleByIndex({index}), {mw})\nemit(1)"
        )

    def write_state(self, gpus: dict[str, dict[str, Any]]) -> None:
        self.control_dir.mkdir(exist_ok=True)
        self.state_file.write_text(json.dumps({"version": 1, "gpus": gpus}))


@pytest.fixture
def node() -> Iterator[Node]:
    base = Path(tempfile.mkdtemp(prefix="gpuprobe-powerlimit-"))
    try:
        base.chmod(0o755)  # nobody must reach the simulator's state (pytest's tmp_path is private to root)
        machine = open_machine(base / "sim", [PROFILES["L4"], PROFILES["RTX-4090"]], period_s=0.05)
        (base / "control").mkdir()
        (base / "control").chmod(0o777)
        yield Node(base, machine)
    finally:
        shutil.rmtree(base, ignore_errors=True)


# --- requests ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected", "label"),
    [
        ("60%", LimitRequest(pct_of_max=60.0), "60%"),
        (" 62.5 % ", LimitRequest(pct_of_max=62.5), "62.5%"),
        ("100%", LimitRequest(pct_of_max=100.0), "100%"),
        ("250W", LimitRequest(watts=250.0), "250W"),
        ("250w", LimitRequest(watts=250.0), "250W"),
        ("250 W", LimitRequest(watts=250.0), "250W"),
        ("250", LimitRequest(watts=250.0), "250W"),
        ("72.5", LimitRequest(watts=72.5), "72.5W"),
        ("default", LimitRequest(), ""),
        ("Default", LimitRequest(), ""),
        ("", LimitRequest(), ""),
        ("  ", LimitRequest(), ""),
    ],
)
def test_parse_limit_reads_percentages_watts_and_default(text: str, expected: LimitRequest, label: str) -> None:
    request = parse_limit(text)
    assert request == expected
    assert request.label == label
    assert request.is_default == (label == "")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("0%", "more than 0 and at most 100"),
        ("-5%", "more than 0 and at most 100"),
        ("100.5%", "more than 0 and at most 100"),
        ("0W", "watts must be more than 0"),
        ("-250", "watts must be more than 0"),
        ("0", "watts must be more than 0"),
        ("sixty%", "not a power limit: 'sixty%'"),
        ("250kW", "not a power limit"),
        ("W", "not a power limit"),
        ("%", "not a power limit"),
        ("nan", "not a power limit"),
        ("inf W", "not a power limit"),
        ("max", "not a power limit"),
    ],
)
def test_parse_limit_refuses_with_a_clear_message(text: str, says: str) -> None:
    with pytest.raises(ValueError, match="power limit") as caught:
        parse_limit(text)
    assert says in str(caught.value)
    if "not a power limit" in says:
        assert "60%" in str(caught.value) and "250W" in str(caught.value), "the message says what is accepted"


def test_a_request_is_a_percentage_or_watts_and_sane() -> None:
    for bad in ({"pct_of_max": 60.0, "watts": 250.0}, {"pct_of_max": 0.0}, {"pct_of_max": 101.0}, {"watts": -1.0}):
        with pytest.raises(ValueError):
            LimitRequest(**bad)


def test_an_agent_that_does_not_allow_power_limits_refuses_without_touching_nvml(tmp_path: Path) -> None:
    # this process has no NVML: a call into it would fail with another reason
    limits = PowerLimits(tmp_path / FILE_NAME, allowed=False)
    assert limits.resolve(0, LimitRequest()) is None, "leaving the limit as it is needs no permission"
    for call in (lambda: limits.resolve(0, parse_limit("60%")), lambda: limits.apply(0, 60.0)):
        with pytest.raises(PowerLimitRefused) as caught:
            call()
        assert caught.value.reason == "not_allowed"
        assert "GPU 0" in str(caught.value) and "--allow-power-limits" in str(caught.value)
    assert "power limit 60% for GPU 0" in _message(lambda: limits.resolve(0, parse_limit("60%")))
    assert not (tmp_path / FILE_NAME).exists()
    assert limits.restore() == []


def _message(call: Any) -> str:
    try:
        call()
    except PowerLimitRefused as e:
        return str(e)
    raise AssertionError("not refused")


# --- resolve ----------------------------------------------------------------------------------------


def test_resolve_turns_requests_into_watts_and_refuses_limits_outside_the_gpus_range(node: Node) -> None:
    out = node.run(
        """
        pl = PowerLimits(STATE, True)
        asks = [(0, "100%"), (0, "60W"), (0, "40"), (0, "72W"), (0, "default"), (1, "75%"), (1, "25%"),
                (1, "600W"), (0, "50%"), (0, "39.9W"), (0, "72.1W"), (1, "24%"), (1, "601")]
        emit({f"{i}:{t}": refusal(lambda: pl.resolve(i, parse_limit(t))) for i, t in asks})
        """
    )
    assert out["0:100%"] == {"ok": 72.0}
    assert out["0:60W"] == {"ok": 60.0}
    assert out["0:40"] == {"ok": 40.0}
    assert out["0:72W"] == {"ok": 72.0}
    assert out["0:default"] == {"ok": None}
    assert out["1:75%"] == {"ok": 450.0}, "a percentage of the MAXIMUM limit (600 W), not of the default (450 W)"
    assert out["1:25%"] == {"ok": 150.0}
    assert out["1:600W"] == {"ok": 600.0}
    for key in ("0:50%", "0:39.9W", "0:72.1W", "1:24%", "1:601"):
        assert out[key]["reason"] == "out_of_range", key
    assert out["0:50%"]["message"] == (
        "power limit 50% for GPU 0 is 36 W, outside the GPU's range 40 W to 72 W (55.6% to 100% of its maximum)"
    )
    assert out["0:72.1W"]["message"] == (
        "power limit 72.1W for GPU 0 is outside the GPU's range 40 W to 72 W (55.6% to 100% of its maximum)"
    )
    assert "GPU 1 is 144 W, outside the GPU's range 150 W to 600 W" in out["1:24%"]["message"]
    assert "601W" in out["1:601"]["message"] and "150 W to 600 W (25% to 100%" in out["1:601"]["message"]
    # resolving changes nothing
    assert node.limits_mw() == [L4_DEFAULT_MW, RTX_DEFAULT_MW]
    assert not node.state_file.exists()


def test_a_lost_gpu_is_refused_as_an_nvml_error(node: Node) -> None:
    state.set_failed(node.machine.state_dir, 0, True)
    out = node.run(
        """
        time.sleep(0.15)
        pl = PowerLimits(STATE, True)
        emit([refusal(lambda: pl.resolve(0, parse_limit("60W"))), refusal(lambda: pl.apply(0, 60.0)),
              refusal(lambda: pl.resolve(1, parse_limit("300W"))), refusal(lambda: pl.resolve(5, parse_limit("60%")))])
        """
    )
    assert out[0]["reason"] == "nvml_error" and "GPU 0" in out[0]["message"], out
    assert "lost" in out[0]["message"].lower(), out
    assert out[1]["reason"] == "nvml_error", out
    assert out[2] == {"ok": 300.0}, "the other GPU is not affected"
    assert out[3]["reason"] == "nvml_error" and out[3]["message"].startswith("power limit 60% for GPU 5 refused: NVML")
    assert not node.state_file.exists()


# --- privilege --------------------------------------------------------------------------------------


def test_an_unprivileged_agent_is_refused_before_and_by_nvml_and_changes_nothing(node: Node) -> None:
    out = node.run(
        """
        pl = PowerLimits(STATE, True)
        emit({"euid": os.geteuid(), "describe": pl.describe(),
              "resolve": refusal(lambda: pl.resolve(0, parse_limit("60W"))),
              "default": refusal(lambda: pl.resolve(0, parse_limit("default"))),
              "apply": refusal(lambda: pl.apply(0, 60.0)),
              "file_after_apply": STATE.exists()})
        """,
        as_nobody=True,
    )
    assert out["euid"] == NOBODY
    assert "do not run (unprivileged" in out["describe"]
    assert out["resolve"]["reason"] == "unprivileged"
    message = out["resolve"]["message"]
    assert "power limit 60W for GPU 0" in message and "nobody (uid 65534) without CAP_SYS_ADMIN" in message
    assert "root or CAP_SYS_ADMIN" in message
    assert out["default"] == {"ok": None}
    # past the check, NVML itself answers NO_PERMISSION (the simulator, like the driver, refuses
    # non-root callers); the limit to restore that apply wrote first is taken back
    assert out["apply"]["reason"] == "unprivileged", out["apply"]
    assert "Insufficient Permissions" in out["apply"]["message"]
    assert out["file_after_apply"] is False
    assert node.limits_mw() == [L4_DEFAULT_MW, RTX_DEFAULT_MW]


def test_leftovers_that_cannot_be_restored_stay_in_the_file_for_the_next_start(node: Node) -> None:
    uuid0, _ = node.uuids()
    node.set_limit_behind_our_back(0, 50_000)
    node.write_state({uuid0: {"index": 0, "limit_mw": L4_DEFAULT_MW}})
    kept = node.state_file.read_text()
    out = node.run("emit(PowerLimits(STATE, True).restore_leftovers())", as_nobody=True)
    assert len(out) == 1 and "cannot restore the power limit to 72 W" in out[0], out
    assert "kept in" in out[0] and "next start" in out[0]
    assert json.loads(node.state_file.read_text())["gpus"] == json.loads(kept)["gpus"]
    assert node.limits_mw() == [50_000, RTX_DEFAULT_MW]
    # a privileged start restores it
    lines = node.run("emit(PowerLimits(STATE, False).restore_leftovers())")
    assert lines == [f"GPU 0 ({uuid0}): power limit restored to 72 W"]
    assert not node.state_file.exists()
    assert node.limits_mw() == [L4_DEFAULT_MW, RTX_DEFAULT_MW]


# --- apply and restore ------------------------------------------------------------------------------


def test_apply_then_restore_puts_the_original_limits_back(node: Node) -> None:
    uuid0, uuid1 = node.uuids()
    child = node.spawn(
        """
        pl = PowerLimits(STATE, True)
        pl.apply(0, pl.resolve(0, parse_limit("50W")))
        pl.apply(0, pl.resolve(0, parse_limit("60W")))   # a second point: the original stays the one to restore
        pl.apply(1, pl.resolve(1, parse_limit("50%")))
        emit({"state": json.loads(STATE.read_text())})
        sys.stdin.readline()
        emit({"lines": pl.restore(), "exists": STATE.exists(), "again": pl.restore()})
        """
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        first = json.loads(child.stdout.readline() or "null")
        assert first is not None, child.stderr.read() if child.stderr else ""
        gpus = first["state"]["gpus"]
        assert gpus == {
            uuid0: {"index": 0, "limit_mw": L4_DEFAULT_MW},
            uuid1: {"index": 1, "limit_mw": RTX_DEFAULT_MW},
        }
        assert node.limits_mw() == [60_000, 300_000]
        child.stdin.write("go\n")
        child.stdin.flush()
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 0, err
    second = json.loads(out.strip().splitlines()[-1])
    assert second["lines"] == [
        f"GPU 0 ({uuid0}): power limit restored to 72 W",
        f"GPU 1 ({uuid1}): power limit restored to 450 W",
    ]
    assert second["exists"] is False and second["again"] == []
    assert node.limits_mw() == [L4_DEFAULT_MW, RTX_DEFAULT_MW]
    assert f"GPU 0 ({uuid0}): power limit set to 60 W (restores to 72 W)" in err


def test_a_killed_agent_leaves_the_file_and_the_next_start_restores_the_limits(node: Node) -> None:
    child = node.spawn(
        """
        pl = PowerLimits(STATE, True)
        pl.apply(0, pl.resolve(0, parse_limit("45W")))
        pl.apply(1, pl.resolve(1, parse_limit("200W")))
        emit("applied")
        sys.stdin.read()  # runs on, as an agent does, until its SIGKILL (or the test closes stdin)
        """
    )
    try:
        assert child.stdout is not None
        assert json.loads(child.stdout.readline() or "null") == "applied"
        assert node.limits_mw() == [45_000, 200_000]
        child.send_signal(signal.SIGKILL)
        assert child.wait(30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate()
    assert node.limits_mw() == [45_000, 200_000], "nothing restores a SIGKILLed agent's limits by itself"
    saved = json.loads(node.state_file.read_text())["gpus"]
    assert sorted(g["limit_mw"] for g in saved.values()) == [L4_DEFAULT_MW, RTX_DEFAULT_MW]
    lines = node.run("emit(PowerLimits(STATE, True).restore_leftovers())")
    assert len(lines) == 2 and all("power limit restored to" in line for line in lines), lines
    assert "GPU 0 (GPU-" in lines[0] and "restored to 72 W" in lines[0]
    assert "GPU 1 (GPU-" in lines[1] and "restored to 450 W" in lines[1]
    assert not node.state_file.exists()
    assert node.limits_mw() == [L4_DEFAULT_MW, RTX_DEFAULT_MW]
    assert node.run("emit(PowerLimits(STATE, True).restore_leftovers())") == [], "nothing left: nothing to do"


def test_a_gpu_that_is_gone_is_dropped_with_a_message(node: Node) -> None:
    uuid0, _ = node.uuids()
    node.set_limit_behind_our_back(0, 55_000)
    node.write_state(
        {
            FAKE_UUID: {"index": 7, "limit_mw": 300_000},
            uuid0: {"index": 3, "limit_mw": L4_DEFAULT_MW},  # the index is only a hint: found by UUID
        }
    )
    lines = node.run("emit(PowerLimits(STATE, True).restore_leftovers())")
    assert f"GPU {FAKE_UUID} (index 7 when its limit was set) is not on this node any more" in lines[0], lines
    assert "(300 W) is dropped" in lines[0]
    assert lines[1] == f"GPU 0 ({uuid0}): power limit restored to 72 W"
    assert not node.state_file.exists()
    assert node.limits_mw() == [L4_DEFAULT_MW, RTX_DEFAULT_MW]


@pytest.mark.parametrize(
    "content",
    ["{not json", json.dumps({"version": 1, "gpus": {"GPU-x": {"index": "zero", "limit_mw": 1}}}), "[]", ""],
)
def test_a_damaged_state_file_is_reported_moved_aside_and_not_fatal(node: Node, content: str) -> None:
    node.state_file.write_text(content)
    out = node.run(
        """
        pl = PowerLimits(STATE, True)
        lines = pl.restore_leftovers()
        pl.apply(0, 60.0)
        emit({"lines": lines, "restore": pl.restore(), "exists": STATE.exists()})
        """
    )
    (line,) = out["lines"]
    assert line.startswith(f"the power limits to restore in {node.state_file} are unreadable (")
    aside = list(node.control_dir.glob(f"{FILE_NAME}.damaged-*"))
    assert len(aside) == 1 and aside[0].read_text() == content
    assert f"moved to {aside[0]}" in line and "nvidia-smi -q -d POWER" in line
    assert out["restore"] == [f"GPU 0 ({node.uuids()[0]}): power limit restored to 72 W"]
    assert out["exists"] is False
    assert node.limits_mw() == [L4_DEFAULT_MW, RTX_DEFAULT_MW]


# --- the agents -------------------------------------------------------------------------------------


def _wait_for(path: Path, text: str, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        log = path.read_text(errors="replace") if path.exists() else ""
        if text in log:
            return log
        if proc.poll() is not None:
            raise AssertionError(f"exited ({proc.returncode}) without {text!r}:\n{log}")
        time.sleep(0.05)
    raise AssertionError(f"no {text!r} within {timeout_s} s:\n{path.read_text(errors='replace')}")


def test_control_agents_restore_leftovers_at_start_and_take_the_option(node: Node, tmp_path: Path) -> None:
    from gpuprobe.control import keys

    public = keys.generate(tmp_path / "keys", "operator").public
    uuid0, _ = node.uuids()
    node.set_limit_behind_our_back(0, 48_000)
    node.write_state({uuid0: {"index": 0, "limit_mw": L4_DEFAULT_MW}})
    unreachable = "mqtt://127.0.0.1:1"  # refused at once: the agents keep retrying, and start up regardless
    runs = [
        # gpuprobe control-agent, option off: it still restores what a killed agent left
        ([*_gpuprobe(), "control-agent", "--broker", unreachable, "--host", "pl-node", "--control-dir",
          str(node.control_dir), "--trusted-keys", str(public)], {},
         ["power limits: not allowed", f"GPU 0 ({uuid0}): power limit restored to 72 W"]),
        # the same with the flag
        ([*_gpuprobe(), "control-agent", "--broker", unreachable, "--host", "pl-node", "--control-dir",
          str(node.control_dir), "--trusted-keys", str(public), "--allow-power-limits"], {},
         ["power limits: allowed; the agent runs as root (uid 0)"]),
        # gpuprobe agent --broker, from the environment
        ([*_gpuprobe(), "agent", "--collector", "127.0.0.1:1", "--spool", str(tmp_path / "spool"), "--broker",
          unreachable, "--trusted-keys", str(public), "--control-dir", str(node.control_dir)],
         {"GPUPROBE_ALLOW_POWER_LIMITS": "true"}, ["power limits: allowed; the agent runs as root (uid 0)"]),
    ]  # fmt: skip
    for n, (args, extra_env, expected) in enumerate(runs):
        log_path = tmp_path / f"agent-{n}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(args, env={**node.env(), **extra_env}, stdout=log, stderr=log)
        try:
            for text in expected:
                _wait_for(log_path, text, proc)
            _wait_for(log_path, "nothing listens at the MQTT broker", proc)  # past the start-up
        finally:
            proc.kill()
            proc.wait()
        if n == 0:
            assert not node.state_file.exists()
            assert node.limits_mw() == [L4_DEFAULT_MW, RTX_DEFAULT_MW]


def test_install_agent_passes_the_option_and_grants_the_capability_in_a_drop_in(tmp_path: Path) -> None:
    from gpuprobe.control import keys

    public = keys.generate(tmp_path / "keys", "operator").public
    root = tmp_path / "root"

    def install(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*_gpuprobe(), "install", "agent", "--collector", "c1", *args],
            env=_env_without_gpuprobe(),
            capture_output=True,
            text=True,
            timeout=60,
        )

    done = install("--root", str(root), "--broker", "mqtt://broker:1883", "--trusted-keys", str(public),
                   "--allow-power-limits")  # fmt: skip
    assert done.returncode == 0, done.stderr
    config = root / "etc/gpuprobe/agent.toml"
    assert tomllib.loads(config.read_text())["agent"]["allow_power_limits"] is True
    unit = root / "etc/systemd/system/gpuprobe-agent.service"
    dropin = root / "etc/systemd/system/gpuprobe-agent.service.d/power-limits.conf"
    lines = dropin.read_text().splitlines()
    assert "[Service]" in lines
    assert "CapabilityBoundingSet=CAP_SYS_ADMIN" in lines and "AmbientCapabilities=CAP_SYS_ADMIN" in lines
    assert "User=gpuprobe" in unit.read_text().splitlines(), "the agent keeps its unprivileged user"
    assert "CAP_SYS_ADMIN" in done.stdout
    if shutil.which("systemd-analyze") is not None:
        # systemd merges the drop-in into the unit (whose empty assignments drop every capability) and,
        # at debug level, dumps the unit as it would run it: exactly CAP_SYS_ADMIN, bounding and ambient
        verify = subprocess.run(
            ["systemd-analyze", "verify", str(unit)],
            env={**os.environ, "SYSTEMD_LOG_LEVEL": "debug"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert verify.returncode == 0, verify.stderr
        dump = {line.strip() for line in (verify.stdout + verify.stderr).splitlines()}
        assert f"DropIn Path: {dropin}" in dump, verify.stderr
        assert {"CapabilityBoundingSet: cap_sys_admin", "AmbientCapabilities: cap_sys_admin"} <= dump, verify.stderr
    # the agent reads the config it wrote
    check = subprocess.run([*_gpuprobe(), "--config", str(config), "agent", "--check"],
                           env=_env_without_gpuprobe(), capture_output=True, text=True, timeout=60)  # fmt: skip
    assert check.returncode == 0, check.stderr
    # without it: neither the config line nor the drop-in; and it needs the broker
    plain = tmp_path / "plain"
    assert install("--root", str(plain), "--broker", "mqtt://b", "--trusted-keys", str(public)).returncode == 0
    assert "allow_power_limits" not in (plain / "etc/gpuprobe/agent.toml").read_text()
    assert not (plain / "etc/systemd/system/gpuprobe-agent.service.d").exists()
    refused = install("--root", str(tmp_path / "r2"), "--allow-power-limits")
    assert refused.returncode == 2 and "--allow-power-limits only apply with --broker" in refused.stderr
    # installing again without it takes the capability away: the earlier drop-in is removed
    again = install("--root", str(root), "--broker", "mqtt://broker:1883", "--trusted-keys", str(public), "--force")
    assert again.returncode == 0, again.stderr
    assert not dropin.exists() and "no longer allowed" in again.stdout
    assert "allow_power_limits" not in config.read_text()
