"""Drains the WAL into InfluxDB: batches of about 5 000 lines, gzip, several requests in flight.

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
                           capped backoff (v1 with ``--influx-create-db``: a 404 creates the database)
=========================  ==============================================================================

Two backends, chosen by ``--influx-api``: :class:`V1Backend` posts to ``/write?db=&rp=&precision=ns``
with httpx (InfluxDB 1.x, and the v1 compatibility API of 2.x and 3.x); :class:`V2Backend` uses the
official ``influxdb-client``'s asyncio client (``/api/v2/write`` with org, bucket and token).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import time
from collections import deque
from collections.abc import Sequence
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
    parse_retry_after,
    reason,
    refused_lines_named,
)
from gpuprobe.influx.influxql import InfluxError, parse_results, quote_identifier
from gpuprobe.influx.settings import InfluxSettings

if TYPE_CHECKING:
    from influxdb_client.client.influxdb_client_async import InfluxDBClientAsync
    from influxdb_client.client.write_api_async import WriteApiAsync

log = logging.getLogger(__name__)

_GZIP_INLINE_BYTES = 64 * 1024
_ALERT_LOG_INTERVAL_S = 60.0
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

    async def on_not_found(self) -> bool:
        return await self._create() if self.settings.create_database else False

    async def _create(self) -> bool:
        settings = self.settings
        db = quote_identifier(settings.database)
        statements = [f"CREATE DATABASE {db}"]
        if settings.retention_policy:
            duration = settings.retention or "INF"
            statements.append(
                f"CREATE RETENTION POLICY {quote_identifier(settings.retention_policy)} ON {db} "
                f"DURATION {duration} REPLICATION 1"
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
    """Rows read together, sent as one request; ``done`` once InfluxDB has them (or refused some for good)."""

    last_id: int
    done: bool = False


class Sink:
    """Sends the WAL's pending rows to a :class:`Backend` until stopped.

    It also knows which rows InfluxDB has: every row up to :attr:`written_through` was answered 2xx
    (or its refused lines were quarantined). Chunks are read in id order but finish in any order, so
    that mark only moves past a chunk once every chunk before it finished too. :meth:`written` waits
    for it (``--ack-after sink``)."""

    def __init__(self, wal: WriteAheadLog, backend: Backend, metrics: Metrics, settings: SinkSettings) -> None:
        self.wal = wal
        self.backend = backend
        self.metrics = metrics
        self.settings = settings
        self._wake = asyncio.Event()
        self._hurry = asyncio.Event()  # set by a drain: partly filled requests no longer linger
        self._queue: asyncio.Queue[tuple[_Chunk, list[PendingRow]]] = asyncio.Queue(
            maxsize=max(1, settings.concurrency)
        )
        self._chunks: deque[_Chunk] = deque()
        self.written_through = 0  # every pending row id up to this one is in InfluxDB (or quarantined)
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []  # heap of (row id, tiebreak, future)
        self._tiebreak = itertools.count()
        self._tasks: list[asyncio.Task[None]] = []
        self._last_alert_log: dict[int | None, float] = {}
        self._last_retry_log: dict[tuple[int | None, str], float] = {}
        self._retries_unlogged = 0
        self._settling: set[asyncio.Future[None]] = set()
        self.up = True
        wal.add_listener(self._wake.set)

    async def start(self) -> None:
        await self.backend.prepare()
        self._tasks.append(asyncio.create_task(self._dispatch(), name="sink-dispatch"))
        for i in range(max(1, self.settings.concurrency)):
            self._tasks.append(asyncio.create_task(self._work(), name=f"sink-worker-{i}"))

    async def written(self, row_id: int) -> None:
        """Returns once InfluxDB has the WAL row ``row_id`` (2xx, or its refused lines quarantined)."""
        if row_id <= self.written_through:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (row_id, next(self._tiebreak), future))
        await future

    def hurry(self) -> None:
        """From now on partly filled requests go out at once (``--sink-linger`` no longer applies):
        a drain writes what the WAL holds without waiting for lines that will not come."""
        self._hurry.set()

    async def stop(self) -> None:
        """Stops sending; requests in flight are abandoned (their rows stay in the WAL)."""
        for _, _, future in self._waiters:
            future.cancel()
        self._waiters.clear()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self._settling:  # what InfluxDB confirmed is deleted before the WAL closes
            await asyncio.gather(*self._settling, return_exceptions=True)
        await self.backend.close()

    # --- reading the WAL ------------------------------------------------------------------------

    async def _dispatch(self) -> None:
        after = 0
        target = self.settings.batch_lines
        while True:
            self._wake.clear()
            rows = await asyncio.to_thread(self.wal.read_after, after, target)
            if rows and sum(r.line_count for r in rows) < target and self.settings.linger_s > 0:
                with contextlib.suppress(TimeoutError):  # a drain does not wait for more lines
                    await asyncio.wait_for(self._hurry.wait(), self.settings.linger_s)
                rows = await asyncio.to_thread(self.wal.read_after, after, target)
            if not rows:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=1.0)
                continue
            after = rows[-1].id
            chunk = _Chunk(after)
            self._chunks.append(chunk)
            await self._queue.put((chunk, rows))

    def _chunk_done(self, chunk: _Chunk) -> None:
        chunk.done = True
        while self._chunks and self._chunks[0].done:
            self.written_through = self._chunks.popleft().last_id
        waiters = self._waiters
        while waiters and waiters[0][0] <= self.written_through:
            _, _, future = heapq.heappop(waiters)
            if not future.done():
                future.set_result(None)

    async def _work(self) -> None:
        while True:
            chunk, rows = await self._queue.get()
            refused: list[tuple[bytes, int | None, str]] = []
            backoff = self._backoff()
            while True:
                try:
                    body = await asyncio.to_thread(_rows_body, rows)
                    await self._deliver(body, sum(r.line_count for r in rows), refused)
                    break
                except Exception:  # a bug must not lose the rows: they are sent again
                    log.exception("sending %d WAL rows failed unexpectedly; sending them again", len(rows))
                    refused.clear()
                    await backoff.wait()
            self._chunk_done(chunk)
            # deleting the rows waits for a WAL commit (an fsync): the next request need not wait for it
            settle = asyncio.ensure_future(self.wal.settle(rows, refused))
            self._settling.add(settle)
            settle.add_done_callback(self._settled)
            for _, status, _ in refused:
                self.metrics.quarantined(quarantine_label(status))

    def _settled(self, future: asyncio.Future[None]) -> None:
        self._settling.discard(future)
        if not future.cancelled() and future.exception() is not None:
            log.error("could not delete delivered rows from the WAL (they will be sent again): %s", future.exception())

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
        for position in sorted(named):
            refused.append((lines[position], answer.status, reason(answer)))
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
            self.metrics.write_request(answer.status, verdict.value, elapsed)
            if verdict is Verdict.WRITTEN:
                self.metrics.written(count)
                self._set_up(True)
                return answer
            if verdict in (Verdict.REFUSED_LINES, Verdict.TOO_LARGE, Verdict.SERIES_LIMIT):
                self._set_up(True)
                return answer
            if verdict is Verdict.ALERT:
                self._alert(answer)
                if answer.status == 404 and await self.backend.on_not_found():
                    continue
                delay = backoff.next_delay_s()
            elif verdict is Verdict.THROTTLED and answer.retry_after_s is not None:
                delay = min(answer.retry_after_s, self.settings.retry_after_max_s)
                log.warning("InfluxDB answered %s; waiting Retry-After %.1f s", answer.status, delay)
            else:
                # InfluxDB is down or failing (a full disk among others): it does not accept writes
                delay = backoff.next_delay_s()
                self._set_up(False)
                self._log_retry(answer, delay)
            self.metrics.sink_retry(verdict.value)
            await asyncio.sleep(delay)

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
            "InfluxDB write failed (%s: %s); retrying in %.1f s, the WAL keeps the lines%s",
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
                "InfluxDB refuses the collector's writes (HTTP %s: %s); check --influx-url, the database or "
                "bucket, and the credentials. Batches stay in the WAL (%d lines queued) and are retried.",
                answer.status,
                answer.body[:500] or "(no message)",
                self.wal.depth_lines,
            )

    def _set_up(self, up: bool) -> None:
        if up != self.up:
            self.up = up
            if up:
                log.info("InfluxDB accepts writes again; %d lines queued in the WAL", self.wal.depth_lines)
        self.metrics.sink_up(up)


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
