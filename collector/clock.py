"""Part: collector. A node's clock offset: measured at its stream's Hello, taken out of its batches' timestamps.

A node whose time synchronisation failed (a dead RTC battery, a VM resumed from suspension) stamps
its samples minutes or hours off; refused as out of range, its telemetry would be lost exactly when
an operator needs to see it. So the collector measures each stream's offset once, from the Hello's
``time_unix_ns`` against its own clock on arrival (latency makes the agent look that much behind),
and when it is at least ``CLOCK_CORRECTED_FROM_S`` (1 s) it moves every timestamp of that stream's batches
onto the collector's clock, in whole seconds, before they are checked and stored; the offset itself
is stored with the agent's health point (``agent`` ``clock_offset_s``, docs/schema.md). Smaller
offsets are left alone: they are within the jitter of the measurement and of a node that keeps time.
Whole seconds, because a batch sent again on a later stream (whose Hello measures the offset a few
milliseconds differently) must land on the same timestamps and overwrite itself, and the agent's 1 s
aggregates must stay on their second.

Samples spooled before a step of the node's clock (an NTP correction while the collector was away)
are moved by the offset measured at the next Hello, so they land that step away from where they
belong; the gap or overlap shows in the ``agent`` points' ``clock_offset_s``.
"""

from __future__ import annotations

from gpuprobe.v1 import telemetry_pb2
from gpuprobe.wire.validate import CLOCK_CORRECTED_FROM_S, NS_PER_S

# every repeated sample kind of a batch that carries its own time: derived from the contract, so a kind
# added to SampleBatch later is moved too
_STAMPED = tuple(
    f.name
    for f in telemetry_pb2.SampleBatch.DESCRIPTOR.fields
    if f.message_type is not None and f.is_repeated and "time_unix_ns" in f.message_type.fields_by_name
)


def measured_offset_ns(hello: telemetry_pb2.Hello, received_ns: int) -> int:
    """How far the agent's clock is ahead of the collector's (negative: behind); 0 if the Hello has no time."""
    return hello.time_unix_ns - received_ns if hello.time_unix_ns else 0


def correction_ns(offset_ns: int) -> int:
    """What to take out of the stream's timestamps: the offset in whole seconds, 0 when it is too small."""
    if abs(offset_ns) < CLOCK_CORRECTED_FROM_S * NS_PER_S:
        return 0
    return round(offset_ns / NS_PER_S) * NS_PER_S


def shift_batch(batch: telemetry_pb2.SampleBatch, correction_ns: int) -> None:
    """Take ``correction_ns`` out of every timestamp of ``batch``, in place (zero and unset stay so:
    the validator refuses those, as from any node)."""
    if batch.created_unix_ns:
        batch.created_unix_ns -= correction_ns
    for name in _STAMPED:
        for sample in getattr(batch, name):
            if sample.time_unix_ns:
                sample.time_unix_ns -= correction_ns
    for aggregate in batch.gpu_aggregates:
        if aggregate.start_unix_ns:
            aggregate.start_unix_ns -= correction_ns
