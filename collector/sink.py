"""Drains the WAL into InfluxDB: batches of about 5 000 lines, gzip, several requests in flight.

Every answer is classified once (:func:`classify`) and handled so that nothing is lost and nothing
loops forever:

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
other 5xx, no answer       capped exponential backoff with jitter, then send again (until it works)
401 / 403 / 404, other 4xx an alert (an ERROR log line at most once a minute, the ``sink_alerts`` metric,
                           ``sink_up`` 0); the WAL keeps buffering and the request is retried with the
                           capped backoff (v1 with ``--influx-create-db``: a 404 creates the database)
=========================  ==============================================================================

Two backends, chosen by ``--influx-api``: :class:`V1Backend` posts to ``/write?db=&rp=&precision=ns``
with httpx (InfluxDB 1.x, and the v1 compatibility API of 2.x and 3.x); :class:`V2Backend` uses the
official ``influxdb-client`` (``/api/v2/write`` with org, bucket and token).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import enum
import json
import logging
import random
import re
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
from gpuprobe.collector.compression import gunzip_bytes, gzip_bytes
from gpuprobe.collector.metrics import Metrics
from gpuprobe.collector.wal import PendingRow, WriteAheadLog

log = logging.getLogger(__name__)

_MAX_SERIES = re.compile(r"max[- ]series[- ]per[- ]database|max series per database", re.IGNORECASE)
_UNPARSEABLE = re.compile(r"unable to parse '(.*?)': ")
_DROPPED = re.compile(r"dropped=(\d+)")
_GZIP_INLINE_BYTES = 64 * 1024
_ALERT_LOG_INTERVAL_S = 60.0


@dataclass(frozen=True)
class Answer:
    """What one write request got back: the HTTP status (None: no answer), body and Retry-After."""

    status: int | None
    body: str = ""
    retry_after_s: float | None = None


class Verdict(enum.Enum):
    WRITTEN = "written"
    REFUSED_LINES = "refused_lines"
    TOO_LARGE = "too_large"
    THROTTLED = "throttled"
    SERIES_LIMIT = "series_limit"
    RETRY = "retry"
    ALERT = "alert"


def classify(answer: Answer) -> Verdict:
    """The one place where an InfluxDB answer gets its meaning (see the module docstring)."""
    status = answer.status
    if status is None or status == 408:
        return Verdict.RETRY
    if 200 <= status < 300:
        return Verdict.WRITTEN
    if status in (400, 422):
        return Verdict.REFUSED_LINES
    if status == 413:
        return Verdict.TOO_LARGE
    if status in (429, 503):
        return Verdict.THROTTLED
    if status >= 500:
        return Verdict.SERIES_LIMIT if _MAX_SERIES.search(answer.body) else Verdict.RETRY
    return Verdict.ALERT


def parse_retry_after(value: str | None, now_s: float | None = None) -> float | None:
    """``Retry-After`` as seconds from now: delta-seconds or an HTTP date; None when absent or bad."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now_s is None else now_s))


def refused_lines_named(answer: Answer, lines: Sequence[bytes]) -> tuple[set[int], int | None]:
    """Which of ``lines`` the answer names as refused (positions), and its ``dropped=N`` count of
    refused lines it does *not* name (None when it gives no count)."""
    named: set[int] = set()
    body = answer.body
    try:
        document = json.loads(body)
    except ValueError:
        document = None
    if isinstance(document, dict) and isinstance(document.get("data"), list):  # InfluxDB 3.x
        for item in document["data"]:
            number = item.get("line_number") if isinstance(item, dict) else None
            if isinstance(number, int) and 1 <= number <= len(lines):
                named.add(number - 1)
        return named, 0 if named else None
    if isinstance(document, dict) and isinstance(document.get("error"), str):
        body = document["error"]
    texts = set(_UNPARSEABLE.findall(body))
    if texts:
        for position, line in enumerate(lines):
            if line.decode(errors="replace") in texts:
                named.add(position)
    dropped = _DROPPED.search(body)
    return named, int(dropped.group(1)) if dropped else None


class Backend(Protocol):
    """Sends one body of line protocol (uncompressed, ``\\n``-separated) to InfluxDB."""

    name: str

    async def write(self, body: bytes) -> Answer: ...

    async def prepare(self) -> None:
        """Called once at start (create the database where configured); must not raise."""

    async def on_not_found(self) -> bool:
        """Called after a 404; True when something was fixed and an immediate retry makes sense."""

    async def close(self) -> None: ...


def _quote_identifier(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


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
        self.url = url.rstrip("/")
        self.database = database
        self.retention_policy = retention_policy
        self.gzip_level = gzip_level
        self.create = create_database
        self.retention = retention
        headers = {"Content-Type": "text/plain; charset=utf-8", "User-Agent": "gpuprobe-collector"}
        if gzip_level > 0:
            headers["Content-Encoding"] = "gzip"
        if token:
            headers["Authorization"] = f"Token {token}"
        self._headers = headers
        self._params = {"db": database, "precision": "ns"}
        if retention_policy:
            self._params["rp"] = retention_policy
        verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=ca_file) if ca_file else True
        self._client = httpx.AsyncClient(
            base_url=self.url,
            timeout=timeout_s,
            verify=verify,
            auth=httpx.BasicAuth(username, password) if username else None,
            limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
        )

    async def write(self, body: bytes) -> Answer:
        data = body
        if self.gzip_level > 0:
            if len(body) > _GZIP_INLINE_BYTES:
                data = await asyncio.to_thread(gzip_bytes, body, self.gzip_level)
            else:
                data = gzip_bytes(body, self.gzip_level)
        try:
            response = await self._client.post("/write", params=self._params, content=data, headers=self._headers)
        except httpx.HTTPError as exc:
            return Answer(None, f"{type(exc).__name__}: {exc}".strip())
        return Answer(
            response.status_code, response.text[:8000], parse_retry_after(response.headers.get("Retry-After"))
        )

    async def query(self, influxql: str) -> Answer:
        headers = {k: v for k, v in self._headers.items() if k in ("Authorization", "User-Agent")}
        try:
            response = await self._client.post("/query", params={"q": influxql}, headers=headers)
        except httpx.HTTPError as exc:
            return Answer(None, f"{type(exc).__name__}: {exc}")
        return Answer(response.status_code, response.text[:8000])

    async def prepare(self) -> None:
        if self.create:
            await self._create()

    async def on_not_found(self) -> bool:
        return await self._create() if self.create else False

    async def _create(self) -> bool:
        db = _quote_identifier(self.database)
        statements = [f"CREATE DATABASE {db}"]
        if self.retention_policy:
            duration = self.retention or "INF"
            statements.append(
                f"CREATE RETENTION POLICY {_quote_identifier(self.retention_policy)} ON {db} "
                f"DURATION {duration} REPLICATION 1"
            )
        ok = True
        for statement in statements:
            answer = await self.query(statement)
            failed = answer.status != 200 or '"error"' in answer.body
            if failed and "already exists" not in answer.body:
                log.error("InfluxDB refused %r: %s %s", statement, answer.status, answer.body[:500])
                ok = False
            elif not failed:
                log.info("InfluxDB: %s", statement)
        return ok

    async def close(self) -> None:
        await self._client.aclose()


class V2Backend:
    """``/api/v2/write`` through the official ``influxdb-client`` (org, bucket, token, gzip)."""

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
        from influxdb_client.client.influxdb_client import InfluxDBClient
        from influxdb_client.client.write_api import SYNCHRONOUS

        self.url = url
        self.org = org
        self.bucket = bucket
        extra: dict[str, Any] = {"ssl_ca_cert": ca_file} if ca_file else {}
        self._client = InfluxDBClient(
            url=url,
            token=token,
            org=org,
            enable_gzip=gzip,
            timeout=int(timeout_s * 1000),
            connection_pool_maxsize=connections,
            **extra,
        )
        self._write_api = self._client.write_api(write_options=SYNCHRONOUS)

    def _write_blocking(self, body: bytes) -> Answer:
        from influxdb_client.domain.write_precision import WritePrecision
        from influxdb_client.rest import ApiException

        try:
            precision: Any = WritePrecision.NS
            self._write_api.write(bucket=self.bucket, org=self.org, record=body, write_precision=precision)
        except ApiException as exc:
            headers: Any = exc.headers or {}
            text = exc.body.decode(errors="replace") if isinstance(exc.body, bytes) else str(exc.body or exc.reason)
            return Answer(exc.status, text[:8000], parse_retry_after(headers.get("Retry-After")))
        except Exception as exc:  # urllib3 and socket errors: no answer
            return Answer(None, f"{type(exc).__name__}: {exc}")
        return Answer(204)

    async def write(self, body: bytes) -> Answer:
        return await asyncio.to_thread(self._write_blocking, body)

    async def prepare(self) -> None:
        return None

    async def on_not_found(self) -> bool:
        return False

    async def close(self) -> None:
        await asyncio.to_thread(self._client.close)


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


class Sink:
    """Sends the WAL's pending rows to a :class:`Backend` until stopped."""

    def __init__(self, wal: WriteAheadLog, backend: Backend, metrics: Metrics, settings: SinkSettings) -> None:
        self.wal = wal
        self.backend = backend
        self.metrics = metrics
        self.settings = settings
        self._wake = asyncio.Event()
        self._queue: asyncio.Queue[list[PendingRow]] = asyncio.Queue(maxsize=max(1, settings.concurrency))
        self._tasks: list[asyncio.Task[None]] = []
        self._last_alert_log: dict[int | None, float] = {}
        self._settling: set[asyncio.Future[None]] = set()
        self.up = True
        wal.add_listener(self._wake.set)

    async def start(self) -> None:
        await self.backend.prepare()
        self._tasks.append(asyncio.create_task(self._dispatch(), name="sink-dispatch"))
        for i in range(max(1, self.settings.concurrency)):
            self._tasks.append(asyncio.create_task(self._work(), name=f"sink-worker-{i}"))

    async def stop(self) -> None:
        """Stops sending; requests in flight are abandoned (their rows stay in the WAL)."""
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
                await asyncio.sleep(self.settings.linger_s)
                rows = await asyncio.to_thread(self.wal.read_after, after, target)
            if not rows:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=1.0)
                continue
            after = rows[-1].id
            await self._queue.put(rows)

    async def _work(self) -> None:
        while True:
            rows = await self._queue.get()
            refused: list[tuple[bytes, int | None, str]] = []
            attempt = 0
            while True:
                try:
                    body = await asyncio.to_thread(_rows_body, rows)
                    await self._deliver(body, sum(r.line_count for r in rows), refused)
                    break
                except Exception:  # a bug must not lose the rows: they are sent again
                    log.exception("sending %d WAL rows failed unexpectedly; sending them again", len(rows))
                    refused.clear()
                    await asyncio.sleep(self._backoff(attempt))
                    attempt += 1
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
            refused.append((lines[position], answer.status, _reason(answer)))
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
                refused.extend((line, answer.status, _reason(answer) + " (not isolated further)") for line in lines)
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
            refused.append((lines[0], answer.status, _reason(answer)))
            return
        if budget[0] <= 0:
            refused.extend((line, answer.status, _reason(answer) + " (not isolated further)") for line in lines)
            return
        middle = len(lines) // 2
        for half in (lines[:middle], lines[middle:]):
            await self._isolate(half, answer, refused, budget, known_bad=False)

    async def _send_until_settled(self, body: bytes, count: int) -> Answer:
        """Sends until the answer is final for these lines: written, refused, too large or series limit.
        Throttling, server errors, no answer and alerts are waited out here (the WAL keeps buffering)."""
        attempt = 0
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
                delay = self._backoff(attempt)
            elif verdict is Verdict.THROTTLED and answer.retry_after_s is not None:
                delay = min(answer.retry_after_s, self.settings.retry_after_max_s)
                log.warning("InfluxDB answered %s; waiting Retry-After %.1f s", answer.status, delay)
            else:
                delay = self._backoff(attempt)
                log.warning(
                    "InfluxDB write failed (%s: %s); retrying in %.1f s",
                    answer.status if answer.status is not None else "no answer",
                    answer.body[:300],
                    delay,
                )
                if answer.status is None:
                    self._set_up(False)
            self.metrics.sink_retry(verdict.value)
            attempt += 1
            await asyncio.sleep(delay)

    def _backoff(self, attempt: int) -> float:
        """Capped exponential backoff with equal jitter: in [d/2, d], d = initial * 2**attempt <= max."""
        ceiling = min(self.settings.backoff_max_s, self.settings.backoff_initial_s * (2 ** min(attempt, 30)))
        return random.uniform(ceiling / 2, ceiling)

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


def _reason(answer: Answer) -> str:
    verdict = classify(answer)
    text = answer.body.strip()
    with contextlib.suppress(ValueError):
        document = json.loads(text)
        if isinstance(document, dict) and isinstance(document.get("error"), str):
            text = document["error"]
    return f"{verdict.value}: {text[:1000]}" if text else verdict.value
