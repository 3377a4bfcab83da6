"""Part: core. Options that come from a TOML file, ``GPUPROBE_*`` environment variables and flags.

Each command declares its options once (:class:`Option`) in its :class:`Command`; the parts' CLI
modules list their commands and ``gpuprobe.app.cli`` (the entry point) dispatches them. Both classes live
here, beside the option machinery, so that a part's CLI never imports the dispatcher that imports it.
:func:`add_options` turns options into argparse flags and :func:`resolve` merges the sources with this
precedence, highest first::

    --flag  >  GPUPROBE_<NAME> environment variable  >  [command] table in the file  >
    top-level key in the file  >  the option's default

The file is named by ``--config`` or ``GPUPROBE_CONFIG``. A table is named after the command
(``[agent]``, ``[collector]``, ``[sim]``; a sub-command also reads its own table, ``[sim.run]``), and
top-level keys apply to every command that has that option (except :data:`PER_COMMAND_KEYS`, whose
meaning differs between commands: only flags and the command's own table set them). Keys use underscores
(``spool_max_bytes``), flags dashes (``--spool-max-bytes``), environment variables upper case
(``GPUPROBE_SPOOL_MAX_BYTES``). A key no command knows is an error, so typos do not pass silently.

Every duration option reads its values with :func:`parse_duration` (``30``, ``30.5``, ``30s``, ``500ms``,
``2m``, ``1h``, ``7d``; a bare number is seconds) and shows ``DURATION`` in ``--help``.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# ConfigError is the `ConfigError` branch of the exception tree (gpuprobe.errors); every option
# parser here raises it, so the parts' CLI modules import it from this module.
from gpuprobe.errors import ConfigError as ConfigError

ENV_PREFIX = "GPUPROBE_"
# Options whose name means something else in each command that has it: `gpus` is sim run's number of
# GPUs and probe start's GPU indices, `out` the demo's report folder and certs' key folder, `json` a
# switch here and a file there. A top-level key or a GPUPROBE_* variable set for one command would
# silently aim another (a top-level `gpus = 2` made `probe start` aim at GPU 2), so these are taken only
# from the command line and from the command's own table in the file.
PER_COMMAND_KEYS = frozenset({"gpus", "json", "out"})
CONFIG_ENV = "GPUPROBE_CONFIG"
DURATION_METAVAR = "DURATION"
DURATION_FORMS = "30, 30.5, 30s, 500ms, 2m, 1h, 7d"

log = logging.getLogger(__name__)

_DURATION = re.compile(r"(?P<number>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*(?P<unit>ms|s|min|m|h|d)?")
_SECONDS_PER_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Seconds from a duration: a bare number is seconds (``30``, ``30.5``), or a number with a unit
    (``500ms``, ``30s``, ``2m``, ``1h``, ``7d``). No sign: every duration option is a length of time."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise ValueError(
            f"not a duration: {text!r} (use {DURATION_FORMS}: seconds, or a number with the unit ms, s, m, h or d)"
        )
    seconds = float(match["number"]) * _SECONDS_PER_UNIT[match["unit"] or "s"]
    if not math.isfinite(seconds):
        raise ValueError(f"not a finite duration: {text!r}")
    return seconds


def parse_whole_seconds(text: str) -> int:
    """A duration (:func:`parse_duration`) that must be whole seconds: systemd's and MQTT's own
    settings in s (``WatchdogSec``, the MQTT keepalive) have no finer unit."""
    seconds = parse_duration(text)
    if not seconds.is_integer():
        raise ValueError(f"{text!r} is not a whole number of seconds")
    return int(seconds)


def parse_duration_or_none(text: str) -> float | None:
    """A duration (:func:`parse_duration`), or None for an empty value: for options whose unset
    state means something (an infinite retention) and that an empty variable has always unset."""
    return None if not text.strip() else parse_duration(text)


# the parsers that make an option a duration option: DURATION in --help, defaults shown with a unit
DURATION_TYPES: tuple[Callable[[str], Any], ...] = (parse_duration, parse_whole_seconds, parse_duration_or_none)


def format_duration(seconds: float) -> str:
    """``seconds`` in the largest unit that writes it exactly, a form :func:`parse_duration` reads back
    (``7d``, ``1h``, ``30s``, ``100ms``): defaults in ``--help``, and InfluxQL duration literals (whose
    units d, h, m, s and ms are the same)."""
    for unit, size_s in (("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0)):
        count = seconds / size_s
        if count >= 1 and count.is_integer():
            return f"{int(count)}{unit}"
    milliseconds = seconds * 1000
    if seconds > 0 and abs(milliseconds - round(milliseconds)) < 1e-9:
        return f"{round(milliseconds)}ms"
    return f"{seconds:g}s"


def format_time_ns(t_ns: int) -> str:
    """A timestamp (ns since the Unix epoch) as messages write it: ISO 8601 in UTC, ``2026-12-04T01:02:03Z``
    (milliseconds only when there are some), a form ``gpuprobe model --from`` reads back; never raw ns."""
    seconds, rest_ns = divmod(int(t_ns), 10**9)
    text = datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    milliseconds = rest_ns // 10**6
    return f"{text}.{milliseconds:03d}Z" if milliseconds else f"{text}Z"


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
    # A destructive switch (--force: overwrite files, replace a key): taken only from the command line,
    # never from a GPUPROBE_* variable or a config file set for another command's sake.
    flag_only: bool = False
    # The docs' options tables are made from these declarations (options_table, tools/docs_options.py):
    # `doc` is the table's text where it says more than --help can (links, markdown), `default_text`
    # the default as a reader says it where the value is not that ("the system's host name").
    doc: str | None = None
    default_text: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env_var(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def is_duration(self) -> bool:
        return self.type in DURATION_TYPES

    @property
    def file_keys(self) -> tuple[str, ...]:
        """The keys a config file may set this option with."""
        return (self.name,)

    def convert(self, raw: Any, source: str) -> Any:
        """Turns a value from the environment (a string) or TOML (typed) into the option's type."""
        if self.multiple:
            items = raw.split(",") if isinstance(raw, str) else raw
            if not isinstance(items, list):
                raise ConfigError(f"{source}: {self.name} must be a list")
            return [self.convert_one(item.strip() if isinstance(item, str) else item, source) for item in items]
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


_FLAG_IN_TEXT = re.compile(r"(?<![`\w-])(--[a-z][a-z0-9-]*)(?![\w`-])")
_DEFAULT_IN_HELP = re.compile(r"\s*\(default: [^()]*\)$")


def shown_default(opt: Option) -> str:
    """The default as the docs' tables write it: durations with their unit, switches on or off."""
    if opt.default_text is not None:
        return opt.default_text
    if opt.is_flag:
        return "on" if opt.default else "off"
    if opt.default is None or opt.default == "" or opt.default == []:
        return "—"
    return format_duration(opt.default) if opt.is_duration else str(opt.default)


def options_table(options: Iterable[Option]) -> str:
    """A Markdown table of options (flag, environment variable, default, meaning), the form of the
    docs' tables of each command's options, made from the declarations so that they cannot drift."""
    rows = ["| flag | environment | default | meaning |", "|---|---|---|---|"]
    for opt in options:
        env = "—" if opt.flag_only or opt.name in PER_COMMAND_KEYS else f"`{opt.env_var}`"
        # --help's text, argparse's %% unescaped, without its "(default: ...)" where the default column says it
        text = opt.help.replace("%%", "%")
        text = _DEFAULT_IN_HELP.sub("", text) if opt.default_text is not None else text
        meaning = opt.doc if opt.doc is not None else _FLAG_IN_TEXT.sub(r"`\1`", text)
        rows.append(f"| `{opt.flag}` | {env} | {shown_default(opt)} | {meaning} |")
    return "\n".join(rows) + "\n"


Handler = Callable[[dict[str, Any], argparse.Namespace], int]


@dataclass(frozen=True)
class Command:
    """A leaf command such as ``sim.run``; its options come from flags, environment and file."""

    name: str  # dotted: "sim.run" is `gpuprobe sim run`
    help: str
    run: Handler
    options: list[Option] = field(default_factory=list)
    description: str | None = None
    # extra argparse arguments that are not options (positionals such as `-- COMMAND...`)
    extra_arguments: Callable[[argparse.ArgumentParser], None] | None = None
    # the description keeps its line breaks in --help (a list of files, one per line)
    raw_description: bool = False


def add_options(parser: argparse.ArgumentParser, options: Iterable[Option]) -> None:
    """Adds flags whose absence is visible (``argparse.SUPPRESS``), so lower sources can fill in."""
    for opt in options:
        if opt.flag_only:
            where = "command line only"
        elif opt.name in PER_COMMAND_KEYS:
            where = "command line or this command's table in the file"
        else:
            where = f"env {opt.env_var}"
        if opt.is_duration:
            default = "" if opt.default is None else f"; default {format_duration(opt.default)}"
            help_text = f"{opt.help} (e.g. 30s, 2m; {where}{default})"
        else:
            default = "" if opt.default in (None, [], "") else f"; default {opt.default}"
            help_text = f"{opt.help} ({where}{default})"
        _add_flag(parser, opt, opt.name, help_text)


def _add_flag(parser: argparse.ArgumentParser, opt: Option, dest: str, help_text: str) -> None:
    if opt.is_flag:
        parser.add_argument(
            opt.flag,
            dest=dest,
            action=argparse.BooleanOptionalAction,
            default=argparse.SUPPRESS,
            help=help_text,
        )
        return
    parser.add_argument(
        opt.flag,
        dest=dest,
        type=_flag_type(opt),
        action="append" if opt.multiple else "store",
        default=argparse.SUPPRESS,
        metavar=DURATION_METAVAR if opt.is_duration else opt.metavar or opt.name.upper(),
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
                    raise ConfigError(f"{path}: unknown table [{dotted}]; commands: {', '.join(sorted(command_roots))}")
                walk(value, dotted)
                continue
            if not prefix:
                if key not in all_known:
                    raise ConfigError(f"{path}: unknown option {key!r}{_did_you_mean(key, all_known)}")
                if key in PER_COMMAND_KEYS:
                    tables = [f"[{c}]" for c in sorted(c for c, names in known_by_command.items() if key in names)]
                    raise ConfigError(
                        f"{path}: a top-level {key!r} would set it for every command that has one, and it means"
                        f" something different in each: put it in the table of the command it is for"
                        f": {', '.join(tables)}"
                    )
                continue
            allowed: set[str] = set()
            for command, names in known_by_command.items():
                if command == prefix or command.startswith(prefix + "."):
                    allowed |= names
            if key not in allowed:
                raise ConfigError(f"{path}: unknown option {key!r} in [{prefix}]{_did_you_mean(key, allowed)}")

    walk(data, "")


def _did_you_mean(key: str, known: Iterable[str]) -> str:
    import difflib

    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


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
        if opt.flag_only:
            values[opt.name] = getattr(args, opt.name, opt.default)
            ignored = [f"environment {opt.env_var}"] if opt.env_var in env else []
            ignored += [source for source, layer in layers if _has_value(layer, opt.name)]
            if ignored:
                log.warning("%s ignored: %s is taken only from the command line", ", ".join(ignored), opt.flag)
            continue
        per_command = opt.name in PER_COMMAND_KEYS  # then neither the environment nor the top level
        if hasattr(args, opt.name):
            values[opt.name] = getattr(args, opt.name)
        elif opt.env_var in env and not per_command:
            values[opt.name] = opt.convert(env[opt.env_var], f"environment {opt.env_var}")
        else:
            value: Any = opt.default
            for source, layer in layers[1:] if per_command else layers:
                if _has_value(layer, opt.name):
                    value = opt.convert(layer[opt.name], source)
            values[opt.name] = value
    return values


def _has_value(layer: Mapping[str, Any], key: str) -> bool:
    return key in layer and not isinstance(layer[key], Mapping)
