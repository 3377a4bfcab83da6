"""Part: agent. The resolution policy: which GPU samples ship at full rate, which as per-interval aggregates.

``auto`` (the default): outside a high-resolution window every GPU's samples of one
``aggregate_interval_s`` (1 s) become one ``GpuAggregate`` (mean, min, max and last of each per-tick
field, counters as their last value), and the raw samples go to the spool's flight recorder instead
of the wire. A window opens while a probe runs on this node (its ``ProbeEvent`` start until its
end) and for ``hires_after_s`` after a trigger: a thermal slowdown, HW slowdown or HW power brake
in a sample's ``clock_event_reasons``, or a fault event (XID, ECC, lost). Inside a window the raw
samples ship as they are; when a window opens, the flight recorder's last ``flight_recorder_s``
are shipped too (the spool moves them into its sequence), so the moments before the trigger arrive
at full rate. ``full``: every sample ships, as before the policy existed.

The decision is made once per batch take (:meth:`ResolutionPolicy.take`), outside the sampler
thread, from the samples and events of that batch: a trigger counts from the batch it arrives in;
in the batch in which a window closes, the samples up to the close (a probe's end event, a trigger's
``hires_after_s``) and to the end of its interval still ship raw, so a fit of a probe never meets an
aggregate inside its window.
An interval is aggregated once it is complete (a later sample of the same GPU arrived, or the
interval ended an interval ago): its samples wait here across takes, so an interval is never split
over two aggregates with the same timestamp (the second would overwrite the first in InfluxDB).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuprobe.fields import GPU_FIELDS, Aggregate
from gpuprobe.v1 import telemetry_pb2

RESOLUTIONS = ("auto", "full")

# clock_event_reasons bits that open a window: HW slowdown, SW thermal, HW thermal, HW power brake
TRIGGER_REASONS_MASK = 0x8 | 0x20 | 0x40 | 0x80

# the GPU events that open a window (faults; a recovery closes nothing and opens nothing)
FAULT_EVENT_KINDS = frozenset(
    {
        telemetry_pb2.GPU_EVENT_KIND_XID,
        telemetry_pb2.GPU_EVENT_KIND_ECC_SINGLE_BIT,
        telemetry_pb2.GPU_EVENT_KIND_ECC_DOUBLE_BIT,
        telemetry_pb2.GPU_EVENT_KIND_LOST,
    }
)

# the GpuSample fields by how they travel in an aggregate (the field catalogue, in Aggregate's order),
# and the integer fields, whose mean is rounded (sets, not a dict of kinds: this is the faster loop)
_GAUGES, _AVERAGES, _LAST, _BITMASKS = (frozenset(f.name for f in GPU_FIELDS if f.aggregate is a) for a in Aggregate)
_ROUNDED = frozenset(f.name for f in GPU_FIELDS if f.integer)
CLOCK_REASONS = "clock_event_reasons"


def aggregate(samples: Sequence[dict[str, Any]], interval_ns: int) -> list[telemetry_pb2.GpuAggregate]:
    """One ``GpuAggregate`` per GPU and interval of ``samples`` (GpuSample keyword dicts, each GPU's in
    time order), ordered by interval start, then GPU."""
    groups: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for s in samples:
        t = s["time_unix_ns"]
        groups.setdefault((t - t % interval_ns, s["gpu_index"]), []).append(s)
    return [aggregate_one(gpu, start, interval_ns, group) for (start, gpu), group in sorted(groups.items())]


def aggregate_one(
    gpu_index: int, start_ns: int, interval_ns: int, group: Sequence[dict[str, Any]]
) -> telemetry_pb2.GpuAggregate:
    """The aggregate of one GPU's samples of one interval (column by column)."""
    # every field's values (None left out) in time order, in one pass over the samples (this runs for
    # every GPU every second on the event loop; a pass per field had cost more)
    columns: dict[str, list[Any]] = {}
    for s in group:
        for name, v in s.items():
            if v is not None:
                column = columns.get(name)
                if column is None:
                    columns[name] = [v]
                else:
                    column.append(v)
    mean: dict[str, Any] = {}
    low: dict[str, Any] = {}
    high: dict[str, Any] = {}
    last: dict[str, Any] = {}
    for name, values in columns.items():
        if name in _GAUGES:
            m = sum(values) / len(values)
            mean[name] = round(m) if name in _ROUNDED else m
            low[name] = min(values)
            high[name] = max(values)
            last[name] = values[-1]
        elif name in _LAST:
            mean[name] = values[-1]
        elif name in _AVERAGES:
            mean[name] = sum(values) / len(values)
        elif name in _BITMASKS:
            bits = 0
            for r in values:
                bits |= r
            mean[name] = bits
            last[name] = values[-1]
    # one constructor call: the four samples are built from their dicts inside protobuf
    return telemetry_pb2.GpuAggregate(
        start_unix_ns=start_ns,
        interval_ms=interval_ns // 1_000_000,
        gpu_index=gpu_index,
        sample_count=len(group),
        mean=mean,
        min=low,
        max=high,
        last=last,
    )


def is_trigger_sample(sample: dict[str, Any]) -> bool:
    reasons = sample.get(CLOCK_REASONS)
    return bool(reasons and reasons & TRIGGER_REASONS_MASK)


@dataclass
class Decision:
    """What one batch take ships and records."""

    raw: list[dict[str, Any]] = field(default_factory=list)  # GPU samples shipped as they are
    aggregates: list[telemetry_pb2.GpuAggregate] = field(default_factory=list)
    recorded: list[dict[str, Any]] = field(default_factory=list)  # raw samples for the flight recorder
    promote_since_ns: int | None = None  # a window opened: ship the recorder's batches created since then
    hires: bool = False


class ResolutionPolicy:
    """The state of the windows and of the intervals not yet complete; used by one thread at a time."""

    def __init__(
        self,
        mode: str = "auto",
        aggregate_interval_s: float = 1.0,
        hires_after_s: float = 300.0,
        flight_recorder_s: float = 300.0,
    ) -> None:
        if mode not in RESOLUTIONS:
            raise ValueError(f"resolution must be one of {', '.join(RESOLUTIONS)}, not {mode!r}")
        interval_ns = round(aggregate_interval_s * 1e9)
        if interval_ns <= 0 or interval_ns % 1_000_000:
            raise ValueError(
                f"the aggregate interval must be a positive whole number of ms, not {aggregate_interval_s}"
            )
        self.mode = mode
        self.interval_ns = interval_ns
        self.hires_after_ns = round(hires_after_s * 1e9)
        self.flight_recorder_ns = round(flight_recorder_s * 1e9)
        self._hires_until_ns = 0  # end of the trigger window (0: none yet)
        # probes running on this node -> the GPUs whose trainers run them (None: a trainer on the CPU); a
        # probe ends when the last of them has ended, not at the first GPU's end (a study's GPUs finish
        # their last point seconds apart, and the slower one's steady window must not meet aggregates)
        self._probes: dict[str, set[int | None]] = {}
        self._pending: list[dict[str, Any]] = []  # samples of intervals not yet complete
        self._open = False  # whether a window was open at the last take
        self._probe_ended_ns = 0  # when the last running probe ended
        self.triggers = 0  # trigger samples and events seen (a burst counts each)

    @property
    def full(self) -> bool:
        return self.mode == "full"

    @property
    def pending(self) -> int:
        """Samples waiting for their interval to complete."""
        return len(self._pending)

    def hires(self, now_ns: int) -> bool:
        """Whether ``now_ns`` is inside a high-resolution window."""
        return bool(self._probes) or now_ns < self._hires_until_ns

    def observe(
        self,
        samples: Iterable[dict[str, Any]],
        gpu_events: Iterable[telemetry_pb2.GpuEvent] = (),
        probe_events: Iterable[telemetry_pb2.ProbeEvent] = (),
    ) -> None:
        """Opens or extends the windows from one batch's samples and events."""
        for s in samples:
            reasons = s.get(CLOCK_REASONS)
            if reasons and reasons & TRIGGER_REASONS_MASK:
                self._trigger(s["time_unix_ns"])
        for e in gpu_events:
            if e.kind in FAULT_EVENT_KINDS:
                self._trigger(e.time_unix_ns)
        for p in probe_events:
            gpu = p.gpu_index if p.HasField("gpu_index") else None
            if p.kind == telemetry_pb2.PROBE_EVENT_KIND_END:
                running = self._probes.get(p.probe_id)
                if running is None:
                    continue
                running.discard(gpu)
                if not running:
                    del self._probes[p.probe_id]
                    self._probe_ended_ns = max(self._probe_ended_ns, p.time_unix_ns)
            elif p.kind in (telemetry_pb2.PROBE_EVENT_KIND_START, telemetry_pb2.PROBE_EVENT_KIND_PHASE_CHANGE):
                # a phase change of a probe not seen starting: the agent restarted during it
                self._probes.setdefault(p.probe_id, set()).add(gpu)

    def _trigger(self, time_ns: int) -> None:
        self.triggers += 1
        self._hires_until_ns = max(self._hires_until_ns, time_ns + self.hires_after_ns)

    def take(
        self,
        samples: list[dict[str, Any]],
        gpu_events: Sequence[telemetry_pb2.GpuEvent],
        probe_events: Sequence[telemetry_pb2.ProbeEvent],
        now_ns: int,
        final: bool = False,
    ) -> Decision:
        """The decision for one batch: ``samples`` are the batch's GPU samples; ``final``: the agent
        stops, so incomplete intervals are aggregated too."""
        if self.full:
            return Decision(raw=samples, hires=True)
        was_open = self._open
        self.observe(samples, gpu_events, probe_events)
        self._open = self.hires(now_ns)
        if self._open:
            # the intervals begun before the window: aggregated as they are (their samples are in the
            # recorder, shipped raw now too when it is on)
            held, self._pending = self._pending, []
            promote = None if was_open or not self.flight_recorder_ns else now_ns - self.flight_recorder_ns
            return Decision(
                raw=samples, aggregates=aggregate(held, self.interval_ns), promote_since_ns=promote, hires=True
            )
        raw: list[dict[str, Any]] = []
        if was_open:
            # the window closed since the last take: its samples up to the close still ship raw, and so
            # do the rest of the close's interval (an aggregate is stamped at its interval's start, which
            # would fall inside the window): a fit of a probe never meets an aggregate inside its window
            closed_ns = max(self._hires_until_ns, self._probe_ended_ns + 1)  # the first instant outside
            closed_ns = -(-closed_ns // self.interval_ns) * self.interval_ns
            raw = [s for s in samples if s["time_unix_ns"] < closed_ns]
            samples = [s for s in samples if s["time_unix_ns"] >= closed_ns]
        self._pending.extend(samples)
        complete = self._complete(now_ns, final)
        return Decision(
            raw=raw,
            aggregates=aggregate(complete, self.interval_ns),
            recorded=samples if self.flight_recorder_ns else [],
        )

    def _complete(self, now_ns: int, final: bool) -> list[dict[str, Any]]:
        """Removes and returns the pending samples whose interval is complete."""
        if final:
            everything, self._pending = self._pending, []
            return everything
        interval = self.interval_ns
        newest: dict[int, int] = {}  # gpu -> start of its newest interval
        for s in self._pending:
            t = s["time_unix_ns"]
            newest[s["gpu_index"]] = max(newest.get(s["gpu_index"], 0), t - t % interval)
        # a GPU's newest interval is complete once it ended an interval ago (the GPU stopped answering)
        open_start = {gpu: start for gpu, start in newest.items() if now_ns < start + 2 * interval}
        done: list[dict[str, Any]] = []
        keep: list[dict[str, Any]] = []
        for s in self._pending:
            start = open_start.get(s["gpu_index"])
            t = s["time_unix_ns"]
            (keep if start is not None and t - t % interval >= start else done).append(s)
        self._pending = keep
        return done
