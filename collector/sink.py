"""Part: collector. Drains the WAL into InfluxDB: batches of about 5 000 lines, gzip, several requests in flight.

Every answer gets its meaning once (:func:`gpuprobe.influx.answers.classify`) and is handled so that
nothing is lost and nothing loops forever:

=========================  ==============================================================================
answer                     what the sink does
=========================  ==============================================================================
2xx                        written; the WAL rows are deleted
400 / 422 (partial write,  the valid lines are stored by InfluxDB; the refused ones are found (named in
unparseable lines)         the message, listed by line number (3.x), or by sending halves again, which is
                           idempotent) and moved to the quarantine table; never retried
413 (too large)            split in halves and each sent again; a single line that is too large is
                           quarantined
429 / 503                  wait ``Retry-After`` (seconds or an HTTP date; capped exponential backoff when
                           absent), then send again
500 "max series per        InfluxDB 1.x refuses new series beyond ``max-series-per-database``: retrying
database exceeded"         cannot help, so the refused lines are isolated as for 400 and quarantined
disk full (any status)     "no space left on device", ENOSPC, ...: capped exponential backoff, then send
                           again; nothing is quarantined because InfluxDB's disk filled
other 5xx, no answer       capped exponential backoff with jitter, then send again (until it works)
401 / 403 / 404, other 4xx an alert (an ERROR log line at most once a minute, the ``sink_alerts`` metric,
                           ``sink_up`` 0); the WAL keeps buffering and the request is retried with the
                           capped backoff (v1 with ``--influx-create-db``: a 404 creates the database);
                           a drain ends at once on it (:meth:`Sink.hopeless`)
=========================  ==============================================================================

Two backends, chosen by ``--influx-api``: :class:`V1Backend` posts to ``/write?db=&rp=&precision=ns``
with httpx (InfluxDB 1.x, and the v1 compatibility API of 2.x and 3.x); :class:`V2Backend` uses the
official ``influxdb-client``'s asyncio client (``/api/v2/write`` with org, bucket and token).

Lanes: one destination is drained by one lane. Several (``--influx-route`` by ``cluster`` tag, and
the ``events`` retention policy that also gets the probe, trainer, GPU inventory and event lines)
are drained by one lane each, with its own WAL cursor, requests, retries and backoff; a WAL row is
deleted once every lane passed it (:class:`Sink`).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import re
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import httpx

from gpuprobe.backoff import Backoff
from gpuprobe.collector.compression import gunzip_bytes, gzip_bytes
from gpuprobe.collector.metrics import Metrics
from gpuprobe.collector.wal import PendingRow, WriteAheadLog
from gpuprobe.influx.answers import (
    Answer,
    Verdict,
    classify,
    error_text,
    line_errors,
    parse_retry_after,
    reason,
    refused_lines_named,
)
from gpuprobe.influx.influxql import InfluxError, parse_results, quote_identifier
from gpuprobe.influx.retention import (
    EVENT_MEASUREMENTS,
    EVENTS_RP,
    create_database_statement,
    create_policy_statement,
)
from gpuprobe.influx.settings import InfluxSettings

if TYPE_CHECKING:
    from influxdb_client.client.influxdb_client_async import InfluxDBClientAsync
    from influxdb_client.client.write_api_async import WriteApiAsync

log = logging.getLogger(__name__)

_GZIP_INLINE_BYTES = 64 * 1024
_ALERT_LOG_INTERVAL_S = 60.0
#: A drain retries a failed request at least this often, whatever ``--sink-max-backoff``.
DRAIN_RETRY_MAX_S = 0.5
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


@dataclass(frozen=True)
class SinkSettings:
    batch_lines: int = 5000
    concurrency: int = 3
    linger_s: float = 0.05
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    retry_after_max_s: float = 300.0
    #: Requests one refused chunk may spend finding its refused lines before the rest of the
    #: suspect part is quarantined whole.
    isolate_budget: int = 64


@dataclass
class _Chunk:
    """Rows read together, sent as one request; ``done`` once InfluxDB has them (or refused some for good).

    A routed lane keeps the rows until its mark passes them (the sink deletes them once every lane has)."""

    last_id: int
    rows: list[PendingRow] | None = None
    done: bool = False


@dataclass(frozen=True)
class Destination:
    """Where the lines of some ``cluster`` tag values go (``--influx-route``): one InfluxDB server and
    database (v1) or bucket (v2), drained by its own lane."""

    name: str  # the metrics label and the log lines' name: the route's URL (and database)
    backend: Backend
    clusters: frozenset[str]


class Sink:
    """Sends the WAL's pending rows to InfluxDB until stopped: to one :class:`Backend`, or routed by the
    lines' ``cluster`` tag to several (``--influx-route``), each drained by its own lane.

    It also knows which rows InfluxDB has: every row up to :attr:`written_through` was answered 2xx
    (or its refused lines were quarantined) by every destination. Chunks are read in id order but
    finish in any order, so a lane's mark only moves past a chunk once every chunk before it finished
    too. :meth:`written` waits for the mark (``--ack-after sink``).

    Routed, every lane reads the whole WAL with its own cursor and sends only its own lines; a lane
    quarantines what its InfluxDB refused at once, and a row is deleted by the last lane to pass it
    (each lane's mark only grows, so exactly one lane sees all the others past it). A destination
    that is down holds its rows in the WAL while the other lanes keep going; after a restart every
    lane starts again from the oldest row left, which sends some lines a second time to the
    destinations that had them: harmless, every point overwrites itself."""

    def __init__(
        self,
        wal: WriteAheadLog,
        backend: Backend,
        metrics: Metrics,
        settings: SinkSettings,
        routes: Sequence[Destination] = (),
        events: Mapping[str, Backend] | None = None,
    ) -> None:
        """``routes``: the ``--influx-route`` destinations; ``events``: for a destination (``default`` or
        a route's name) whose database has the ``events`` retention policy, a backend that writes into
        it: that destination's :data:`EVENT_MEASUREMENTS` lines are written there too, by a lane of
        their own."""
        self.wal = wal
        self.backend = backend
        self.metrics = metrics
        self.settings = settings
        self.routed = bool(routes) or bool(events)
        if self.routed:
            # a cluster named by two routes goes to the first one (settings.check refuses that anyway)
            where: dict[bytes, _Lane] = {}
            self.lanes = [_Lane(self, "default", backend)]
            for route in routes:
                lane = _Lane(self, route.name, route.backend)
                self.lanes.append(lane)
                for cluster in route.clusters:
                    where.setdefault(cluster_tag_text(cluster), lane)
            default = self.lanes[0]
            if routes:
                for lane in self.lanes:
                    lane.select = _selector(lane, where, default)
            for main in list(self.lanes):
                events_backend = (events or {}).get(main.name)
                if events_backend is not None:
                    lane = _Lane(self, f"{main.name} ({EVENTS_RP})", events_backend)
                    lane.select = _events_selector(main.select)
                    self.lanes.append(lane)
        else:
            self.lanes = [_Lane(self, "", backend)]
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []  # heap of (row id, tiebreak, future)
        self._tiebreak = itertools.count()
        self._settling: set[asyncio.Future[None]] = set()

    @property
    def written_through(self) -> int:
        """Every pending row id up to this one is in InfluxDB (every destination's), or quarantined."""
        return min(lane.written_through for lane in self.lanes)

    @property
    def up(self) -> bool:
        """Every destination accepts writes."""
        return all(lane.up for lane in self.lanes)

    async def start(self) -> None:
        for lane in self.lanes:
            await lane.start()

    async def written(self, row_id: int) -> None:
        """Returns once InfluxDB has the WAL row ``row_id`` (2xx, or its refused lines quarantined)."""
        if row_id <= self.written_through or (self.routed and self.done_with(row_id)):
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (row_id, next(self._tiebreak), future))
        await future

    def hurry(self) -> None:
        """From now on partly filled requests go out at once (``--sink-linger`` no longer applies):
        a drain writes what the WAL holds without waiting for lines that will not come. Requests
        waiting out a backoff are sent again now, and retried at least every
        :data:`DRAIN_RETRY_MAX_S` (a drain is short; it must see InfluxDB come back)."""
        for lane in self.lanes:
            lane.hurry.set()
            lane.retry_now()

    def hopeless(self, since: float, grace_s: float) -> str | None:
        """Why a drain that began at ``since`` (monotonic) cannot write what is left, or None while it
        may: some destination answered, after ``since``, with a refusal that retrying cannot fix
        (401, 403, 404, another 4xx), or could not be connected to at all for ``grace_s`` within
        the drain, and every other destination has written all it had."""
        now = time.monotonic()
        reasons: list[str] = []
        for lane in self.lanes:
            failing = lane.failing
            if failing is not None:
                kind, answer, first, latest = failing
                where = f" ({lane.name})" if lane.name else ""
                if kind == "refused" and latest >= since:
                    said = error_text(answer.body)[:200]
                    reasons.append(f"InfluxDB{where} refuses the writes (HTTP {answer.status}: {said})")
                    continue
                if kind == "unreachable" and latest >= since and now - max(first, since) >= grace_s:
                    reasons.append(f"InfluxDB{where} cannot be reached ({answer.body[:200]})")
                    continue
            if not lane.idle:
                return None
        return "; ".join(reasons) or None

    async def stop(self) -> None:
        """Stops sending; requests in flight are abandoned (their rows stay in the WAL)."""
        for _, _, future in self._waiters:
            future.cancel()
        self._waiters.clear()
        for lane in self.lanes:
            lane.cancel()
        for lane in self.lanes:
            await lane.stopped()
        if self._settling:  # what InfluxDB confirmed is deleted before the WAL closes
            await asyncio.gather(*self._settling, return_exceptions=True)
        for lane in self.lanes:
            await lane.backend.close()

    # --- called by the lanes ----------------------------------------------------------------------

    def settle(self, rows: Sequence[PendingRow], refused: Sequence[tuple[bytes, int | None, str]]) -> None:
        """Deletes ``rows`` and quarantines ``refused`` in the background (a WAL commit: an fsync the
        next request need not wait for)."""
        if not rows and not refused:
            return
        settle = asyncio.ensure_future(self.wal.settle(rows, refused))
        self._settling.add(settle)
        settle.add_done_callback(self._settled)

    def passed(self, lane: _Lane, chunks: Sequence[_Chunk]) -> None:
        """``lane``'s mark moved past ``chunks``: routed, the rows every other lane passed already are
        deleted; then the ``--ack-after sink`` waiters the new mark covers are released."""
        if self.routed:
            others = [other for other in self.lanes if other is not lane]
            last = [
                row
                for chunk in chunks
                for row in chunk.rows or ()
                if all(other.written_through >= row.id for other in others)
            ]
            self.settle(last, ())
        self.progressed()

    def progressed(self) -> None:
        """Releases the ``--ack-after sink`` waiters whose rows every destination has now."""
        through = self.written_through
        waiters = self._waiters
        while waiters and waiters[0][0] <= through:
            _, _, future = heapq.heappop(waiters)
            if not future.done():
                future.set_result(None)
        if self.routed and waiters:
            # routed, a later row may be done before an earlier one: its lines went to a destination
            # that is up, while one that is down holds back only the rows with lines for it
            done = [w for w in waiters if self.done_with(w[0])]
            if done:
                for _, _, future in done:
                    if not future.done():
                        future.set_result(None)
                self._waiters = [w for w in waiters if not self.done_with(w[0])]
                heapq.heapify(self._waiters)

    def done_with(self, row_id: int) -> bool:
        """Every destination has row ``row_id`` (or it holds no lines for some of them)."""
        return all(lane.done_with(row_id) for lane in self.lanes)

    def lane_up_changed(self) -> None:
        self.metrics.sink_up(self.up)

    def _settled(self, future: asyncio.Future[None]) -> None:
        self._settling.discard(future)
        if not future.cancelled() and future.exception() is not None:
            log.error("could not delete delivered rows from the WAL (they will be sent again): %s", future.exception())


class _Lane:
    """One destination's reader and senders: its own cursor in the WAL, its own requests in flight,
    its own retries and backoff, so a destination that is down or slow holds back only itself."""

    def __init__(self, sink: Sink, name: str, backend: Backend) -> None:
        self.sink = sink
        self.name = name  # "" when the sink is not routed (log lines and metrics then name no destination)
        self.backend = backend
        self.wal = sink.wal
        self.metrics = sink.metrics
        self.settings = sink.settings
        #: Routed: this lane's lines of a body (None: every line).
        self.select: Callable[[bytes], tuple[bytes, int]] | None = None
        self._wake = asyncio.Event()
        self.hurry = asyncio.Event()  # set by a drain: partly filled requests no longer linger
        # (chunk, rows, routed: this destination's lines of the rows and their number)
        self._queue: asyncio.Queue[tuple[_Chunk, list[PendingRow], bytes, int]] = asyncio.Queue(
            maxsize=max(1, self.settings.concurrency)
        )
        self._chunks: deque[_Chunk] = deque()
        self.written_through = 0  # every pending row id up to this one is in this destination (or quarantined)
        #: Routed: ids of rows past the mark that hold none of this destination's lines.
        self.clear: set[int] = set()
        self._clear_kept = 1024
        self._skimmed = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._last_alert_log: dict[int | None, float] = {}
        self._last_retry_log: dict[tuple[int | None, str], float] = {}
        self._retries_unlogged = 0
        self.up = True
        #: The last answers' failure that retrying within a drain cannot mend: ``("refused", answer)``
        #: (an alert: credentials, permissions, database) or ``("unreachable", answer)`` (no connection),
        #: with the monotonic time the run of such answers began and that of the latest one; None once
        #: any other answer came.
        self.failing: tuple[str, Answer, float, float] | None = None
        self._caught_up = False  # the dispatcher's last read found nothing past its cursor
        # resolved and replaced by retry_now(): wakes the workers waiting out a backoff at once
        self._retry_now: asyncio.Future[None] | None = None
        self.wal.add_listener(self._wake.set)
        if name:
            self.metrics.destination_up(name, True)

    async def start(self) -> None:
        await self.backend.prepare()
        label = f"sink-{self.name}" if self.name else "sink"
        self._tasks.append(asyncio.create_task(self._dispatch(), name=f"{label}-dispatch"))
        for i in range(max(1, self.settings.concurrency)):
            self._tasks.append(asyncio.create_task(self._work(), name=f"{label}-worker-{i}"))

    def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()

    @property
    def idle(self) -> bool:
        """This lane sent everything the WAL holds for it, and nothing of it is outstanding."""
        return self._caught_up and not self._chunks

    def retry_now(self) -> None:
        """Wakes the workers waiting out a backoff."""
        if self._retry_now is not None and not self._retry_now.done():
            self._retry_now.set_result(None)
        self._retry_now = None

    async def _pause(self, delay_s: float) -> None:
        """Waits ``delay_s`` before a retry (at most :data:`DRAIN_RETRY_MAX_S` in a drain), or until
        :meth:`retry_now`."""
        if self.hurry.is_set():
            delay_s = min(delay_s, DRAIN_RETRY_MAX_S)
        # asyncio.wait, not wait_for: Python 3.11's wait_for can swallow a cancellation that comes as
        # the awaited thing completes, and a worker that missed its cancel would retry forever
        if self._retry_now is None:
            self._retry_now = asyncio.get_running_loop().create_future()
        await asyncio.wait({self._retry_now}, timeout=delay_s)

    async def stopped(self) -> None:
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()

    @property
    def _where(self) -> str:
        return f" ({self.name})" if self.name else ""

    # --- reading the WAL ------------------------------------------------------------------------

    async def _dispatch(self) -> None:
        after = 0
        target = self.settings.batch_lines
        while True:
            self._wake.clear()
            rows = await asyncio.to_thread(self.wal.read_after, after, target)
            if rows and sum(r.line_count for r in rows) < target and self.settings.linger_s > 0:
                with contextlib.suppress(TimeoutError):  # a drain does not wait for more lines
                    await asyncio.wait_for(self.hurry.wait(), self.settings.linger_s)
                rows = await asyncio.to_thread(self.wal.read_after, after, target)
            if not rows:
                self._caught_up = True
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=1.0)
                continue
            self._caught_up = False
            after = rows[-1].id
            if not self.sink.routed:
                chunk = _Chunk(after)
                self._chunks.append(chunk)
                await self._queue.put((chunk, rows, b"", 0))
                continue
            body, count, clear = await asyncio.to_thread(self._mine, rows)
            if clear:
                self.clear.update(clear)
                self.sink.progressed()
            chunk = _Chunk(after, rows)
            self._chunks.append(chunk)
            if not count:  # nothing of this destination's: passed at once
                self._chunk_done(chunk)
                continue
            if self._queue.full():
                await self._skim(after)
            await self._queue.put((chunk, rows, body, count))

    def _mine(self, rows: Sequence[PendingRow]) -> tuple[bytes, int, list[int]]:
        """This destination's lines of ``rows``, their number, and the ids of the rows without any."""
        if self.select is None:
            return _rows_body(rows), sum(r.line_count for r in rows), []
        parts: list[bytes] = []
        count = 0
        clear: list[int] = []
        for row in rows:
            body, n = self.select(gunzip_bytes(row.gzipped))
            if n:
                parts.append(body)
                count += n
            else:
                clear.append(row.id)
        return b"".join(parts), count, clear

    async def _skim(self, after: int) -> None:
        """While this destination's requests are all taken (it is down or slow), reads on past ``after``
        without keeping anything but the ids of the rows that hold none of its lines: their batches
        need not wait for this destination (``--ack-after sink``). The rows that do are read again
        once there is room."""
        target = self.settings.batch_lines
        skimmed = max(after, self._skimmed)
        while self._queue.full():
            self._wake.clear()
            rows = await asyncio.to_thread(self.wal.read_after, skimmed, target)
            if not rows:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=0.5)
                continue
            _, _, clear = await asyncio.to_thread(self._mine, rows)
            self.clear.update(clear)
            skimmed = self._skimmed = rows[-1].id
            if clear:
                self.sink.progressed()

    def done_with(self, row_id: int) -> bool:
        """This destination has row ``row_id``'s lines (or the row holds none of them)."""
        return row_id <= self.written_through or row_id in self.clear

    def _chunk_done(self, chunk: _Chunk) -> None:
        chunk.done = True
        passed: list[_Chunk] = []
        while self._chunks and self._chunks[0].done:
            passed.append(self._chunks.popleft())
            self.written_through = passed[-1].last_id
        if passed:
            if self.clear and len(self.clear) > 2 * self._clear_kept:  # forget what the mark passed
                self.clear = {row_id for row_id in self.clear if row_id > self.written_through}
                self._clear_kept = max(1024, len(self.clear))
            self.sink.passed(self, passed)
            for done in passed:
                done.rows = None

    async def _work(self) -> None:
        while True:
            chunk, rows, body, count = await self._queue.get()
            refused: list[tuple[bytes, int | None, str]] = []
            backoff = self._backoff()
            while True:
                try:
                    if not self.sink.routed:
                        body = await asyncio.to_thread(_rows_body, rows)
                        count = sum(r.line_count for r in rows)
                    await self._deliver(body, count, refused)
                    break
                except Exception:  # a bug must not lose the rows: they are sent again
                    log.exception(
                        "sending %d WAL rows failed unexpectedly%s; sending them again", len(rows), self._where
                    )
                    refused.clear()
                    await backoff.wait()
            if not self.sink.routed:
                self._chunk_done(chunk)
                self.sink.settle(rows, refused)
            else:
                # routed, a row is deleted once every lane passed it (Sink.passed); what this
                # destination refused is quarantined first, so that no deletion can overtake it
                self.sink.settle((), refused)
                self._chunk_done(chunk)
            for _, status, _ in refused:
                self.metrics.quarantined(quarantine_label(status))

    # --- one chunk ------------------------------------------------------------------------------

    async def _deliver(self, body: bytes, count: int, refused: list[tuple[bytes, int | None, str]]) -> None:
        """Sends ``body`` (``count`` lines, each ending in a newline) until each line is written or in
        ``refused``. Only an answer that concerns single lines makes the body be split into lines."""
        answer = await self._send_until_settled(body, count)
        verdict = classify(answer)
        if verdict is Verdict.WRITTEN:
            return
        lines = body.split(b"\n")
        if lines and not lines[-1]:
            lines.pop()
        if verdict is Verdict.TOO_LARGE:
            await self._split(lines, answer, refused)
            return
        budget = [self.settings.isolate_budget]
        named, unnamed = refused_lines_named(answer, lines) if verdict is Verdict.REFUSED_LINES else (set(), None)
        self._refuse_named(lines, named, answer, refused)
        if named and unnamed == 0:
            return  # every refused line is named; InfluxDB stored the others
        rest = [line for position, line in enumerate(lines) if position not in named]
        if rest:
            await self._isolate(rest, answer, refused, budget, known_bad=not named)

    async def _split(self, lines: list[bytes], answer: Answer, refused: list[tuple[bytes, int | None, str]]) -> None:
        if len(lines) == 1:
            refused.append((lines[0], answer.status, "a single line larger than InfluxDB accepts (413)"))
            return
        middle = len(lines) // 2
        self.metrics.sink_split()
        for half in (lines[:middle], lines[middle:]):
            await self._deliver(_body(half), len(half), refused)

    @staticmethod
    def _refuse_named(
        lines: list[bytes], named: set[int], answer: Answer, refused: list[tuple[bytes, int | None, str]]
    ) -> None:
        """The lines ``answer`` names as refused go to ``refused``, each with InfluxDB's own words."""
        why = line_errors(answer) if named else {}
        for position in sorted(named):
            own = why.get(position)
            refused.append((lines[position], answer.status, reason(answer) + (f" ({own})" if own else "")))

    async def _isolate(
        self,
        lines: list[bytes],
        answer: Answer,
        refused: list[tuple[bytes, int | None, str]],
        budget: list[int],
        *,
        known_bad: bool,
    ) -> None:
        """Finds the refused lines among ``lines`` by sending halves (idempotent for the good ones).

        ``known_bad``: ``answer`` is the answer to exactly these lines, so sending them whole again
        would tell nothing new."""
        if not known_bad:
            if budget[0] <= 0:
                refused.extend((line, answer.status, reason(answer) + " (not isolated further)") for line in lines)
                return
            budget[0] -= 1
            answer = await self._send_until_settled(_body(lines), len(lines))
            verdict = classify(answer)
            if verdict is Verdict.WRITTEN:
                return
            if verdict is Verdict.TOO_LARGE:
                await self._split(lines, answer, refused)
                return
            if verdict is Verdict.REFUSED_LINES:
                # InfluxDB 3.x names up to 100 refused lines per answer: take those, look further only
                # among the others (each round has fewer lines, so this ends)
                named, unnamed = refused_lines_named(answer, lines)
                if named:
                    self._refuse_named(lines, named, answer, refused)
                    rest = [line for position, line in enumerate(lines) if position not in named]
                    if rest and unnamed != 0:
                        await self._isolate(rest, answer, refused, budget, known_bad=False)
                    return
        if len(lines) == 1:
            refused.append((lines[0], answer.status, reason(answer)))
            return
        if budget[0] <= 0:
            refused.extend((line, answer.status, reason(answer) + " (not isolated further)") for line in lines)
            return
        middle = len(lines) // 2
        for half in (lines[:middle], lines[middle:]):
            await self._isolate(half, answer, refused, budget, known_bad=False)

    async def _send_until_settled(self, body: bytes, count: int) -> Answer:
        """Sends until the answer is final for these lines: written, refused, too large or series limit.
        Throttling, server errors, no answer and alerts are waited out here (the WAL keeps buffering)."""
        backoff = self._backoff()
        while True:
            started = time.perf_counter()
            answer = await self.backend.write(body)
            elapsed = time.perf_counter() - started
            verdict = classify(answer)
            self._note_failure(answer, verdict)
            self.metrics.write_request(answer.status, verdict.value, elapsed)
            if verdict is Verdict.WRITTEN:
                self.metrics.written(count)
                if self.name:
                    self.metrics.destination_written(self.name, count)
                self._set_up(True)
                return answer
            if verdict in (Verdict.REFUSED_LINES, Verdict.TOO_LARGE, Verdict.SERIES_LIMIT):
                self._set_up(True)
                return answer
            if verdict is Verdict.ALERT:
                self._alert(answer)
                if answer.status == 404 and await self.backend.on_not_found():
                    self.failing = None  # the database was created: not a refusal (yet)
                    continue
                delay = backoff.next_delay_s()
            elif verdict is Verdict.THROTTLED and answer.retry_after_s is not None:
                delay = min(answer.retry_after_s, self.settings.retry_after_max_s)
                log.warning("InfluxDB%s answered %s; waiting Retry-After %.1f s", self._where, answer.status, delay)
            else:
                # InfluxDB is down or failing (a full disk among others): it does not accept writes
                delay = backoff.next_delay_s()
                self._set_up(False)
                self._log_retry(answer, delay)
            self.metrics.sink_retry(verdict.value)
            if self.name:
                self.metrics.destination_retry(self.name, verdict.value)
            await self._pause(delay)

    def _note_failure(self, answer: Answer, verdict: Verdict) -> None:
        kind = "refused" if verdict is Verdict.ALERT else "unreachable" if answer.unreachable else None
        if kind is None:
            self.failing = None
            return
        now = time.monotonic()
        first = self.failing[2] if self.failing is not None and self.failing[0] == kind else now
        self.failing = (kind, answer, first, now)

    def _backoff(self) -> Backoff:
        return Backoff(self.settings.backoff_initial_s, self.settings.backoff_max_s)

    def _log_retry(self, answer: Answer, delay_s: float) -> None:
        """One line per kind of failure a minute, not one per request (several are in flight)."""
        now = time.monotonic()
        key = (answer.status, answer.body[:80])
        if now - self._last_retry_log.get(key, -1e9) < _ALERT_LOG_INTERVAL_S:
            self._retries_unlogged += 1
            return
        self._last_retry_log[key] = now
        also = (
            f" ({self._retries_unlogged} more failed requests since the last such line)"
            if self._retries_unlogged
            else ""
        )
        self._retries_unlogged = 0
        log.warning(
            "InfluxDB%s write failed (%s: %s); retrying in %.1f s, the WAL keeps the lines%s",
            self._where,
            answer.status if answer.status is not None else "no answer",
            answer.body[:300],
            delay_s,
            also,
        )

    def _alert(self, answer: Answer) -> None:
        self._set_up(False)
        self.metrics.sink_alert(answer.status)
        now = time.monotonic()
        if now - self._last_alert_log.get(answer.status, -1e9) >= _ALERT_LOG_INTERVAL_S:
            self._last_alert_log[answer.status] = now
            log.error(
                "InfluxDB%s refuses the collector's writes (HTTP %s: %s); check %s, the database or "
                "bucket, and the credentials. Batches stay in the WAL (%d lines queued) and are retried.",
                self._where,
                answer.status,
                answer.body[:500] or "(no message)",
                "--influx-route" if self.name and self.name != "default" else "--influx-url",
                self.wal.depth_lines,
            )

    def _set_up(self, up: bool) -> None:
        if up != self.up:
            self.up = up
            if up:
                log.info(
                    "InfluxDB%s accepts writes again; %d lines queued in the WAL", self._where, self.wal.depth_lines
                )
        if self.name:
            self.metrics.destination_up(self.name, up)
        self.sink.lane_up_changed()


_MEASUREMENT_TEXT = rb"(?:[^\\, ]|\\.)*"  # escaped commas and spaces are part of the name
_TAG_VALUE = rb"(?:[^\\, ]|\\.)*"
_MEASUREMENT = re.compile(_MEASUREMENT_TEXT)
_TAG = re.compile(rb",((?:[^\\=, ]|\\.)*)=(" + _TAG_VALUE + rb")")


def cluster_of(line: bytes) -> bytes | None:
    """The ``cluster`` tag's value of one line of line protocol, escaped as written; None without one.

    Tags are read one by one from the start (escapes skipped), so an escaped ``\\,cluster\\=`` inside
    another tag's value is not taken for the tag."""
    match = _MEASUREMENT.match(line)
    position = match.end() if match is not None else 0
    while True:
        tag = _TAG.match(line, position)
        if tag is None:
            return None
        if tag.group(1) == b"cluster":
            return tag.group(2)
        position = tag.end()


def cluster_tag_text(cluster: str) -> bytes:
    """A cluster name as its tag value is written in line protocol (``,``, ``=`` and space escaped)."""
    return cluster.replace(",", "\\,").replace("=", "\\=").replace(" ", "\\ ").encode()


def _selector(lane: _Lane, where: dict[bytes, _Lane], default: _Lane) -> Callable[[bytes], tuple[bytes, int]]:
    """``select(body) -> (lines, count)``: the lines of ``body`` (one WAL row) that go to ``lane`` (a
    line whose cluster no route names goes to ``default``)."""

    def select(body: bytes) -> tuple[bytes, int]:
        lines = body.count(b"\n")
        whole = _row_cluster(body, lines)
        if whole is not None:  # the common case: one agent's batch, every line with the agent's tags
            return (body, lines) if where.get(whole, default) is lane else (b"", 0)
        mine = [line for line in body.splitlines(keepends=True) if where.get(cluster_of(line) or b"", default) is lane]
        return b"".join(mine), len(mine)

    return select


def _row_cluster(body: bytes, lines: int) -> bytes | None:
    """The cluster of every line of ``body`` when they all have the same (``b""``: none has the tag);
    None when that takes reading the lines one by one (a mix, or a lookalike in another value).

    A WAL row is one agent batch, and each of its lines carries the agent's tags: so the cluster of
    the first line that has the tag is counted as text over the whole body, at memchr speed, rather
    than by parsing ~5 000 lines in Python."""
    at = body.find(b",cluster=")
    if at < 0:
        return b""
    start = body.rfind(b"\n", 0, at) + 1
    end = body.find(b"\n", at)
    cluster = cluster_of(body[start : end + 1 if end >= 0 else len(body)])
    if cluster is None:
        return None
    tag = b",cluster=" + cluster
    return cluster if body.count(tag + b",") + body.count(tag + b" ") == lines else None


# a line of an events measurement, found after the newline that ends the line before it (the body
# gets one in front): a literal first character lets the regex engine skip along at memchr speed
_EVENT_LINE = re.compile(rb"\n((?:" + b"|".join(name.encode() for name in EVENT_MEASUREMENTS) + rb")[, ][^\n]*)")


def _events_selector(
    inner: Callable[[bytes], tuple[bytes, int]] | None,
) -> Callable[[bytes], tuple[bytes, int]]:
    """``select(body)``: the :data:`EVENT_MEASUREMENTS` lines of ``body`` that ``inner`` selects (None:
    all of them). The measurement is the line's start, so a regex over the body finds them."""

    def select(body: bytes) -> tuple[bytes, int]:
        found = _EVENT_LINE.findall(b"\n" + body)
        if not found:
            return b"", 0
        mine = b"\n".join(found) + b"\n"
        return inner(mine) if inner is not None else (mine, len(found))

    return select


def _rows_body(rows: Sequence[PendingRow]) -> bytes:
    """The line protocol of WAL rows (stored gzip-compressed, one member per row)."""
    return b"".join(gunzip_bytes(row.gzipped) for row in rows)


def _body(lines: Sequence[bytes]) -> bytes:
    return b"\n".join(lines) + b"\n"


def quarantine_label(status: int | None) -> str:
    """The ``reason`` label of the quarantine metric for a line refused with ``status``."""
    if status == 413:
        return "too_large"
    if status in (400, 422):
        return "refused_lines"
    return "series_limit"
