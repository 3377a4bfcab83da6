"""Part: collector. The transport of the sink: one InfluxDB destination, built from the settings.

A :class:`Backend` sends one body of line protocol and says what InfluxDB answered (an
:class:`~gpuprobe.influx.answers.Answer`; the sink gives it its meaning and retries). Two, chosen by
``--influx-api``: :class:`V1Backend` posts to ``/write?db=&rp=&precision=ns`` with httpx (InfluxDB 1.x,
and the v1 compatibility API of 2.x and 3.x; with ``--influx-create-db`` it creates the database and
its retention policy through :mod:`gpuprobe.influx.retention`); :class:`V2Backend` uses the official
``influxdb-client``'s asyncio client (``/api/v2/write`` with org, bucket and token).
:func:`make_backend` builds one from the collector's settings.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Protocol

import httpx

from gpuprobe.collector.compression import gzip_bytes
from gpuprobe.collector.settings import CollectorSettings, InfluxRoute
from gpuprobe.influx.answers import Answer, error_text, parse_retry_after
from gpuprobe.influx.influxql import InfluxError, parse_results, quote_identifier
from gpuprobe.influx.retention import create_database_statement, create_policy_statement
from gpuprobe.influx.settings import InfluxSettings

if TYPE_CHECKING:
    from influxdb_client.client.influxdb_client_async import InfluxDBClientAsync
    from influxdb_client.client.write_api_async import WriteApiAsync


log = logging.getLogger(__name__)

_GZIP_INLINE_BYTES = 64 * 1024
_ANSWER_BODY_MAX_CHARS = 8000  # InfluxDB's messages are short; a proxy's HTML page need not be kept whole


class Backend(Protocol):
    """Sends one body of line protocol (uncompressed, ``\\n``-separated) to InfluxDB."""

    name: str

    async def write(self, body: bytes) -> Answer: ...

    async def prepare(self) -> None:
        """Called once at start (create the database where configured); must not raise."""

    async def on_not_found(self) -> bool:
        """Called after a 404; True when something was fixed and an immediate retry makes sense."""

    async def close(self) -> None: ...


class V1Backend:
    """``POST /write?db=&rp=&precision=ns`` (InfluxDB 1.x; 2.x and 3.x through their v1 API)."""

    name = "v1"

    def __init__(
        self,
        url: str,
        database: str,
        retention_policy: str = "",
        *,
        username: str = "",
        password: str = "",
        token: str = "",
        gzip_level: int = 1,
        timeout_s: float = 30.0,
        connections: int = 4,
        ca_file: str = "",
        create_database: bool = False,
        retention: str = "",
    ) -> None:
        self.settings = settings = InfluxSettings(
            url=url,
            database=database,
            retention_policy=retention_policy,
            username=username,
            password=password,
            token=token,
            create_database=create_database,
            retention=retention,
            ca_file=ca_file,
            timeout_s=timeout_s,
            gzip_level=gzip_level,
        )
        self._headers = {"User-Agent": "gpuprobe-collector", **settings.auth_headers()}
        self._write_headers = {**self._headers, "Content-Type": "text/plain; charset=utf-8"}
        if gzip_level > 0:
            self._write_headers["Content-Encoding"] = "gzip"
        self._params = settings.write_params()
        self._client = httpx.AsyncClient(
            base_url=settings.base_url,
            timeout=timeout_s,
            verify=settings.verify(),
            limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
        )

    async def write(self, body: bytes) -> Answer:
        data = body
        level = self.settings.gzip_level
        if level > 0:
            if len(body) > _GZIP_INLINE_BYTES:  # larger bodies compress in a thread, off the event loop
                data = await asyncio.to_thread(gzip_bytes, body, level)
            else:
                data = gzip_bytes(body, level)
        try:
            response = await self._client.post("/write", params=self._params, content=data, headers=self._write_headers)
        except httpx.ConnectError as exc:
            return Answer(None, f"{type(exc).__name__}: {exc}".strip(), unreachable=True)
        except httpx.HTTPError as exc:
            return Answer(None, f"{type(exc).__name__}: {exc}".strip())
        return Answer(
            response.status_code,
            response.text[:_ANSWER_BODY_MAX_CHARS],
            parse_retry_after(response.headers.get("Retry-After")),
        )

    async def query(self, influxql: str) -> Answer:
        try:
            response = await self._client.post("/query", params={"q": influxql}, headers=self._headers)
        except httpx.HTTPError as exc:
            return Answer(None, f"{type(exc).__name__}: {exc}")
        return Answer(response.status_code, response.text[:_ANSWER_BODY_MAX_CHARS])

    async def prepare(self) -> None:
        if self.settings.create_database:
            await self._create()

    async def retention_policies(self) -> set[str] | None:
        """The database's retention policies; None when InfluxDB cannot tell (down, no database, refused)."""
        policies, _ = await self.retention_policies_or_cause()
        return policies

    async def retention_policies_or_cause(self) -> tuple[set[str] | None, str]:
        """The database's retention policies and "", or None and why InfluxDB could not tell, in one
        sentence that names the cause and what to do (the collector logs it at start)."""
        settings = self.settings
        where = f"InfluxDB at {settings.base_url}"
        statement = f"SHOW RETENTION POLICIES ON {quote_identifier(settings.database)}"
        answer = await self.query(statement)
        if answer.status is None:
            return None, (
                f"{where} is unreachable ({answer.body}): check --influx-url and that InfluxDB runs; the agents'"
                " data waits in the WAL until it answers"
            )
        if answer.status in (401, 403):
            return None, (
                f"{where} refused the credentials (HTTP {answer.status}): check --influx-user and"
                " GPUPROBE_INFLUX_PASSWORD (or --influx-token); the agents' data waits in the WAL"
            )
        if answer.status != 200:
            return None, f"{where} answered HTTP {answer.status} ({answer.body[:200]}): check --influx-url"
        try:
            return {str(row[0]) for series in parse_results(answer.body, statement) for row in series.values}, ""
        except InfluxError as exc:
            if "database not found" in str(exc) and not settings.create_database:
                return None, (
                    f"{where} has no database {settings.database!r}: create it (gpuprobe collector --init-db,"
                    f" or CREATE DATABASE {quote_identifier(settings.database)}), start with --influx-create-db,"
                    " or fix --influx-db; the agents' data waits in the WAL until it exists"
                )
            return None, f"{where}: {exc}"

    async def on_not_found(self) -> bool:
        return await self._create() if self.settings.create_database else False

    async def _create(self) -> bool:
        settings = self.settings
        statements = [create_database_statement(settings.database)]
        if settings.retention_policy:
            statements.append(
                create_policy_statement(settings.database, settings.retention_policy, settings.retention or "INF")
            )
        ok = True
        for statement in statements:
            answer = await self.query(statement)
            if answer.status == 200:
                try:
                    parse_results(answer.body, statement)
                except InfluxError as exc:
                    problem = exc.message
                else:
                    problem = ""
            else:
                problem = f"{answer.status}: {error_text(answer.body)}"
            if problem and "already exists" not in problem:
                log.error("InfluxDB refused %r: %s", statement, problem[:500])
                ok = False
            elif not problem:
                log.info("InfluxDB: %s", statement)
        return ok

    async def close(self) -> None:
        await self._client.aclose()


class V2Backend:
    """``/api/v2/write`` through ``influxdb-client``'s asyncio client (org, bucket, token, gzip).

    The client is made on the first write, inside the running event loop: its aiohttp session
    belongs to the loop it was made in."""

    name = "v2"

    def __init__(
        self,
        url: str,
        org: str,
        bucket: str,
        token: str,
        *,
        gzip: bool = True,
        timeout_s: float = 30.0,
        connections: int = 4,
        ca_file: str = "",
    ) -> None:
        self.url = url
        self.org = org
        self.bucket = bucket
        self._token = token
        self._gzip = gzip
        self._timeout_s = timeout_s
        self._connections = connections
        self._ca_file = ca_file
        self._client: InfluxDBClientAsync | None = None
        self._write_api: WriteApiAsync | None = None

    def _writer(self) -> WriteApiAsync:
        if self._write_api is None:
            from influxdb_client.client.influxdb_client_async import InfluxDBClientAsync

            self._client = InfluxDBClientAsync(
                url=self.url,
                token=self._token,
                org=self.org,
                enable_gzip=self._gzip,
                timeout=int(self._timeout_s * 1000),  # ms, for the whole request
                connection_pool_maxsize=self._connections,
                ssl_ca_cert=self._ca_file or None,
            )
            self._write_api = self._client.write_api()
        return self._write_api

    async def write(self, body: bytes) -> Answer:
        import aiohttp
        from influxdb_client.domain.write_precision import WritePrecision
        from influxdb_client.rest import ApiException

        precision: Any = WritePrecision.NS  # a str constant; the stubs ask for the enum-like class
        try:
            await self._writer().write(bucket=self.bucket, org=self.org, record=body, write_precision=precision)
        except ApiException as exc:
            retry_after = exc.headers.get("Retry-After") if exc.headers else None
            text = exc.body.decode(errors="replace") if isinstance(exc.body, bytes) else str(exc.body or exc.reason)
            return Answer(exc.status, text[:_ANSWER_BODY_MAX_CHARS], parse_retry_after(retry_after))
        except aiohttp.ClientConnectorError as exc:  # no connection (refused, no route, no such host)
            return Answer(None, f"{type(exc).__name__}: {exc}", unreachable=True)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:  # no answer
            return Answer(None, f"{type(exc).__name__}: {exc}")
        return Answer(204)

    async def prepare(self) -> None:
        return None

    async def on_not_found(self) -> bool:
        return False

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()  # type: ignore[no-untyped-call]  # influxdb-client leaves it unannotated
            self._client = self._write_api = None


def make_backend(
    config: CollectorSettings, route: InfluxRoute | None = None, retention_policy: str | None = None
) -> Backend:
    """The backend of ``--influx-url``, or of one ``--influx-route`` (its URL and database or bucket,
    the other ``--influx-*`` settings shared); v1 into ``retention_policy`` rather than ``--influx-rp``."""
    influx = config.influx
    if retention_policy is not None:  # a policy that exists (--influx-create-db must not create it another way)
        influx = dataclasses.replace(influx, retention_policy=retention_policy, create_database=False)
    if route is not None:
        if influx.api == "v2":
            influx = dataclasses.replace(influx, url=route.url, bucket=route.database or influx.bucket)
        else:
            influx = dataclasses.replace(influx, url=route.url, database=route.database or influx.database)
    connections = config.sink.concurrency + 1
    if influx.api == "v2":
        return V2Backend(
            influx.url,
            influx.org,
            influx.bucket,
            influx.token,
            gzip=influx.gzip_level > 0,
            timeout_s=influx.timeout_s,
            connections=connections,
            ca_file=influx.ca_file,
        )
    return V1Backend(
        influx.url,
        influx.database,
        influx.retention_policy,
        username=influx.username,
        password=influx.password,
        token=influx.token,
        gzip_level=influx.gzip_level,
        timeout_s=influx.timeout_s,
        connections=connections,
        ca_file=influx.ca_file,
        create_database=influx.create_database,
        retention=influx.retention,
    )
