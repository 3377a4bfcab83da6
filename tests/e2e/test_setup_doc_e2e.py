"""docs/setup.md, run as written: every ``sh`` block of a section, in order, in one bash shell.

The trial ("A trial on one machine"): the section's first line (``export TRIAL=…``) gets a temporary
folder for ``$TRIAL``, the source tree for ``$SRC`` and free ports; ``gpuprobe`` is this checkout's,
first on PATH. It ends with a stored probe in InfluxDB and a model report, over mutual TLS and tokens
(collector) and TLS and passwords (Mosquitto).

Installing and production: "Installing gpuprobe" runs with ``HOME`` a temporary folder; in
"Production" the first line (``export ROOT=…``) gets a temporary folder for ``$ROOT``, a clean machine
layout; the lines the page marks ``# needs systemd running`` are left out (no systemd runs here)."""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import re
import signal
import subprocess
import sys
import tomllib
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import support

from gpuprobe.devservices import free_ports

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / "docs" / "setup.md"
SECTION = "## A trial on one machine"
EXPORT = re.compile(r"^export TRIAL=.*$", re.M)
PORTS = ("INFLUX_PORT", "INFLUX_RPC_PORT", "MQTT_PORT", "COLLECTOR_PORT", "METRICS_PORT")


INSTALLING = "## Installing gpuprobe"
PRODUCTION = "## Production"
PRODUCTION_EXPORT = re.compile(r"^export ROOT=.*$", re.M)
NEEDS_SYSTEMD = "# needs systemd running"


def section_blocks(title: str) -> list[str]:
    """The ``sh`` blocks of the section ``title`` (up to the next ``## `` heading), in order."""
    text = SETUP.read_text()
    section = text[text.index(title) :]
    end = section.find("\n## ", len(title))
    section = section if end < 0 else section[:end]
    return re.findall(r"^```sh\n(.*?)^```", section, re.S | re.M)


def trial_script() -> str:
    blocks = section_blocks(SECTION)
    assert blocks and EXPORT.search(blocks[0]), "the section starts with its `export TRIAL=...` line"
    return "\n".join(blocks)


def test_the_trial_section_has_its_steps() -> None:
    script = trial_script()
    for step in ("gpuprobe certs", "influxd run", "mosquitto -c", "gpuprobe collector --listen", "gpuprobe agent",
                 "fleet", "probe start", "model --probe"):  # fmt: skip
        assert step in script, step


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_commands_of_docs_setup_md_reach_a_stored_probe_and_a_model_report(tmp_path: Path) -> None:
    trial = tmp_path / "trial"
    ports = dict(zip(PORTS, free_ports(len(PORTS)), strict=True))
    export = f"export TRIAL={trial} SRC={ROOT} " + " ".join(f"{k}={v}" for k, v in ports.items())
    script = "set -euo pipefail\n" + EXPORT.sub(export, trial_script(), count=1)
    env = support.clean_env(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        GPUPROBE_THREADS="1",  # the trainers share two cores
    )
    log = tmp_path / "script.log"
    with log.open("wb") as out:
        shell = subprocess.Popen(
            ["bash", "-c", script], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        returncode = shell.wait(330)
    except subprocess.TimeoutExpired:
        returncode = None
    finally:
        # the script's background services are in its process group; its last block stops them
        # when it gets there, this stops them when it did not
        if shell.poll() is None or returncode != 0:
            with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(shell.pid, signal.SIGTERM)
                shell.wait(30)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(shell.pid, signal.SIGKILL)

    def logs() -> str:
        parts = [log.read_text(errors="replace")[-5000:]]
        for name in ("collector", "node-a", "node-b", "mosquitto"):
            path = trial / f"{name}.log"
            if path.exists():
                parts.append(f"--- {name}.log\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)

    assert returncode == 0, logs()
    output = log.read_text()
    assert re.search(r"node-a\s+online", output) and re.search(r"node-b\s+online", output), logs()
    report = trial / "report" / "first-probe.html"
    assert report.exists() and report.stat().st_size > 10_000, logs()
    numbers = json.loads((trial / "report" / "first-probe.json").read_text())
    assert numbers["probe"] == "first-probe"
    # each node's GPU has a thermal fit from the samples that came through the collector
    assert {g["host"] for g in numbers["gpus"] if g["thermal"]} == {"node-a", "node-b"}, numbers["gpus"]
    assert all(n["samples_per_s"] > 0 for n in numbers["nodes"]), numbers["nodes"]
    # the probe is stored: every node's trainer points and the probe's phases, through the TLS collector
    for name in ("collector", "node-a", "node-b"):
        assert "UNAUTHENTICATED" not in (trial / f"{name}.log").read_text()
    assert stored_probe_hosts(trial, ports["INFLUX_PORT"]) == {"node-a", "node-b"}, logs()


def stored_probe_hosts(trial: Path, influx_port: int) -> set[str]:
    """Which hosts have `probe` points of first-probe in InfluxDB; InfluxDB is started again on the
    trial's data (the script stopped it), as the doc's last paragraph says one can."""
    conf = trial / "influxdb" / "influxdb.conf"
    influxd = subprocess.Popen(
        ["influxd", "run", "-config", str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{influx_port}"
    try:
        support.wait_until(lambda: _ping(base), 30, "InfluxDB on the trial's data")
        query = urllib.parse.urlencode(
            {"db": "gpuprobe", "q": "SELECT count(kind) FROM probe WHERE probe = 'first-probe' GROUP BY host"}
        )
        with urllib.request.urlopen(f"{base}/query?{query}", timeout=10) as answer:
            body = json.load(answer)
        series = body["results"][0].get("series", [])
        return {s["tags"]["host"] for s in series if s["values"][0][1] > 0}
    finally:
        influxd.terminate()
        influxd.wait(30)


def _ping(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/ping", timeout=1) as answer:
            return bool(answer.status == 204)
    except OSError:
        return False


def production_blocks() -> list[str]:
    """The production section's blocks, without the lines that need a running systemd."""
    blocks = section_blocks(PRODUCTION)
    assert blocks and PRODUCTION_EXPORT.search(blocks[0]), "the section starts with its `export ROOT=...` line"
    return ["\n".join(line for line in block.splitlines() if NEEDS_SYSTEMD not in line) for block in blocks]


def test_production_leaves_out_only_what_needs_systemd() -> None:
    skipped = [line for block in section_blocks(PRODUCTION) for line in block.splitlines() if NEEDS_SYSTEMD in line]
    assert skipped and all(line.startswith("systemctl ") for line in skipped), skipped
    script = "\n".join(production_blocks())
    for step in ("sys.version_info >= (3, 11)", "-m venv", "pip\" install", "install agent", "systemd-sysusers",
                 "install --upgrade", "rm -rf", "userdel"):  # fmt: skip
        assert step in script, step


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_install_and_production_commands_of_docs_setup_md_run_under_a_temporary_root(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("systemd-sysusers and userdel write the root's user database as root only")
    root = tmp_path / "root"
    root.mkdir()
    export = f"export ROOT={root} SRC={ROOT}"
    *install, uninstall = production_blocks()
    assert "userdel" in uninstall, "the last block uninstalls"
    # The new environment finds the dependencies this checkout already has (the test's site-packages, on
    # PYTHONPATH), and pip builds with the setuptools there when it is recent enough (no isolated build
    # environment to fill), so it builds gpuprobe from the tree and downloads nothing. gpuprobe itself comes from
    # the new environment: a folder holding a gpuprobe package is left out, and an editable install is a
    # .pth, which PYTHONPATH does not read (checked below).
    site_dirs = [p for p in sys.path if p.endswith("site-packages") and not (Path(p) / "gpuprobe").is_dir()]
    env = support.clean_env(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", PYTHONPATH=os.pathsep.join(site_dirs)
    )
    if _setuptools_major() >= 77:  # pyproject.toml's build-system requires
        env["PIP_NO_BUILD_ISOLATION"] = "0"  # pip's spelling of --no-build-isolation

    def run(blocks: list[str], home: Path | None = None) -> str:
        script = "set -euo pipefail\n" + PRODUCTION_EXPORT.sub(export, "\n".join(blocks), count=1)
        done = subprocess.run(
            ["bash", "-c", script],
            cwd=ROOT,
            env={**env, "HOME": str(home)} if home else env,
            capture_output=True,
            text=True,
            timeout=150,
            check=False,
        )
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        return done.stdout + done.stderr

    # "Installing gpuprobe": the trial's environment in the home folder, every extra
    home = tmp_path / "home"
    home.mkdir()
    installed = run(section_blocks(INSTALLING), home)
    assert re.search(r"^gpuprobe \d+\.\d+", installed, re.M), installed
    assert (home / "gpuprobe-venv/bin/gpuprobe").exists()

    output = run(install)
    venv = root / "opt/gpuprobe"
    imported = subprocess.run(
        [venv / "bin/python", "-c", "import gpuprobe; print(gpuprobe.__file__)"],
        env=env, cwd=tmp_path, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert Path(imported.strip()).is_relative_to(venv), imported
    # the native sampler was built into the environment, where the service's user finds it without
    # building (it can't write there): its own cache, in an empty home, is not where it is
    empty_home = tmp_path / "service-home"
    empty_home.mkdir()
    built = subprocess.run(
        [venv / "bin/python", "-c", "from gpuprobe.nvml.native import LIBRARY; print(LIBRARY.built())"],
        env={**env, "HOME": str(empty_home)}, cwd=tmp_path, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert Path(built.strip()).is_relative_to(venv), built
    unit = (root / "etc/systemd/system/gpuprobe-agent.service").read_text()
    assert f"ExecStart={venv}/bin/gpuprobe --config /etc/gpuprobe/agent.toml agent" in unit, unit
    config = tomllib.loads((root / "etc/gpuprobe/agent.toml").read_text())["agent"]
    assert config["collector"] == ["collector.example.net:7447"] and config["token_file"].endswith(".token")
    # every secret the agent reads is listed with the owner and mode it needs
    for secret in ("gpu-node-01.key", "gpu-node-01.token"):
        assert re.search(rf"/etc/gpuprobe/{re.escape(secret)}\s+0640 root:gpuprobe", output), output
    assert re.search(r"^gpuprobe:", (root / "etc/passwd").read_text(), re.M), "systemd-sysusers made the user"

    run([install[0], uninstall])
    assert not venv.exists() and not (root / "etc/gpuprobe").exists()
    assert not (root / "etc/systemd/system/gpuprobe-agent.service").exists()
    assert not re.search(r"^gpuprobe:", (root / "etc/passwd").read_text(), re.M), "userdel removed the user"


def _setuptools_major() -> int:
    try:
        return int(importlib.metadata.version("setuptools").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return 0
