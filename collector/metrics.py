"""Part: collector. The collector's Prometheus metrics (``--metrics-listen``); docs/operations.md lists them.

Each :class:`Metrics` has its own registry, so several collectors can live in one process (tests).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, start_http_server

_LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.info = Gauge(
            "gpuprobe_collector_info", "Always 1; labels say which collector", ["collector_id", "version"], registry=r
        )
        self.streams_open = Gauge("gpuprobe_collector_streams_open", "Agent streams open now", registry=r)
        self.streams_ended = Counter(
            "gpuprobe_collector_streams_ended", "Agent streams ended, by gRPC status code", ["code"], registry=r
        )
        self.batches_received = Counter(
            "gpuprobe_collector_batches_received", "Sample batches received (replays included)", registry=r
        )
        self.batches_replayed = Counter(
            "gpuprobe_collector_batches_replayed",
            "Batches recognized as replays of batches already durable (acked, not stored again)",
            registry=r,
        )
        self.acks_waiting_for_influxdb = Gauge(
            "gpuprobe_collector_acks_waiting_for_influxdb",
            "Batches stored in the WAL whose ack waits for InfluxDB to have them (--ack-after sink)",
            registry=r,
        )
        self.samples_received = Counter(
            "gpuprobe_collector_samples_received", "Samples received in stored batches", registry=r
        )
        self.lines_accepted = Counter(
            "gpuprobe_collector_lines_accepted", "Line-protocol lines committed to the WAL", registry=r
        )
        self.rejected_samples = Counter(
            "gpuprobe_collector_rejected_samples",
            "Samples refused, by reason (reported to the agent)",
            ["reason"],
            registry=r,
        )
        self.rejected_values = Counter(
            "gpuprobe_collector_rejected_values",
            "Single values (fields) dropped from otherwise stored samples, by reason",
            ["reason"],
            registry=r,
        )
        self.timestamps_flagged = Counter(
            "gpuprobe_collector_timestamps_flagged",
            "Samples stored with a timestamp outside the window (--timestamp-policy flag)",
            registry=r,
        )
        self.clock_corrected_streams = Counter(
            "gpuprobe_collector_clock_corrected_streams",
            "Streams of agents whose clock was a second or more off the collector's (their timestamps moved)",
            registry=r,
        )
        self.wal_queued_lines = Gauge(
            "gpuprobe_collector_wal_queued_lines", "Lines in the WAL waiting for InfluxDB", registry=r
        )
        self.wal_queued_bytes = Gauge(
            "gpuprobe_collector_wal_queued_bytes", "Bytes of line protocol in the WAL waiting for InfluxDB", registry=r
        )
        self.wal_queued_batches = Gauge(
            "gpuprobe_collector_wal_queued_batches", "Agent batches in the WAL waiting for InfluxDB", registry=r
        )
        self.wal_up = Gauge(
            "gpuprobe_collector_wal_up",
            "1 while WAL commits succeed, 0 while they fail and are retried (disk full, I/O error) or failed for good",
            registry=r,
        )
        self.wal_failed_commits = Gauge(
            "gpuprobe_collector_wal_failed_commits",
            "WAL commits that failed since the collector started (each is retried until it succeeds)",
            registry=r,
        )
        self.wal_commit_seconds = Histogram(
            "gpuprobe_collector_wal_commit_seconds",
            "Time of one WAL group commit (fsync included)",
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.written_lines = Counter("gpuprobe_collector_written_lines", "Lines InfluxDB accepted", registry=r)
        self.write_requests = Counter(
            "gpuprobe_collector_write_requests",
            "Write requests to InfluxDB by HTTP status (none: no answer) and outcome",
            ["status", "outcome"],
            registry=r,
        )
        self.write_seconds = Histogram(
            "gpuprobe_collector_write_seconds",
            "Latency of one InfluxDB write request",
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.quarantined_lines = Counter(
            "gpuprobe_collector_quarantined_lines",
            "Lines InfluxDB refused for good, moved to the WAL's quarantine table, by reason",
            ["reason"],
            registry=r,
        )
        self.sink_alerts = Counter(
            "gpuprobe_collector_sink_alerts",
            "Answers that need an operator (401, 403, 404, other 4xx)",
            ["status"],
            registry=r,
        )
        self.sink_retries = Counter(
            "gpuprobe_collector_sink_retries",
            "Write requests that will be sent again, by outcome",
            ["outcome"],
            registry=r,
        )
        self.sink_splits = Counter("gpuprobe_collector_sink_splits", "Requests split in two after a 413", registry=r)
        self.sink_up_gauge = Gauge(
            "gpuprobe_collector_sink_up",
            "1 while InfluxDB accepts writes, 0 while it is unreachable or refuses",
            registry=r,
        )
        self.sink_up_gauge.set(1)
        # --influx-route: one lane per destination (labelled by its URL and database)
        self.destination_written_lines = Counter(
            "gpuprobe_collector_destination_written_lines",
            "Lines one destination (--influx-route, or default) accepted",
            ["destination"],
            registry=r,
        )
        self.destination_retries = Counter(
            "gpuprobe_collector_destination_retries",
            "Write requests to one destination that will be sent again, by outcome",
            ["destination", "outcome"],
            registry=r,
        )
        self.destination_up_gauge = Gauge(
            "gpuprobe_collector_destination_up",
            "1 while one destination (--influx-route, or default) accepts writes",
            ["destination"],
            registry=r,
        )
        self._server: Any = None

    # --- hooks -------------------------------------------------------------------------------------

    def watch_wal(
        self,
        lines: Callable[[], float],
        nbytes: Callable[[], float],
        batches: Callable[[], float],
        up: Callable[[], float],
        failed_commits: Callable[[], float],
    ) -> None:
        self.wal_queued_lines.set_function(lines)
        self.wal_queued_bytes.set_function(nbytes)
        self.wal_queued_batches.set_function(batches)
        self.wal_up.set_function(up)
        self.wal_failed_commits.set_function(failed_commits)

    def written(self, lines: int) -> None:
        self.written_lines.inc(lines)

    def write_request(self, status: int | None, outcome: str, seconds: float) -> None:
        self.write_requests.labels(str(status) if status is not None else "none", outcome).inc()
        self.write_seconds.observe(seconds)

    def quarantined(self, reason: str, lines: int = 1) -> None:
        self.quarantined_lines.labels(reason).inc(lines)

    def sink_alert(self, status: int | None) -> None:
        self.sink_alerts.labels(str(status)).inc()

    def sink_retry(self, outcome: str) -> None:
        self.sink_retries.labels(outcome).inc()

    def sink_split(self) -> None:
        self.sink_splits.inc()

    def sink_up(self, up: bool) -> None:
        self.sink_up_gauge.set(1 if up else 0)

    def destination_written(self, destination: str, lines: int) -> None:
        self.destination_written_lines.labels(destination).inc(lines)

    def destination_retry(self, destination: str, outcome: str) -> None:
        self.destination_retries.labels(destination, outcome).inc()

    def destination_up(self, destination: str, up: bool) -> None:
        self.destination_up_gauge.labels(destination).set(1 if up else 0)

    # --- exposition --------------------------------------------------------------------------------

    def text(self) -> str:
        return generate_latest(self.registry).decode()

    def serve(self, host: str, port: int) -> None:
        """Serves ``/metrics`` over HTTP from a daemon thread."""
        server, thread = start_http_server(port, addr=host, registry=self.registry)
        self._server = (server, thread)

    def close(self) -> None:
        if self._server is not None:
            server, thread = self._server
            server.shutdown()
            server.server_close()
            if isinstance(thread, threading.Thread):
                thread.join(timeout=5)
            self._server = None

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """The current value of one sample (tests and the benchmark); 0 when it does not exist."""
        got = self.registry.get_sample_value(name, labels or {})
        return 0.0 if got is None else float(got)
