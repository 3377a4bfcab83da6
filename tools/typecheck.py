"""Runs mypy over the ``gpuprobe`` package as it is installed.

The repository's top-level folders (``agent/``, ``collector/``, ``sim/``...) are sub-packages of
``gpuprobe`` through setuptools' ``package-dir`` mapping, which mypy cannot follow. This script lays
out the installed package shape as symbolic links under ``build/typecheck`` (from the mapping in
pyproject.toml, so it never drifts) and type-checks that, plus ``tools/`` (tests are not type-checked).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "typecheck"


def lay_out_tree() -> Path:
    mapping: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    shutil.rmtree(TREE, ignore_errors=True)
    top = TREE / "gpuprobe"
    top.mkdir(parents=True)
    mapped = {name.split(".", 1)[1]: folder for name, folder in mapping.items() if "." in name}
    for entry in (ROOT / mapping["gpuprobe"]).iterdir():
        if entry.name != "__pycache__" and entry.name not in mapped:
            (top / entry.name).symlink_to(entry)
    for sub, folder in mapped.items():
        (top / sub).symlink_to(ROOT / folder)
    return TREE


def main() -> int:
    # one run at a time: the tree is rebuilt in place, and mypy's cache is keyed by its paths
    (ROOT / "build").mkdir(exist_ok=True)
    lock = (ROOT / "build" / "typecheck.lock").open("w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    tree = lay_out_tree()
    env = dict(os.environ, MYPYPATH=str(tree))
    cmd = [
        sys.executable,
        "-m",
        "mypy",
        "--config-file",
        str(ROOT / "pyproject.toml"),
        "-p",
        "gpuprobe",
        *sys.argv[1:],
    ]
    package = subprocess.run(cmd, cwd=tree, env=env)
    others = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "tools"],
        cwd=ROOT,
        env=env,
    )
    return package.returncode or others.returncode


if __name__ == "__main__":
    sys.exit(main())
