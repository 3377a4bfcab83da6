"""Part: devservices. A real InfluxDB 1.x (``influxd``) on free loopback ports, for tests, benchmarks and the demo.

Talking to it is :mod:`gpuprobe.influx.client`'s job (the one InfluxDB client gpuprobe has);
this module starts, stops and configures the server and offers that client's calls per database.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import ClassVar, NamedTuple, Self

from gpuprobe.devservices._process import ServerProcess
from gpuprobe.devservices.ports import LOOPBACK, free_ports
from gpuprobe.influx.client import InfluxClient
from gpuprobe.influx.influxql import InfluxError, Series, quote_identifier
from gpuprobe.influx.retention import create_database_statement
from gpuprobe.influx.settings import InfluxSettings

_PRECISIONS = frozenset({"ns", "u", "ms", "s", "m", "h"})
#: The admin user of a server started with ``admin_password``.
ADMIN_USER = "admin"

#: What the server's requests raise: InfluxDB refused a request (``status`` and InfluxDB's own
#: ``message``), or could not be reached (``status`` None). The name the tests know.
InfluxDBError = InfluxError

__all__ = ["InfluxDBDatabase", "InfluxDBError", "InfluxDBServer", "Series"]


class InfluxDBServer(ServerProcess):
    """``influxd`` with a generated config, data under ``base_dir``, HTTP and RPC on free loopback ports.

    >>> with InfluxDBServer(tmp_dir) as influx:          # doctest: +SKIP
    ...     influx.create_database("telemetry")
    ...     influx.write_lines("telemetry", "gpu,host=a power_w=251.5 1700000000000000000")
    ...     influx.query("telemetry", "SELECT * FROM gpu")[0].rows()

    :meth:`stop` then :meth:`start` (or :meth:`kill` then :meth:`start`) comes back on the same port with
    the same data: a write answered 204 survives a SIGKILL (the WAL is fsynced before the answer).
    """

    display_name: ClassVar[str] = "influxd"
    package: ClassVar[str] = "influxdb"

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        *,
        port: int | None = None,
        rpc_port: int | None = None,
        binary: str | os.PathLike[str] = "influxd",
        log_level: str = "info",
        extra_config: str = "",
        start_timeout_s: float = 30.0,
        stop_timeout_s: float = 10.0,
        http_timeout_s: float = 30.0,
        admin_password: str | None = None,
    ) -> None:
        """Prepare (not start) a server.

        ``port`` and ``rpc_port`` default to free ports, replaced if the first start finds them taken.
        ``log_level`` is influxd's ``[logging] level``; the HTTP access log and the query log are off either
        way. ``extra_config`` is appended to the generated TOML (for example a ``[retention]`` section).
        ``admin_password``: authentication on (``[http] auth-enabled``), with the admin user
        :data:`ADMIN_USER` of that password made at the first start; this object's own requests log
        in as it.
        """
        auto = port is None and rpc_port is None
        super().__init__(
            base_dir,
            binary=binary,
            log_name="influxd.log",
            auto_ports=auto,
            start_timeout_s=start_timeout_s,
            stop_timeout_s=stop_timeout_s,
        )
        if port is None or rpc_port is None:
            chosen = free_ports(2)
            port = chosen[0] if port is None else port
            rpc_port = (chosen[1] if chosen[1] != port else chosen[0]) if rpc_port is None else rpc_port
        self._port = port
        self._rpc_port = rpc_port
        self.log_level = log_level
        self.extra_config = extra_config
        self.http_timeout_s = http_timeout_s
        self.admin_password = admin_password
        self._client: InfluxClient | None = None

    # --- addresses ---------------------------------------------------------------------------------

    @property
    def host(self) -> str:
        return LOOPBACK

    @property
    def port(self) -> int:
        """The HTTP port (``/write``, ``/query``, ``/ping``)."""
        return self._port

    @property
    def rpc_port(self) -> int:
        """The RPC port of backup and restore (influxd's top-level ``bind-address``)."""
        return self._rpc_port

    @property
    def url(self) -> str:
        """The HTTP base URL, e.g. ``http://127.0.0.1:43567``."""
        return f"http://{LOOPBACK}:{self._port}"

    @property
    def config_path(self) -> Path:
        """The generated config, rewritten on every start."""
        return self.base_dir / "influxdb.conf"

    # --- client ----------------------------------------------------------------------------------

    def client(self) -> InfluxClient:
        """The HTTP client of this server (made again when the server moved to another port)."""
        if self._client is None or self._client.settings.url != self.url:
            if self._client is not None:
                self._client.close()
            settings = InfluxSettings(
                url=self.url,
                database="",
                timeout_s=self.http_timeout_s,
                username=ADMIN_USER if self.admin_password is not None else "",
                password=self.admin_password or "",
            )
            self._client = InfluxClient(settings, user_agent="gpuprobe-devservices")
        return self._client

    def ping(self, timeout_s: float = 1.0) -> bool:
        """Whether ``GET /ping`` answers 204 now."""
        return self.client().ping(timeout_s)

    def create_database(self, name: str) -> None:
        """``CREATE DATABASE name`` (a no-op if it exists)."""
        self.execute(create_database_statement(name))

    def drop_database(self, name: str) -> None:
        """``DROP DATABASE name`` (a no-op if it does not exist)."""
        self.execute(f"DROP DATABASE {quote_identifier(name)}")

    def databases(self) -> list[str]:
        """The names of all databases."""
        return [str(row[0]) for series in self.execute("SHOW DATABASES") for row in series.values]

    def write_lines(
        self,
        db: str,
        lines: str | bytes | Iterable[str],
        precision: str = "ns",
        *,
        retention_policy: str | None = None,
    ) -> None:
        """``POST /write`` line protocol; raise :class:`InfluxDBError` unless InfluxDB stores it.

        ``lines`` is one string or bytes with newline-separated points, or an iterable of lines.
        """
        if precision not in _PRECISIONS:
            raise ValueError(f"precision must be one of {sorted(_PRECISIONS)}, not {precision!r}")
        self.client().write(lines, database=db, retention_policy=retention_policy, precision=precision)

    def query(self, db: str, influxql: str) -> list[Series]:
        """``GET /query`` with ``epoch=ns``: every series of every statement, in order.

        Raises :class:`InfluxDBError` if the request fails or any statement has an error. Statements that
        change things (CREATE, DROP, ...) must go through :meth:`execute`.
        """
        return self.client().query(influxql, database=db)

    def execute(self, influxql: str, db: str | None = None) -> list[Series]:
        """``POST /query`` with ``epoch=ns``, for statements that change things."""
        return self.client().execute(influxql, database=db or "")

    # --- ServerProcess -----------------------------------------------------------------------------

    def start(self) -> Self:
        super().start()
        if self.admin_password is not None:
            # influxd lets anyone create the first admin; once it exists, the same statement (same
            # password, logged in as it) changes nothing
            password = self.admin_password.replace("\\", "\\\\").replace("'", "\\'")
            user = quote_identifier(ADMIN_USER)
            self.execute(f"CREATE USER {user} WITH PASSWORD '{password}' WITH ALL PRIVILEGES")
        return self

    def _choose_new_ports(self) -> None:
        self._port, self._rpc_port = free_ports(2)

    def _prepare(self) -> list[str]:
        base = self.base_dir
        for sub in ("meta", "data", "wal"):
            (base / sub).mkdir(exist_ok=True)
        config = f"""\
# Generated by gpuprobe.devservices.InfluxDBServer; rewritten on every start.
reporting-disabled = true
bind-address = {_toml(f"{LOOPBACK}:{self._rpc_port}")}

[meta]
  dir = {_toml(base / "meta")}
  logging-enabled = false

[data]
  dir = {_toml(base / "data")}
  wal-dir = {_toml(base / "wal")}
  wal-fsync-delay = "0s"
  query-log-enabled = false

[monitor]
  store-enabled = false

[subscriber]
  enabled = false

[continuous_queries]
  log-enabled = false

[http]
  enabled = true
  bind-address = {_toml(f"{LOOPBACK}:{self._port}")}
  log-enabled = false
  pprof-enabled = false
  unix-socket-enabled = false
  auth-enabled = {"true" if self.admin_password is not None else "false"}
  bind-socket = {_toml(base / "influxdb.sock")}

[logging]
  level = {_toml(self.log_level)}
  suppress-logo = true

{self.extra_config}
"""
        self.config_path.write_text(config)
        return ["run", "-config", os.fspath(self.config_path)]

    def _is_ready(self) -> bool:
        return self.ping(timeout_s=0.5)

    def _environment(self) -> dict[str, str]:
        # INFLUXDB_* variables override the config file (e.g. INFLUXDB_HTTP_BIND_ADDRESS): leave them out.
        return {key: value for key, value in os.environ.items() if not key.startswith("INFLUXDB_")}


def _toml(value: str | os.PathLike[str]) -> str:
    """A TOML basic string (JSON's escapes are valid TOML)."""
    return json.dumps(os.fspath(value))


class InfluxDBDatabase(NamedTuple):
    """A server and one database on it, as the ``influxdb`` test fixture yields them."""

    server: InfluxDBServer
    name: str

    def write_lines(self, lines: str | bytes | Iterable[str], precision: str = "ns") -> None:
        self.server.write_lines(self.name, lines, precision)

    def query(self, influxql: str) -> list[Series]:
        return self.server.query(self.name, influxql)
