"""Part: agent. The trainer socket: a local unix stream socket where the trainer on this node reports its progress.

The trainer writes JSON lines (one object per line, UTF-8, at most 64 KiB); each becomes a
``TrainerSample`` or ``ProbeEvent`` in the same batches as the node's other samples. The format is
documented for trainer authors in ``docs/agent.md`` ("Trainer socket"):

    {"type": "progress", "workload": "resnet50", "step": 120, "batch_size": 64, "phase": "steady",
     "samples_per_s": 812.5, "step_time_s": 0.0788, "loss": 2.31, "gpu": 0, "probe": "p-1"}
    {"type": "probe_event", "probe": "p-1", "workload": "resnet50", "kind": "start", "phase": "idle",
     "status": "running", "message": ""}

A line that is not valid (bad JSON, unknown type, missing or mistyped key, oversized) is refused
with one warning in the agent's log and one ``{"error": "..."}`` line back to the sender; the
connection stays open and nothing else is affected. Unknown keys are ignored, so a newer trainer can
add keys without breaking an older agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import stat
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpuprobe.errors import ProtocolError
from gpuprobe.v1 import telemetry_pb2
from gpuprobe.wire.vocabulary import PHASES, PROBE_EVENT_KINDS, STATUSES

log = logging.getLogger(__name__)

MAX_LINE_BYTES = 64 * 1024
MAX_STRING_CHARS = 256
MAX_UINT32 = 2**32 - 1
MAX_UINT64 = 2**64 - 1

DEVICES = {
    "cuda": telemetry_pb2.TRAINER_DEVICE_CUDA,
    "cpu": telemetry_pb2.TRAINER_DEVICE_CPU,
    "sim": telemetry_pb2.TRAINER_DEVICE_SIM,
}

Message = telemetry_pb2.TrainerSample | telemetry_pb2.ProbeEvent


class BadMessage(ProtocolError, ValueError):
    pass


def _string(obj: Mapping[str, Any], key: str, required: bool = False, max_chars: int = MAX_STRING_CHARS) -> str:
    value = obj.get(key)
    if value is None:
        if required:
            raise BadMessage(f"{key!r} is required")
        return ""
    if not isinstance(value, str):
        raise BadMessage(f"{key!r} must be a string, not {type(value).__name__}")
    if len(value) > max_chars:
        raise BadMessage(f"{key!r} is longer than {max_chars} characters")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise BadMessage(f"{key!r} contains control characters")
    if required and not value:
        raise BadMessage(f"{key!r} must not be empty")
    return value


def _integer(obj: Mapping[str, Any], key: str, maximum: int, required: bool = False) -> int | None:
    value = obj.get(key)
    if value is None:
        if required:
            raise BadMessage(f"{key!r} is required")
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadMessage(f"{key!r} must be an integer, not {type(value).__name__}")
    if not 0 <= value <= maximum:
        raise BadMessage(f"{key!r} must be between 0 and {maximum}, not {value}")
    return value


def _number(obj: Mapping[str, Any], key: str, allow_non_finite: bool = False) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadMessage(f"{key!r} must be a number, not {type(value).__name__}")
    if not math.isfinite(value):
        if allow_non_finite:
            return None
        raise BadMessage(f"{key!r} must be finite, not {value}")
    return float(value)


def _choice(obj: Mapping[str, Any], key: str, choices: Mapping[str, int], required: bool) -> int:
    value = obj.get(key)
    if value is None:
        if required:
            raise BadMessage(f"{key!r} is required (one of {', '.join(choices)})")
        return 0
    if value not in choices:
        raise BadMessage(f"{key!r} must be one of {', '.join(choices)}, not {value!r}")
    return choices[value]


def parse_line(line: bytes, now_ns: int) -> Message:
    """One line of the trainer socket as a TrainerSample or ProbeEvent; BadMessage says what is wrong."""
    try:
        obj = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadMessage(f"not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise BadMessage(f"a message must be a JSON object, not {type(obj).__name__}")
    kind = obj.get("type")
    t_ns = _integer(obj, "time_unix_ns", 2**63 - 1) or now_ns
    if kind == "progress":
        sample = telemetry_pb2.TrainerSample(
            time_unix_ns=t_ns,
            probe_id=_string(obj, "probe"),
            workload=_string(obj, "workload", required=True),
            step=_integer(obj, "step", MAX_UINT64, required=True),
            batch_size=_integer(obj, "batch_size", MAX_UINT32) or 0,
            phase=_choice(obj, "phase", PHASES, required=True),  # type: ignore[arg-type]
            device=_choice(obj, "device", DEVICES, required=False),  # type: ignore[arg-type]
        )
        for key, attr in (("gpu", "gpu_index"), ("point", "point")):
            number = _integer(obj, key, MAX_UINT32)
            if number is not None:
                setattr(sample, attr, number)
        for key in ("samples_per_s", "step_time_s"):
            value = _number(obj, key)
            if value is not None:
                setattr(sample, key, value)
        loss = _number(obj, "loss", allow_non_finite=True)
        if loss is not None:
            sample.loss = loss
        return sample
    if kind == "probe_event":
        event = telemetry_pb2.ProbeEvent(
            time_unix_ns=t_ns,
            probe_id=_string(obj, "probe", required=True),
            workload=_string(obj, "workload"),
            kind=_choice(obj, "kind", PROBE_EVENT_KINDS, required=True),  # type: ignore[arg-type]
            phase=_choice(obj, "phase", PHASES, required=False),  # type: ignore[arg-type]
            status=_choice(obj, "status", STATUSES, required=False),  # type: ignore[arg-type]
            message=_string(obj, "message", max_chars=4096),
            power_limit=_string(obj, "power_limit", max_chars=64),
        )
        for key, attr, maximum in (
            ("gpu", "gpu_index", MAX_UINT32),
            ("point", "point", MAX_UINT32),
            ("batch_size", "batch_size", MAX_UINT32),
            ("steady_samples", "steady_samples", MAX_UINT64),
        ):
            number = _integer(obj, key, maximum)
            if number is not None:
                setattr(event, attr, number)
        for key in ("power_limit_w", "temp_slowdown_c"):
            value = _number(obj, key)
            if value is not None:
                setattr(event, key, value)
        return event
    raise BadMessage(f"'type' must be 'progress' or 'probe_event', not {kind!r}")


class TrainerInput:
    """Listens on ``path``; ``deliver`` receives every valid message (in the event loop)."""

    def __init__(
        self,
        path: Path,
        deliver: Callable[[Message], None],
        on_error: Callable[[], None] | None = None,
        mode: int = 0o660,
    ) -> None:
        self.path = path
        self._deliver = deliver
        self._on_error = on_error
        self._mode = mode
        self._server: asyncio.AbstractServer | None = None
        self._connections = 0

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(self.path.lstat().st_mode):
                self.path.unlink()  # left behind by a previous run
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._server = await asyncio.start_unix_server(self._handle, path=str(self.path))
        os.chmod(self.path, self._mode)
        log.info("trainer socket: %s", self.path)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            self._server = None
        with contextlib.suppress(OSError):
            self.path.unlink()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections += 1
        peer = f"trainer connection {self._connections}"
        buf = bytearray()
        discarding = False
        try:
            while True:
                chunk = await reader.read(65536)
                if not chunk:
                    if buf and not discarding:
                        await self._line(bytes(buf), peer, writer)
                    return
                buf += chunk
                while True:
                    end = buf.find(b"\n")
                    if end < 0:
                        if len(buf) > MAX_LINE_BYTES:
                            if not discarding:
                                await self._refuse(peer, writer, f"line longer than {MAX_LINE_BYTES} bytes; discarded")
                            discarding = True
                            buf.clear()
                        break
                    line = bytes(buf[:end])
                    del buf[: end + 1]
                    if discarding:
                        discarding = False  # the end of the oversized line
                        continue
                    if len(line) > MAX_LINE_BYTES:
                        await self._refuse(peer, writer, f"line longer than {MAX_LINE_BYTES} bytes; discarded")
                        continue
                    await self._line(line, peer, writer)
        except (ConnectionError, OSError):
            return
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _line(self, line: bytes, peer: str, writer: asyncio.StreamWriter) -> None:
        if not line.strip():
            return
        try:
            message = parse_line(line, time.time_ns())
        except BadMessage as e:
            await self._refuse(peer, writer, str(e))
            return
        self._deliver(message)

    async def _refuse(self, peer: str, writer: asyncio.StreamWriter, reason: str) -> None:
        log.warning("trainer socket %s: refused a line from %s: %s", self.path, peer, reason)
        if self._on_error is not None:
            self._on_error()
        with contextlib.suppress(Exception):
            writer.write(json.dumps({"error": reason}).encode() + b"\n")
            await asyncio.wait_for(writer.drain(), 1.0)  # a trainer that never reads must not stall us
