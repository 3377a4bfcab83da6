"""Part: collector. The collector's write-ahead log: encoded batches are durable here before an agent gets its ack.

Format
------
One SQLite database per collector process, ``<wal dir>/collector-<worker>.sqlite`` (journal mode
WAL, ``synchronous=FULL``, ``auto_vacuum=INCREMENTAL``), next to an exclusive ``flock`` lock file
``collector-<worker>.lock`` so that two processes never share one log. Tables:

``pending(id INTEGER PRIMARY KEY AUTOINCREMENT, agent_id, seq, received_ns, line_count, lines BLOB)``
    One row per accepted agent batch: its line protocol (UTF-8, every line ending in ``\\n``, no
    other newline anywhere), gzip-compressed as one member (about 8 times smaller: less disk, and
    less for SQLite to copy), waiting for the sink. ``id`` grows; the sink sends in ``id`` order.
``agents(agent_id PRIMARY KEY, spool_id, durable_seq, updated_ns)``
    Per agent: the highest batch sequence number of its spool ``spool_id`` that is durable here.
``quarantine(id INTEGER PRIMARY KEY AUTOINCREMENT, quarantined_ns, status, reason, line BLOB)``
    Lines InfluxDB refused for good (partial write, series limit, a single line too large), with
    the HTTP status and InfluxDB's message; kept for the operator, never retried. At most
    ``quarantine_max_lines`` rows (the oldest go first).
``meta(key PRIMARY KEY, value)``
    ``format`` = :data:`FORMAT_VERSION`.

Invariants
----------
1. The future :meth:`WriteAheadLog.append` returns resolves only after the transaction holding the
   batch's ``pending`` row *and* its ``agents`` update has been committed and fsynced; only then does
   the server ack the batch. Batches arriving together are committed in one transaction (group
   commit): the writer takes everything queued since its last commit, and the batches of one turn
   of the event loop reach it as one queue item.
   Transactions that only delete delivered rows are committed without waiting for fsync: losing one
   in a power cut means sending those rows again, which is idempotent.
2. ``agents.durable_seq`` only grows while ``spool_id`` stays the same; a new ``spool_id`` starts the
   agent's sequence afresh. A batch with ``seq <= durable_seq`` of the same spool is a replay of
   something already durable (here or already in InfluxDB): it is acked without being stored again.
3. A ``pending`` row is deleted only after every one of its lines was answered 204 by InfluxDB or
   moved to ``quarantine`` (in the same transaction as the delete). A crash at any point leaves the
   row in place and the sink sends it again after restart; that is safe because every point carries
   the agent's timestamp and full tag set, so InfluxDB overwrites it with itself.
4. All writes go through one writer thread and one connection; the sink reads through a second
   connection (WAL mode lets it read while the writer commits).
5. A commit that fails (disk full, I/O error) is retried by the writer thread with capped backoff
   until it succeeds: the batches of the failed group are neither acked nor refused meanwhile, and
   deletes of delivered rows queued meanwhile are committed first (they make room). While it fails,
   :attr:`WriteAheadLog.failure` says why and the server refuses new batches with ``UNAVAILABLE``.
   Only an error other than a full disk that outlives closing and reopening the database is fatal
   (:attr:`WriteAheadLog.fatal`): the collector then exits non-zero for systemd to restart it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import queue
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuprobe.backoff import Backoff
from gpuprobe.collector.compression import gunzip_bytes, gzip_bytes
from gpuprobe.errors import ServiceError
from gpuprobe.fulldisk import DISK_FULL, failure_cause, truncate_wal_file

log = logging.getLogger(__name__)

FORMAT_VERSION = "1"
_MAX_GROUP_OPS = 1024
_MAX_GROUP_BYTES = 64 * 1024 * 1024
_VACUUM_PAGES = 4096
_RETRY_INITIAL_S = 0.2
_RETRY_MAX_S = 5.0
_REOPEN_AFTER_FAILURES = 3  # consecutive failures (not a full disk) before the database is reopened
_FAILURE_LOG_INTERVAL_S = 60.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS pending(
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    agent_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    received_ns INTEGER NOT NULL,
    line_count INTEGER NOT NULL,
    lines BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS agents(
    agent_id TEXT PRIMARY KEY,
    spool_id TEXT NOT NULL,
    durable_seq INTEGER NOT NULL,
    updated_ns INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS quarantine(
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    quarantined_ns INTEGER NOT NULL,
    status INTEGER,
    reason TEXT NOT NULL,
    line BLOB NOT NULL
);
"""

_UPSERT_AGENT = """
INSERT INTO agents(agent_id, spool_id, durable_seq, updated_ns) VALUES (?, ?, ?, ?)
ON CONFLICT(agent_id) DO UPDATE SET
    durable_seq = CASE WHEN agents.spool_id = excluded.spool_id
                       THEN max(agents.durable_seq, excluded.durable_seq)
                       ELSE excluded.durable_seq END,
    spool_id = excluded.spool_id,
    updated_ns = excluded.updated_ns
"""


class WalError(ServiceError, RuntimeError):
    """The WAL cannot be opened or written (disk full, I/O error, another process holds it)."""


@dataclass
class WalFailure:
    """Why the WAL's commits fail right now (set by the writer thread, read by the event loop)."""

    cause: str  # "disk full", "I/O error", "read-only", "corrupt", "error"
    message: str  # SQLite's or the OS's own words
    since_monotonic: float
    failed_commits: int = 1

    @property
    def disk_full(self) -> bool:
        return self.cause == DISK_FULL

    def describe(self) -> str:
        return f"{self.cause}: {self.message}; failing for {time.monotonic() - self.since_monotonic:.0f} s"


@dataclass(frozen=True)
class PendingRow:
    """One stored batch waiting for the sink."""

    id: int
    line_count: int
    gzipped: bytes  # the batch's line protocol, one gzip member

    def lines(self) -> bytes:
        return gunzip_bytes(self.gzipped)


@dataclass
class _Op:
    kind: str  # "append" | "delete" | "quarantine"
    args: Any
    future: asyncio.Future[Any] | None
    nbytes: int = 0
    result: Any = None  # an append's pending row id (None: an empty batch, no row)


def wal_path(directory: Path, worker: int) -> Path:
    return directory / f"collector-{worker}.sqlite"


class WriteAheadLog:
    """The log of one collector process. :meth:`start` it inside the event loop that awaits it."""

    def __init__(self, path: Path, *, max_bytes: int = 8 << 30, quarantine_max_lines: int = 1_000_000) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.quarantine_max_lines = quarantine_max_lines
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_file = _lock(path.with_suffix(".lock"))
        try:
            self._db = _connect(path)
            with self._db:
                self._db.executescript(_SCHEMA)
                self._db.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('format', ?)", (FORMAT_VERSION,))
            version = self._db.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()[0]
            if version != FORMAT_VERSION:
                raise WalError(f"{path}: WAL format {version!r}, this collector writes {FORMAT_VERSION!r}")
            self._agents: dict[str, tuple[str, int]] = {
                agent: (spool, seq)
                for agent, spool, seq in self._db.execute("SELECT agent_id, spool_id, durable_seq FROM agents")
            }
            rows, lines, nbytes, inherited = self._db.execute(
                "SELECT count(*), coalesce(sum(line_count), 0), coalesce(sum(length(lines)), 0),"
                " coalesce(max(id), 0) FROM pending"
            ).fetchone()
            self._reader = _connect(path)
        except sqlite3.Error as exc:
            self._lock_file.close()
            raise WalError(f"cannot open the WAL {path}: {exc}") from exc
        self.depth_rows: int = rows
        self.depth_lines: int = lines
        self.depth_bytes: int = nbytes
        #: The highest pending row id found at open: rows up to it were stored by an earlier run.
        self.inherited_through: int = inherited
        self.quarantined_lines = 0
        self._reader_lock = threading.Lock()
        self._synchronous = "FULL"
        # None: stop. A SimpleQueue: its put is one C call, where Queue.put runs a Condition in Python
        self._ops: queue.SimpleQueue[list[_Op] | None] = queue.SimpleQueue()
        self._handover: list[_Op] | None = None  # submitted in this turn of the event loop
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listeners: list[Callable[[], None]] = []
        self._closing = threading.Event()
        self.failure: WalFailure | None = None  # commits fail now and are being retried
        self.fatal: WalError | None = None  # the database could not be reopened: the writer stopped
        self.failed_commits = 0  # over the WAL's life, for the metrics
        self._last_failure_log = 0.0
        self.on_commit_seconds: Callable[[float], None] | None = None
        self.on_state_change: Callable[[], None] | None = None  # runs in the event loop

    # --- life cycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Starts the writer thread; futures are resolved in the running event loop."""
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._write_loop, name=f"wal-writer {self.path.name}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stops the writer after what is queued, closes both connections and releases the lock."""
        if self._thread is not None:
            self._closing.set()  # cuts a retry pause short
            self._hand_over()
            self._ops.put(None)
            self._thread.join()
            self._thread = None
        with contextlib.suppress(sqlite3.Error):
            self._reader.close()
        with contextlib.suppress(sqlite3.Error):
            self._db.close()
        self._lock_file.close()

    def add_listener(self, callback: Callable[[], None]) -> None:
        """``callback()`` runs in the event loop after every commit that added pending rows."""
        self._listeners.append(callback)

    @property
    def healthy(self) -> bool:
        """Commits succeed: new batches are accepted."""
        return self.failure is None and self.alive

    @property
    def alive(self) -> bool:
        """The writer works (it may be retrying a failed commit): systemd's watchdog is pinged."""
        return self.fatal is None and (self._thread is None or self._thread.is_alive())

    def state(self) -> str:
        """One phrase for logs and ``systemctl status``."""
        if self.fatal is not None:
            return f"FAILED ({self.fatal})"
        failure = self.failure
        if failure is not None:
            return f"NOT WRITABLE ({failure.describe()}; retrying)"
        return "ok"

    @property
    def full(self) -> bool:
        """Whether the pending (compressed) lines reached ``max_bytes`` (new batches are then refused)."""
        return self.depth_bytes >= self.max_bytes

    # --- the server side ------------------------------------------------------------------------

    def durable_seq(self, agent_id: str, spool_id: str) -> int:
        """The highest durable ``seq`` of this agent's spool (0 when unknown or another spool)."""
        known = self._agents.get(agent_id)
        return known[1] if known is not None and known[0] == spool_id else 0

    def append(self, agent_id: str, spool_id: str, seq: int, lines: bytes, line_count: int) -> asyncio.Future[Any]:
        """Stores one batch (call it in the event loop). The future it returns resolves once the batch
        is committed and fsynced, to the id of its ``pending`` row (None for a batch without lines,
        which gets no row), or holds a :class:`WalError`. A future, not a coroutine: the server waits
        for it without a Task per batch."""
        return self._submit("append", (agent_id, spool_id, seq, lines, line_count), len(lines))

    def pending_summary(self, through_id: int | None = None) -> tuple[int, int, int]:
        """``(rows, lines, compressed bytes)`` pending, all of them or those with ``id <= through_id``."""
        with self._reader_lock:
            rows, lines, nbytes = self._reader.execute(
                "SELECT count(*), coalesce(sum(line_count), 0), coalesce(sum(length(lines)), 0) FROM pending"
                " WHERE id <= ?",
                (through_id if through_id is not None else 2**63 - 1,),
            ).fetchone()
        return int(rows), int(lines), int(nbytes)

    # --- the sink side --------------------------------------------------------------------------

    def read_after(self, after_id: int, max_lines: int, max_rows: int = 10_000) -> list[PendingRow]:
        """Pending rows with ``id > after_id`` in id order, up to about ``max_lines`` lines (at least one
        row). Blocking: call it from a worker thread."""
        out: list[PendingRow] = []
        total = 0
        with self._reader_lock:
            cursor = self._reader.execute(
                "SELECT id, line_count, lines FROM pending WHERE id > ? ORDER BY id LIMIT ?", (after_id, max_rows)
            )
            try:
                for row_id, line_count, lines in cursor:
                    if out and total + line_count > max_lines:
                        break
                    out.append(PendingRow(row_id, line_count, lines))  # (lines: gzip-compressed)
                    total += line_count
            finally:
                cursor.close()
        return out

    async def settle(
        self, rows: Sequence[PendingRow], quarantined: Sequence[tuple[bytes, int | None, str]] = ()
    ) -> None:
        """Deletes delivered rows and stores the lines InfluxDB refused for good, in one transaction."""
        await self._submit("settle", (list(rows), list(quarantined)), 0)

    def quarantine_rows(self, limit: int = 100) -> list[tuple[int, int | None, str, bytes]]:
        """The newest quarantined lines: ``(quarantined_ns, status, reason, line)``."""
        with self._reader_lock:
            return list(
                self._reader.execute(
                    "SELECT quarantined_ns, status, reason, line FROM quarantine ORDER BY id DESC LIMIT ?", (limit,)
                )
            )

    def quarantine_count(self) -> int:
        with self._reader_lock:
            return int(self._reader.execute("SELECT count(*) FROM quarantine").fetchone()[0])

    # --- the writer thread ----------------------------------------------------------------------

    def _submit(self, kind: str, args: Any, nbytes: int) -> asyncio.Future[Any]:
        """Queues one operation for the writer thread; its future resolves in the event loop.

        The operations submitted in one turn of the event loop reach the writer together, as one
        queue item (one wake-up of the writer thread instead of one per batch)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if self.fatal is not None:
            future.set_exception(self.fatal)
        elif self._thread is None:
            future.set_exception(WalError("the WAL is not started"))
        else:
            op = _Op(kind, args, future, nbytes)
            handover = self._handover
            if handover is None:
                self._handover = [op]
                loop.call_soon(self._hand_over)
            else:
                handover.append(op)
        return future

    def _hand_over(self) -> None:
        ops, self._handover = self._handover, None
        if ops:
            self._ops.put(ops)

    def _write_loop(self) -> None:
        while True:
            first = self._ops.get()
            if first is None:
                return
            group = list(first)
            size = sum(op.nbytes for op in first)
            stop = False
            while len(group) < _MAX_GROUP_OPS and size < _MAX_GROUP_BYTES:
                try:
                    ops = self._ops.get_nowait()
                except queue.Empty:
                    break
                if ops is None:
                    stop = True
                    break
                group.extend(ops)
                size += sum(op.nbytes for op in ops)
            if not self._commit_until_done(group) or stop:
                return

    def _commit_until_done(self, group: list[_Op]) -> bool:
        """Commits ``group``, retrying with backoff while it fails; False when the writer must stop
        (the log is closing, or failed for good: the group's futures then carry the error)."""
        error = self._commit(group)
        if error is None:
            return True
        backoff = Backoff(_RETRY_INITIAL_S, _RETRY_MAX_S)
        stop = False
        while error is not None:
            failure = self._failed_commit(error)
            # a full disk frees up by itself; other errors may need a fresh connection
            reopen = not failure.disk_full and failure.failed_commits % _REOPEN_AFTER_FAILURES == 0
            if reopen and not self._reopen():
                self._fail_for_good(group)
                return False
            if stop or backoff.wait_blocking(self._closing):
                self._resolve_soon(group, WalError(f"the collector stopped while the WAL failed ({error})"), False)
                return False
            stop = self._take_queued(group)
            if failure.disk_full:
                truncate_wal_file(self._db)
            # deletes of delivered rows first, on their own: they free pages for the batches
            settles = [op for op in group if op.kind == "settle"]
            if settles and len(settles) < len(group) and self._commit(settles, whole_group=False) is None:
                group = [op for op in group if op.kind != "settle"]
            error = self._commit(group)
        return not stop

    def _recovered(self) -> None:
        """A commit of a whole group succeeded after failures: healthy again. Called before that
        group's futures resolve, so whoever is acked sees a healthy log."""
        recovered = self.failure
        if recovered is None:
            return
        self.failure = None
        log.warning(
            "WAL %s is writable again after %.1f s and %d failed commits: batches are acked again",
            self.path,
            time.monotonic() - recovered.since_monotonic,
            recovered.failed_commits,
        )
        self._state_changed()

    def _take_queued(self, group: list[_Op]) -> bool:
        """Moves what was queued meanwhile into ``group``; True when close() asked the writer to stop."""
        while True:
            try:
                ops = self._ops.get_nowait()
            except queue.Empty:
                return False
            if ops is None:
                return True
            group.extend(ops)

    def _failed_commit(self, error: BaseException) -> WalFailure:
        """Records a failed commit (logging the first of a kind, then once a minute)."""
        self.failed_commits += 1
        cause = failure_cause(error.__cause__ or error)
        now = time.monotonic()
        failure = self.failure
        if failure is None or failure.cause != cause:
            self.failure = WalFailure(cause, str(error.__cause__ or error), now)
            self._last_failure_log = now
            log.error(
                "WAL commit failed (%s, %s): %s. Batches are not acknowledged and new ones are refused"
                " (agents keep them in their spools); retrying every %g s at most%s",
                self.path,
                cause,
                error.__cause__ or error,
                _RETRY_MAX_S,
                "; free space on that file system" if cause == DISK_FULL else "",
            )
            self._state_changed()
            return self.failure
        failure.failed_commits += 1
        if now - self._last_failure_log >= _FAILURE_LOG_INTERVAL_S:
            self._last_failure_log = now
            log.error("WAL %s still not writable: %s", self.path, failure.describe())
        return failure

    def _reopen(self) -> bool:
        """Closes and reopens the writer's connection (a transient I/O error may leave it unusable)."""
        with contextlib.suppress(sqlite3.Error):
            self._db.close()
        try:
            self._db = _connect(self.path)
            self._synchronous = "FULL"
            with self._db:  # a write that changes nothing: can this connection write at all?
                self._db.execute("UPDATE meta SET value = value WHERE key = 'format'")
        except sqlite3.Error as exc:
            log.critical("the WAL %s cannot be reopened after failed commits: %s", self.path, exc)
            self.fatal = WalError(f"the WAL {self.path} cannot be reopened: {exc}")
            return False
        log.warning("reopened the WAL %s after %s", self.path, self.failure.describe() if self.failure else "errors")
        return True

    def _fail_for_good(self, group: list[_Op]) -> None:
        assert self.fatal is not None
        self._take_queued(group)
        self._state_changed()  # first: whoever learns of the failure from a batch sees the state too
        self._resolve_soon(group, self.fatal, False)

    def _state_changed(self) -> None:
        callback = self.on_state_change
        loop = self._loop
        if callback is not None and loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(callback)

    def _resolve_soon(self, group: list[_Op], error: BaseException | None, appended: bool) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._resolve, group, error, appended)

    def _commit(self, group: list[_Op], whole_group: bool = True) -> BaseException | None:
        """One transaction for ``group``; resolves its futures on success, returns the error otherwise
        (the futures then stay pending for the retry). Only the commit of a ``whole_group`` ends a
        failure: the deletes committed ahead of it may pass while the batches still fail."""
        started = time.perf_counter()
        now_ns = time.time_ns()
        # compressed here, in the writer thread, off the event loop
        append_ops = [op for op in group if op.kind == "append"]
        appended: list[tuple[str, str, int, bytes, int]] = [
            (agent, spool, seq, gzip_bytes(lines) if count else b"", count)
            for agent, spool, seq, lines, count in (op.args for op in append_ops)
        ]
        settled = [op.args for op in group if op.kind == "settle"]
        error: BaseException | None = None
        latest: dict[str, tuple[str, int]] = {}
        quarantined = 0
        try:
            # A commit that stores batches is fsynced before anyone is told (synchronous=FULL). One
            # that only deletes delivered rows need not wait for the disk: if it is lost, the rows are
            # sent again (idempotent), and the next fsync (WAL frames are ordered) makes it durable.
            self._set_synchronous("FULL" if appended else "NORMAL")
            with self._db:  # BEGIN ... COMMIT, ROLLBACK on error
                for op, (agent, _, seq, lines, count) in zip(append_ops, appended, strict=True):
                    op.result = None
                    if count:
                        cursor = self._db.execute(
                            "INSERT INTO pending(agent_id, seq, received_ns, line_count, lines) VALUES (?, ?, ?, ?, ?)",
                            (agent, seq, now_ns, count, lines),
                        )
                        op.result = cursor.lastrowid
                for agent, spool, seq, _, _ in appended:
                    known = latest.get(agent)
                    if known is None or known[0] != spool or known[1] < seq:
                        latest[agent] = (spool, seq)
                self._db.executemany(
                    _UPSERT_AGENT, [(agent, spool, seq, now_ns) for agent, (spool, seq) in latest.items()]
                )
                for rows, refused in settled:
                    self._db.executemany("DELETE FROM pending WHERE id = ?", [(r.id,) for r in rows])
                    self._db.executemany(
                        "INSERT INTO quarantine(quarantined_ns, status, reason, line) VALUES (?, ?, ?, ?)",
                        [(now_ns, status, reason, line) for line, status, reason in refused],
                    )
                    quarantined += len(refused)
                if quarantined:
                    self._db.execute(
                        "DELETE FROM quarantine WHERE id <= (SELECT max(id) FROM quarantine) - ?",
                        (self.quarantine_max_lines,),
                    )
        except (sqlite3.Error, OSError) as exc:
            error = WalError(f"WAL commit failed: {exc}")
            error.__cause__ = exc
            if self._db.in_transaction:  # SQLite may have rolled back by itself already
                with contextlib.suppress(sqlite3.Error):
                    self._db.rollback()
        else:
            for agent, (spool, seq) in latest.items():
                known = self._agents.get(agent)
                if known is None or known[0] != spool or known[1] < seq:
                    self._agents[agent] = (spool, seq)
            for _, _, _, lines, count in appended:
                if count:
                    self.depth_rows += 1
                    self.depth_lines += count
                    self.depth_bytes += len(lines)
            for rows, _ in settled:
                self.depth_rows -= len(rows)
                self.depth_lines -= sum(r.line_count for r in rows)
                self.depth_bytes -= sum(len(r.gzipped) for r in rows)
            self.quarantined_lines += quarantined
            if settled and self.depth_rows == 0:
                self._vacuum()
        if self.on_commit_seconds is not None:
            self.on_commit_seconds(time.perf_counter() - started)
        if error is None:
            if whole_group:
                self._recovered()
            self._resolve_soon(group, None, bool(appended))
        return error

    def _set_synchronous(self, level: str) -> None:
        if level != self._synchronous:
            self._db.execute(f"PRAGMA synchronous = {level}")
            self._synchronous = level

    def _vacuum(self) -> None:
        try:
            free = self._db.execute("PRAGMA freelist_count").fetchone()[0]
            if free > _VACUUM_PAGES:
                self._db.execute(f"PRAGMA incremental_vacuum({_VACUUM_PAGES})").fetchall()
        except sqlite3.Error as exc:  # only space is at stake
            log.warning("WAL incremental vacuum failed: %s", exc)

    def _resolve(self, group: list[_Op], error: BaseException | None, appended: bool) -> None:
        for op in group:
            if op.future is not None and not op.future.done():
                if error is None:
                    op.future.set_result(op.result)
                else:
                    op.future.set_exception(error)
        if appended and error is None:
            for callback in self._listeners:
                callback()


def _connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level="DEFERRED", check_same_thread=False, timeout=30.0)
    db.execute("PRAGMA auto_vacuum = INCREMENTAL")  # effective only before the first table exists
    db.execute("PRAGMA journal_mode = WAL").fetchall()
    db.execute("PRAGMA synchronous = FULL")
    db.execute("PRAGMA journal_size_limit = 67108864")
    return db


class _LockFile:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _lock(path: Path) -> _LockFile:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise WalError(f"{path.parent} is in use by another collector process (lock {path.name} is held)") from None
    return _LockFile(fd)


_WAL_FILE = re.compile(r"collector-(\d+)\.sqlite")


def merge_orphans(directory: Path, workers: int) -> int:
    """Moves the pending and quarantined lines of ``collector-K.sqlite`` files with ``K >= workers``
    (left by an earlier run with more workers) into worker ``K % workers``'s log; returns how many
    files were merged. Run before the workers start."""
    merged = 0
    if not directory.is_dir():
        return 0
    for entry in sorted(directory.iterdir()):
        match = _WAL_FILE.fullmatch(entry.name)
        if match is None or int(match.group(1)) < workers:
            continue
        target = WriteAheadLog(wal_path(directory, int(match.group(1)) % workers))
        lock = _lock(entry.with_suffix(".lock"))
        try:
            with target._db:
                target._db.execute("ATTACH DATABASE ? AS orphan", (str(entry),))
                target._db.execute(
                    "INSERT INTO pending(agent_id, seq, received_ns, line_count, lines) "
                    "SELECT agent_id, seq, received_ns, line_count, lines FROM orphan.pending ORDER BY id"
                )
                target._db.execute(
                    "INSERT INTO quarantine(quarantined_ns, status, reason, line) "
                    "SELECT quarantined_ns, status, reason, line FROM orphan.quarantine ORDER BY id"
                )
            target._db.execute("DETACH DATABASE orphan")
        finally:
            lock.close()
            target.close()
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(str(entry) + suffix)
        with contextlib.suppress(FileNotFoundError):
            entry.with_suffix(".lock").unlink()
        log.info("merged the WAL of a former worker, %s, into worker %d", entry.name, int(match.group(1)) % workers)
        merged += 1
    return merged
