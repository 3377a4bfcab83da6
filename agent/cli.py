"""Part: agent. ``gpuprobe agent`` and ``gpuprobe install agent``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gpuprobe.agent.options import AGENT_OPTIONS
from gpuprobe.config import Command, ConfigError, Option

# This module is imported by every `gpuprobe` invocation (to list the commands): it must stay light,
# so the agent's own modules (pynvml, grpc, psutil...) are imported only when a command runs.


def _run_agent(values: dict[str, Any], args: argparse.Namespace) -> int:
    from gpuprobe.agent.settings import AgentSettings

    try:
        settings = AgentSettings.from_values(values)
    except ConfigError as e:
        print(f"gpuprobe agent: error: {e}", file=sys.stderr)
        return 2
    if values["check"]:
        print(settings.describe())
        return 0
    from gpuprobe.agent.service import RESTART, Agent

    code = Agent(settings).run()
    if code == RESTART:
        # NVML answers now: the same program again, in this process (systemd's main PID and its notify
        # socket stay), which opens the GPUs; everything was stopped and spooled before
        import logging
        import os

        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
    return code


def _run_install(values: dict[str, Any], args: argparse.Namespace) -> int:
    from gpuprobe.agent import install

    return install.run(values, check_config_text)


def check_config_text(config_text: str) -> str | None:
    """What the agent would say when it read ``config_text`` (its own option parsers and settings checks,
    as ``gpuprobe agent --check`` does), or None when it accepts it. Files not there yet are accepted (the
    operator puts them in place later); files that exist are read and checked."""
    import tomllib

    from gpuprobe.agent import install
    from gpuprobe.agent.settings import AgentSettings
    from gpuprobe.config import resolve

    try:
        data = tomllib.loads(config_text)
        # no flags and no environment: the unit runs the agent with this file alone
        values = resolve("agent", AGENT_OPTIONS, argparse.Namespace(), data, Path(install.CONFIG_PATH), environ={})
        AgentSettings.from_values(values, missing_files_ok=True)
    except ConfigError as e:
        return str(e)
    return None


def _install_options() -> list[Option]:
    from gpuprobe.agent.install import INSTALL_OPTIONS

    return INSTALL_OPTIONS


COMMANDS = [
    Command(
        name="agent",
        help="run the GPU-node agent (NVML, host, acoustics -> spool -> collector; with --broker, fleet probes)",
        description=(
            "Sample every GPU through NVML (10 Hz by default), the host and acoustics (1 Hz), keep every batch "
            "in a durable local spool and stream it to a collector over gRPC. With --broker it also runs the "
            "fleet control plane (presence, signed probe commands, trainers, results over MQTT); see docs/agent.md."
        ),
        run=_run_agent,
        options=AGENT_OPTIONS,
    ),
    Command(
        name="install.agent",
        help="install the agent as a systemd service (unit + /etc/gpuprobe/agent.toml)",
        description=(
            "Write the hardened systemd unit gpuprobe-agent.service, /etc/gpuprobe/agent.toml and a sysusers.d "
            "entry for the unprivileged user; --root DIR stages them under DIR instead. Refuses to overwrite "
            "without --force."
        ),
        run=_run_install,
        options=_install_options(),
    ),
]
