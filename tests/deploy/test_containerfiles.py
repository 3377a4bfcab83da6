"""deploy/containers/: the Containerfiles cannot be built here (no base image can be pulled), so what
can be checked without a build is: the files they copy exist and are exactly what the distribution
is built from, a wheel builds from only those files, and the entry point is the real console script."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from k8s_helpers import CONTAINERS, ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
ROLES = ("agent", "collector")


def instructions(role: str) -> list[tuple[str, str]]:
    text = (CONTAINERS / f"{role}.Containerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def copied(role: str) -> list[str]:
    sources: list[str] = []
    for word, rest in instructions(role):
        if word == "COPY":
            sources += shlex.split(rest)[:-1]
    return sources


@pytest.mark.parametrize("role", ROLES)
def test_a_containerfile_copies_what_the_distribution_is_built_from(role: str) -> None:
    sources = copied(role)
    for source in sources:
        assert (ROOT / source).exists(), f"{role}.Containerfile copies {source}, which does not exist"
    folders = set(PYPROJECT["tool"]["setuptools"]["package-dir"].values())
    assert set(sources) == folders | {"pyproject.toml", PYPROJECT["project"]["readme"]}


@pytest.mark.parametrize("role", ROLES)
def test_a_containerfile_installs_its_extra_and_runs_the_console_script_unprivileged(role: str) -> None:
    steps = instructions(role)
    assert steps[0][0] == "FROM"
    run = " ".join(rest for word, rest in steps if word == "RUN")
    extras = re.findall(r'pip install [^"]*"/src\[([a-z,]+)\]"', run)
    assert extras == [role] and role in PYPROJECT["project"]["optional-dependencies"]
    entrypoint = next(rest for word, rest in steps if word == "ENTRYPOINT")
    assert entrypoint == '["gpuprobe"]' and "gpuprobe" in PYPROJECT["project"]["scripts"]
    user = next(rest for word, rest in steps if word == "USER")
    assert user.split(":")[0] not in ("0", "root")
    assert "--uid 10001" in run and user == "10001:10001"


@pytest.mark.slow
def test_a_wheel_builds_from_only_the_copied_files(tmp_path: Path) -> None:
    """What `pip install /src[...]` does in the image, offline: the copied files make the distribution."""
    src = tmp_path / "src"
    src.mkdir()
    for source in copied("agent"):
        cmd = ["cp", "-r", str(ROOT / source), str(src / source)]
        subprocess.run(cmd, check=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=240,
    )
    (wheel,) = tmp_path.glob("gpuprobe-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        entry_points = z.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "gpuprobe = gpuprobe.app.cli:main" in entry_points
    for module in ("gpuprobe/agent/service.py", "gpuprobe/collector/server.py", "gpuprobe/v1/telemetry_pb2.py"):
        assert module in names


def test_the_build_context_holds_only_what_the_containerfiles_copy() -> None:
    lines = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()]
    rules = [ln for ln in lines if ln and not ln.startswith("#")]
    assert rules[0] == "*", "everything is left out first"
    kept = {rule[1:] for rule in rules if rule.startswith("!")}
    for role in ROLES:
        assert set(copied(role)) == kept, f"{role}.Containerfile copies other files than .dockerignore keeps"
