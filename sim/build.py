"""Compiles the simulator library (``libnvidia-ml.so.1``) with the machine's C compiler.

``make sim`` calls ``python -m gpuprobe.sim.build``; ``gpuprobe sim run`` calls :func:`ensure_library`
so an installed gpuprobe builds it on first use. The output is keyed by a hash of the source and
the flags, so a changed source is never served stale.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from gpuprobe.errors import ServiceError

NATIVE_DIR = Path(__file__).resolve().parent / "native"
SOURCE = NATIVE_DIR / "nvml_sim.c"
SONAME = "libnvidia-ml.so.1"
LIB_ENV = "GPUPROBE_SIM_LIB_DIR"
CFLAGS = ["-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror"]
LDFLAGS = [f"-Wl,-soname,{SONAME}", "-lm", "-lpthread"]


class SimBuildError(ServiceError, RuntimeError):
    pass


def _cache_root() -> Path:
    in_tree = NATIVE_DIR / "build"
    if os.access(NATIVE_DIR, os.W_OK):
        return in_tree
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpuprobe" / "sim"


def _build_key(compiler: str) -> str:
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(" ".join([compiler, *CFLAGS, *LDFLAGS]).encode())
    return digest.hexdigest()[:16]


def build(out_dir: Path | None = None, compiler: str | None = None) -> Path:
    """Compile the library into a folder of its own; returns that folder (for LD_LIBRARY_PATH)."""
    cc = compiler or os.environ.get("CC") or "gcc"
    if shutil.which(cc) is None:
        raise SimBuildError(f"no C compiler {cc!r} on PATH: install gcc (apt-get install gcc) or set CC")
    lib_dir = out_dir or _cache_root() / _build_key(cc)
    lib_dir.mkdir(parents=True, exist_ok=True)
    target = lib_dir / SONAME
    tmp = lib_dir / f".{SONAME}.{os.getpid()}.tmp"
    cmd = [cc, *CFLAGS, "-o", str(tmp), str(SOURCE), *LDFLAGS]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise SimBuildError(f"compiling the GPU simulator failed ({' '.join(cmd)}):\n{proc.stderr}")
    tmp.replace(target)  # atomic: a concurrent reader sees the old or the new library, never half
    return lib_dir


def ensure_library() -> Path:
    """The folder that holds an up-to-date ``libnvidia-ml.so.1``, building it if needed."""
    override = os.environ.get(LIB_ENV)
    if override:
        lib_dir = Path(override)
        if not (lib_dir / SONAME).exists():
            raise SimBuildError(f"{LIB_ENV}={override} has no {SONAME}")
        return lib_dir
    cc = os.environ.get("CC") or "gcc"
    lib_dir = _cache_root() / _build_key(cc)
    if (lib_dir / SONAME).exists():
        return lib_dir
    return build(lib_dir, cc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m gpuprobe.sim.build", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", type=Path, help="folder to write libnvidia-ml.so.1 into (default: a cache)")
    args = parser.parse_args(argv)
    try:
        lib_dir = build(args.out) if args.out else ensure_library()
    except SimBuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(lib_dir / SONAME)
    return 0


if __name__ == "__main__":
    sys.exit(main())
