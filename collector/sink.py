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

The output is layered, each layer a module: the transport (:mod:`gpuprobe.collector.backends`, one
InfluxDB built from the settings) under the retries and the split/quarantine of this module's lanes,
under the routing (:mod:`gpuprobe.collector.routing`: which lines go to which destination).

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
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpuprobe.backoff import Backoff
from gpuprobe.collector.backends import Backend
from gpuprobe.collector.compression import gunzip_bytes
from gpuprobe.collector.metrics import Metrics
from gpuprobe.collector.routing import Destination, cluster_tag_text, events_selector, lane_selector
from gpuprobe.collector.settings import SinkSettings
from gpuprobe.collector.wal import PendingRow, WriteAheadLog
from gpuprobe.influx.answers import Answer, Verdict, classify, error_text, line_errors, reason, refused_lines_named
from gpuprobe.influx.retention import EVENTS_RP

log = logging.getLogger(__name__)

_ALERT_LOG_INTERVAL_S = 60.0
#: A drain retries a failed request at least this often, whatever ``--sink-max-backoff``.
DRAIN_RETRY_MAX_S = 0.5


@dataclass
class _Chunk:
    """Rows read together, sent as one request; ``done`` once InfluxDB has them (or refused some for good).

    A routed lane keeps the rows until its mark passes them (the sink deletes them once every lane has)."""

    last_id: int
    rows: list[PendingRow] | None = None
    done: bool = False


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
                    lane.select = lane_selector(lane, where, default)
            for main in list(self.lanes):
                events_backend = (events or {}).get(main.name)
                if events_backend is not None:
                    lane = _Lane(self, f"{main.name} ({EVENTS_RP})", events_backend)
                    lane.select = events_selector(main.select)
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
