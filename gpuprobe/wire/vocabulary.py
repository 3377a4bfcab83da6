"""Part: wire (ground floor). The words of a probe's life: its phases, statuses and event kinds.

A trainer writes the names in its JSON lines (docs/trainer.md), the agent turns them into protobuf
values (``agent/trainer_input.py``), the collector back into the ``phase``, ``status`` and ``kind``
values of the points it writes (``collector/encode.py``, docs/schema.md), and the control plane
into its progress messages (``control/probe_run.py``). One table each, so the ends cannot drift apart.
"""

from __future__ import annotations

from gpuprobe.v1 import common_pb2, telemetry_pb2

#: A probe's phases, in the order they run (``idle`` is the idle baseline).
PHASES: dict[str, common_pb2.ProbePhase] = {
    "pending": common_pb2.PROBE_PHASE_PENDING,
    "idle": common_pb2.PROBE_PHASE_IDLE_BASELINE,
    "warmup": common_pb2.PROBE_PHASE_WARMUP,
    "steady": common_pb2.PROBE_PHASE_STEADY,
    "cooldown": common_pb2.PROBE_PHASE_COOLDOWN,
    "done": common_pb2.PROBE_PHASE_DONE,
}
PHASE_NAMES: dict[int, str] = {value: name for name, value in PHASES.items()}

STATUSES: dict[str, common_pb2.ProbeStatus] = {
    "running": common_pb2.PROBE_STATUS_RUNNING,
    "succeeded": common_pb2.PROBE_STATUS_SUCCEEDED,
    "failed": common_pb2.PROBE_STATUS_FAILED,
    "cancelled": common_pb2.PROBE_STATUS_CANCELLED,
}
STATUS_NAMES: dict[int, str] = {value: name for name, value in STATUSES.items()}

#: A study point a node did not run. The event carries the phase the trainer was in when it refused,
#: and is no phase change: the phases and steady windows built from the events skip it.
POINT_REFUSED = "point_refused"
#: The kinds of ``ProbeEvent`` (a trainer's ``probe`` lines).
PROBE_EVENT_KINDS: dict[str, telemetry_pb2.ProbeEventKind] = {
    "start": telemetry_pb2.PROBE_EVENT_KIND_START,
    "phase_change": telemetry_pb2.PROBE_EVENT_KIND_PHASE_CHANGE,
    "end": telemetry_pb2.PROBE_EVENT_KIND_END,
    POINT_REFUSED: telemetry_pb2.PROBE_EVENT_KIND_POINT_REFUSED,
}
PROBE_EVENT_KIND_NAMES: dict[int, str] = {value: name for name, value in PROBE_EVENT_KINDS.items()}


def marks_a_phase(kind: str | None) -> bool:
    """Whether a ``probe`` event of this kind starts or ends a phase of its GPU: every kind but
    :data:`POINT_REFUSED`. The one rule that ``gpuprobe model``'s phases and ``study report``'s steady
    windows read the events by (the model once made a refused slot a steady phase)."""
    return kind != POINT_REFUSED
