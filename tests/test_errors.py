"""One exception tree (gpuprobe/errors.py): every exception class that a gpuprobe module defines derives
from GpuprobeError, and the tree drawn in gpuprobe.errors' docstring names each of them, its module and
its place, exactly as the code has it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

import gpuprobe.errors

ROOT = Path(__file__).resolve().parent.parent


def package_modules() -> list[str]:
    """Every module of the installed package shape (pyproject's ``package-dir``), but the entry point."""
    mapping: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    names: set[str] = set()
    for package, folder in mapping.items():
        base = ROOT / folder
        for path in base.rglob("*.py"):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if "__pycache__" in parts:
                continue
            if parts[-1] == "__init__":
                parts.pop()
            names.add(".".join([package, *parts]))
    return sorted(names - {"gpuprobe.app.__main__"})  # importing __main__ runs the CLI


@dataclass(frozen=True)
class Defined:
    module: str
    name: str
    mro: list[str]  # "module.Name" of every class in its MRO

    @property
    def qualified(self) -> str:
        return f"{self.module}.{self.name}"


def exception_classes() -> list[Defined]:
    """The exception classes defined at module level in gpuprobe, found by importing every module in a
    child interpreter (a module that needs an extra not installed here is skipped, as in
    test_module_graph)."""
    code = textwrap.dedent(
        f"""
        import importlib, inspect, json
        found = []
        for name in {package_modules()!r}:
            try:
                module = importlib.import_module(name)
            except ModuleNotFoundError as e:
                if (e.name or "").split(".")[0] == "gpuprobe":
                    raise
                continue
            for attr, obj in vars(module).items():
                if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == name:
                    mro = [f"{{c.__module__}}.{{c.__name__}}" for c in obj.__mro__]
                    found.append({{"module": name, "name": attr, "mro": mro}})
        print(json.dumps(found))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return [Defined(**d) for d in json.loads(done.stdout)]


@dataclass(frozen=True)
class Node:
    name: str
    path: str  # the module's file, relative to the package ("wire/validate.py")
    parent: str | None


_BRANCH = re.compile(r"^(?P<lead>[ │]*)(?:├── |└── )(?P<name>\w+)\b(?P<rest>.*)$")
_ROOT = re.compile(r"^ {4}(?P<name>GpuprobeError)\b(?P<rest>.*)$")
_PATH = re.compile(r"\s([\w/]+\.py)[:,]")


def tree() -> dict[str, Node]:
    """The tree drawn in gpuprobe.errors' docstring: class name -> its node."""
    doc = gpuprobe.errors.__doc__ or ""
    nodes: dict[str, Node] = {}
    at_depth: list[str] = []
    for line in doc.splitlines():
        root = _ROOT.match(line)
        branch = _BRANCH.match(line)
        if root:
            name, rest, depth = root["name"], root["rest"], 0
        elif branch:
            name, rest = branch["name"], branch["rest"]
            depth = (len(branch["lead"]) - 4) // 4 + 1
        else:
            continue  # a continuation line of the text before it
        path = _PATH.search(rest)
        assert path, f"the tree names no module for {name}: {line!r}"
        del at_depth[depth:]
        parent = at_depth[depth - 1] if depth else None
        at_depth.append(name)
        assert name not in nodes, f"{name} is twice in the tree"
        nodes[name] = Node(name, path[1], parent)
    return nodes


KINDS = ("ConfigError", "ServiceError", "ProtocolError", "DataError")


def module_path(module: str) -> str:
    return module.removeprefix("gpuprobe.").replace(".", "/") + ".py"


CLASSES = exception_classes()
TREE = tree()


def test_the_tree_is_drawn() -> None:
    assert {"GpuprobeError", *KINDS} <= set(TREE)
    assert TREE["GpuprobeError"].parent is None
    assert {TREE[kind].parent for kind in KINDS} == {"GpuprobeError"}
    assert len(CLASSES) >= 26  # every part's modules were imported


@pytest.mark.parametrize("defined", CLASSES, ids=lambda c: c.qualified)
def test_every_exception_class_derives_from_gpuprobe_error_and_is_in_the_tree(defined: Defined) -> None:
    assert "gpuprobe.errors.GpuprobeError" in defined.mro, f"{defined.qualified} does not derive from GpuprobeError"
    node = TREE.get(defined.name)
    assert node is not None, f"{defined.qualified} is not in the tree of gpuprobe/errors.py"
    assert node.path == module_path(defined.module), f"the tree puts {defined.name} in {node.path}"
    if node.parent is not None:
        parent = TREE[node.parent]
        parent_qualified = "gpuprobe." + parent.path.removesuffix(".py").replace("/", ".") + "." + parent.name
        assert parent_qualified in defined.mro, f"{defined.qualified} does not derive from {node.parent} (the tree's)"
    kinds = [k for k in KINDS if f"gpuprobe.errors.{k}" in defined.mro]
    assert defined.module == "gpuprobe.errors" or len(kinds) == 1, f"{defined.qualified} is of kinds {kinds}"


def test_every_class_in_the_tree_exists_where_it_says() -> None:
    defined = {(module_path(c.module), c.name) for c in CLASSES}
    missing = [n for n in TREE.values() if (n.path, n.name) not in defined]
    assert not missing, f"the tree names classes the code does not define: {missing}"


def test_config_error_is_one_class_in_both_modules() -> None:
    import gpuprobe.config

    assert gpuprobe.config.ConfigError is gpuprobe.errors.ConfigError
    assert issubclass(gpuprobe.errors.ConfigError, ValueError)  # code catches option errors as ValueError
