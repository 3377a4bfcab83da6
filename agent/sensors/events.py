"""Part: agent. GPU events: NVML's event set (XID, ECC, clock and power source changes) read in a thread of its own.

:class:`EventThread` waits on one NVML event set (:meth:`GpuSensor.open_events
<gpuprobe.nvml.sensor.GpuSensor.open_events>`: every known GPU, registered for the subset of
:data:`EVENT_TYPES` it supports) with a timeout of :data:`WAIT_MS` (a stop waits at most that long: the
service joins the thread for 2 s; NVML's wait blocks until an event, so each timeout is one wake-up), turns
each event into a ``GpuEvent`` stamped ``time.time_ns()`` at receipt, and hands it to ``sink`` (the
sampler's, which puts it into the open batch and tells the health tracker). The GPU sensor's
lost / recovered hook makes ``LOST`` / ``RECOVERED`` events the same way (:func:`lost_event`).

Each event is made once, when NVML delivers it, and goes into a batch like every sample; the spool
and the collector's replay handling make it stored exactly once. Nothing is re-emitted at a restart
(NVML's event sets deliver only what happens after they are created).

Clock change events can come many times a second on a GPU whose clocks move with load: at most one
per GPU per :data:`CLOCK_CHANGE_MIN_INTERVAL_S` is kept, the others are counted
(:attr:`EventThread.clock_changes_dropped`) and dropped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gpuprobe.nvml.errors import NVML_ERROR_GPU_IS_LOST, gone_reason
from gpuprobe.nvml.sensor import EventSource, RawEvent
from gpuprobe.v1 import telemetry_pb2

log = logging.getLogger(__name__)

# nvmlEventType bits (NVML's ABI)
EVENT_SINGLE_BIT_ECC = 0x1
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_XID = 0x8
EVENT_CLOCK = 0x10
EVENT_POWER_SOURCE = 0x80
EVENT_TYPES = EVENT_XID | EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC | EVENT_CLOCK | EVENT_POWER_SOURCE

KINDS: dict[int, telemetry_pb2.GpuEventKind] = {
    EVENT_XID: telemetry_pb2.GPU_EVENT_KIND_XID,
    EVENT_SINGLE_BIT_ECC: telemetry_pb2.GPU_EVENT_KIND_ECC_SINGLE_BIT,
    EVENT_DOUBLE_BIT_ECC: telemetry_pb2.GPU_EVENT_KIND_ECC_DOUBLE_BIT,
    EVENT_CLOCK: telemetry_pb2.GPU_EVENT_KIND_CLOCK_CHANGE,
    EVENT_POWER_SOURCE: telemetry_pb2.GPU_EVENT_KIND_POWER_SOURCE_CHANGE,
}

WAIT_MS = 1000  # was 200: five wake-ups a second cost 0.04 % of a core on the 2-vCPU bench VM, for nothing
CLOCK_CHANGE_MIN_INTERVAL_S = 1.0

# NVIDIA's XID catalog (https://docs.nvidia.com/deploy/xid-errors/), short descriptions
XID_TEXT: dict[int, str] = {
    13: "Graphics engine exception",
    31: "GPU memory page fault",
    32: "Invalid or corrupted push buffer stream",
    38: "Driver firmware error",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors",
    48: "Double-bit ECC error",
    56: "Display engine error",
    57: "Error programming video memory interface",
    61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "NVDEC0 exception",
    69: "Graphics engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    109: "Context switch timeout error",
    119: "GSP RPC timeout",
    120: "GSP error",
    121: "C2C link corrected error",
    140: "Unrecovered ECC error",
}


def xid_text(code: int) -> str:
    """``XID 79: GPU has fallen off the bus``; an XID not in the table names the catalog."""
    text = XID_TEXT.get(code)
    return f"XID {code}: {text}" if text else f"XID {code} (see NVIDIA's XID catalog)"


def make_event(raw: RawEvent, time_unix_ns: int) -> telemetry_pb2.GpuEvent | None:
    """The ``GpuEvent`` of one NVML event (None for an event type it does not know)."""
    kind = KINDS.get(raw.event_type)
    if kind is None:
        return None
    event = telemetry_pb2.GpuEvent(time_unix_ns=time_unix_ns, gpu_index=raw.gpu_index, kind=kind, data=raw.data)
    if kind == telemetry_pb2.GPU_EVENT_KIND_XID:
        event.text = xid_text(raw.data)
    elif kind == telemetry_pb2.GPU_EVENT_KIND_ECC_DOUBLE_BIT:
        event.text = "double-bit (uncorrected) ECC error"
    elif kind == telemetry_pb2.GPU_EVENT_KIND_ECC_SINGLE_BIT:
        event.text = "single-bit (corrected) ECC error"
    if raw.gpu_instance_id is not None:
        event.gpu_instance_id = raw.gpu_instance_id
    return event


def lost_event(gpu_index: int, lost: bool, time_unix_ns: int | None = None, reason: str = "") -> telemetry_pb2.GpuEvent:
    """``LOST`` (the GPU answered GPU_IS_LOST or another of NVML's "gone" codes, which ``reason`` names:
    :func:`~gpuprobe.nvml.errors.gone_reason`) or ``RECOVERED`` (it answers again)."""
    return telemetry_pb2.GpuEvent(
        time_unix_ns=time.time_ns() if time_unix_ns is None else time_unix_ns,
        gpu_index=gpu_index,
        kind=telemetry_pb2.GPU_EVENT_KIND_LOST if lost else telemetry_pb2.GPU_EVENT_KIND_RECOVERED,
        text=f"{_LOST_TEXT}{reason or gone_reason(NVML_ERROR_GPU_IS_LOST)})" if lost else "GPU answers again",
    )


_LOST_TEXT = "GPU is lost ("


def lost_reason(event: telemetry_pb2.GpuEvent) -> str:
    """The reason a :func:`lost_event` carries (``RESET_REQUIRED: the GPU needs a reset ...``)."""
    if event.text.startswith(_LOST_TEXT) and event.text.endswith(")"):
        return event.text[len(_LOST_TEXT) : -1]
    return gone_reason(NVML_ERROR_GPU_IS_LOST)


class EventThread:
    """Waits on ``source`` until stopped; every event goes to ``sink`` (called in this thread)."""

    def __init__(
        self,
        source: EventSource,
        sink: Callable[[telemetry_pb2.GpuEvent], None],
        wait_ms: int = WAIT_MS,
        clock_change_min_interval_s: float = CLOCK_CHANGE_MIN_INTERVAL_S,
    ) -> None:
        self._source = source
        self._sink = sink
        self._wait_ms = wait_ms
        self._clock_min_s = clock_change_min_interval_s
        self._last_clock_mono: dict[int, float] = {}
        self.clock_changes_dropped = 0
        self.events = 0
        self._stop = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="gpuprobe-events", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        """Waits for the thread (at most one wait, ``wait_ms``) and frees the event set."""
        if self._thread.is_alive():
            self._thread.join(timeout)
        if not self._thread.is_alive() and not self._closed:
            self._closed = True  # freed once, also when join is called again at the exit
            self._source.close()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                raw = self._source.wait(self._wait_ms)
                if raw is None:
                    continue
                received_ns = time.time_ns()
                if raw.event_type == EVENT_CLOCK:
                    now = time.monotonic()
                    last = self._last_clock_mono.get(raw.gpu_index)
                    if last is not None and now - last < self._clock_min_s:
                        self.clock_changes_dropped += 1
                        continue
                    self._last_clock_mono[raw.gpu_index] = now
                event = make_event(raw, received_ns)
                if event is None:
                    continue
                self.events += 1
                if event.kind in (telemetry_pb2.GPU_EVENT_KIND_XID, telemetry_pb2.GPU_EVENT_KIND_ECC_DOUBLE_BIT):
                    log.error("GPU %d: %s", event.gpu_index, event.text)
                self._sink(event)
        except Exception:
            log.exception("the GPU events thread failed; GPU events are no longer collected")
