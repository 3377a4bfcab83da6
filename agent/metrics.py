"""Part: agent. The agent's own counters, and an optional Prometheus endpoint that exposes them.

Counters are plain integers behind one lock, incremented by the sampler thread and the event loop;
the Prometheus collector reads them only when scraped, so an agent without ``--metrics-listen``
pays nothing for metrics and one with it pays per scrape, not per sample.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class Totals:
    """Totals since the agent started (``spool_*``, ``connected`` and ``acked_seq`` are gauges)."""

    samples_taken: int = 0
    samples_spooled: int = 0
    batches_spooled: int = 0
    samples_sent: int = 0
    batches_sent: int = 0
    samples_acked: int = 0
    batches_acked: int = 0
    samples_dropped: int = 0
    batches_dropped: int = 0
    samples_rejected: int = 0
    samples_overwritten: int = 0
    read_errors: int = 0
    missed_ticks: int = 0
    reconnects: int = 0
    trainer_messages: int = 0
    trainer_errors: int = 0
    spool_bytes: int = 0
    spool_batches: int = 0
    connected: int = 0
    acked_seq: int = 0
    gpu_aggregates: int = 0
    samples_promoted: int = 0
    recorder_trimmed_samples: int = 0
    recorder_batches: int = 0
    recorder_samples: int = 0
    recorder_bytes: int = 0
    high_resolution: int = 0
    clock_offset_ms: int = 0


GAUGES = {
    "spool_bytes",
    "spool_batches",
    "connected",
    "acked_seq",
    "recorder_batches",
    "recorder_samples",
    "recorder_bytes",
    "high_resolution",
    "clock_offset_ms",
}

HELP = {
    "samples_taken": "Samples taken by the sensors (GPU, node, acoustic, trainer).",
    "samples_spooled": "Samples written to the durable spool.",
    "batches_spooled": "Batches written to the durable spool.",
    "samples_sent": "Samples sent to a collector (replays count again).",
    "batches_sent": "Batches sent to a collector (replays count again).",
    "samples_acked": "Samples acknowledged as durable by a collector and removed from the spool.",
    "batches_acked": "Batches acknowledged as durable by a collector and removed from the spool.",
    "samples_dropped": "Samples dropped from the spool by its size or age cap (oldest first).",
    "batches_dropped": "Batches dropped from the spool by its size or age cap (oldest first).",
    "samples_rejected": "Samples a collector refused permanently (Ack.rejections).",
    "samples_overwritten": "GPU samples the native sampler's ring overwrote before the agent read them (it fell"
    " behind); in AgentStats.dropped_samples too.",
    "read_errors": "Sensor reads that failed with an error other than not-supported.",
    "missed_ticks": "Sampling ticks skipped because the previous one was still running.",
    "reconnects": "Streams to a collector that ended and were opened again.",
    "trainer_messages": "Messages accepted on the trainer socket.",
    "trainer_errors": "Lines refused on the trainer socket.",
    "spool_bytes": "Bytes of batches held in the spool.",
    "spool_batches": "Batches held in the spool (not yet acknowledged).",
    "connected": "1 while a stream to a collector is open and welcomed.",
    "acked_seq": "Highest batch sequence number acknowledged by a collector.",
    "gpu_aggregates": "GPU aggregates (one GPU, one --aggregate-interval) put into batches (--resolution auto).",
    "samples_promoted": "Raw GPU samples moved from the flight recorder into the shipped batches (window opened).",
    "recorder_trimmed_samples": "Raw GPU samples the flight recorder let go by age or size (not drops: their"
    " aggregates were shipped); since the spool was opened.",
    "recorder_batches": "Batches of raw GPU samples held by the spool's flight recorder.",
    "recorder_samples": "Raw GPU samples held by the spool's flight recorder.",
    "recorder_bytes": "Bytes held by the spool's flight recorder.",
    "high_resolution": "1 while every GPU sample is shipped (a probe, a trigger's window or --resolution full).",
    "clock_offset_ms": "How far this node's clock is ahead of its collector's (negative: behind), in ms, at the last"
    " Welcome; from 1 s either way the collector moves the node's timestamps onto its own clock.",
}


class Counters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals = Totals()
        self._reported_read_errors = 0
        self._reported_missed_ticks = 0
        self._reported_overwritten = 0

    def add(self, **deltas: int) -> None:
        with self._lock:
            t = self._totals
            for name, delta in deltas.items():
                setattr(t, name, getattr(t, name) + delta)

    def set(self, **values: int) -> None:
        with self._lock:
            for name, value in values.items():
                setattr(self._totals, name, value)

    def snapshot(self) -> Totals:
        with self._lock:
            return Totals(**{f.name: getattr(self._totals, f.name) for f in fields(Totals)})

    def take_batch_deltas(self) -> tuple[int, int, int]:
        """(read_errors, missed_ticks, samples_overwritten) since the previous call: the AgentStats deltas of a
        new batch."""
        with self._lock:
            t = self._totals
            read_errors = t.read_errors - self._reported_read_errors
            missed = t.missed_ticks - self._reported_missed_ticks
            overwritten = t.samples_overwritten - self._reported_overwritten
            self._reported_read_errors = t.read_errors
            self._reported_missed_ticks = t.missed_ticks
            self._reported_overwritten = t.samples_overwritten
            return read_errors, missed, overwritten


class _Collector:
    """A prometheus_client collector that reads :class:`Counters` at scrape time."""

    def __init__(self, counters: Counters) -> None:
        self._counters = counters

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        totals = self._counters.snapshot()
        for f in fields(Totals):
            value = getattr(totals, f.name)
            name = f"gpuprobe_agent_{f.name}"
            if f.name in GAUGES:
                yield GaugeMetricFamily(name, HELP[f.name], value=value)
            else:
                yield CounterMetricFamily(name, HELP[f.name], value=value)


def metrics_page(counters: Counters) -> Callable[[], bytes]:
    """The counters' page as a function, for an endpoint shared with the GPU metrics (gpuprobe.agent.prometheus)."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(counters))
    return lambda: generate_latest(registry)


def serve_metrics(counters: Counters, host: str, port: int) -> Any:
    """Start the Prometheus endpoint (``/metrics``) in a background thread; returns the server."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(counters))
    server, _thread = start_http_server(port, addr=host, registry=registry)
    log.info("Prometheus metrics on http://%s:%d/metrics", host, server.server_port)
    return server
