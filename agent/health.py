"""Part: agent. Each GPU's health verdict (``GpuHealth``) and its reason, from events and the health interval's reads.

The rule (docs/agent.md, "GPU health"), per GPU:

- **failed** when any of: the GPU is lost (GPU_IS_LOST, or another answer after which it gives
  nothing: RESET_REQUIRED, DRIVER_NOT_LOADED, LIB_RM_VERSION_MISMATCH, UNKNOWN); an XID in
  :data:`FAILING_XIDS` (79, 48, 94, 95, 64) was seen since the GPU was last reset or the agent
  started; a double-bit ECC event was seen since then; the uncorrected volatile ECC count is above 0;
  a row remap failed;
- else **degraded** when any of: a row remap or a page retirement is pending; an XID in
  :data:`DEGRADING_XIDS` (63, 74, 92) was seen since the last reset; an NVLink CRC (flit or data) or
  replay error counter grew in the last :data:`NVLINK_WINDOW_S` (60) s; thermal slowdown
  (``clock_event_reasons & 0x60`` or ``& 0x8``) in every health read for :data:`THERMAL_HOLD_S` (10) s or
  longer;
- else **healthy**.

"Reset" means: the volatile ECC counters went down (a GPU reset or driver reload zeroes them) or
the GPU answered again after it was lost. The reason is every cause of the worst level, joined by
``; `` (for example ``XID 79: GPU has fallen off the bus``).

:attr:`HealthTracker.health` is ``dict[int, tuple[int, str]]``: GPU index -> (``GpuHealth`` value,
reason). It is replaced by a new dict whenever a verdict changes, never changed in place, so another
thread (the control plane) may read it at any time. Events (XIDs, ECC, lost / recovered) change it
at once; the counters at each GPU's health read. ``on_change`` (optional) is called after each
replacement, in the thread that made it, outside the tracker's lock. Every change of a verdict is
logged (``GPU 0 health: failed (XID 79: GPU has fallen off the bus)``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gpuprobe.agent.sensors.events import lost_reason
from gpuprobe.v1 import common_pb2, telemetry_pb2

FAILING_XIDS = frozenset({79, 48, 94, 95, 64})
DEGRADING_XIDS = frozenset({63, 74, 92})
NVLINK_WINDOW_S = 60.0
THERMAL_HOLD_S = 10.0
THERMAL_REASONS = 0x60 | 0x8  # SW thermal (0x20), HW thermal (0x40), HW slowdown (0x8)

HEALTHY = common_pb2.GPU_HEALTH_HEALTHY
DEGRADED = common_pb2.GPU_HEALTH_DEGRADED
FAILED = common_pb2.GPU_HEALTH_FAILED

Verdict = tuple[int, str]
NAMES: dict[int, str] = {HEALTHY: "healthy", DEGRADED: "degraded", FAILED: "failed"}

log = logging.getLogger(__name__)


@dataclass
class _State:
    lost: bool = False
    lost_reason: str = ""  # NVML's answer (events.lost_reason)
    xids: dict[int, str] = field(default_factory=dict)  # code -> text, seen since the last reset
    dbe_event: bool = False
    ecc_volatile_total: int | None = None
    ecc_uncorrected_volatile: int = 0
    remap_failure: bool = False
    remap_pending: bool = False
    retired_pending: bool = False
    nvlink_errors: int | None = None
    nvlink_grew_mono: float | None = None
    thermal_since_mono: float | None = None

    def reset(self) -> None:
        self.xids.clear()
        self.dbe_event = False


def verdict(s: _State, now_mono: float) -> Verdict:
    """The rule (module docstring) over one GPU's state."""
    failed: list[str] = []
    if s.lost:
        failed.append(s.lost_reason)
    failed.extend(f"XID {code}: {text}" for code, text in s.xids.items() if code in FAILING_XIDS)
    if s.ecc_uncorrected_volatile > 0:
        failed.append(f"{s.ecc_uncorrected_volatile} uncorrected ECC errors since the driver loaded")
    elif s.dbe_event:
        failed.append("double-bit (uncorrected) ECC error")
    if s.remap_failure:
        failed.append("row remap failure: the GPU needs service")
    if failed:
        return FAILED, "; ".join(failed)
    degraded: list[str] = []
    if s.remap_pending:
        degraded.append("row remap pending: reset the GPU")
    if s.retired_pending:
        degraded.append("page retirement pending: reset the GPU")
    degraded.extend(f"XID {code}: {text}" for code, text in s.xids.items() if code in DEGRADING_XIDS)
    if s.nvlink_grew_mono is not None and now_mono - s.nvlink_grew_mono <= NVLINK_WINDOW_S:
        degraded.append(f"NVLink CRC/replay errors grew in the last {NVLINK_WINDOW_S:.0f} s")
    if s.thermal_since_mono is not None and now_mono - s.thermal_since_mono >= THERMAL_HOLD_S:
        degraded.append(f"thermal slowdown for {now_mono - s.thermal_since_mono:.0f} s")
    if degraded:
        return DEGRADED, "; ".join(degraded)
    return HEALTHY, ""


class HealthTracker:
    """The verdicts of every GPU; fed by the events thread and the sampler thread."""

    def __init__(self, gpus: Iterable[int] = (), on_change: Callable[[], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._states: dict[int, _State] = {i: _State() for i in gpus}
        self.on_change = on_change
        self.health: dict[int, Verdict] = {i: (HEALTHY, "") for i in self._states}

    def _state(self, index: int) -> _State:
        s = self._states.get(index)
        if s is None:
            s = self._states[index] = _State()
        return s

    def _publish(self, now_mono: float, index: int) -> bool:
        """Replaces ``health`` if GPU ``index``'s verdict changed; True if it did (called with the lock held).

        Only that GPU's verdict is worked out: the others' change with their own events and reads (a
        verdict that changes with time alone, such as the end of the NVLink window, at the GPU's next
        health read), and 8 verdicts per read had been most of the tracker's cost."""
        old = self.health
        mine = verdict(self._states[index], now_mono)
        if old.get(index) == mine:
            return False
        level, reason = mine
        log.log(
            logging.INFO if level == HEALTHY else logging.WARNING,
            "GPU %d health: %s%s",
            index,
            NAMES.get(level, str(level)),
            f" ({reason})" if reason else "",
        )
        new = dict(old)
        new[index] = mine
        self.health = dict(sorted(new.items()))  # replaced, never mutated: readers in other threads see old or new
        return True

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def event(self, event: telemetry_pb2.GpuEvent, now_mono: float | None = None) -> None:
        """A GPU event (from NVML's event set or the sensor's lost / recovered hook)."""
        now = time.monotonic() if now_mono is None else now_mono
        with self._lock:
            s = self._state(event.gpu_index)
            if event.kind == telemetry_pb2.GPU_EVENT_KIND_XID:
                code = int(event.data)
                if code in FAILING_XIDS or code in DEGRADING_XIDS:
                    s.xids[code] = event.text.split(": ", 1)[-1] if event.text else f"XID {code}"
            elif event.kind == telemetry_pb2.GPU_EVENT_KIND_ECC_DOUBLE_BIT:
                s.dbe_event = True
            elif event.kind == telemetry_pb2.GPU_EVENT_KIND_LOST:
                s.lost = True
                s.lost_reason = lost_reason(event)
            elif event.kind == telemetry_pb2.GPU_EVENT_KIND_RECOVERED:
                s.lost = False
                s.reset()  # it answers again: reset (or re-attached)
                s.ecc_volatile_total = None
            changed = self._publish(now, event.gpu_index)
        if changed:
            self._changed()

    def observe(
        self, index: int, sample: dict[str, Any], nvlink_errors: int | None = None, now_mono: float | None = None
    ) -> Verdict:
        """One health-interval sample of GPU ``index`` (``GpuSample`` keys) and the sum of its NVLink
        CRC and replay error counters (None: not read); its verdict after it."""
        now = time.monotonic() if now_mono is None else now_mono
        with self._lock:
            s = self._state(index)
            s.lost = False  # it answered
            corrected = sample.get("ecc_corrected_volatile")
            uncorrected = sample.get("ecc_uncorrected_volatile")
            if corrected is not None or uncorrected is not None:
                total = int(corrected or 0) + int(uncorrected or 0)
                if s.ecc_volatile_total is not None and total < s.ecc_volatile_total:
                    s.reset()  # the volatile counters went down: the GPU was reset
                s.ecc_volatile_total = total
                s.ecc_uncorrected_volatile = int(uncorrected or 0)
            s.remap_failure = bool(sample.get("remap_failure", False))
            s.remap_pending = bool(sample.get("remap_pending", False))
            s.retired_pending = bool(sample.get("retired_pages_pending", False))
            if nvlink_errors is not None:
                if s.nvlink_errors is not None and nvlink_errors > s.nvlink_errors:
                    s.nvlink_grew_mono = now
                s.nvlink_errors = nvlink_errors
            reasons = sample.get("clock_event_reasons")
            if reasons is not None and int(reasons) & THERMAL_REASONS:
                if s.thermal_since_mono is None:
                    s.thermal_since_mono = now
            else:
                s.thermal_since_mono = None
            changed = self._publish(now, index)
            result = self.health.get(index, (HEALTHY, ""))
        if changed:
            self._changed()
        return result
