"""A real InfluxDB 1.x (``influxd``) on free loopback ports, with a thin HTTP client built on urllib.

Only the standard library is used, so the collector host needs nothing extra to run it.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

from gpuprobe.devservices._process import ServerProcess
from gpuprobe.devservices.errors import DevServiceError
from gpuprobe.devservices.ports import LOOPBACK, free_ports

_PRECISIONS = frozenset({"ns", "u", "ms", "s", "m", "h"})


class InfluxDBError(DevServiceError):
    """InfluxDB refused a request, or could not be reached.

    ``status`` is the HTTP status (None when no response came back, e.g. the server is down) and
    ``message`` InfluxDB's own error text (for a 400 on a write, e.g.
    ``partial write: field type conflict: ...``).
    """

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message if status is None else f"HTTP {status}: {message}")
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Series:
    """One series of a query result, as InfluxDB's JSON gives it (times in ns since the epoch)."""

    name: str
    columns: tuple[str, ...]
    values: tuple[tuple[Any, ...], ...]
    tags: Mapping[str, str] = field(default_factory=dict)

    def rows(self) -> list[dict[str, Any]]:
        """Each row as a dict of column to value, with the series' GROUP BY tags added."""
        return [{**self.tags, **dict(zip(self.columns, row, strict=True))} for row in self.values]


def quote_identifier(name: str) -> str:
    """An InfluxQL identifier in double quotes, for database and measurement names."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


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
    ) -> None:
        """Prepare (not start) a server.

        ``port`` and ``rpc_port`` default to free ports, replaced if the first start finds them taken.
        ``log_level`` is influxd's ``[logging] level``; the HTTP access log and the query log are off either
        way. ``extra_config`` is appended to the generated TOML (for example a ``[retention]`` section).
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

    # --- client ------------------------------------------------------------------------------------

    def ping(self, timeout_s: float = 1.0) -> bool:
        """Whether ``GET /ping`` answers 204 now."""
        try:
            status, _ = self._request("GET", "/ping", timeout_s=timeout_s)
        except InfluxDBError:
            return False
        return status == 204

    def create_database(self, name: str) -> None:
        """``CREATE DATABASE name`` (a no-op if it exists)."""
        self.execute(f"CREATE DATABASE {quote_identifier(name)}")

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
        """``POST /write`` line protocol; raise :class:`InfluxDBError` unless InfluxDB answers 204.

        ``lines`` is one string or bytes with newline-separated points, or an iterable of lines.
        """
        if precision not in _PRECISIONS:
            raise ValueError(f"precision must be one of {sorted(_PRECISIONS)}, not {precision!r}")
        if isinstance(lines, bytes):
            body = lines
        elif isinstance(lines, str):
            body = lines.encode()
        else:
            body = "\n".join(lines).encode()
        params = {"db": db, "precision": precision}
        if retention_policy is not None:
            params["rp"] = retention_policy
        status, text = self._request("POST", "/write", params=params, body=body)
        if status != 204:
            raise InfluxDBError(f"unexpected answer to /write: {text[:500]}", status=status)

    def query(self, db: str, influxql: str) -> list[Series]:
        """``GET /query`` with ``epoch=ns``: every series of every statement, in order.

        Raises :class:`InfluxDBError` if the request fails or any statement has an error. Statements that
        change things (CREATE, DROP, ...) must go through :meth:`execute`.
        """
        return self._query("GET", influxql, db)

    def execute(self, influxql: str, db: str | None = None) -> list[Series]:
        """``POST /query`` with ``epoch=ns``, for statements that change things."""
        return self._query("POST", influxql, db)

    # --- internals ---------------------------------------------------------------------------------

    def _query(self, method: str, influxql: str, db: str | None) -> list[Series]:
        params = {"q": influxql, "epoch": "ns"}
        if db is not None:
            params["db"] = db
        status, text = self._request(method, "/query", params=params)
        try:
            document = json.loads(text)
        except ValueError as exc:
            raise InfluxDBError(
                f"/query answered something that is not JSON: {text[:500]}", status=status
            ) from exc
        if "error" in document:
            raise InfluxDBError(str(document["error"]), status=status)
        series: list[Series] = []
        for result in document.get("results", []):
            if "error" in result:
                raise InfluxDBError(
                    f"statement {result.get('statement_id', '?')}: {result['error']}", status=status
                )
            for raw in result.get("series", []):
                series.append(
                    Series(
                        name=str(raw.get("name", "")),
                        columns=tuple(raw.get("columns", ())),
                        values=tuple(tuple(row) for row in raw.get("values", ())),
                        tags=dict(raw.get("tags", {})),
                    )
                )
        return series

    def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: bytes | None = None,
        timeout_s: float | None = None,
    ) -> tuple[int, str]:
        url = self.url + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        request = urllib.request.Request(url, data=body, method=method)
        if body is not None:
            request.add_header("Content-Type", "text/plain; charset=utf-8")
        timeout = self.http_timeout_s if timeout_s is None else timeout_s
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return int(response.status), response.read().decode("utf-8", errors="replace")
        except urllib.error.HTTPError as exc:
            text = exc.read().decode("utf-8", errors="replace")
            raise InfluxDBError(
                _error_message(text, exc.headers.get("X-Influxdb-Error")), status=exc.code
            ) from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            raise InfluxDBError(f"cannot reach InfluxDB at {self.url}: {reason}") from exc

    # --- ServerProcess -----------------------------------------------------------------------------

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


def _error_message(body: str, header: str | None) -> str:
    try:
        document = json.loads(body)
    except ValueError:
        document = None
    if isinstance(document, dict) and "error" in document:
        return str(document["error"])
    if header:
        return header
    return body.strip() or "(empty answer)"


class InfluxDBDatabase(NamedTuple):
    """A server and one database on it, as the ``influxdb`` test fixture yields them."""

    server: InfluxDBServer
    name: str

    def write_lines(self, lines: str | bytes | Iterable[str], precision: str = "ns") -> None:
        self.server.write_lines(self.name, lines, precision)

    def query(self, influxql: str) -> list[Series]:
        return self.server.query(self.name, influxql)
