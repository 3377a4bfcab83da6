"""Part: control. The agent side of the control plane: its options, and the :class:`ControlSettings` built from them.

Two commands run the agent side: ``gpuprobe control-agent`` (on its own, ``control/cli.py``) and
``gpuprobe agent --broker`` (embedded, ``agent/cli.py``, ``agent/settings.py``); ``gpuprobe install
agent`` writes some of the same options into the agent's config. The options are declared once here
and :func:`control_settings` checks the resolved values and turns them into the settings the
control client runs with, so none of them imports another command's CLI module.

This module is imported by every ``gpuprobe`` invocation (to list the commands): cryptography, MQTT
and protobuf load only when :func:`control_settings` runs.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuprobe import __version__, workloads
from gpuprobe.config import ConfigError, Option, format_duration, parse_duration, parse_whole_seconds

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from gpuprobe.control.mqtt import BrokerSettings
    from gpuprobe.v1 import common_pb2

DEFAULT_STATE_DIR = "/var/lib/gpuprobe/control"
# An agent refuses commands that live longer than this (an operator's mistake or a stolen command kept
# for later) and commands stamped further than this from its own clock (docs/control.md).
DEFAULT_MAX_LIFETIME_S = 3600.0
DEFAULT_CLOCK_SKEW_S = 30.0
# The most points one study may have (gpuprobe study start; agents refuse more).
MAX_STUDY_POINTS = 256
# What a probe runs for each GPU: this installation's own trainer, never a command from the network.
TRAINER_COMMAND: tuple[str, ...] = (sys.executable, "-m", "gpuprobe.app", "train")

TRUSTED_KEYS = Option(
    "trusted_keys",
    "operator public keys (PEM files, or folders of *.pub) whose signed commands the agent runs",
    Path,
    multiple=True,
    default=[],
    metavar="PATH",
    default_text="— (required with `--broker`)",
)
CONTROL_DIR = Option(
    "control_dir",
    "where the replay memory, results and trainer logs are kept",
    Path,
    Path(DEFAULT_STATE_DIR),
    metavar="DIR",
)
ALLOW_POWER_LIMITS = Option(
    "allow_power_limits",
    "let probes set GPU power limits (needs root or CAP_SYS_ADMIN; the previous limits are always restored)",
    is_flag=True,
    default=False,
)
CONTROL_OPTIONS = [
    TRUSTED_KEYS,
    CONTROL_DIR,
    Option("presence_interval", "republish the online presence this often", parse_duration, 30.0),
    Option(
        "max_command_lifetime", "refuse commands that live longer than this", parse_duration, DEFAULT_MAX_LIFETIME_S
    ),
    Option("clock_skew", "allowed clock difference to the operator", parse_duration, DEFAULT_CLOCK_SKEW_S),
    Option(
        "mqtt_keepalive",
        "MQTT keepalive, in whole seconds (the broker declares the agent lost after 1.5x)",
        parse_whole_seconds,
        30,
    ),
    Option(
        "result_retention",
        "republish the results of probes this recent after every reconnect",
        parse_duration,
        86400.0,
    ),
    ALLOW_POWER_LIMITS,
]


# What `probe start` and `study start` both ask: which nodes, when, the model size and the phases
# around the steady load (unset phases: the trainer's defaults, gpuprobe/workloads.py).
NODES = Option(
    "nodes",
    "which agents: all, host names, or KEY=VALUE terms (host, cluster, cloud, instance_type, region)",
    default="all",
)
SIZE = Option("size", "model size", default="full", choices=list(workloads.SIZES))
START_IN = Option(
    "start_in",
    "synchronized start this long after now; leave the nodes time to load torch and build the model",
    parse_duration,
    30.0,
)
_TRAINER_PHASE_S = {
    "idle_baseline": workloads.DEFAULT_IDLE_BASELINE_S,
    "warmup": workloads.DEFAULT_WARMUP_S,
    "cooldown": workloads.DEFAULT_COOLDOWN_S,
}


def phase_option(name: str, what: str) -> Option:
    """``--idle-baseline``, ``--warmup`` or ``--cooldown`` of a probe, described as ``what``; unset, the
    trainer's own default, which the help names."""
    return Option(name, f"{what} (default: the trainer's, {format_duration(_TRAINER_PHASE_S[name])})", parse_duration)


IDLE_BASELINE = phase_option("idle_baseline", "idle baseline")
WARMUP = phase_option("warmup", "warm-up, excluded from the results")
COOLDOWN = phase_option("cooldown", "cool-down")

# Reconnect pauses towards the broker. `gpuprobe agent` has options of these names for the gRPC
# collector, so it takes them with an `mqtt_` prefix (RETRY_PREFIX); `control-agent` keeps the plain names.
RETRY_OPTIONS = [
    Option("reconnect_max", "longest pause between reconnect attempts", parse_duration, 30.0),
    Option("auth_retry", "pause after the broker refused the credentials", parse_duration, 60.0),
]
RETRY_PREFIX = "mqtt_"


@dataclass(frozen=True)
class ControlSettings:
    """Everything :class:`~gpuprobe.control.agent_side.ControlClient` runs with, checked."""

    broker: BrokerSettings
    identity: common_pb2.AgentIdentity
    trusted_keys: dict[str, Ed25519PublicKey]  # by key id
    state_dir: Path
    agent_socket: Path | None = None  # the agent's trainer socket, passed to the trainers
    presence_interval_s: float = 30.0
    max_command_lifetime_s: float = DEFAULT_MAX_LIFETIME_S
    clock_skew_s: float = DEFAULT_CLOCK_SKEW_S
    keepalive_s: int = 30
    reconnect_min_s: float = 0.5
    reconnect_max_s: float = 30.0
    auth_retry_s: float = 60.0
    sample_interval_s: float = 0.1  # how often a probe reads the GPUs' power, temperature and energy
    result_retention_s: float = 86400.0
    trainer_command: Sequence[str] = TRAINER_COMMAND
    agent_version: str = __version__
    telemetry_interval_s: float = 0.0  # the agent's sampling interval, shown in the presence
    allow_power_limits: bool = False  # probes may set GPU power limits (gpuprobe.control.powerlimit)

    @property
    def host(self) -> str:
        return self.identity.host


def control_settings(
    values: dict[str, Any],
    identity: common_pb2.AgentIdentity,
    *,
    control_dir: Path,
    agent_socket: Path | None,
    retry_prefix: str = "",
    telemetry_interval_s: float = 0.0,
    sample_interval_s: float = 0.1,
    missing_files_ok: bool = False,
) -> ControlSettings:
    """``ControlSettings`` from the resolved options (``MQTT_OPTIONS`` of :mod:`gpuprobe.control.mqtt`,
    :data:`CONTROL_OPTIONS`, and :data:`RETRY_OPTIONS` with ``retry_prefix``); raises ConfigError (a bad
    option, no or unreadable trusted keys). ``missing_files_ok`` (the installer's check) accepts key,
    certificate and password files that do not exist yet; those that exist are read and checked."""
    from gpuprobe.control import keys, topics
    from gpuprobe.control.mqtt import BrokerSettings

    broker = BrokerSettings.from_values(values, missing_files_ok=missing_files_ok)
    if not values["trusted_keys"]:
        raise ConfigError("--trusted-keys is required: the operator public keys whose commands this agent runs")
    key_paths = [Path(p) for p in values["trusted_keys"] if not (missing_files_ok and not Path(p).exists())]
    try:
        trusted = keys.load_trusted(key_paths)
        topics.check_segment(identity.host, "host name")
    except (keys.KeyFileError, ValueError) as e:
        raise ConfigError(str(e)) from None
    for name in ("presence_interval", "max_command_lifetime", "clock_skew", "mqtt_keepalive"):
        if values[name] <= 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be positive")
    return ControlSettings(
        broker=broker,
        identity=identity,
        trusted_keys=trusted,
        state_dir=control_dir,
        agent_socket=agent_socket,
        presence_interval_s=values["presence_interval"],
        max_command_lifetime_s=values["max_command_lifetime"],
        clock_skew_s=values["clock_skew"],
        keepalive_s=values["mqtt_keepalive"],
        reconnect_max_s=values[retry_prefix + "reconnect_max"],
        auth_retry_s=values[retry_prefix + "auth_retry"],
        result_retention_s=values["result_retention"],
        telemetry_interval_s=telemetry_interval_s,
        sample_interval_s=sample_interval_s,
        allow_power_limits=bool(values.get("allow_power_limits", False)),
    )
