"""Part: top. ``gpuprobe demo``: the whole system on one machine, with simulated GPUs, ending in a model report.

In a temporary directory it starts a real InfluxDB and a real Mosquitto, a collector (TLS and a
bearer token per agent), and two simulated nodes of four GPUs each (``gpuprobe sim run … --
gpuprobe agent``, the control plane embedded); it signs and starts a short full-size ResNet-50 probe on both
nodes over MQTT, follows its progress, collects the results, fits the thermal, acoustic and
efficiency models from InfluxDB and writes the HTML report. Then a small *study* on GPU 0 of both
nodes (full-size ResNet-50 at two batch sizes and two power limits; the agents may set limits) and
its report: samples/s and J/sample of the simulated H100 and A100, labelled simulated (the
simulator's performance model), ranked by GPU model and by the nodes' simulated instance types
(``sim-h100x4-node``, ``sim-a100x2-l4-4090-node``: labels of the demo, no cloud's). Every process
is stopped and the temporary directory removed at the end; the reports stay in ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from gpuprobe.config import Command, Option, parse_duration
from gpuprobe.errors import ServiceError

NODES = {"node-a": "4xH100-SXM5-80GB", "node-b": "2xA100-SXM4-80GB,L4,RTX-4090"}
#: Each node's labels (``--instance-type``, ``--virt``, ``--region``; ``--cloud sim``), so that the study
#: report compares instance types as it would on a real fleet. Named ``sim-…`` so that nobody takes
#: them for a cloud's, and set so that a demo run on a cloud VM is not labelled with its instance type.
NODE_LABELS = {
    "node-a": {"instance_type": "sim-h100x4-node", "virt": "bare_metal", "region": "sim-local"},
    "node-b": {"instance_type": "sim-a100x2-l4-4090-node", "virt": "bare_metal", "region": "sim-local"},
}
GPUS_PER_NODE = 4
# The simulated GPUs' thermal time constants, shortened (about 4x; the resistances are the profiles'),
# so that a probe of a minute or two settles: at the stock 30 s heatsink and 120 s inlet air a fit of
# so short a probe would be an extrapolation (docs/simulator.md has the stock values)
DEMO_THERMAL = {"tau_fast_s": "0.8", "tau_s": "8", "inlet_tau_s": "30", "mem_tau_s": "10"}
DB = "gpuprobe"


class DemoError(ServiceError, RuntimeError):
    pass


def _say(message: str) -> None:
    print(f"demo: {message}", file=sys.stderr, flush=True)


def _gpuprobe(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpuprobe.app", *args]


@dataclass
class Processes:
    """Background processes with their logs; stopped in reverse order of start."""

    workdir: Path
    running: list[tuple[str, subprocess.Popen[bytes], Path]] = field(default_factory=list)

    def start(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log_path = self.workdir / f"{name}.log"
        log: IO[bytes] = log_path.open("wb")
        proc = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        self.running.append((name, proc, log_path))
        return proc

    def check_alive(self) -> None:
        for name, proc, log_path in self.running:
            if proc.poll() is not None:
                raise DemoError(f"{name} exited with status {proc.returncode}:\n{_tail(log_path)}")

    def stop_all(self, timeout_s: float = 20.0) -> None:
        for _, proc, _ in reversed(self.running):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for _, proc, _ in reversed(self.running):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _run(argv: Sequence[str], what: str, timeout_s: float, echo: bool = True) -> str:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s)
    if echo and proc.stdout.strip():
        print(proc.stdout.rstrip(), flush=True)
    if proc.returncode not in (0, 3):
        raise DemoError(f"{what} failed (status {proc.returncode}):\n{proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def _wait_for(what: str, check: Any, timeout_s: float, procs: Processes) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        procs.check_alive()
        result = check()
        if result:
            return result
        time.sleep(0.5)
    raise DemoError(f"timed out after {timeout_s:.0f} s waiting for {what}")


@contextlib.contextmanager
def _workdir(keep: bool) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gpuprobe-demo-"))
    try:
        yield path
    finally:
        if keep:
            _say(f"kept the working directory {path}")
        else:
            shutil.rmtree(path, ignore_errors=True)


def run_demo(values: dict[str, Any]) -> int:
    from gpuprobe.collector.auth import format_tokens, new_token
    from gpuprobe.control import keys
    from gpuprobe.devservices.certs import make_pki
    from gpuprobe.devservices.influxdb import InfluxDBServer
    from gpuprobe.devservices.mosquitto import MosquittoServer
    from gpuprobe.devservices.ports import free_port
    from gpuprobe.model import InfluxSettings, ModelSettings, run
    from gpuprobe.model.api import QuietProgress
    from gpuprobe.pki import write_private

    out_dir: Path = values["out"].resolve()
    probe_id = f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    phases = {
        "idle_baseline": values["idle"],
        "warmup": 5.0,
        "duration": values["steady"],
        "cooldown": values["cooldown"],
    }
    total_s = sum(phases.values()) + values["start_in"]
    _say(
        f"two simulated nodes ({', '.join(f'{h}: {p}' for h, p in NODES.items())}), InfluxDB, Mosquitto, a"
        f" collector; probe {probe_id} runs about {total_s:.0f} s"
    )
    _say(
        "the simulated GPUs' thermal time constants are shortened so the probe settles in a minute: "
        + ", ".join(f"{k} {v}" for k, v in DEMO_THERMAL.items())
    )
    thermal_sets = [f"--set={i}.{k}={v}" for i in range(GPUS_PER_NODE) for k, v in DEMO_THERMAL.items()]
    with _workdir(values["keep"]) as work, contextlib.ExitStack() as stack:
        procs = Processes(work)
        stack.callback(procs.stop_all)
        influx = stack.enter_context(InfluxDBServer(work / "influxdb"))
        influx.create_database(DB)
        mqtt = stack.enter_context(MosquittoServer(work / "mosquitto"))
        broker = f"mqtt://127.0.0.1:{mqtt.port}"
        _say(f"InfluxDB at {influx.url}, Mosquitto at {broker}")

        pki = make_pki(work / "pki")
        tokens = {host: new_token() for host in NODES}
        write_private(work / "tokens", format_tokens(tokens).encode())
        collector_port = free_port()
        procs.start(
            "collector",
            _gpuprobe(
                "collector", "--listen", f"127.0.0.1:{collector_port}", "--influx-url", influx.url,
                "--influx-db", DB, "--wal", str(work / "wal"), "--tls-cert", str(pki.server.cert_path),
                "--tls-key", str(pki.server.key_path), "--tokens-file", str(work / "tokens"),
            ),
        )  # fmt: skip
        operator_key = keys.generate(work / "keys", "operator")

        # the trainers the probes start inherit this: one torch thread each, so that eight of them
        # share the machine's cores instead of thrashing them
        agent_env = dict(os.environ, GPUPROBE_THREADS="1")
        for host, profiles in NODES.items():
            token_file = work / f"{host}.token"
            write_private(token_file, tokens[host].encode())
            procs.start(
                host,
                _gpuprobe(
                    "sim", "run", "--profile", profiles, *thermal_sets, "--state-dir", str(work / host / "sim"), "--",
                    sys.executable, "-m", "gpuprobe.app", "agent", "--host", host, "--cluster", "demo",
                    "--collector", f"127.0.0.1:{collector_port}", "--tls-ca", str(pki.ca.cert_path),
                    "--tls-server-name", "localhost", "--token-file", str(token_file),
                    "--spool", str(work / host / "spool"), "--broker", broker,
                    "--trusted-keys", str(operator_key.public), "--control-dir", str(work / host / "control"),
                    "--allow-power-limits", "--cloud", "sim",
                    "--instance-type", NODE_LABELS[host]["instance_type"], "--virt", NODE_LABELS[host]["virt"],
                    "--region", NODE_LABELS[host]["region"],
                ),
                env=agent_env,
            )  # fmt: skip

        def fleet_online() -> bool:
            out = subprocess.run(_gpuprobe("fleet", "--broker", broker, "--json"), capture_output=True, text=True)
            if out.returncode != 0:
                return False
            online = {p.get("host") for p in json.loads(out.stdout or "[]") if p.get("state") == "online"}
            return set(NODES) <= online

        _wait_for("both agents to come online", fleet_online, 60, procs)
        _say("both agents are online; starting the probe (signed with a fresh operator key)")
        _run(
            _gpuprobe(
                "probe", "start", "--broker", broker, "--key", str(operator_key.private),
                "--workload", values["workload"], "--size", "full", "--probe-id", probe_id,
                "--start-in", str(values["start_in"]), "--idle-baseline", str(phases["idle_baseline"]),
                "--warmup", str(phases["warmup"]), "--duration", str(phases["duration"]),
                "--cooldown", str(phases["cooldown"]), "--wait", "10",
            ),
            "probe start",
            60,
        )  # fmt: skip
        status = subprocess.Popen(_gpuprobe("probe", "status", probe_id, "--broker", broker, "--refresh", "10"))
        try:
            status.wait(timeout=total_s + 120)
        except subprocess.TimeoutExpired:
            status.kill()
            raise DemoError("the probe did not finish in time") from None
        procs.check_alive()
        results = json.loads(
            _run(
                _gpuprobe("probe", "results", probe_id, "--broker", broker, "--wait", "30", "--json"),
                "probe results",
                60,
                echo=False,
            )
        )
        if len(results["results"]) != len(NODES):
            raise DemoError(f"results from {len(results['results'])} of {len(NODES)} nodes: {results}")
        _run(_gpuprobe("probe", "results", probe_id, "--broker", broker), "probe results", 60)

        _say("waiting for the collector to write everything to InfluxDB")
        time.sleep(3.0)
        _say("fitting the thermal, acoustic and efficiency models")
        progress = QuietProgress("demo")  # the fits take minutes here: say which stage they are at
        try:
            paths = run(
                ModelSettings(
                    influx=InfluxSettings(url=influx.url, database=DB, timeout_s=60.0),
                    probe=probe_id,
                    out_dir=out_dir,
                    price_per_gpu_hour=values["price_per_gpu_hour"],
                ),
                progress,
            )
        finally:
            progress.close()
        print()
        print(paths.summary)
        print(f"\nreport: {paths.html}\nnumbers: {paths.json}")
        if values["study"]:
            _study(values, broker, influx.url, operator_key.private, out_dir)
    return 0


def _study(values: dict[str, Any], broker: str, influx_url: str, key: Path, out_dir: Path) -> None:
    """A small study on GPU 0 of both nodes (an H100 and an A100): full-size ResNet-50 at two batch
    sizes and two power limits, then its report, which ranks the two nodes' simulated instance types
    (:data:`NODE_LABELS`). The throughput is the simulator's performance model."""
    study_id = f"demo-study-{time.strftime('%Y%m%d-%H%M%S')}"
    phases = {"idle_baseline": 3.0, "warmup": 8.0, "duration": values["study_steady"], "cooldown": 3.0}
    points = 4
    total_s = values["start_in"] + phases["idle_baseline"] + points * (phases["warmup"] + phases["duration"])
    _say(
        f"a small study {study_id}: full-size ResNet-50 at batch 64 and 256 and power limits 70 % and 100 % on "
        f"GPU 0 of both nodes, about {total_s + phases['cooldown']:.0f} s (throughput SIMULATED: the simulator's "
        "performance model, while the CPU trains the real model with a small batch)"
    )
    _run(
        _gpuprobe(
            "study", "start", "--broker", broker, "--key", str(key), "--study-id", study_id,
            "--workloads", "resnet50", "--size", "full", "--batch-sizes", "64,256", "--power-limits", "70%,100%",
            "--gpus", "0", "--start-in", str(values["start_in"]), "--idle-baseline", str(phases["idle_baseline"]),
            "--warmup", str(phases["warmup"]), "--duration", str(phases["duration"]),
            "--cooldown", str(phases["cooldown"]), "--wait", "10",
        ),
        "study start",
        60,
    )  # fmt: skip
    status = subprocess.Popen(_gpuprobe("study", "status", study_id, "--broker", broker, "--refresh", "10"))
    try:
        status.wait(timeout=total_s + phases["cooldown"] + 180)
    except subprocess.TimeoutExpired:
        status.kill()
        raise DemoError("the study did not finish in time") from None
    if status.returncode != 0:
        raise DemoError(f"gpuprobe study status failed ({status.returncode})")
    _say("waiting for the collector to write everything to InfluxDB")
    time.sleep(3.0)
    _say("the study's report: throughput per GPU, samples/J, the energy-optimal point per GPU model")
    html, numbers = out_dir / "study.html", out_dir / "study.json"
    _run(
        _gpuprobe(
            "study", "report", study_id, "--influx-url", influx_url, "--influx-db", DB,
            "--html", str(html), "--json", str(numbers),
        ),
        "study report",
        180,
    )  # fmt: skip


def _stopped(signum: int, frame: Any) -> None:
    raise DemoError(f"stopped by {signal.Signals(signum).name}")


def _command(values: dict[str, Any], args: argparse.Namespace) -> int:
    # the demo's services run in sessions of their own (a Ctrl-C in the terminal reaches only the demo,
    # which stops them in order): a SIGTERM must unwind the same way, or it would leave them running
    previous = signal.signal(signal.SIGTERM, _stopped)
    try:
        return run_demo(values)
    except DemoError as e:
        print(f"gpuprobe demo: error: {e}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)


COMMANDS = [
    Command(
        name="demo",
        help="the whole system on one machine with simulated GPUs, ending in a model report",
        description=__doc__,
        run=_command,
        options=[
            Option(
                "out", "folder for the report (HTML) and its numbers (JSON)", Path, Path("demo-report"), metavar="DIR"
            ),
            Option("workload", "the probe's workload", default="resnet50"),
            Option("idle", "idle baseline of the probe", parse_duration, 15.0),
            Option("steady", "steady load of the probe", parse_duration, 60.0),
            Option("cooldown", "cool-down of the probe", parse_duration, 45.0),
            Option("start_in", "time the nodes get to load torch before the synchronized start", parse_duration, 30.0),
            Option("price_per_gpu_hour", "price of one GPU-hour for the cost figures", float, 2.5, metavar="PRICE"),
            Option(
                "study",
                "after the probe, a small study (2 batch sizes x 2 power limits, full-size ResNet-50, simulated "
                "throughput) and its report (--no-study: skip it)",
                is_flag=True,
                default=True,
            ),
            Option("study_steady", "steady phase of each study point", parse_duration, 15.0),
            Option("keep", "keep the temporary working directory (logs, WAL, spools)", is_flag=True, default=False),
        ],
    )
]
