"""Fixtures of the importer tests (helpers in import_helpers.py): run `gpuprobe import nvidia-smi` in
this process, write input files."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from import_helpers import Import


@pytest.fixture(autouse=True)
def _no_gpuprobe_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPUPROBE_* variable of the machine (GPUPROBE_HOST...) must not change what the tests import."""
    for name in list(os.environ):
        if name.startswith("GPUPROBE_"):
            monkeypatch.delenv(name)


def _command(capsys: pytest.CaptureFixture[str], tool: str) -> Import:
    from gpuprobe.app.cli import main

    def run(*args: str | Path) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            status = main(["import", tool, *map(str, args)])
        except SystemExit as e:  # argparse's usage errors
            status = int(e.code or 0)
        out = capsys.readouterr()
        return status, out.out, out.err

    return run


@pytest.fixture
def gpuprobe_import(capsys: pytest.CaptureFixture[str]) -> Import:
    """``gpuprobe_import(*args)`` runs ``gpuprobe import nvidia-smi *args``: (exit status, stdout, stderr)."""
    return _command(capsys, "nvidia-smi")


@pytest.fixture
def gpuprobe_import_amd(capsys: pytest.CaptureFixture[str]) -> Import:
    """``gpuprobe_import_amd(*args)`` runs ``gpuprobe import amd-smi *args``: (exit status, stdout, stderr)."""
    return _command(capsys, "amd-smi")


@pytest.fixture
def write_file(tmp_path: Path) -> Callable[[str, str], Path]:
    """``write_file(name, text)``: a file under the test's tmp_path."""

    def write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return write
