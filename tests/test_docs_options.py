"""Every `gpuprobe …` command line written in the README and docs/ names a command that exists and only
options that command has, and every `GPUPROBE_*` variable the docs name is one the CLI reads.
The parser is the CLI's own, so the docs cannot drift from the code unnoticed."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from gpuprobe.app.cli import all_commands, build_parser
from gpuprobe.config import CONFIG_ENV

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# `gpuprobe` up to the end of the command: a pipe, `;`, `&&`, `)`, a backtick or the end of the line
COMMAND_LINE = re.compile(r"(?<![\w/.-])gpuprobe((?:[ \t]+[^\s|;&)`]+)*)")
FLAG = re.compile(r"^--[a-z][a-z0-9-]*")
ENV_VAR = re.compile(r"\bGPUPROBE_[A-Z0-9_]*[A-Z0-9]\b")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings if s.startswith("--")}


def _doc_lines(path: Path) -> list[tuple[int, str]]:
    """The lines, with backslash continuations joined onto the line they continue."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append((start, pending + line))
        pending = ""
    return out


def _check_command(parser: argparse.ArgumentParser, words: list[str]) -> str | None:
    """Why the words after `gpuprobe` are not a command line the CLI accepts (None when they are)."""
    global_flags = _flags(parser)
    current, path = parser, ["gpuprobe"]
    for i, word in enumerate(words):
        flag_match = FLAG.match(word)
        if flag_match:
            flag = flag_match.group(0)
            if flag not in _flags(current) and flag not in global_flags and flag not in ("--help",):
                return f"{' '.join(path)} has no option {flag}"
            continue
        children = _subparsers(current)
        if not children:
            return None  # a positional argument of a leaf command
        if word not in children:
            if i == 0 or not re.fullmatch(r"[a-z][a-z0-9-]*", word):
                return None  # prose ("gpuprobe's", "gpuprobe is ...") rather than a command
            return f"{' '.join(path)} has no command {word!r}"
        current, path = children[word], [*path, word]
    return None


def test_every_documented_gpuprobe_command_line_uses_options_the_command_has() -> None:
    parser = build_parser(all_commands())
    problems = []
    for doc in DOCS:
        for number, line in _doc_lines(doc):
            for match in COMMAND_LINE.finditer(line):
                words = match.group(1).split()
                before = line[: match.start()].split()
                if before and before[-1].startswith("-"):
                    continue  # a value ("--db gpuprobe"), not the command
                if not words or words[0] not in {*_subparsers(parser), *_flags(parser)}:
                    continue  # "gpuprobe agent" is a command; "gpuprobe exits 0" is prose
                problem = _check_command(parser, words)
                if problem:
                    problems.append(f"{doc.relative_to(ROOT)}:{number}: {problem}: {line.strip()[:120]}")
    assert not problems, "\n".join(problems)


def _read_elsewhere() -> set[str]:
    """GPUPROBE_* names the code and the deployment files read themselves (the simulator's directory,
    Grafana's provisioning variables), not through an option."""
    names: set[str] = set()
    skipped = {".venv", "node_modules", "tests", "docs", ".git", "build", "__pycache__"}
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [name for name in subfolders if name not in skipped and not name.endswith(".egg-info")]
        for name in files:
            if Path(name).suffix in {".py", ".yaml", ".yml", ".service", ".sh", ".toml", ".c", ".tpl"}:
                names.update(ENV_VAR.findall((Path(folder) / name).read_text(errors="replace")))
    return names


def test_every_documented_gpuprobe_variable_is_read_by_the_cli() -> None:
    known = {CONFIG_ENV, "GPUPROBE_LOG_LEVEL", *_read_elsewhere()}
    for command in all_commands():
        for option in command.options:
            known.add(option.env_var)
    problems = []
    for doc in DOCS:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            for name in ENV_VAR.findall(line):
                if name not in known and not name.endswith("_"):
                    problems.append(f"{doc.relative_to(ROOT)}:{number}: {name} is not read by any command")
    assert not problems, "\n".join(problems)


# --- the options tables made from the declarations (tools/docs_options.py) -----------------------


def _docs_options_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_options", ROOT / "tools" / "docs_options.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_options_tables_are_the_declarations() -> None:
    """What `python tools/docs_options.py --check` checks: every generated table is current, and a
    command with tables (the agent, the collector, model, import, study report) has each of its
    options in one of them."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "docs_options.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    tool = _docs_options_tool()
    commands = {t.command for t in tool.tables()}
    assert {"agent", "collector", "model", "import.nvidia-smi", "study.report"} <= commands
    agent_options = {o.name for c in all_commands() if c.name == "agent" for o in c.options}
    assert {o.name for t in tool.tables() if t.command == "agent" for o in t.options} == agent_options


def test_a_changed_declaration_changes_its_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A row is made from its Option: change the declaration's default and the table follows; a row
    edited by hand is made anew; an option left out of every table is reported."""
    tool = _docs_options_tool()
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("")
    doc = tmp_path / "docs" / "agent.md"
    written = (ROOT / "docs" / "agent.md").read_text()
    hand_edited = written.replace("| `GPUPROBE_INTERVAL` | 100ms |", "| `GPUPROBE_INTERVAL` | 250ms |")
    assert hand_edited != written
    doc.write_text(hand_edited)
    assert tool.render(doc) == written
    agent = next(c for c in all_commands() if c.name == "agent")
    interval = next(o for o in agent.options if o.name == "interval")
    options = [dataclasses.replace(o, default=0.05) if o is interval else o for o in agent.options]
    monkeypatch.setattr(tool, "all_commands", lambda: [dataclasses.replace(agent, options=options)])
    assert "| `--interval` | `GPUPROBE_INTERVAL` | 50ms |" in tool.render(doc)
    narrowed = written.replace("agent --collector..--check -->", "agent --collector..--hwmon-dir -->")
    doc.write_text(narrowed)
    assert tool.uncovered(tool.tables(tmp_path)) == ["agent --check"]
