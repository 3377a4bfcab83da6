"""Part: top. The one ``gpuprobe`` command (the entry point). Each part lists its sub-commands as
:class:`~gpuprobe.config.Command` objects in its ``cli`` module; this module collects and dispatches them.

Nothing but the entry point (``app/__main__.py``, the ``gpuprobe`` script) imports this module:
the parts' CLI modules take ``Command`` and ``Option`` from :mod:`gpuprobe.config`.
"""

from __future__ import annotations

import argparse
import difflib
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


LOG_LEVELS = ["debug", "info", "warning", "error"]


# Libraries that log one INFO line per request (httpx: "HTTP Request: POST …"): noise for an operator,
# shown only with --log-level debug.
LIBRARY_LOGGERS = ("httpx", "httpcore", "urllib3", "aiomqtt", "paho", "matplotlib", "PIL", "asyncio")


def quiet_libraries(level: str) -> None:
    """Library loggers at WARNING unless ``--log-level debug``: the default output is gpuprobe's own."""
    if level != "debug":
        for name in LIBRARY_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)


def all_commands() -> list[Command]:
    # imported here so that `gpuprobe --help` costs only what the registered parts import
    from gpuprobe.agent import cli as agent_cli
    from gpuprobe.app import demo
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


class _Parser(argparse.ArgumentParser):
    """argparse without abbreviations (``--influx-ur`` is not ``--influx-url``), and an unknown option
    answered by the sub-command it was given to: its usage and the closest option it has."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.leaves: dict[str, argparse.ArgumentParser] = {}

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            cmd: Command | None = getattr(parsed, "_command", None)
            leaf = self.leaves.get(cmd.name, self) if cmd is not None else self
            leaf.error(_unrecognized(extras, leaf))
        return parsed


def _unrecognized(extras: Sequence[str], parser: argparse.ArgumentParser) -> str:
    """argparse's message, with "did you mean --collector?" for the first misspelled option."""
    message = f"unrecognized arguments: {' '.join(extras)}"
    known = [flag for action in parser._actions for flag in action.option_strings if flag.startswith("--")]
    for extra in extras:
        if extra.startswith("--"):
            close = difflib.get_close_matches(extra.split("=", 1)[0], known, n=1, cutoff=0.6)
            if close:
                return f"{message} (did you mean {close[0]}?)"
    return message


def _add_global_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """--config and --log-level, on the top-level parser and again on every sub-command's, so that
    they work anywhere on the line (``gpuprobe agent --log-level debug``). Below the top they default
    to SUPPRESS: only a value given there replaces the top level's."""
    group = parser.add_argument_group("global options (anywhere on the line)") if not top else parser
    group.add_argument(
        "--config",
        type=Path,
        default=None if top else argparse.SUPPRESS,
        metavar="FILE",
        help=f"TOML configuration file (env {CONFIG_ENV})",
    )
    group.add_argument(
        "--log-level",
        default=os.environ.get("GPUPROBE_LOG_LEVEL", "info") if top else argparse.SUPPRESS,
        choices=LOG_LEVELS,
        help="logging threshold; libraries (httpx, MQTT...) log below WARNING only at debug"
        " (env GPUPROBE_LOG_LEVEL; default info)",
    )


def build_parser(commands: Sequence[Command]) -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gpuprobe",
        description="Distributed GPU telemetry: agents, collector, trainer, fleet probes and models.",
        epilog=(
            "Every option can also come from the TOML file given by --config (or GPUPROBE_CONFIG) and "
            "from a GPUPROBE_<OPTION> environment variable; flags win over the environment, which "
            "wins over the file. --config and --log-level may be given anywhere on the line."
        ),
    )
    parser.add_argument("--version", action="version", version=f"gpuprobe {__version__}")
    _add_global_options(parser, top=True)
    groups: dict[str, argparse._SubParsersAction[argparse.ArgumentParser]] = {}
    # every sub-parser is a plain ArgumentParser without abbreviations; only the top one checks extras
    top = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=argparse.ArgumentParser)
    top.required = True
    groups[""] = top
    for cmd in commands:
        parts = cmd.name.split(".")
        for depth in range(1, len(parts)):
            prefix = ".".join(parts[:depth])
            if prefix not in groups:
                parent = groups[".".join(parts[: depth - 1])]
                group_parser = parent.add_parser(parts[depth - 1], help=GROUP_HELP.get(prefix, ""), allow_abbrev=False)
                _add_global_options(group_parser, top=False)
                sub = group_parser.add_subparsers(dest=f"command_{depth}", metavar="COMMAND")
                sub.required = True
                groups[prefix] = sub
        leaf = groups[".".join(parts[:-1])].add_parser(
            parts[-1],
            help=cmd.help,
            description=cmd.description or cmd.help,
            allow_abbrev=False,
            formatter_class=argparse.RawDescriptionHelpFormatter if cmd.raw_description else argparse.HelpFormatter,
        )
        add_options(leaf, cmd.options)
        if cmd.extra_arguments:
            cmd.extra_arguments(leaf)
        _add_global_options(leaf, top=False)
        leaf.set_defaults(_command=cmd)
        parser.leaves[cmd.name] = leaf
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
    quiet_libraries(args.log_level)
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
