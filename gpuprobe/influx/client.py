"""Part: influx. A synchronous client of InfluxDB's v1 HTTP API (``/query``, ``/write``, ``/ping``) on httpx.

InfluxDB 1.x serves this API, and 2.x and 3.x serve it for compatibility, so ``gpuprobe model`` and
the development servers (:mod:`gpuprobe.devservices.influxdb`) reach every version with it. Every
failure becomes one :class:`~gpuprobe.influx.influxql.InfluxError` with InfluxDB's own message
(:func:`~gpuprobe.influx.answers.error_text`). The collector writes with its own async writer
(:mod:`gpuprobe.collector.sink`) built from the same settings and answers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import TracebackType

import httpx

from gpuprobe.influx.answers import error_text
from gpuprobe.influx.influxql import InfluxError, Series, parse_results
from gpuprobe.influx.settings import InfluxSettings

#: Rows per chunk of a chunked query answer: large enough that a chunk costs little, small enough
#: that no single JSON document gets huge.
CHUNK_ROWS = 20000


class InfluxClient:
    """One InfluxDB server; the default database and retention policy come from the settings."""

    def __init__(self, settings: InfluxSettings, *, user_agent: str = "gpuprobe") -> None:
        self.settings = settings
        self._http = httpx.Client(
            base_url=settings.base_url,
            timeout=settings.timeout_s,
            verify=settings.verify(),
            headers={"User-Agent": user_agent, "Accept": "application/json", **settings.auth_headers()},
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> InfluxClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def ping(self, timeout_s: float | None = None) -> bool:
        """Whether ``GET /ping`` answers 204 now."""
        try:
            response = self._http.get("/ping", timeout=self.settings.timeout_s if timeout_s is None else timeout_s)
        except httpx.HTTPError:
            return False
        return response.status_code == 204

    def query(self, influxql: str, database: str | None = None) -> list[Series]:
        """``GET /query``: every series of every statement, in order, chunks joined. Statements that
        change things (CREATE, DROP, ...) go through :meth:`execute`. ``database`` None: the settings'."""
        return self._query("GET", influxql, database)

    def execute(self, influxql: str, database: str | None = None) -> list[Series]:
        """``POST /query``, for statements that change things."""
        return self._query("POST", influxql, database)

    def write(
        self,
        lines: str | bytes | Iterable[str],
        *,
        database: str | None = None,
        retention_policy: str | None = None,
        precision: str = "ns",
    ) -> int:
        """``POST /write``: one text of newline-separated lines, or the lines; returns how many were
        written. ``database`` and ``retention_policy`` None: the settings'."""
        if isinstance(lines, bytes):
            body = lines
        elif isinstance(lines, str):
            body = lines.encode()
        else:
            body = "\n".join(lines).encode()
        count = sum(1 for line in body.split(b"\n") if line.strip())
        if not count:
            return 0
        params = dict(self.settings.write_params(database, retention_policy), precision=precision)
        self._send("POST", "/write", params, body, {"Content-Type": "text/plain; charset=utf-8"})
        return count

    def _query(self, method: str, influxql: str, database: str | None) -> list[Series]:
        params = {"q": influxql, "epoch": "ns", "chunked": "true", "chunk_size": str(CHUNK_ROWS)}
        db = self.settings.database if database is None else database
        if db:
            params["db"] = db
            if self.settings.retention_policy:
                params["rp"] = self.settings.retention_policy
        response = self._send(method, "/query", params)
        return parse_results(response.text, influxql, status=response.status_code)

    def _send(
        self,
        method: str,
        path: str,
        params: Mapping[str, str],
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        url = self.settings.base_url
        try:
            response = self._http.request(method, path, params=params, content=body, headers=headers)
        except httpx.HTTPError as exc:
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise InfluxError(f"cannot reach InfluxDB at {url}: {reason}") from exc
        if not 200 <= response.status_code < 300:
            message = error_text(response.text, response.headers.get("X-Influxdb-Error"))
            raise InfluxError(
                f"InfluxDB at {url} answered HTTP {response.status_code}: {message}",
                status=response.status_code,
                message=message,
            )
        return response
