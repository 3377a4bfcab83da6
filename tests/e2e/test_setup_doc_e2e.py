"""docs/setup.md's trial, run as written: every ``sh`` block of its section "A trial on one machine", in
order, in one bash shell. The only change is mechanical: the section's first line (``export TRIAL=…``)
gets a temporary folder for ``$TRIAL``, the source tree for ``$SRC`` and free ports; ``gpuprobe`` is
this checkout's, first on PATH. It ends with a stored probe in InfluxDB and a model report, over
mutual TLS and tokens (collector) and TLS and passwords (Mosquitto)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
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


def trial_script() -> str:
    text = SETUP.read_text()
    section = text[text.index(SECTION) :]
    section = section[: section.index("\n## ", len(SECTION))]
    blocks = re.findall(r"^```sh\n(.*?)^```", section, re.S | re.M)
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
