"""Part: collector. gzip for the WAL rows and the write requests: ISA-L when installed (several times faster than zlib
at level 1, and smaller output), zlib otherwise. Both write and read the standard gzip format."""

from __future__ import annotations

import importlib
import zlib
from typing import Any

_isal: Any
try:
    _isal = importlib.import_module("isal.igzip")
except ImportError:  # pragma: no cover - the collector extra installs isal where wheels exist
    _isal = None


def gzip_bytes(data: bytes, level: int = 1) -> bytes:
    """``data`` as one gzip member; ISA-L levels 0-3 (higher levels use 3), zlib 0-9."""
    if _isal is not None:
        return bytes(_isal.compress(data, min(level, 3)))
    compressor = zlib.compressobj(level, zlib.DEFLATED, 31)  # wbits 31: the gzip container
    return compressor.compress(data) + compressor.flush()


def gunzip_bytes(data: bytes) -> bytes:
    if _isal is not None:
        return bytes(_isal.decompress(data))
    return zlib.decompress(data, 47)  # 32 + 15: a gzip (or zlib) container
