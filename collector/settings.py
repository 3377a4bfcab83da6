"""Part: collector. The collector's settings (:class:`CollectorSettings`, built from its options in
``collector/cli.py``),
checked once at start (fail fast, never after)."""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass, field
from pathlib import Path

from gpuprobe.collector.options import OPTION
from gpuprobe.errors import ConfigError
from gpuprobe.influx.settings import InfluxSettings
from gpuprobe.wire.validate import Limits

ACK_MODES = ("wal", "sink")


class CollectorConfigError(ConfigError):
    """A setting or a combination of settings that cannot work (the message says which)."""


def parse_address(text: str, what: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT``; :class:`CollectorConfigError` when it is not one."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or not host:
        raise CollectorConfigError(f"{what} must be HOST:PORT, not {text!r}")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise CollectorConfigError(f"{what}: port {port} is out of range")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


# The defaults that are options' are the options' own (collector/options.py): written once.
@dataclass(frozen=True)
class SinkSettings:
    batch_lines: int = OPTION["sink_batch_lines"].default
    concurrency: int = OPTION["sink_concurrency"].default
    linger_s: float = OPTION["sink_linger"].default
    backoff_initial_s: float = 0.5
    backoff_max_s: float = OPTION["sink_max_backoff"].default
    retry_after_max_s: float = 300.0
    #: Requests one refused chunk may spend finding its refused lines before the rest of the
    #: suspect part is quarantined whole.
    isolate_budget: int = 64


@dataclass(frozen=True)
class InfluxRoute:
    """``--influx-route CLUSTER=URL[/DATABASE]``: lines whose ``cluster`` tag is ``cluster`` go to ``url``
    (and ``database``: the v1 database or the v2 bucket; empty: ``--influx-db`` or ``--influx-bucket``)."""

    cluster: str
    url: str
    database: str = ""


_ROUTE = re.compile(r"(?P<cluster>.+?)=(?P<url>https?://[^/?#]+)(?P<path>/[^?#]*)?")


def parse_route(text: str) -> InfluxRoute:
    """``CLUSTER=URL[/DATABASE]``; the URL's last path segment, if any, is the database (or bucket)."""
    match = _ROUTE.fullmatch(text.strip())
    if match is None:
        raise CollectorConfigError(
            f"--influx-route must be CLUSTER=URL[/DATABASE] with an http:// or https:// URL, not {text!r} "
            "(e.g. eu-west=http://influx-eu.internal:8086/gpuprobe)"
        )
    base, _, database = (match["path"] or "").strip("/").rpartition("/")
    url = match["url"] + (f"/{base}" if base else "")
    return InfluxRoute(match["cluster"], url, database)


def default_collector_id() -> str:
    return socket.gethostname()


@dataclass(frozen=True)
class CollectorSettings:
    listen: str = OPTION["listen"].default
    wal_dir: Path = OPTION["wal"].default
    wal_max_bytes: int = OPTION["wal_max_bytes"].default
    quarantine_max_lines: int = OPTION["quarantine_max_lines"].default
    workers: int = OPTION["workers"].default
    collector_id: str = field(default_factory=default_collector_id)
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    tls_bind_agent_id: bool = False
    tokens_file: Path | None = None
    insecure: bool = False
    metrics_listen: str = OPTION["metrics_listen"].default
    #: Batches of one stream that may wait for the WAL at once (the reader then stops reading,
    #: and HTTP/2 flow control slows the agent down).
    stream_window: int = 64
    shutdown_grace_s: float = 5.0
    #: When a batch is acked: ``wal`` once it is durable in the WAL, ``sink`` once InfluxDB has it.
    ack_after: str = OPTION["ack_after"].default
    #: SIGTERM: how long the drain (finish acks, then write the WAL into InfluxDB) may take in all.
    drain_timeout_s: float = OPTION["drain_timeout"].default
    limits: Limits = field(default_factory=Limits)
    influx: InfluxSettings = field(default_factory=InfluxSettings)
    #: ``--influx-route``: lines of these clusters go elsewhere than ``influx`` (the rest go there).
    routes: tuple[InfluxRoute, ...] = ()
    sink: SinkSettings = field(default_factory=SinkSettings)

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @property
    def mtls(self) -> bool:
        return self.tls_client_ca is not None

    def check(self) -> None:
        """Raises :class:`CollectorConfigError` for settings that cannot work together."""
        _, port = parse_address(self.listen, "--listen")
        if self.workers < 1:
            raise CollectorConfigError("--workers must be at least 1")
        if self.workers > 1 and port == 0:
            raise CollectorConfigError("--workers > 1 needs a fixed --listen port (all workers share it)")
        if self.metrics_listen:
            parse_address(self.metrics_listen, "--metrics-listen")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise CollectorConfigError("--tls-cert and --tls-key go together")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise CollectorConfigError("--tls-client-ca (mutual TLS) needs --tls-cert and --tls-key")
        if self.tls_bind_agent_id and self.tls_client_ca is None:
            raise CollectorConfigError("--tls-bind-agent-id needs --tls-client-ca (mutual TLS)")
        if not self.insecure:
            if not self.tls:
                raise CollectorConfigError(
                    "refusing to serve agents over plaintext: give --tls-cert/--tls-key "
                    "(and --tls-client-ca for mutual TLS), or --insecure for a test setup"
                )
            if self.tokens_file is None and not self.mtls:
                raise CollectorConfigError(
                    "no agent authentication: give --tls-client-ca (mutual TLS) and/or --tokens-file, "
                    "or --insecure for a test setup"
                )
        influx = self.influx
        if influx.api not in ("v1", "v2"):
            raise CollectorConfigError(f"--influx-api must be v1 or v2, not {influx.api!r}")
        if not influx.url.startswith(("http://", "https://")):
            raise CollectorConfigError(f"--influx-url must start with http:// or https://, not {influx.url!r}")
        if influx.api == "v1" and not influx.database:
            raise CollectorConfigError("--influx-api v1 needs --influx-db")
        if influx.api == "v2":
            missing = [
                f
                for f, v in (
                    ("--influx-org", influx.org),
                    ("--influx-bucket", influx.bucket),
                    ("--influx-token", influx.token),
                )
                if not v
            ]
            if missing:
                raise CollectorConfigError(f"--influx-api v2 needs {', '.join(missing)}")
        seen: dict[str, InfluxRoute] = {}
        for route in self.routes:
            if route.cluster in seen:
                raise CollectorConfigError(
                    f"--influx-route: cluster {route.cluster!r} is routed twice ({seen[route.cluster].url} and "
                    f"{route.url}); give each cluster one route"
                )
            seen[route.cluster] = route
        if not 0 <= influx.gzip_level <= 9:
            raise CollectorConfigError("--influx-gzip-level must be 0-9")
        if self.sink.batch_lines < 1 or self.sink.concurrency < 1:
            raise CollectorConfigError("--sink-batch-lines and --sink-concurrency must be at least 1")
        if self.ack_after not in ACK_MODES:
            raise CollectorConfigError(f"--ack-after must be one of {', '.join(ACK_MODES)}, not {self.ack_after!r}")
        if self.drain_timeout_s < 0:
            raise CollectorConfigError("--drain-timeout must not be negative")
        if self.wal_max_bytes < 1 << 20:
            raise CollectorConfigError("--wal-max-bytes must be at least 1 MiB")
