"""Each role runs with only its own extra installed: a GPU node without torch, a collector host
without torch or NVML. Simulated by making the other extras' modules unimportable in a child."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import gpuprobe

TRAINER_ONLY = ["torch", "torchvision", "transformers"]
MODEL_ONLY = ["matplotlib"]
AGENT_ONLY = ["pynvml", "sounddevice", "psutil", "aiomqtt", "paho", "numpy", "scipy"]
COLLECTOR_ONLY = ["influxdb_client", "httpx", "orjson", "isal"]


def run_without(blocked: list[str], code: str) -> subprocess.CompletedProcess[str]:
    prelude = textwrap.dedent(
        f"""
        import importlib.abc, sys
        BLOCKED = {blocked!r}
        class Missing(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ModuleNotFoundError(f"No module named {{name!r}} (not installed for this role)")
                return None
        sys.meta_path.insert(0, Missing())
        """
    )
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True)


def modules_of(package: str) -> list[str]:
    module = __import__(f"gpuprobe.{package}", fromlist=["_"])
    return [
        info.name
        for info in pkgutil.walk_packages(module.__path__, f"gpuprobe.{package}.")
        if ".tests" not in info.name
    ]


@pytest.mark.parametrize(
    ("role", "blocked", "commands", "packages"),
    [
        (
            "collector host",
            TRAINER_ONLY + MODEL_ONLY + AGENT_ONLY,
            [["collector"], ["install", "collector"]],
            ["collector"],
        ),
        ("GPU node", TRAINER_ONLY + MODEL_ONLY + COLLECTOR_ONLY, [["agent"], ["install", "agent"]], ["agent"]),
    ],
)
def test_role_runs_with_only_its_extra(
    role: str, blocked: list[str], commands: list[list[str]], packages: list[str]
) -> None:
    for argv in [[], *commands]:
        result = run_without(
            blocked,
            f"from gpuprobe.app.cli import main\ntry:\n    main({[*argv, '--help']!r})\nexcept SystemExit as e:\n"
            "    raise SystemExit(e.code)\n",
        )
        assert result.returncode == 0, f"{role}: gpuprobe {' '.join(argv)} --help failed:\n{result.stderr}"
        assert "usage: gpuprobe" in result.stdout
    for package in packages:
        for module in modules_of(package):
            result = run_without(blocked, f"import {module}")
            assert result.returncode == 0, f"{role}: import {module} needs another role's extra:\n{result.stderr}"


def test_the_blocking_works() -> None:
    result = run_without(["json"], "import json")
    assert result.returncode != 0 and "not installed for this role" in result.stderr
    assert Path(gpuprobe.__file__).exists()
