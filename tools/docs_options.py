#!/usr/bin/env python3
"""Write the options tables of the docs from the commands' declarations, or check that they are current.

Usage::

    python tools/docs_options.py            # rewrite the tables in README.md and docs/*.md
    python tools/docs_options.py --check    # exit 1 if a table differs from the declarations

A table is the text between a marker and ``<!-- end options -->``::

    <!-- options: agent --collector..--check -->
    | flag | environment | default | meaning |
    ...
    <!-- end options -->

The marker names a command (``agent``, ``sim.run``) and, optionally, which of its options, in the
table's order: flags, and runs of flags in the command's order (``--first..--last``); without any,
every option. Each row comes from one
``Option`` (``gpuprobe.config.options_table``): its flag, its ``GPUPROBE_*`` variable, its default and
its text, so that an option is declared once and the docs follow. A command that has tables must have
every one of its options in one of them.

Exit status: 0 written / up to date, 1 stale (``--check``), 2 a marker that names no command or flag.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from gpuprobe.app.cli import all_commands
from gpuprobe.config import Option, options_table

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(
    r"^<!-- options: (?P<command>[\w.-]+)(?P<which>(?: --[a-z0-9-]+(?:\.\.--[a-z0-9-]+)?)*) -->\n"
    r"(?P<table>.*?)^<!-- end options -->$",
    re.MULTILINE | re.DOTALL,
)


@dataclass(frozen=True)
class Table:
    path: Path
    command: str
    options: list[Option]
    written: str  # the table as the file has it now


def selected(options: list[Option], which: list[str]) -> list[Option]:
    """The options a marker names (``--flag`` or ``--first..--last``; none: all); KeyError names a
    flag the command does not have."""
    if not which:
        return options
    index = {o.flag: i for i, o in enumerate(options)}
    out: list[Option] = []
    for word in which:
        first, _, last = word.partition("..")
        for flag in (first, last or first):
            if flag not in index:
                raise KeyError(flag)
        out.extend(options[index[first] : index[last or first] + 1])
    return out


def doc_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def tables(root: Path = ROOT) -> list[Table]:
    commands = {c.name: c for c in all_commands()}
    found = []
    for path in doc_files(root):
        for m in MARKER.finditer(path.read_text(encoding="utf-8")):
            where = f"{path.relative_to(root)}: <!-- options: {m['command']} -->"
            if m["command"] not in commands:
                raise SystemExit(f"{where}: no such command")
            try:
                options = selected(commands[m["command"]].options, m["which"].split())
            except KeyError as e:
                raise SystemExit(f"{where}: the command has no {e.args[0]}") from None
            found.append(Table(path, m["command"], options, m["table"]))
    return found


def uncovered(found: list[Table]) -> list[str]:
    """``command --flag`` for each option of a command with tables that no table of it lists."""
    commands = {c.name: c for c in all_commands()}
    listed = {(t.command, o.flag) for t in found for o in t.options}
    return [
        f"{name} {o.flag}"
        for name in sorted({t.command for t in found})
        for o in commands[name].options
        if (name, o.flag) not in listed
    ]


def render(path: Path) -> str:
    """The file's text with every table made anew."""
    commands = {c.name: c for c in all_commands()}

    def table(m: re.Match[str]) -> str:
        options = selected(commands[m["command"]].options, m["which"].split())
        start, end = m.span("table")
        return m.group(0)[: start - m.start()] + options_table(options) + m.group(0)[end - m.start() :]

    return MARKER.sub(table, path.read_text(encoding="utf-8"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a table is stale")
    args = parser.parse_args(argv)
    found = tables()
    missing = uncovered(found)
    if missing:
        print("options in no table of their command's docs:\n  " + "\n  ".join(missing), file=sys.stderr)
        return 1
    stale = []
    for path in sorted({t.path for t in found}):
        text = render(path)
        if text != path.read_text(encoding="utf-8"):
            stale.append(path.relative_to(ROOT))
            if not args.check:
                path.write_text(text, encoding="utf-8")
    if stale and args.check:
        print("stale options tables (run python tools/docs_options.py): " + ", ".join(map(str, stale)), file=sys.stderr)
        return 1
    for path in stale:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
