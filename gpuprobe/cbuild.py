"""Part: core. Compiles gpuprobe's C libraries (the GPU simulator, the agent's native sampler) with the
machine's C compiler, into a cache keyed by a hash of the source and the flags, so a changed source is
never served stale. ``make sim`` builds both (``python -m gpuprobe.sim.build``,
``python -m gpuprobe.nvml.native``); an installed gpuprobe builds one on first use.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

COMMON_CFLAGS = ("-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror")


@dataclass(frozen=True)
class CLibrary:
    """One shared library built from one C file. ``error`` is the exception raised when it cannot be built."""

    what: str  # "the GPU simulator": for messages
    source: Path
    soname: str
    ldflags: tuple[str, ...]
    env_dir: str  # a variable naming a folder that holds a ready library (nothing is built then)
    cache_name: str  # the cache's sub-folder, when the source's folder is not writable
    error: type[Exception]
    cflags: tuple[str, ...] = COMMON_CFLAGS

    def _cache_root(self) -> Path:
        native = self.source.parent
        if os.access(native, os.W_OK):
            return native / "build"
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return Path(base) / "gpuprobe" / self.cache_name

    def _key(self, compiler: str) -> str:
        digest = hashlib.sha256(self.source.read_bytes())
        digest.update(" ".join([compiler, *self.cflags, *self.ldflags]).encode())
        return digest.hexdigest()[:16]

    def build(self, out_dir: Path | None = None, compiler: str | None = None) -> Path:
        """Compile the library into a folder of its own; returns that folder."""
        cc = compiler or os.environ.get("CC") or "gcc"
        if shutil.which(cc) is None:
            raise self.error(f"no C compiler {cc!r} on PATH: install gcc (apt-get install gcc) or set CC")
        lib_dir = out_dir or self._cache_root() / self._key(cc)
        lib_dir.mkdir(parents=True, exist_ok=True)
        target = lib_dir / self.soname
        tmp = lib_dir / f".{self.soname}.{os.getpid()}.tmp"
        cmd = [cc, *self.cflags, "-o", str(tmp), str(self.source), *self.ldflags]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise self.error(f"compiling {self.what} failed ({' '.join(cmd)}):\n{proc.stderr}")
        tmp.replace(target)  # atomic: a concurrent reader sees the old or the new library, never half
        return lib_dir

    def built(self) -> Path | None:
        """The folder of an up-to-date library, without building it (None: there is none)."""
        override = os.environ.get(self.env_dir)
        if override:
            return Path(override) if (Path(override) / self.soname).exists() else None
        lib_dir = self._cache_root() / self._key(os.environ.get("CC") or "gcc")
        return lib_dir if (lib_dir / self.soname).exists() else None

    def ensure(self) -> Path:
        """The folder that holds an up-to-date library, building it if needed."""
        override = os.environ.get(self.env_dir)
        if override:
            if not (Path(override) / self.soname).exists():
                raise self.error(f"{self.env_dir}={override} has no {self.soname}")
            return Path(override)
        return self.built() or self.build(None, os.environ.get("CC") or "gcc")
