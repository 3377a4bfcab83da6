"""Part: agent. ``gpuprobe install agent``: the hardened systemd unit, ``/etc/gpuprobe/agent.toml`` and the service
user.

Files (under ``--root DIR`` when staging an image or a test tree):

- ``/etc/systemd/system/gpuprobe-agent.service``: rendered by :func:`gpuprobe.systemd.render_unit`
  (Type=notify with WatchdogSec, Restart=on-failure, an unprivileged user, StateDirectory for the
  spool, ProtectSystem=strict, NoNewPrivileges and the rest of the shared hardening);
- ``/etc/gpuprobe/agent.toml``: the ``[agent]`` options given here (with ``--broker``, the fleet
  control plane's: broker, trusted keys, a control directory in the StateDirectory); every other
  option keeps its default and can be added by hand (``gpuprobe agent --help``);
- ``/etc/sysusers.d/gpuprobe-agent.conf``: the unprivileged user, created by ``systemd-sysusers``;
- with ``--allow-power-limits`` (fleet probes may set GPU power limits): ``allow_power_limits = true``
  in the config and the drop-in ``/etc/systemd/system/gpuprobe-agent.service.d/power-limits.conf``,
  which gives the agent CAP_SYS_ADMIN (what NVML needs to set a power limit; docs/operations.md).

Nothing is overwritten without ``--force``. This module is imported to list the commands, so it
imports only what writing the files needs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuprobe.agent.options import AGENT_OPTION
from gpuprobe.config import Option, parse_whole_seconds
from gpuprobe.control.mqtt import MQTT_OPTIONS
from gpuprobe.control.settings import ALLOW_POWER_LIMITS, TRUSTED_KEYS
from gpuprobe.nvml import REALTIME_PRIORITY
from gpuprobe.systemd import (
    UnitSpec,
    default_executable,
    hidden_executable_warning,
    render_unit,
    secret_files_note,
    staged_path,
    staging_root,
    toml_value,
    write_install_files,
    written_to_config,
)

UNIT_PATH = "/etc/systemd/system/gpuprobe-agent.service"
CONFIG_PATH = "/etc/gpuprobe/agent.toml"
SYSUSERS_PATH = "/etc/sysusers.d/gpuprobe-agent.conf"
STATE_DIRECTORY = "gpuprobe/agent"  # /var/lib/gpuprobe/agent
# NVIDIA's driver services, where the node has them: the agent starts after them, so that at boot it
# finds NVML answering (persistenced starts once the driver is loaded) and, on NVSwitch systems, the
# fabric up for probes. After= only: a node without them (or with them disabled) is not changed.
NVIDIA_SERVICES = ("nvidia-persistenced.service", "nvidia-fabricmanager.service")
SPOOL_DIR = "/var/lib/gpuprobe/agent/spool"
TRAINER_SOCKET = "/var/lib/gpuprobe/agent/trainer.sock"
CONTROL_DIR = "/var/lib/gpuprobe/agent/control"  # with --broker: inside the StateDirectory
POWER_LIMITS_DROPIN_PATH = "/etc/systemd/system/gpuprobe-agent.service.d/power-limits.conf"
# The unit drops every capability (CapabilityBoundingSet= and AmbientCapabilities= empty); a drop-in's
# assignments add to those, so this gives the agent exactly CAP_SYS_ADMIN, as an ambient capability of
# its unprivileged user (NoNewPrivileges does not affect ambient capabilities).
POWER_LIMITS_DROPIN = """\
# Written by `gpuprobe install agent --allow-power-limits`: NVML sets GPU power limits only for root
# or a process with CAP_SYS_ADMIN (docs/operations.md, "GPU power limits"). CAP_SYS_ADMIN is a broad
# capability: to take it away, remove this file and `allow_power_limits` from /etc/gpuprobe/agent.toml,
# then `systemctl daemon-reload` and restart the agent.
[Service]
CapabilityBoundingSet=CAP_SYS_ADMIN
AmbientCapabilities=CAP_SYS_ADMIN
"""


INSTALL_OPTIONS = [
    *(
        written_to_config(AGENT_OPTION[name])
        for name in ("collector", "cluster", "region", "tls_ca", "tls_cert", "tls_key", "token_file", "metrics_listen")
    ),
    Option("root", "stage the files under DIR instead of / (for images and tests)", Path, metavar="DIR"),
    Option("force", "overwrite files that exist", is_flag=True, default=False, flag_only=True),
    Option("executable", "the gpuprobe program the unit runs (default: this installation's)", Path, metavar="PATH"),
    Option("user", "unprivileged user (and group) the agent runs as", default="gpuprobe"),
    written_to_config(AGENT_OPTION["mic_device"], "; adds the audio group"),
    written_to_config(AGENT_OPTION["grace"], " (the unit's stop timeout is 20 s longer)"),
    Option("watchdog", "systemd watchdog timeout, in whole seconds", parse_whole_seconds, 30),
]
# The fleet control plane (`gpuprobe agent --broker`): the broker options of gpuprobe.control.mqtt
# (never the password itself: a file or the environment) and the operator keys the agent trusts.
_BROKER_PATHS = ("mqtt_password_file", "mqtt_ca", "mqtt_cert", "mqtt_key")
INSTALL_OPTIONS += [
    written_to_config(opt, "; enables fleet probes (default: off)", default="")
    if opt.name == "broker"
    else written_to_config(opt)
    for opt in MQTT_OPTIONS
    if opt.name != "mqtt_password"
]
INSTALL_OPTIONS.append(written_to_config(TRUSTED_KEYS))
INSTALL_OPTIONS.append(
    written_to_config(ALLOW_POWER_LIMITS, ", with a unit drop-in that gives the agent CAP_SYS_ADMIN (needs --broker)")
)


def render_config(values: dict[str, Any]) -> str:
    collectors = [part.strip() for item in values["collector"] for part in item.split(",") if part.strip()]
    entries: dict[str, Any] = {
        "collector": collectors,
        "spool": SPOOL_DIR,
        "trainer_socket": TRAINER_SOCKET,
        "grace": float(values["grace"]),
    }
    for key in ("cluster", "region", "metrics_listen", "mic_device"):
        if values[key]:
            entries[key] = values[key]
    for key in ("tls_ca", "tls_cert", "tls_key", "token_file"):
        if values[key] is not None:
            entries[key] = str(Path(values[key]).absolute())
    if values["broker"]:
        entries["broker"] = values["broker"]
        entries["trusted_keys"] = [str(Path(k).absolute()) for k in values["trusted_keys"]]
        entries["control_dir"] = CONTROL_DIR
        if values["allow_power_limits"]:
            entries["allow_power_limits"] = True
        if values["mqtt_username"]:
            entries["mqtt_username"] = values["mqtt_username"]
        for key in _BROKER_PATHS:
            if values[key] is not None:
                entries[key] = str(Path(values[key]).absolute())
    lines = [
        "# gpuprobe agent configuration, written by `gpuprobe install agent`.",
        "# Any option of `gpuprobe agent --help` can be set here (keys use underscores, e.g. spool_max_bytes).",
        "# GPUPROBE_* environment variables and command-line flags override this file.",
        "",
        "[agent]",
        *(f"{key} = {toml_value(value)}" for key, value in entries.items()),
        "",
    ]
    return "\n".join(lines)


def render_agent_unit(values: dict[str, Any], executable: Path) -> str:
    stop_s = int(float(values["grace"])) + 20
    if values["broker"]:
        from gpuprobe.agent.embedded_control import STOP_TIMEOUT_S

        stop_s += int(STOP_TIMEOUT_S)  # the control plane stops first (a running probe's result)
    spec = UnitSpec(
        description="gpuprobe agent: GPU, host and acoustic telemetry to the gpuprobe collectors",
        exec_start=[str(executable), "--config", CONFIG_PATH, "agent"],
        user=values["user"],
        state_directory=STATE_DIRECTORY,
        after_only=NVIDIA_SERVICES,
        realtime_priority=REALTIME_PRIORITY,  # the native sampler's ticks on time with every core busy
        watchdog_s=int(values["watchdog"]),
        timeout_stop_s=stop_s,
        supplementary_groups=("audio",) if values["mic_device"] else (),
    )
    return render_unit(spec)


# The files the agent reads: option, and whether it is a secret (only root and the agent's group may read it).
_FILES = (
    ("tls_ca", False),
    ("tls_cert", False),
    ("tls_key", True),
    ("token_file", True),
    ("mqtt_ca", False),
    ("mqtt_cert", False),
    ("mqtt_key", True),
    ("mqtt_password_file", True),
)


def secret_files(values: dict[str, Any]) -> list[tuple[str, Path, bool]]:
    found = [(key, Path(values[key]).absolute(), secret) for key, secret in _FILES if values[key] is not None]
    if values["broker"]:
        found += [("trusted_keys", Path(k).absolute(), False) for k in values["trusted_keys"]]
    return found


def render_sysusers(user: str) -> str:
    return f'u {user} - "gpuprobe telemetry agent" /var/lib/gpuprobe\n'


def run(values: dict[str, Any], check_config: Callable[[str], str | None]) -> int:
    """Install the agent; ``check_config`` says what the agent would refuse in a config file (the
    agent's own parsers, passed in by ``agent/cli.py`` so this module need not import its caller)."""

    def fail(message: str) -> int:
        print(f"gpuprobe install agent: error: {message}", file=sys.stderr)
        return 2

    if not values["collector"]:
        return fail("pass --collector HOST[:PORT] (the collector the agent streams to)")
    if values["broker"] and not values["trusted_keys"]:
        return fail("--broker needs --trusted-keys (the operator public keys whose probe commands the agent runs)")
    broker_only = [o for o in ("mqtt_username", *_BROKER_PATHS, "allow_power_limits") if values[o]] + (
        ["trusted_keys"] if values["trusted_keys"] else []
    )
    if broker_only and not values["broker"]:
        return fail(
            ", ".join(f"--{o.replace('_', '-')}" for o in broker_only) + " only apply with --broker (fleet probes)"
        )
    executable = Path(values["executable"]) if values["executable"] else default_executable()
    if not executable.is_absolute():
        return fail(f"--executable must be an absolute path, not {executable}")
    config_text = render_config(values)
    refused = check_config(config_text)
    if refused is not None:
        # what the agent would refuse at every start (and systemd restart without end): refused here
        return fail(f"the agent would refuse this configuration: {refused}")
    unit_text = render_agent_unit(values, executable)
    root = staging_root(values["root"])
    files = {
        staged_path(root, UNIT_PATH): (unit_text, 0o644),
        staged_path(root, CONFIG_PATH): (config_text, 0o644),
        staged_path(root, SYSUSERS_PATH): (render_sysusers(values["user"]), 0o644),
    }
    if values["allow_power_limits"]:
        files[staged_path(root, POWER_LIMITS_DROPIN_PATH)] = (POWER_LIMITS_DROPIN, 0o644)
    written = write_install_files(files, values["force"], "install agent")
    if written != 0:
        return written
    stale_dropin = staged_path(root, POWER_LIMITS_DROPIN_PATH)
    if not values["allow_power_limits"] and stale_dropin.exists():
        # an earlier install allowed power limits: without this the agent would keep CAP_SYS_ADMIN
        stale_dropin.unlink()
        print(f"removed {stale_dropin}: power limits are no longer allowed, the agent loses CAP_SYS_ADMIN")
    where = f" (staged under {root}: copy that tree onto the node first)" if root is not None else ""
    print(f"\nnext steps{where}:")
    print("  systemd-sysusers                      # creates the user " + values["user"])
    print("  systemctl daemon-reload")
    print("  systemctl enable --now gpuprobe-agent")
    print("  systemctl status gpuprobe-agent       # STATUS shows GPUs, collector, spool")
    print("  journalctl -u gpuprobe-agent -f")
    warning = hidden_executable_warning(executable, unit_text)
    if warning:
        print(f"\n{warning}")
    files_read = secret_files(values)
    if files_read:
        print("\n" + secret_files_note(files_read, values["user"]))
    if values["allow_power_limits"]:
        print(
            f"\nnote: {POWER_LIMITS_DROPIN_PATH} gives the agent CAP_SYS_ADMIN so that probes may set GPU"
            " power limits; the agent restores the previous limits after each probe and at its next start"
        )
    if values["broker"] and not values["mqtt_password_file"] and values["mqtt_username"]:
        print(
            "\nnote: give the MQTT password with --mqtt-password-file"
            " (or GPUPROBE_MQTT_PASSWORD in the unit's environment)"
        )
    return 0
