"""The one ``gpuprobe`` command (the entry point). Each part lists its sub-commands as
:class:`~gpuprobe.config.Command` objects in its ``cli`` module; this module collects and dispatches them.

Nothing but the entry point (``gpuprobe/__main__.py``, the ``gpuprobe`` script) imports this module:
the parts' CLI modules take ``Command`` and ``Option`` from :mod:`gpuprobe.config`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuprobe import __version__
from gpuprobe.config import CONFIG_ENV, Command, ConfigError, add_options, check_keys, load_file, resolve

GROUP_HELP = {
    "sim": "simulated GPUs at the NVML interface",
    "install": "install a gpuprobe service (systemd unit and configuration)",
    "probe": "fleet-wide training probes over MQTT (signed commands, progress, results)",
    "import": "import existing GPU logs into InfluxDB as `gpu` points",
    "study": "studies: one fleet probe over a matrix of workloads, batch sizes and power limits, and its report",
}


def all_commands() -> list[Command]:
    # imported here so that `gpuprobe --help` costs only what the registered parts import
    from gpuprobe import demo
    from gpuprobe.agent import cli as agent_cli
    from gpuprobe.collector import cli as collector_cli
    from gpuprobe.control import cli as control_cli
    from gpuprobe.importer import cli as importer_cli
    from gpuprobe.model import cli as model_cli
    from gpuprobe.sim import cli as sim_cli
    from gpuprobe.study import cli as study_cli
    from gpuprobe.trainer import cli as trainer_cli

    return [
        *sim_cli.COMMANDS,
        *demo.COMMANDS,
        *agent_cli.COMMANDS,
        *collector_cli.COMMANDS,
        *trainer_cli.COMMANDS,
        *control_cli.COMMANDS,
        *model_cli.COMMANDS,
        *importer_cli.COMMANDS,
        *study_cli.COMMANDS,
    ]


def build_parser(commands: Sequence[Command]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuprobe",
        description="Distributed GPU telemetry: agents, collector, trainer, fleet probes and models.",
        epilog=(
            "Every option can also come from the TOML file given by --config (or GPUPROBE_CONFIG) and "
            "from a GPUPROBE_<OPTION> environment variable; flags win over the environment, which "
            "wins over the file."
        ),
    )
    parser.add_argument("--version", action="version", version=f"gpuprobe {__version__}")
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help=f"TOML configuration file (env {CONFIG_ENV})",
    )
    parser.add_argument(
        "--log-level",
        default=os.environ.get("GPUPROBE_LOG_LEVEL", "info"),
        choices=["debug", "info", "warning", "error"],
        help="logging threshold (env GPUPROBE_LOG_LEVEL; default info)",
    )
    groups: dict[str, argparse._SubParsersAction[argparse.ArgumentParser]] = {}
    top = parser.add_subparsers(dest="command", metavar="COMMAND")
    top.required = True
    groups[""] = top
    for cmd in commands:
        parts = cmd.name.split(".")
        for depth in range(1, len(parts)):
            prefix = ".".join(parts[:depth])
            if prefix not in groups:
                parent = groups[".".join(parts[: depth - 1])]
                group_parser = parent.add_parser(parts[depth - 1], help=GROUP_HELP.get(prefix, ""))
                sub = group_parser.add_subparsers(dest=f"command_{depth}", metavar="COMMAND")
                sub.required = True
                groups[prefix] = sub
        leaf = groups[".".join(parts[:-1])].add_parser(
            parts[-1], help=cmd.help, description=cmd.description or cmd.help
        )
        add_options(leaf, cmd.options)
        if cmd.extra_arguments:
            cmd.extra_arguments(leaf)
        leaf.set_defaults(_command=cmd)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    commands = all_commands()
    parser = build_parser(commands)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    cmd: Command = args._command
    config_path = args.config or (Path(os.environ[CONFIG_ENV]) if os.environ.get(CONFIG_ENV) else None)
    try:
        file_data: dict[str, Any] = {}
        if config_path is not None:
            file_data = load_file(config_path)
            known = {c.name: {key for o in c.options for key in o.file_keys} for c in commands}
            check_keys(file_data, known, config_path)
        values = resolve(cmd.name, cmd.options, args, file_data, config_path)
    except ConfigError as e:
        parser.exit(2, f"gpuprobe: error: {e}\n")
    try:
        return cmd.run(values, args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
