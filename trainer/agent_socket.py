"""Part: trainer. Reports the trainer's progress to the local agent's trainer socket.

The agent listens on a unix stream socket (``gpuprobe agent --trainer-socket PATH``) and turns each
JSON line it receives into a ``TrainerSample`` (the ``trainer`` measurement) or a ``ProbeEvent``
(the ``probe`` measurement) in its telemetry stream (docs/agent.md, "Trainer socket"; docs/wire.md).
This module is the one place the trainer writes that format::

    {"type": "progress", "time_unix_ns": 1767225600123456789, "workload": "resnet50", "step": 120,
     "batch_size": 64, "phase": "steady", "samples_per_s": 812.5, "step_time_s": 0.0788,
     "loss": 2.31, "gpu": 0, "probe": "p-1"}
    {"type": "probe_event", "time_unix_ns": 1767225600123456789, "probe": "p-1",
     "workload": "resnet50", "kind": "phase_change", "phase": "steady", "status": "running",
     "message": ""}

In a study (``--plan``) both also carry ``point`` (the study point's index), and phase changes carry
``batch_size``, ``power_limit`` (the requested label), ``power_limit_w`` (the limit set) and
``temp_slowdown_c``; a point the node does not run is one ``probe_event`` with kind
``point_refused``. ``device`` (``cuda``, ``cpu``, ``sim``) says what computed the figures.
``gpu`` is absent on a CPU run, ``probe`` on a local run without a probe id (and ``probe_event``
lines are sent only with a probe id); ``loss``, ``samples_per_s`` and ``step_time_s`` are absent
when there is no value (idle phases, the idle workload, a non-finite loss). Phases are ``pending``,
``idle``, ``warmup``, ``steady``, ``cooldown`` and ``done``; event kinds ``start``,
``phase_change`` and ``end``; statuses ``running``, ``succeeded``, ``failed`` and ``cancelled``.

Reporting never stops or slows training: without an agent (no socket, or the agent restarting) the
reporter warns once, drops what it cannot send and tries to connect again every few seconds. The
agent answers a line it refuses with ``{"error": "..."}``; the reporter logs those.
"""

from __future__ import annotations

import json
import logging
import math
import socket
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

RECONNECT_INTERVAL_S = 5.0
SEND_TIMEOUT_S = 0.5


def progress_line(
    *,
    workload: str,
    step: int,
    batch_size: int,
    phase: str,
    time_unix_ns: int,
    samples_per_s: float | None = None,
    step_time_s: float | None = None,
    loss: float | None = None,
    gpu: int | None = None,
    probe: str = "",
    device: str = "",
    point: int | None = None,
) -> dict[str, Any]:
    """One ``progress`` message (absent values are left out, never sent as null or NaN)."""
    line: dict[str, Any] = {
        "type": "progress",
        "time_unix_ns": time_unix_ns,
        "workload": workload,
        "step": step,
        "batch_size": batch_size,
        "phase": phase,
    }
    for key, value in (("samples_per_s", samples_per_s), ("step_time_s", step_time_s), ("loss", loss)):
        if value is not None and math.isfinite(value):
            line[key] = float(value)
    if gpu is not None:
        line["gpu"] = gpu
    if probe:
        line["probe"] = probe
    if device:
        line["device"] = device
    if point is not None:
        line["point"] = point
    return line


def probe_event_line(
    *,
    probe: str,
    workload: str,
    kind: str,
    phase: str,
    status: str,
    time_unix_ns: int,
    message: str = "",
    gpu: int | None = None,
    study: dict[str, Any] | None = None,
    steady_samples: int | None = None,
) -> dict[str, Any]:
    """One ``probe_event`` message: ``kind`` is start, phase_change, end or point_refused.

    ``study`` holds a study point's keys (``point``, ``batch_size``, ``power_limit``,
    ``power_limit_w``, ``temp_slowdown_c``); absent values are left out. ``steady_samples``: on the
    event that ends a steady phase, the samples processed in it."""
    line: dict[str, Any] = {
        "type": "probe_event",
        "time_unix_ns": time_unix_ns,
        "probe": probe,
        "workload": workload,
        "kind": kind,
        "phase": phase,
        "status": status,
        "message": message[:4096],
    }
    if gpu is not None:
        line["gpu"] = gpu
    if steady_samples is not None:
        line["steady_samples"] = steady_samples
    for key, value in (study or {}).items():
        if value is not None and value != "":
            line[key] = value
    return line


class AgentReporter:
    """Sends JSON lines to the agent's trainer socket, best effort."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._sock: socket.socket | None = None
        self._next_attempt = 0.0
        self._warned = False
        self._inbox = b""
        self.sent = 0
        self.dropped = 0

    def _connect(self) -> socket.socket | None:
        now = time.monotonic()
        if self._sock is not None:
            return self._sock
        if now < self._next_attempt:
            return None
        self._next_attempt = now + RECONNECT_INTERVAL_S
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(SEND_TIMEOUT_S)
        try:
            sock.connect(str(self.path))
        except OSError as e:
            sock.close()
            if not self._warned:
                log.warning(
                    "no agent on the trainer socket %s (%s); progress is printed only (retrying every %.0f s)",
                    self.path,
                    e.strerror or e,
                    RECONNECT_INTERVAL_S,
                )
                self._warned = True
            return None
        if self._warned:
            log.info("connected to the agent's trainer socket %s", self.path)
        self._warned = False
        self._sock = sock
        return sock

    def send(self, message: dict[str, Any]) -> bool:
        """Send one message; False when it was dropped (no agent)."""
        sock = self._connect()
        if sock is None:
            self.dropped += 1
            return False
        data = json.dumps(message, separators=(",", ":"), allow_nan=False).encode() + b"\n"
        try:
            sock.sendall(data)
        except OSError as e:
            log.warning("lost the agent's trainer socket %s: %s", self.path, e)
            self._close()
            self.dropped += 1
            return False
        self.sent += 1
        self._read_errors(sock)
        return True

    def _read_errors(self, sock: socket.socket) -> None:
        """Log the agent's refusals (``{"error": ...}`` lines) without ever blocking."""
        try:
            sock.setblocking(False)
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    self._close()
                    return
                self._inbox += chunk
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._close()
            return
        finally:
            if self._sock is not None:
                self._sock.settimeout(SEND_TIMEOUT_S)
        *lines, self._inbox = self._inbox.split(b"\n")
        for line in lines:
            if line.strip():
                log.warning("the agent refused a progress line: %s", line.decode(errors="replace"))

    def _close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def close(self) -> None:
        self._close()
