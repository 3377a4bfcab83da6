"""The one distribution: one namespace, complete package list, extras that keep roles light."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_python_package_folder_is_listed() -> None:
    """An editable install finds unlisted sub-packages; a real install would silently lose them."""
    listed = set(SETUPTOOLS["packages"])
    for package, folder in SETUPTOOLS["package-dir"].items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            relative = init.parent.relative_to(base)
            name = ".".join([package, *relative.parts])
            assert name in listed, f"{init.parent} holds a package {name} missing from [tool.setuptools] packages"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("gpuprobe-*.whl")
    return built


def test_wheel_installs_only_the_gpuprobe_namespace(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names}
    assert {t for t in top_level if not t.endswith(".dist-info")} == {"gpuprobe"}
    for expected in (
        "gpuprobe/sim/native/nvml_sim.c",
        "gpuprobe/sim/native/nvidia-smi",
        "gpuprobe/nvml/native/sampler.c",  # the native sampler, built on the GPU node
        "gpuprobe/sim/workload_costs.json",  # the performance model's cost cache (sim/perf.py)
        "gpuprobe/study/cli.py",
        "gpuprobe/v1/telemetry_pb2.py",
        "gpuprobe/v1/telemetry_pb2.pyi",
        "gpuprobe/py.typed",
    ):
        assert expected in names


def test_extras_keep_torch_off_gpu_nodes_and_nvml_off_the_collector(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        metadata_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(zf.read(metadata_name).decode())
    requirements = metadata.get_all("Requires-Dist") or []

    def extra(name: str) -> set[str]:
        marker = f'extra == "{name}"'
        return {
            r.split(";")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower()
            for r in requirements
            if marker in r
        }

    core = {r.split(">")[0].split("=")[0].split("<")[0].strip().lower() for r in requirements if "extra ==" not in r}
    assert "torch" not in core | extra("agent") | extra("collector")
    assert "nvidia-ml-py" not in core | extra("collector")
    assert "nvidia-ml-py" in extra("agent")
    assert {"torch", "torchvision", "transformers"} <= extra("trainer")
