"""Options that come from a TOML file, ``GPUPROBE_*`` environment variables and flags.

Each command declares its options once (:class:`Option`); :func:`add_options` turns them into
argparse flags and :func:`resolve` merges the sources with this precedence, highest first::

    --flag  >  GPUPROBE_<NAME> environment variable  >  [command] table in the file  >
    top-level key in the file  >  the option's default

The file is named by ``--config`` or ``GPUPROBE_CONFIG``. A table is named after the command
(``[agent]``, ``[collector]``, ``[sim]``; a sub-command also reads its own table, ``[sim.run]``), and
top-level keys apply to every command that has that option. Keys use underscores
(``spool_dir``), flags dashes (``--spool-dir``), environment variables upper case
(``GPUPROBE_SPOOL_DIR``). A key no command knows is an error, so typos do not pass silently.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV_PREFIX = "GPUPROBE_"
CONFIG_ENV = "GPUPROBE_CONFIG"


class ConfigError(ValueError):
    """A bad option value, file or key; the message names where the value came from."""


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r} (use true or false)")


@dataclass(frozen=True)
class Option:
    """One option of one command. ``name`` uses underscores; its flag is ``--name-with-dashes``."""

    name: str
    help: str
    type: Callable[[str], Any] = str
    default: Any = None
    choices: Sequence[Any] | None = None
    metavar: str | None = None
    multiple: bool = False  # repeatable flag; a TOML array; comma-separated in the environment
    is_flag: bool = False  # a boolean switch (--name / --no-name)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env_var(self) -> str:
        return ENV_PREFIX + self.name.upper()

    def convert(self, raw: Any, source: str) -> Any:
        """Turns a value from the environment (a string) or TOML (typed) into the option's type."""
        if self.multiple:
            items = raw.split(",") if isinstance(raw, str) else raw
            if not isinstance(items, list):
                raise ConfigError(f"{source}: {self.name} must be a list")
            return [
                self.convert_one(item.strip() if isinstance(item, str) else item, source) for item in items
            ]
        return self.convert_one(raw, source)

    def convert_one(self, raw: Any, source: str) -> Any:
        try:
            if self.is_flag:
                value: Any = raw if isinstance(raw, bool) else parse_bool(str(raw))
            elif isinstance(raw, bool):
                raise ValueError(f"{raw!r} is a boolean")
            elif isinstance(raw, str | int | float):
                value = self.type(raw) if isinstance(raw, str) else self.type(str(raw))
            else:
                raise ValueError(f"unsupported value {raw!r}")
        except (ValueError, TypeError) as e:
            raise ConfigError(f"{source}: bad value for {self.name}: {e}") from None
        if self.choices is not None and value not in self.choices:
            choices = ", ".join(map(str, self.choices))
            raise ConfigError(f"{source}: {self.name} must be one of {choices}, not {value!r}")
        return value


def add_options(parser: argparse.ArgumentParser, options: Iterable[Option]) -> None:
    """Adds flags whose absence is visible (``argparse.SUPPRESS``), so lower sources can fill in."""
    for opt in options:
        where = f"env {opt.env_var}"
        default = "" if opt.default in (None, [], "") else f"; default {opt.default}"
        help_text = f"{opt.help} ({where}{default})"
        if opt.is_flag:
            parser.add_argument(
                opt.flag,
                dest=opt.name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_text,
            )
            continue
        parser.add_argument(
            opt.flag,
            dest=opt.name,
            type=_flag_type(opt),
            action="append" if opt.multiple else "store",
            default=argparse.SUPPRESS,
            metavar=opt.metavar or opt.name.upper(),
            help=help_text,
        )


def _flag_type(opt: Option) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return opt.convert_one(text, "command line")
        except ConfigError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    convert.__name__ = opt.name
    return convert


def load_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None


def _table(data: Mapping[str, Any], dotted: str) -> Mapping[str, Any] | None:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node if isinstance(node, Mapping) else None


def check_keys(data: Mapping[str, Any], known_by_command: Mapping[str, set[str]], path: Path) -> None:
    """Every key in the file must belong to some command (top level) or to its table's command."""
    all_known = set().union(*known_by_command.values()) if known_by_command else set()
    command_roots = {c.split(".")[0] for c in known_by_command}

    def walk(table: Mapping[str, Any], prefix: str) -> None:
        for key, value in table.items():
            dotted = f"{prefix}.{key}" if prefix else key
            if isinstance(value, Mapping):
                if dotted.split(".")[0] not in command_roots:
                    raise ConfigError(
                        f"{path}: unknown table [{dotted}]; commands: {', '.join(sorted(command_roots))}"
                    )
                walk(value, dotted)
                continue
            if not prefix:
                if key not in all_known:
                    raise ConfigError(f"{path}: unknown option {key!r}")
                continue
            allowed: set[str] = set()
            for command, names in known_by_command.items():
                if command == prefix or command.startswith(prefix + "."):
                    allowed |= names
            if key not in allowed:
                raise ConfigError(f"{path}: unknown option {key!r} in [{prefix}]")

    walk(data, "")


def resolve(
    command: str,
    options: Iterable[Option],
    args: argparse.Namespace,
    file_data: Mapping[str, Any] | None = None,
    file_path: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The final value of every option of ``command`` (a dotted name such as ``sim.run``)."""
    env = os.environ if environ is None else environ
    data = file_data or {}
    # most specific table last, so it wins: top level < [sim] < [sim.run]
    layers: list[tuple[str, Mapping[str, Any]]] = [(str(file_path), data)]
    parts = command.split(".")
    for i in range(1, len(parts) + 1):
        table = _table(data, ".".join(parts[:i]))
        if table is not None:
            layers.append((f"{file_path} [{'.'.join(parts[:i])}]", table))
    values: dict[str, Any] = {}
    for opt in options:
        if hasattr(args, opt.name):
            values[opt.name] = getattr(args, opt.name)
        elif opt.env_var in env:
            values[opt.name] = opt.convert(env[opt.env_var], f"environment {opt.env_var}")
        else:
            value: Any = opt.default
            for source, layer in layers:
                if opt.name in layer and not isinstance(layer[opt.name], Mapping):
                    value = opt.convert(layer[opt.name], source)
            values[opt.name] = value
    return values
