"""Part: collector. The collector's options, declared once: ``gpuprobe collector``'s (:data:`OPTIONS`),
from which ``gpuprobe install collector`` takes those it writes into the collector's config
(collector/install.py). Imported by every ``gpuprobe`` invocation (through collector/cli.py): it stays light.
"""

from __future__ import annotations

from pathlib import Path

from gpuprobe.config import Option, parse_duration
from gpuprobe.influx.options import WRITE_OPTIONS, connection_options


def _path(text: str) -> Path:
    return Path(text)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"{value} is not a positive integer")
    return value


OPTIONS = [
    Option("listen", "gRPC address agents connect to, HOST:PORT", default="0.0.0.0:7447", metavar="HOST:PORT"),
    *connection_options(),
    *WRITE_OPTIONS,
    Option(
        "init_db",
        "set up the database and exit: the raw retention policy (--influx-rp, else autogen; made the "
        "default), rollup_10s and rollup_1m with their continuous queries, the events policy, and the dashboards' "
        "rp_config (v1, an admin user; safe to run again)",
        default=False,
        is_flag=True,
    ),
    Option(
        "retention_raw",
        "--init-db: how long the raw data is kept (0: infinite)",
        parse_duration,
        default=7 * 86400.0,
    ),
    Option(
        "retention_10s",
        "--init-db: how long the 10 s rollup is kept (0: infinite)",
        parse_duration,
        default=90 * 86400.0,
    ),
    Option(
        "retention_1m",
        "--init-db: how long the 1 min rollup is kept (0: infinite)",
        parse_duration,
        default=400 * 86400.0,
    ),
    Option(
        "retention_events",
        "--init-db: how long the events policy keeps the probe, trainer, gpu_info, gpu_event and model points, "
        "which are also written there once it exists (0: infinite)",
        parse_duration,
        default=400 * 86400.0,
    ),
    Option(
        "backfill",
        "--init-db: also compute the rollups of the last DURATION again (data that arrived late, e.g. an agent's "
        "spool after an outage; 0: none)",
        parse_duration,
        default=0.0,
    ),
    Option(
        "influx_route",
        "send the lines whose cluster tag is CLUSTER to another InfluxDB: its URL, and optionally the database "
        "(v1) or bucket (v2) as the URL's last path segment (default: --influx-db or --influx-bucket); the other "
        "--influx-* options apply to it too. Repeatable, one per cluster; clusters no route names go to "
        "--influx-url; a cluster routed twice is an error. Each destination is written on its own, so one that is "
        "down holds back only its lines",
        multiple=True,
        default=[],
        metavar="CLUSTER=URL[/DATABASE]",
    ),
    Option(
        "wal",
        "directory of the write-ahead log (SQLite)",
        type=_path,
        default=Path("/var/lib/gpuprobe/collector"),
        metavar="DIR",
    ),
    Option(
        "wal_max_bytes",
        "queued line protocol at which new batches are refused (RESOURCE_EXHAUSTED)",
        type=_positive_int,
        default=8 << 30,
        metavar="BYTES",
    ),
    Option(
        "quarantine_max_lines",
        "lines kept in the quarantine table (oldest dropped first)",
        type=_positive_int,
        default=1_000_000,
        metavar="N",
    ),
    Option(
        "ack_after",
        "when an agent's batch is acknowledged: wal (once durable in this collector's WAL) or sink (once "
        "InfluxDB has it; the agents' spools buffer meanwhile, nothing acked is left in the WAL)",
        default="wal",
        choices=["wal", "sink"],
        doc=(
            "when an agent's batch is acknowledged: `wal` once it is durable in this "
            "collector's WAL, `sink` once InfluxDB has it ([Acknowledgement "
            "modes](#acknowledgement-modes---ack-after))"
        ),
    ),
    Option(
        "drain_timeout",
        "on SIGTERM: how long to finish acks and write the WAL into InfluxDB before exiting (what is left "
        "stays in the WAL and is logged); a drain ends sooner when InfluxDB refuses the writes (401, 403, "
        "404, ...) or cannot be connected to for 2 s",
        parse_duration,
        default=25.0,
        doc=(
            "on SIGTERM, how long to finish the acks and write the WAL into InfluxDB before "
            "exiting; what is left stays in the WAL and is logged; the drain ends sooner when "
            "InfluxDB refuses the writes (401, 403, 404, other 4xx) or cannot be connected to "
            "for 2 s ([Stopping](#stopping-crashing-restarting))"
        ),
    ),
    Option("tls_cert", "server certificate (PEM)", type=_path, metavar="FILE"),
    Option("tls_key", "server private key (PEM)", type=_path, metavar="FILE"),
    Option("tls_client_ca", "CA of agent certificates: requires mutual TLS", type=_path, metavar="FILE"),
    Option(
        "tls_bind_agent_id",
        "the client certificate's CN or DNS name must equal the agent_id",
        default=False,
        is_flag=True,
    ),
    Option("tokens_file", "per-agent bearer tokens, one 'AGENT_ID TOKEN' per line", type=_path, metavar="FILE"),
    Option(
        "insecure",
        "allow plaintext gRPC and agents without credentials (tests only; logs a warning)",
        default=False,
        is_flag=True,
    ),
    Option(
        "metrics_listen",
        "serve Prometheus metrics on HOST:PORT (worker i: PORT+i); empty: off",
        default="",
        metavar="HOST:PORT",
    ),
    Option(
        "workers",
        "processes sharing the port (SO_REUSEPORT), each with its own WAL file",
        type=_positive_int,
        default=1,
        metavar="N",
    ),
    Option(
        "collector_id",
        "name of this collector in Welcome messages and metrics (default: host name)",
        default="",
        metavar="NAME",
    ),
    Option(
        "max_message_bytes",
        "largest StreamRequest accepted (at least 4 MiB)",
        type=_positive_int,
        default=8 << 20,
        metavar="BYTES",
    ),
    Option("max_clock_skew", "samples further in the future are out of range", parse_duration, default=600.0),
    Option("max_sample_age", "samples older than this are out of range", parse_duration, default=7 * 24 * 3600.0),
    Option(
        "timestamp_policy",
        "out-of-range timestamps: reject (refused, reported to the agent) or flag (stored, counted, logged)",
        default="reject",
        choices=["reject", "flag"],
    ),
    Option(
        "max_tag_bytes",
        "longest tag value (identity labels, uuid, model, workload, probe id), in bytes",
        type=_positive_int,
        default=256,
        metavar="BYTES",
    ),
    Option("sink_batch_lines", "lines per InfluxDB write request", type=_positive_int, default=5000, metavar="N"),
    Option("sink_concurrency", "InfluxDB write requests in flight", type=_positive_int, default=3, metavar="N"),
    Option("sink_linger", "how long a partly filled request waits for more lines", parse_duration, default=0.05),
    Option("sink_max_backoff", "longest wait between retries of a failing write", parse_duration, default=30.0),
]

OPTION = {option.name: option for option in OPTIONS}
