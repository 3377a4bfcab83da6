"""Part: control. ``gpuprobe probe start|status|results|cancel|keygen``, ``gpuprobe fleet`` and ``gpuprobe
control-agent``.

Imported by every ``gpuprobe`` invocation to list the commands: MQTT, cryptography and NVML load
only when a command runs.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import getpass
import json
import logging
import signal
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from gpuprobe import workloads
from gpuprobe.config import Command, ConfigError, Option, parse_duration
from gpuprobe.control.mqtt import MQTT_OPTIONS
from gpuprobe.control.settings import (
    CONTROL_OPTIONS,
    COOLDOWN,
    IDLE_BASELINE,
    NODES,
    RETRY_OPTIONS,
    SIZE,
    START_IN,
    TRUSTED_KEYS,
    WARMUP,
    control_settings,
)

log = logging.getLogger("gpuprobe.control")


def _error(command: str, message: str, code: int = 2) -> int:
    print(f"gpuprobe {command}: error: {message}", file=sys.stderr)
    return code


def _gpu_list(text: str) -> list[int]:
    try:
        indices = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"GPU indices such as 0,1,3, not {text!r}") from None
    if any(i < 0 for i in indices):
        raise ValueError(f"GPU indices are not negative: {text!r}")
    return indices


def _issuer() -> str:
    try:
        user = getpass.getuser()
    except Exception:
        user = "operator"
    return f"{user}@{socket.gethostname()}"


KEY = Option("key", "the operator's Ed25519 private key (PEM) that signs the command", Path, metavar="FILE")
ISSUER = Option("issuer", "who issues the command, for the agents' log (default USER@HOST)", default="")
LIFETIME = Option(
    "lifetime",
    "agents refuse the command after this long (at most their maximum, 1 h by default)",
    parse_duration,
    300.0,
)
WAIT = Option("wait", "how long to wait for the agents' replies", parse_duration, 5.0)

START_OPTIONS = [
    *MQTT_OPTIONS,
    KEY,
    Option("workload", "the workload: " + ", ".join(workloads.WORKLOAD_NAMES) + " (agents refuse anything else)"),
    Option("duration", "steady-load phase", parse_duration),
    NODES,
    SIZE,
    Option("batch_size", "samples per step (default: the workload's for the size)", int, metavar="B"),
    START_IN,
    IDLE_BASELINE,
    WARMUP,
    COOLDOWN,
    Option("gpus", "GPU indices on each node (default: all of them)", _gpu_list, metavar="I[,I...]"),
    Option("probe_id", "the probe's id (default: generated, p-YYYYMMDD-HHMMSS-xxxx)", default=""),
    LIFETIME,
    WAIT,
    ISSUER,
    Option("json", "print the replies as JSON", is_flag=True, default=False),
]

STATUS_OPTIONS = [
    *MQTT_OPTIONS,
    Option("once", "print the current state once and exit", is_flag=True, default=False),
    Option("refresh", "time between redraws", parse_duration, 1.0),
]

RESULTS_OPTIONS = [
    *MQTT_OPTIONS,
    Option("json", "print JSON instead of a table", is_flag=True, default=False),
    Option(
        "wait",
        "wait up to this long for every node that reported progress to have a result",
        parse_duration,
        0.0,
    ),
]

CANCEL_OPTIONS = [*MQTT_OPTIONS, KEY, LIFETIME, WAIT, ISSUER]

FLEET_OPTIONS = [*MQTT_OPTIONS, Option("json", "print JSON instead of a table", is_flag=True, default=False)]

KEYGEN_OPTIONS = [
    Option("out", "folder for NAME.key (private, 0600) and NAME.pub", Path, metavar="DIR"),
    Option("key_name", "file name stem of the key files", default="operator"),
    Option("force", "replace existing files", is_flag=True, default=False, flag_only=True),
]

# `gpuprobe control-agent`: the control plane's options (declared once, in control/settings.py, for
# `gpuprobe agent --broker` too) and the identity that the agent would otherwise give it.
AGENT_OPTIONS = [
    *MQTT_OPTIONS,
    TRUSTED_KEYS,
    Option("host", "host name: the {host} topic segment and `host` tag (default: the system's)", default=""),
    Option("cluster", "cluster or fleet name (for --nodes cluster=...)", default=""),
    Option("cloud", "cloud provider (for --nodes cloud=...)", default=""),
    Option("instance_type", "instance type (for --nodes instance_type=...)", default=""),
    Option("region", "region or site (for --nodes region=...)", default=""),
    *(o for o in CONTROL_OPTIONS if o is not TRUSTED_KEYS),
    Option(
        "trainer_socket",
        "the local agent's trainer socket (`gpuprobe agent --trainer-socket`), passed to the trainers",
        Path,
        metavar="PATH",
    ),
    *RETRY_OPTIONS,
]


def _broker(values: dict[str, Any]) -> Any:
    from gpuprobe.control.mqtt import BrokerSettings

    return BrokerSettings.from_values(values)


def _run_async(command: str, values: dict[str, Any], main: Any) -> int:
    """Run an operator coroutine; connection problems become one clear line and exit status 1."""
    from gpuprobe.control import mqtt

    try:
        broker = _broker(values)
    except ConfigError as e:
        return _error(command, str(e))
    try:
        result: int = asyncio.run(main(broker))
        return result
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        import aiomqtt

        if isinstance(e, aiomqtt.MqttError | OSError):
            return _error(command, mqtt.describe_error(e, broker), 1)
        raise


def _load_key(command: str, values: dict[str, Any]) -> Any:
    from gpuprobe.control import keys

    if values["key"] is None:
        raise ConfigError("--key FILE is required (make one with `gpuprobe probe keygen --out DIR`)")
    try:
        return keys.load_private(values["key"])
    except keys.KeyFileError as e:
        raise ConfigError(str(e)) from None


# --- probe keygen -----------------------------------------------------------------------------------


def _keygen(values: dict[str, Any], args: argparse.Namespace) -> int:
    from gpuprobe.control import keys

    if values["out"] is None:
        return _error("probe keygen", "--out DIR is required")
    try:
        made = keys.generate(values["out"], values["key_name"], force=values["force"])
    except (keys.KeyFileError, OSError) as e:
        return _error("probe keygen", str(e))
    print(f"private key: {made.private}  (keep it secret; `gpuprobe probe start --key {made.private}`)")
    print(f"public key:  {made.public}  (give it to the agents: --trusted-keys)")
    print(f"key id:      {made.key_id}")
    return 0


# --- probe start ------------------------------------------------------------------------------------


def _start(values: dict[str, Any], args: argparse.Namespace) -> int:
    from gpuprobe.control import selector, signing, topics
    from gpuprobe.v1 import control_pb2

    name = "probe start"
    try:
        key = _load_key(name, values)
        if not values["workload"]:
            raise ConfigError("--workload is required: " + ", ".join(workloads.WORKLOAD_NAMES))
        if values["duration"] is None or values["duration"] <= 0:
            raise ConfigError("--duration S is required and must be positive")
        node_selector = selector.parse(values["nodes"])
        probe_id = values["probe_id"] or f"p-{dt.datetime.now():%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:4]}"
        topics.check_probe_id(probe_id)
        if values["batch_size"] is not None and values["batch_size"] <= 0:
            raise ConfigError("--batch-size must be positive")
        if values["lifetime"] <= values["start_in"]:
            raise ConfigError(
                f"--lifetime ({values['lifetime']:.0f} s) must be longer than --start-in ({values['start_in']:.0f} s)"
            )
    except (ConfigError, ValueError) as e:
        return _error(name, str(e))
    if values["workload"] not in workloads.WORKLOADS:
        print(
            f"gpuprobe {name}: warning: {values['workload']!r} is not a workload this CLI knows; agents decide",
            file=sys.stderr,
        )
    now = time.time_ns()
    command = signing.new_command(issuer=values["issuer"] or _issuer(), lifetime_s=values["lifetime"], now_ns=now)
    start = command.probe_start
    start.probe_id = probe_id
    start.workload = values["workload"]
    start.size = control_pb2.WORKLOAD_SIZE_TINY if values["size"] == "tiny" else control_pb2.WORKLOAD_SIZE_FULL
    start.start_at_unix_ns = now + int(values["start_in"] * 1e9)
    start.duration_s = values["duration"]
    for opt, field in (("idle_baseline", "idle_baseline_s"), ("warmup", "warmup_s"), ("cooldown", "cooldown_s")):
        if values[opt] is not None:
            setattr(start, field, values[opt])
    if values["batch_size"] is not None:
        start.batch_size = values["batch_size"]
    start.selector.CopyFrom(node_selector)
    start.gpu_indices.extend(values["gpus"] or [])

    return send_start(
        name,
        values,
        command,
        key,
        headline=f"probe {probe_id}: {start.workload} {values['size']} for {start.duration_s:g} s",
        json_head={"probe": probe_id},
        next_steps=f"watch it:  gpuprobe probe status {probe_id}\nresults:   gpuprobe probe results {probe_id}",
    )


def send_start(
    name: str,
    values: dict[str, Any],
    command: Any,
    key: Any,
    headline: str,
    json_head: dict[str, Any],
    next_steps: str,
    json_extra: dict[str, Any] | None = None,
) -> int:
    """Sends a signed ProbeStart to the online agents its selector picks and prints their replies (the
    ``probe start`` and ``study start`` commands); 0 all accepted, 3 some, 1 none."""
    from gpuprobe.control import operator_side, render, selector

    start = command.probe_start

    async def main(broker: Any) -> int:
        async with operator_side.Session(broker) as session:
            presences = await operator_side.fleet(session)
            expect = operator_side.expected_hosts(presences, start.selector)
            if not expect:
                # agents offline when it is published never see a command (docs/control.md): sending it
                # would only wait --wait seconds for no reply
                return _error(name, operator_side.no_agent_selected(presences, start.selector), 1)
            for warning in operator_side.health_warnings(presences, expect, list(start.gpu_indices)):
                print(f"gpuprobe {name}: warning: {warning}", file=sys.stderr, flush=True)
            if not values["json"]:
                at = dt.datetime.fromtimestamp(start.start_at_unix_ns / 1e9).strftime("%H:%M:%S")
                print(
                    f"{headline} on {selector.describe(start.selector)} "
                    f"({len(expect)} online agent(s) selected), start at {at}",
                    flush=True,
                )
            replies = await operator_side.send_command(session, command, key, expect, values["wait"])
        accepted = [r for r in replies if r.accepted]
        if values["json"]:
            body = {**json_head, "command_id": command.command_id, **(json_extra or {})}
            body["replies"] = [render.reply_dict(r) for r in replies]
            print(json.dumps(body, indent=2))
        else:
            print(render.replies_table(replies, expect) if replies or expect else "no agent answered")
            if accepted:
                print(f"\n{next_steps}")
        if not accepted:
            return 1
        return 0 if len(accepted) == len(replies) else 3

    return _run_async(name, values, main)


# --- probe status -----------------------------------------------------------------------------------


def _status(values: dict[str, Any], args: argparse.Namespace) -> int:
    from gpuprobe.control import operator_side, render

    probe_id: str | None = args.probe_id

    def draw(view: operator_side.ProbeView, clear: bool) -> None:
        ids = [probe_id] if probe_id else view.probes()
        chunks = []
        for pid in ids:
            rows = render.progress_rows(pid, view.hosts(pid), view.progress, view.results)
            workload = next((p.workload for (k, _), p in view.progress.items() if k == pid), "")
            chunks.append(render.progress_table(pid, workload, rows) if rows else f"probe {pid}: nothing reported yet")
        text = "\n\n".join(chunks) if chunks else "no probes on the broker"
        if clear:
            sys.stdout.write("\x1b[H\x1b[2J")
        print(text, flush=True)

    async def main(broker: Any) -> int:
        async with operator_side.Session(broker) as session:
            view = await operator_side.probe_view(session, probe_id)
            tty = sys.stdout.isatty()
            if values["once"] or (probe_id and view.done(probe_id)):
                draw(view, clear=False)
                return 0
            while True:
                draw(view, clear=tty)
                if probe_id and view.done(probe_id):
                    return 0
                deadline = time.monotonic() + values["refresh"]
                while (left := deadline - time.monotonic()) > 0:
                    got = await session.next(left)
                    if got is not None:
                        view.add(got)
                if not tty:
                    print(flush=True)

    return _run_async("probe status", values, main)


# --- probe results ----------------------------------------------------------------------------------


def _results(values: dict[str, Any], args: argparse.Namespace) -> int:
    from gpuprobe.control import operator_side, render
    from gpuprobe.v1 import common_pb2

    probe_id: str = args.probe_id

    async def main(broker: Any) -> int:
        async with operator_side.Session(broker) as session:
            view = await operator_side.probe_view(session, probe_id)
            deadline = time.monotonic() + values["wait"]
            while not view.done(probe_id) and (left := deadline - time.monotonic()) > 0:
                got = await session.next(left)
                if got is not None:
                    view.add(got)
        results = [view.results[(probe_id, h)] for h in view.hosts(probe_id) if (probe_id, h) in view.results]
        missing = [h for h in view.hosts(probe_id) if (probe_id, h) not in view.results]
        if values["json"]:
            print(
                json.dumps(
                    {"probe": probe_id, "results": [render.result_dict(r) for r in results], "pending": missing},
                    indent=2,
                )
            )
        elif results:
            print(f"probe {probe_id}")
            print(render.results_table(results))
            if missing:
                print(f"no result yet from: {', '.join(missing)}")
        else:
            print(f"no results for probe {probe_id}" + (f" (still running on {', '.join(missing)})" if missing else ""))
        if not results:
            return 1
        return 0 if all(r.status == common_pb2.PROBE_STATUS_SUCCEEDED for r in results) and not missing else 3

    return _run_async("probe results", values, main)


# --- probe cancel -----------------------------------------------------------------------------------


def _cancel(values: dict[str, Any], args: argparse.Namespace) -> int:
    from gpuprobe.control import operator_side, render, signing, topics
    from gpuprobe.v1 import common_pb2

    name = "probe cancel"
    probe_id: str = args.probe_id
    try:
        topics.check_probe_id(probe_id)
        key = _load_key(name, values)
    except (ConfigError, ValueError) as e:
        return _error(name, str(e))
    command = signing.new_command(issuer=values["issuer"] or _issuer(), lifetime_s=values["lifetime"])
    command.probe_cancel.probe_id = probe_id

    async def main(broker: Any) -> int:
        async with operator_side.Session(broker) as session:
            view = await operator_side.probe_view(session, probe_id)
            running = {
                h
                for h in view.hosts(probe_id)
                if (probe_id, h) not in view.results
                and view.progress[(probe_id, h)].status == common_pb2.PROBE_STATUS_RUNNING
            }
            replies = await operator_side.send_command(session, command, key, running, values["wait"])
        print(render.replies_table(replies, running) if replies or running else f"no agent runs probe {probe_id}")
        return 0 if any(r.accepted for r in replies) else 1

    return _run_async(name, values, main)


# --- fleet ------------------------------------------------------------------------------------------


def _fleet(values: dict[str, Any], args: argparse.Namespace) -> int:
    from gpuprobe.control import operator_side, render

    async def main(broker: Any) -> int:
        async with operator_side.Session(broker) as session:
            presences = await operator_side.fleet(session)
        if values["json"]:
            print(json.dumps([render.presence_dict(p) for p in presences], indent=2))
        elif presences:
            print(render.fleet_table(presences))
        else:
            print("no agents have announced themselves on this broker")
        return 0

    return _run_async("fleet", values, main)


# --- control-agent ----------------------------------------------------------------------------------


def _control_agent(values: dict[str, Any], args: argparse.Namespace) -> int:
    from gpuprobe.control.agent_side import ControlClient, IdentityValues

    name = "control-agent"
    try:
        identity = IdentityValues(
            host=values["host"] or socket.gethostname(),
            cluster=values["cluster"],
            cloud=values["cloud"],
            instance_type=values["instance_type"],
            region=values["region"],
        ).to_proto()
        settings = control_settings(
            values, identity, control_dir=values["control_dir"], agent_socket=values["trainer_socket"]
        )
    except (ConfigError, ValueError) as e:
        return _error(name, str(e))

    async def main() -> None:
        try:
            client = ControlClient(settings)
        except OSError as e:
            raise SystemExit(_error(name, f"state directory {settings.state_dir}: {e.strerror or e}")) from None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, client.request_stop)
        await client.run()

    asyncio.run(main())
    return 0


def _probe_id_arg(required: bool) -> Any:
    def add(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "probe_id", nargs=None if required else "?", metavar="ID" if required else "[ID]", help="the probe id"
        )

    return add


COMMANDS = [
    Command(
        name="probe.start",
        help="start a probe: one workload on many nodes at a synchronized time (signed command)",
        description=(
            "Sign a ProbeStart with the operator key and publish it on gpuprobe/v1/commands; agents check the "
            "signature, expiry, replay and workload, then start the trainer at the start time. Prints who accepted "
            "or refused and why. Exit status 0: all who answered accepted; 3: some refused; 1: nobody accepted. "
            "See docs/control.md."
        ),
        run=_start,
        options=START_OPTIONS,
    ),
    Command(
        name="probe.status",
        help="live progress of a probe across nodes (a table with progress bars; --once to print once)",
        run=_status,
        options=STATUS_OPTIONS,
        extra_arguments=_probe_id_arg(required=False),
    ),
    Command(
        name="probe.results",
        help="the results of a probe: samples/s, energy, J/sample, power, temperature per node",
        description=(
            "Exit status 0: every node succeeded; 3: some failed, were cancelled or have no result yet; 1: no results."
        ),
        run=_results,
        options=RESULTS_OPTIONS,
        extra_arguments=_probe_id_arg(required=True),
    ),
    Command(
        name="probe.cancel",
        help="cancel a running or pending probe (signed command)",
        run=_cancel,
        options=CANCEL_OPTIONS,
        extra_arguments=_probe_id_arg(required=True),
    ),
    Command(
        name="probe.keygen",
        help="make an operator Ed25519 key pair for signing probe commands",
        run=_keygen,
        options=KEYGEN_OPTIONS,
    ),
    Command(
        name="fleet",
        help="agents on the broker: state (online, offline, lost), last seen, GPUs and their health, running probe",
        run=_fleet,
        options=FLEET_OPTIONS,
    ),
    Command(
        name="control-agent",
        help="run the control plane of a GPU node on its own (presence, signed probe commands, trainer, results)",
        description=(
            "Connect to the MQTT broker, announce this node, accept signed probe commands from trusted operator keys, "
            "run `gpuprobe train` for them and publish progress and results. `gpuprobe agent --broker` runs the same "
            "inside the agent; this command is for hosts that run only the control plane. See docs/control.md."
        ),
        run=_control_agent,
        options=AGENT_OPTIONS,
    ),
]
