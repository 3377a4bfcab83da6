"""Part: core (ground floor). The field catalogue: every field of the ``gpu`` measurement, declared once.

For each field of ``GpuSample`` (proto/gpuprobe/v1/telemetry.proto, in its order) that becomes a field
of ``gpu`` points (docs/schema.md): its InfluxDB type, its unit (as the schema writes it), whether it is
read at every tick or once per health interval, how the agent's aggregate of an interval carries it,
and which fields the rollups keep of it. The agent's resolution policy (``agent/resolution.py``), the
collector's fast path (``collector/encode.py``), the rollup queries (``gpuprobe/influx/retention.py``)
and the importer (``importer/formats.py``) read these facts from here; ``tests/test_fields.py`` checks
the proto and docs/schema.md's tables against them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Aggregate(Enum):
    """How a field travels in the agent's ``GpuAggregate`` of an interval (docs/schema.md's
    "aggregate" column)."""

    GAUGE = "gauge"  # mean (integers rounded), min, max and last
    AVERAGE = "average"  # the mean only: GPM percentages, each already an average over the health interval
    LAST = "last"  # the interval's last value, in `mean`: counters, settings and the 1 Hz health reads
    BITMASK = "bitmask"  # the bitwise OR over the interval in `mean`, the last value in `last`


@dataclass(frozen=True)
class GpuField:
    name: str
    type: str  # InfluxDB field type: float, integer, boolean or string
    unit: str  # as docs/schema.md writes it; "—" for none
    aggregate: Aggregate
    # what each rollup window keeps: the first aggregate under the field's own name, the others
    # (min, max) as `<name>_min`, `<name>_max`; empty: not rolled up
    rollup: tuple[str, ...] = ()
    health: bool = False  # read once per health interval, absent from the other ticks' samples

    @property
    def integer(self) -> bool:
        return self.type == "integer"

    def rollup_fields(self) -> tuple[tuple[str, str, str], ...]:
        """(rollup field, aggregate, raw field) of each rollup field kept of this one."""
        return tuple((f"{self.name}_{agg}" if i else self.name, agg, self.name) for i, agg in enumerate(self.rollup))


_G, _A, _L, _B = Aggregate.GAUGE, Aggregate.AVERAGE, Aggregate.LAST, Aggregate.BITMASK
_PER_TICK: tuple[tuple[str, str, str, Aggregate, tuple[str, ...]], ...] = (
    ("util_pct", "float", "%", _G, ("mean",)),
    ("mem_util_pct", "float", "%", _G, ("mean",)),
    ("mem_used_bytes", "integer", "bytes", _G, ("mean",)),
    ("mem_total_bytes", "integer", "bytes", _L, ("last",)),
    ("power_w", "float", "W", _G, ("mean", "min", "max")),
    ("power_instant_w", "float", "W", _G, ("mean", "max")),
    ("energy_j", "float", "J", _L, ("last",)),
    ("temp_c", "float", "°C", _G, ("mean", "min", "max")),
    ("mem_temp_c", "float", "°C", _G, ("mean", "max")),
    ("fan_pct", "float", "%", _G, ("mean",)),
    ("sm_clock_mhz", "integer", "MHz", _G, ("mean",)),
    ("mem_clock_mhz", "integer", "MHz", _G, ("mean",)),
    ("power_limit_w", "float", "W", _G, ("last",)),
    ("clock_event_reasons", "integer", "bitmask", _B, ("max",)),
    ("pcie_tx_bytes_per_s", "float", "bytes/s", _G, ("mean",)),
    ("pcie_rx_bytes_per_s", "float", "bytes/s", _G, ("mean",)),
)
# none of the health fields is rolled up (query them in the raw policy)
_HEALTH: tuple[tuple[str, str, str, Aggregate], ...] = (
    ("ecc_corrected_volatile", "integer", "errors", _L),
    ("ecc_uncorrected_volatile", "integer", "errors", _L),
    ("ecc_corrected_aggregate", "integer", "errors", _L),
    ("ecc_uncorrected_aggregate", "integer", "errors", _L),
    ("retired_pages_sbe", "integer", "pages", _L),
    ("retired_pages_dbe", "integer", "pages", _L),
    ("retired_pages_pending", "boolean", "—", _L),
    ("remapped_rows_correctable", "integer", "rows", _L),
    ("remapped_rows_uncorrectable", "integer", "rows", _L),
    ("remap_pending", "boolean", "—", _L),
    ("remap_failure", "boolean", "—", _L),
    ("pcie_replay_count", "integer", "replays", _L),
    ("power_violation_us", "integer", "µs", _L),
    ("thermal_violation_us", "integer", "µs", _L),
    ("sync_boost_violation_us", "integer", "µs", _L),
    ("fan_rpm", "float", "RPM", _L),
    ("sm_active_pct", "float", "%", _A),
    ("sm_occupancy_pct", "float", "%", _A),
    ("tensor_active_pct", "float", "%", _A),
    ("dram_bw_util_pct", "float", "%", _A),
    ("fp16_active_pct", "float", "%", _A),
    ("fp32_active_pct", "float", "%", _A),
    ("fp64_active_pct", "float", "%", _A),
    ("nvlink_tx_bytes_per_s", "float", "bytes/s", _L),
    ("nvlink_rx_bytes_per_s", "float", "bytes/s", _L),
    ("health", "string", "—", _L),
    ("health_reason", "string", "—", _L),
)

#: Every field of the ``gpu`` measurement, in GpuSample's order.
GPU_FIELDS: tuple[GpuField, ...] = (
    *(GpuField(name, kind, unit, agg, rollup) for name, kind, unit, agg, rollup in _PER_TICK),
    *(GpuField(name, kind, unit, agg, health=True) for name, kind, unit, agg in _HEALTH),
)
GPU_FIELD: dict[str, GpuField] = {f.name: f for f in GPU_FIELDS}
