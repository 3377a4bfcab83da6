"""The shape of the package's imports (docs/architecture.md, "Rules the tests enforce").

The import graph is read with ``ast`` from the sources of every ``gpuprobe`` module (the folders of
``package-dir`` in pyproject.toml). Every ``import`` statement counts: at module level, inside a
function (the lazy imports that keep ``gpuprobe --help`` light still make a dependency) and under
``if TYPE_CHECKING:``; none had to be excluded. An edge goes to the module named, or to the
sub-module for ``from PACKAGE import MODULE``; importing a sub-module is *not* counted as importing
its parent packages, whose ``__init__`` files import nothing eagerly.

- no cycles;
- only the entry point (``app/__main__.py``; the ``gpuprobe`` script calls ``gpuprobe.app.cli:main``)
  imports the dispatcher ``app/cli.py``, and only a ``cli`` module imports another ``cli`` module:
  what several commands share lives in a non-CLI module (``gpuprobe/config.py``, ``control/settings.py``);
- parts import downward only: every import from one part into another is one that the table "Allowed
  imports" of docs/architecture.md allows (the test reads the table from there, so the docs and the
  test cannot disagree), and there is no cycle between parts;
- one NVML boundary: only ``gpuprobe/nvml/`` imports ``pynvml`` (the simulator package does not
  need to; tests and benchmarks read NVML directly, as peers do);
- and every module imports (in a child interpreter, the way a user's program would).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENTRY_POINT = "gpuprobe.app.__main__"
DISPATCHER = "gpuprobe.app.cli"
NVML_PACKAGE = "gpuprobe.nvml"
NVML_SENSOR = "gpuprobe.nvml.sensor"
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def package_modules() -> dict[str, Path]:
    """Module name -> source file, for every module of the installed package shape."""
    mapping: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    modules: dict[str, Path] = {}
    for package, folder in mapping.items():
        base = ROOT / folder
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if "__pycache__" in parts:
                continue
            if parts[-1] == "__init__":
                parts.pop()
            modules.setdefault(".".join([package, *parts]), path)
    return modules


@dataclass(frozen=True)
class Import:
    importer: str
    target: str  # a dotted module name, ours or not
    line: int


def _dynamic_target(node: ast.Call) -> str | None:
    """``importlib.import_module("x")`` and ``__import__("x")`` with a literal name."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if name in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
        value = node.args[0].value
        return value if isinstance(value, str) else None
    return None


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> Iterator[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(name, alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                yield Import(name, sub if sub in modules else module, node.lineno)
        elif isinstance(node, ast.Call) and (target := _dynamic_target(node)) is not None:
            yield Import(name, target, node.lineno)


MODULES = package_modules()
IMPORTS = [i for name, path in MODULES.items() for i in imports_of(name, path, MODULES)]
GRAPH: dict[str, set[str]] = {name: set() for name in MODULES}
for _i in IMPORTS:
    if _i.target in MODULES and _i.target != _i.importer:
        GRAPH[_i.importer].add(_i.target)


def _is_cli(module: str) -> bool:
    return module.rpartition(".")[2] == "cli"


def _where(imports: list[Import]) -> str:
    return "\n".join(f"{MODULES[i.importer].relative_to(ROOT)}:{i.line}: imports {i.target}" for i in imports)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path (first node repeated at the end), or None; depth-first, iterative."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path: list[str] = [start]
        todo: list[Iterator[str]] = [iter(sorted(graph[start]))]
        state[start] = 1
        while todo:
            nxt = next(todo[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                todo.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                todo.append(iter(sorted(graph[nxt])))
    return None


def test_the_graph_covers_the_package() -> None:
    for module in (DISPATCHER, ENTRY_POINT, "gpuprobe.config", NVML_SENSOR, "gpuprobe.control.settings"):
        assert module in MODULES, module
    assert GRAPH[ENTRY_POINT] == {DISPATCHER}
    # lazy imports count
    assert {"gpuprobe.agent.cli", "gpuprobe.control.cli", "gpuprobe.app.demo"} <= GRAPH[DISPATCHER]


def test_find_cycle_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycles() -> None:
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_only_the_entry_point_imports_the_dispatcher() -> None:
    bad = [i for i in IMPORTS if i.target == DISPATCHER and i.importer != ENTRY_POINT]
    assert not bad, f"only {ENTRY_POINT} may import {DISPATCHER}:\n{_where(bad)}"


def test_only_cli_modules_import_cli_modules() -> None:
    bad = [
        i
        for i in IMPORTS
        if i.target in MODULES and _is_cli(i.target) and not _is_cli(i.importer) and i.importer != ENTRY_POINT
    ]
    assert not bad, f"non-CLI modules that import a CLI module:\n{_where(bad)}"


def test_only_the_nvml_package_imports_pynvml() -> None:
    importers = [i for i in IMPORTS if i.target.split(".")[0] == "pynvml"]
    outside = [i for i in importers if i.importer.rpartition(".")[0] != NVML_PACKAGE]
    assert not outside, f"only {NVML_PACKAGE} may import pynvml:\n{_where(outside)}"
    assert NVML_SENSOR in {i.importer for i in importers}  # the check looks at the right place


# --- parts ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    name: str
    where: tuple[str, ...]  # folders (ending in /) and files, relative to the repository root
    may_import: frozenset[str] | None  # None: every part


def read_parts(text: str) -> dict[str, Part]:
    """The table under "### Allowed imports" of docs/architecture.md: part, its modules, what it may import."""
    section = text[text.index("### Allowed imports") :]
    rows = re.findall(r"^\| *(\w[\w ]*?) *\| *(.+?) *\| *(.+?) *\|$", section, re.MULTILINE)
    parts: dict[str, Part] = {}
    for name, where, may in rows:
        if name == "part":
            continue  # the header
        paths = tuple(w for w in re.findall(r"`([^`]+)`", where) if "/" in w)  # `config` etc. are notes
        allowed = None if may == "every part" else frozenset(re.findall(r"`(\w+)`", may))
        parts[name] = Part(name, paths, allowed)
    return parts


PARTS = read_parts(ARCHITECTURE.read_text(encoding="utf-8"))


def part_of(module: str) -> str:
    """The part whose most specific ``where`` holds the module's file."""
    path = MODULES[module].relative_to(ROOT).as_posix()
    best = max(
        (
            (len(w), p.name)
            for p in PARTS.values()
            for w in p.where
            if path == w or (w.endswith("/") and path.startswith(w))
        ),
        default=None,
    )
    assert best is not None, f"{path} is in no part of the table in docs/architecture.md"
    return best[1]


def part_imports(imports: list[Import]) -> list[tuple[str, str, Import]]:
    """(importer's part, imported part, the import) for every import of one part from another."""
    found = []
    for i in imports:
        if i.target in MODULES and i.target != i.importer:
            a, b = part_of(i.importer), part_of(i.target)
            if a != b:
                found.append((a, b, i))
    return found


def forbidden(imports: list[Import]) -> list[str]:
    """``file:line: part imports part (module)`` for each import between parts the table does not allow."""
    lines = [
        f"{MODULES[i.importer].relative_to(ROOT)}:{i.line}: {a} imports {b} ({i.target})"
        for a, b, i in part_imports(imports)
        if PARTS[a].may_import is not None and b not in (PARTS[a].may_import or ())
    ]
    return list(dict.fromkeys(lines))  # one line per statement, not per imported name


def test_the_parts_table_is_whole() -> None:
    """Every module is in one part, every part named in the table is a row, the table itself has no cycle."""
    assert {"top", "agent", "collector", "control", "trainer", "sim", "nvml", "wire", "core"} <= set(PARTS)
    for module in MODULES:
        part_of(module)
    for part in PARTS.values():
        assert part.where, part.name
        unknown = (part.may_import or frozenset()) - set(PARTS)
        assert not unknown, f"{part.name} may import {sorted(unknown)}: no such part"
    table = {p.name: set(p.may_import) if p.may_import is not None else set() for p in PARTS.values()}
    cycle = find_cycle(table)
    assert cycle is None, "the table allows a cycle: " + " -> ".join(cycle or [])
    top = [p.name for p in PARTS.values() if p.may_import is None]
    assert top == ["top"], top
    assert not any("top" in deps for deps in table.values())  # nothing imports the top floor


def test_forbidden_sees_an_upward_import() -> None:
    """The old agent <-> control cycle: the control plane reaching into the agent is refused, the
    agent embedding the control plane is allowed."""
    up = Import("gpuprobe.control.gpus", "gpuprobe.agent.service", 1)
    down = Import("gpuprobe.agent.service", "gpuprobe.control.gpus", 1)
    assert forbidden([up, down]) == ["control/gpus.py:1: control imports agent (gpuprobe.agent.service)"]


def test_parts_import_only_what_the_table_allows() -> None:
    bad = forbidden(IMPORTS)
    assert not bad, "imports between parts that docs/architecture.md does not allow:\n" + "\n".join(bad)


def test_no_cycles_between_parts() -> None:
    graph: dict[str, set[str]] = {name: set() for name in PARTS}
    for a, b, _ in part_imports(IMPORTS):
        graph[a].add(b)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle between parts: " + " -> ".join(cycle or [])


def _grouped(key: Callable[[str], str]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for importer, targets in GRAPH.items():
        for target in targets:
            graph.setdefault(key(importer), set())
            if key(importer) != key(target):
                graph[key(importer)].add(key(target))
    return graph


def _package(module: str) -> str:
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def _folder(module: str) -> str:
    return MODULES[module].relative_to(ROOT).parts[0]


@pytest.mark.parametrize("key", [_package, _folder], ids=["python packages", "repository folders"])
def test_no_cycles_between_packages(key: Callable[[str], str]) -> None:
    """The parts as Python packages (``gpuprobe`` with its own modules, ``gpuprobe.agent``,
    ``gpuprobe.agent.sensors``, ...) and as the folders a reader of the tree sees (``gpuprobe/``,
    ``agent/``, ``app/``, ...): neither has a cycle. The top floor lives in ``app/``, not beside the
    ground floor in ``gpuprobe/``, which every part imports."""
    cycle = find_cycle(_grouped(key))
    assert cycle is None, "import cycle between packages: " + " -> ".join(cycle or [])


def test_each_module_says_its_part() -> None:
    """A reader who opens any module learns which floor it is on: its docstring starts with
    ``Part: NAME``, NAME a row of the table (the generated protobuf modules excepted)."""
    wrong = []
    for module, path in MODULES.items():
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        said = re.match(r"Part: (\w+)\b", docstring)
        if said is None or said.group(1) != part_of(module):
            wrong.append(f"{path.relative_to(ROOT)}: {docstring[:40]!r}, in part {part_of(module)!r}")
    assert not wrong, "modules whose docstring does not start with 'Part: <its part>':\n" + "\n".join(wrong)


def test_every_module_imports() -> None:
    names = sorted(m for m in MODULES if m != ENTRY_POINT)  # __main__ runs the CLI when imported
    code = textwrap.dedent(
        f"""
        import importlib, sys
        failed = []
        for name in {names!r}:
            try:
                importlib.import_module(name)
            except ModuleNotFoundError as e:
                if (e.name or "").split(".")[0] == "gpuprobe":
                    failed.append(f"{{name}}: {{e!r}}")
                # else: an optional extra that is not installed here (tests/test_roles.py covers the roles)
            except Exception as e:
                failed.append(f"{{name}}: {{e!r}}")
        print("\\n".join(failed))
        sys.exit(1 if failed else 0)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"modules that do not import:\n{done.stdout}{done.stderr[-3000:]}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _is_cli(m)))
def test_cli_modules_are_light(module: str) -> None:
    """A CLI module is imported to list the commands; what is heavy loads when its command runs."""
    heavy = ("torch", "matplotlib", "pynvml", "grpc", "aiomqtt", "cryptography", "numpy", "scipy", "httpx")
    code = f"import sys, {module}\nprint(' '.join(sorted({{m.split('.')[0] for m in sys.modules}} & {set(heavy)!r})))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "", f"importing {module} loads {done.stdout.strip()}"
