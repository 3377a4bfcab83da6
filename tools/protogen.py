#!/usr/bin/env python3
"""Generate the Python code of the wire contract from ``proto/``, or check that it is current.

Usage::

    python tools/protogen.py            # regenerate into the repo (what `make proto` runs)
    python tools/protogen.py --check    # exit 1 if the committed generated code is stale

Every ``.proto`` file under ``--proto-dir`` (default ``proto/``) is compiled with the
``grpc_tools.protoc`` of the installed grpcio-tools (pinned in pyproject.toml, because the
output differs between versions) and its bundled well-known-type includes::

    protoc -I proto -I <grpc_tools>/_proto --python_out=OUT --pyi_out=OUT --grpc_python_out=OUT

so that ``proto/gpuprobe/v1/x.proto`` becomes ``OUT/gpuprobe/v1/x_pb2.py``, ``x_pb2.pyi`` and
``x_pb2_grpc.py`` (imports between files read ``from gpuprobe.v1 import x_pb2``).

One deterministic touch-up is applied to protoc's output so that the stubs pass
``mypy --strict`` (``disallow_any_generics``): protoc's ``.pyi`` writer types a message-valued
constructor argument as ``_Union[Msg, _Mapping]`` with a bare ``Mapping``; it becomes
``_Mapping[str, object]`` (the dict initializer protobuf accepts). Nothing else is changed.

Generation always happens in a temporary directory first. Writing then copies only the files
that changed and deletes generated files whose ``.proto`` is gone; ``--check`` compares the
temporary output byte for byte with ``OUT`` (changed, missing and extra generated files) and
writes nothing.

Exit status: 0 success / up to date, 1 stale (``--check``), 2 usage or protoc error.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.resources
import re
import shutil
import sys
import tempfile
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PROTO_DIR = REPO_ROOT / "proto"
DEFAULT_OUT_DIR = REPO_ROOT

#: Suffixes of the files protoc writes for one ``x.proto``: ``x_pb2.py`` and so on.
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")

#: protoc's bare ``Mapping`` in message-valued constructor arguments (see the module docstring).
_BARE_MAPPING = re.compile(r"(?<=, )_Mapping(?=\])")

REGENERATE_HINT = "run `make proto` (python tools/protogen.py) and commit the result"


class ProtogenError(Exception):
    """protoc failed, or the inputs are unusable."""


@dataclass
class Comparison:
    """How committed generated files differ from freshly generated ones (relative paths)."""

    changed: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)

    @property
    def stale(self) -> bool:
        return bool(self.changed or self.missing or self.extra)

    def report(self) -> str:
        lines: list[str] = []
        for label, paths in (
            ("differs from what the .proto files generate", self.changed),
            ("missing (not generated yet)", self.missing),
            ("no longer generated (its .proto is gone)", self.extra),
        ):
            lines.extend(f"  {path}: {label}" for path in paths)
        return "\n".join(lines)


def find_protos(proto_dir: Path) -> list[Path]:
    """All ``.proto`` files under ``proto_dir``, relative to it, in a stable order."""
    if not proto_dir.is_dir():
        raise ProtogenError(f"proto directory not found: {proto_dir}")
    protos = sorted(p.relative_to(proto_dir) for p in proto_dir.rglob("*.proto"))
    if not protos:
        raise ProtogenError(f"no .proto files under {proto_dir}")
    return protos


def _protoc_main() -> Callable[[list[str]], int]:
    module = importlib.import_module("grpc_tools.protoc")
    main: Callable[[list[str]], int] = module.main
    return main


def _well_known_include() -> Path:
    return Path(str(importlib.resources.files("grpc_tools") / "_proto"))


def generate(proto_dir: Path, out_dir: Path) -> None:
    """Run protoc over every ``.proto`` in ``proto_dir``, writing the Python code under ``out_dir``."""
    protos = find_protos(proto_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"--proto_path={proto_dir}",
        f"--proto_path={_well_known_include()}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(p.as_posix() for p in protos),
    ]
    status = _protoc_main()(args)
    if status != 0:
        raise ProtogenError(f"protoc failed with status {status} (its errors are above)")
    for proto in protos:
        stub = out_dir / proto.with_name(f"{proto.stem}_pb2.pyi")
        text = stub.read_text(encoding="utf-8")
        typed = _BARE_MAPPING.sub("_Mapping[str, object]", text)
        if typed != text:
            stub.write_text(typed, encoding="utf-8")


def _is_generated(path: Path) -> bool:
    return path.is_file() and path.name.endswith(GENERATED_SUFFIXES)


def generated_files(root: Path, packages: Sequence[str]) -> dict[str, Path]:
    """Generated-looking files under ``root/<package>`` for each top-level package, by relative path."""
    found: dict[str, Path] = {}
    for package in packages:
        base = root / package
        if not base.is_dir():
            continue
        for path in base.rglob("*"):
            if "__pycache__" in path.parts or not _is_generated(path):
                continue
            found[path.relative_to(root).as_posix()] = path
    return found


def top_level_packages(proto_dir: Path) -> list[str]:
    """The top-level directories of the proto tree (``gpuprobe`` for ``proto/gpuprobe/v1``)."""
    return sorted({p.parts[0] for p in find_protos(proto_dir) if len(p.parts) > 1})


def compare(fresh_root: Path, out_dir: Path, packages: Sequence[str]) -> Comparison:
    fresh = generated_files(fresh_root, packages)
    committed = generated_files(out_dir, packages)
    result = Comparison()
    for rel, path in sorted(fresh.items()):
        if rel not in committed:
            result.missing.append(rel)
        elif committed[rel].read_bytes() != path.read_bytes():
            result.changed.append(rel)
    result.extra = sorted(set(committed) - set(fresh))
    return result


def _sync(fresh_root: Path, out_dir: Path, comparison: Comparison) -> None:
    for rel in comparison.changed + comparison.missing:
        target = out_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(fresh_root / rel, target)
    for rel in comparison.extra:
        (out_dir / rel).unlink()


def _pinned_grpcio_tools(pyproject: Path) -> str | None:
    """The ``grpcio-tools==X`` pin of pyproject.toml's optional dependencies, if any."""
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return None
    extras = data.get("project", {}).get("optional-dependencies", {})
    for requirements in extras.values():
        for requirement in requirements:
            match = re.fullmatch(r"\s*grpcio-tools\s*==\s*([^\s;,]+)\s*(;.*)?", str(requirement))
            if match:
                return match.group(1)
    return None


def _version_warning() -> str | None:
    pinned = _pinned_grpcio_tools(REPO_ROOT / "pyproject.toml")
    try:
        installed = importlib.metadata.version("grpcio-tools")
    except importlib.metadata.PackageNotFoundError:
        return None
    if pinned is not None and installed != pinned:
        return (
            f"warning: grpcio-tools {installed} is installed but pyproject.toml pins {pinned}; "
            "generated code differs between versions (pip install -e '.[dev]')"
        )
    return None


def run(proto_dir: Path, out_dir: Path, check: bool) -> int:
    packages = top_level_packages(proto_dir)
    with tempfile.TemporaryDirectory(prefix="protogen-") as tmp:
        fresh_root = Path(tmp)
        generate(proto_dir, fresh_root)
        comparison = compare(fresh_root, out_dir, packages)
        if check:
            if not comparison.stale:
                print(f"protogen: generated code under {out_dir} is up to date with {proto_dir}")
                return 0
            print(
                f"protogen: generated code under {out_dir} is stale relative to {proto_dir}:\n"
                f"{comparison.report()}\n{REGENERATE_HINT}",
                file=sys.stderr,
            )
            warning = _version_warning()
            if warning:
                print(warning, file=sys.stderr)
            return 1
        _sync(fresh_root, out_dir, comparison)
    if comparison.stale:
        print(f"protogen: updated under {out_dir}:\n{comparison.report()}")
    else:
        print(f"protogen: generated code under {out_dir} was already up to date")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, description="Generate gpuprobe's Python wire-contract code from .proto files, or check it."
    )
    parser.add_argument(
        "--proto-dir",
        type=Path,
        default=DEFAULT_PROTO_DIR,
        help="root of the .proto tree, passed to protoc as -I (default: %(default)s)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT_DIR,
        help="where generated packages go; gpuprobe/v1/*.proto lands in OUT/gpuprobe/v1 "
        "(default: the repo root, %(default)s)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 and list the files if the generated code under OUT is stale",
    )
    args = parser.parse_args(argv)
    warning = _version_warning()
    if warning and not args.check:
        print(warning, file=sys.stderr)
    try:
        return run(args.proto_dir.resolve(), args.out.resolve(), args.check)
    except ProtogenError as exc:
        print(f"protogen: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
