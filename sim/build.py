"""Part: sim. Compiles the simulator library (``libnvidia-ml.so.1``) with the machine's C compiler.

``make sim`` calls ``python -m gpuprobe.sim.build``; ``gpuprobe sim run`` calls :func:`ensure_library`
so an installed gpuprobe builds it on first use. The output is keyed by a hash of the source and
the flags, so a changed source is never served stale (:mod:`gpuprobe.cbuild`, which builds the agent's
native sampler the same way).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpuprobe.cbuild import CLibrary
from gpuprobe.errors import ServiceError

NATIVE_DIR = Path(__file__).resolve().parent / "native"
SOURCE = NATIVE_DIR / "nvml_sim.c"
SONAME = "libnvidia-ml.so.1"
LIB_ENV = "GPUPROBE_SIM_LIB_DIR"


class SimBuildError(ServiceError, RuntimeError):
    pass


LIBRARY = CLibrary(
    what="the GPU simulator",
    source=SOURCE,
    soname=SONAME,
    ldflags=(f"-Wl,-soname,{SONAME}", "-lm", "-lpthread"),
    env_dir=LIB_ENV,
    cache_name="sim",
    error=SimBuildError,
)


def build(out_dir: Path | None = None, compiler: str | None = None) -> Path:
    """Compile the library into a folder of its own; returns that folder (for LD_LIBRARY_PATH)."""
    return LIBRARY.build(out_dir, compiler)


def ensure_library() -> Path:
    """The folder that holds an up-to-date ``libnvidia-ml.so.1``, building it if needed."""
    return LIBRARY.ensure()


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
