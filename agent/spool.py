"""Part: agent. The durable spool: every batch is in SQLite before it is sent, and leaves only when acknowledged.

Format (``<spool dir>/spool.sqlite3``, SQLite with a rollback journal, ``synchronous=FULL``)::

    meta(key TEXT PRIMARY KEY, value)        format_version  1
                                             spool_id        random hex, made with the spool
                                             last_seq        highest seq ever assigned
                                             pending_dropped_samples / _batches
                                                             cap drops not yet reported in a batch
                                             dropped_samples_total / dropped_batches_total
    batches(seq INTEGER PRIMARY KEY,         one row per unacknowledged batch
            created_unix_ns INTEGER,
            samples INTEGER,
            payload BLOB)                    a serialized gpuprobe.v1.SampleBatch, exactly as sent
    recorded(id INTEGER PRIMARY KEY,         the flight recorder: raw GPU samples that were shipped
             created_unix_ns INTEGER,        as aggregates (agent/resolution.py), the last
             samples INTEGER,                ``recorder_max_age_s`` of them; no seq
             payload BLOB)                   a serialized SampleBatch without seq and stats

``<spool dir>/lock`` is held (``flock``) by the agent that owns the spool, so two agents never share
one.

The journal is a rollback journal that is deleted after each commit, not SQLite's WAL: a WAL file
keeps growing while a checkpoint cannot complete, and on a full disk it can hold all the data and
leave no way to free any. With a rollback journal the data is in the database file, and rows that
are deleted leave free pages there that the next batches reuse.

Invariants:

1. :meth:`Spool.append` returns only after the batch's transaction is committed with
   ``synchronous=FULL`` (fsynced): a batch the uplink can see survives ``kill -9`` and power loss.
2. ``seq`` starts at 1 and increases by one per appended batch for the life of the spool, even when
   every row was deleted (``last_seq`` moves in the same transaction as the insert).
3. A row leaves the table only through :meth:`Spool.delete_through` (an acknowledgement) or the cap
   (:meth:`Spool.append` drops the oldest rows while the payload bytes exceed ``max_bytes`` or a row
   is older than ``max_age_s``; acknowledged rows whose delete is still pending go first and are not
   drops, rows in flight are skipped). Cap drops are added to ``pending_dropped_*`` in the same
   transaction and reported in the ``AgentStats`` of the appended batch, whose commit also resets
   them: a drop is counted exactly once, even across restarts.
4. The newest batch is never dropped by the cap, so a spool always holds what was sampled last.
5. The disk is one more cap: a batch is stored only where it fits in the database's free pages
   plus the disk's free space less :data:`DISK_MARGIN_BYTES` (kept for SQLite's journal, without
   which not even a delete can run); otherwise the oldest rows are dropped first, as for the size
   cap (same victims, same order, counted the same way, in the same transaction). Should SQLite
   still answer "database or disk is full" (another process filled the disk), the oldest rows are
   dropped in a transaction of their own until the batch fits; when that fails too,
   :class:`SpoolDiskFull` is raised, and the agent holds batches in memory (bounded) and tries again.

The flight recorder lives beside the batches, outside the sequence, so the shipped seqs have no
gaps: a recorded batch is never sent unless :meth:`Spool.append` is asked to promote it (a
high-resolution window opened), which moves the recorded batches created since a time into
``batches`` with the next seqs, in their order, in the same transaction as the batch appended. The
recorder is trimmed by age (``recorder_max_age_s``) and always before any batch when bytes are short
(the size cap counts both tables; the recorder's rows are copies of what was shipped as aggregates,
so trimming them is not a drop). A spool of an older agent gets the table when it is opened.

A file that SQLite cannot read is moved aside (``spool.sqlite3.corrupt-<unix time>``) with an error
log, and a new spool (new ``spool_id``) is started: sampling matters more than an unreadable file.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import fcntl
import logging
import os
import secrets
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from gpuprobe.errors import ServiceError
from gpuprobe.fulldisk import free_disk_bytes, is_disk_full
from gpuprobe.v1 import telemetry_pb2

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
DB_NAME = "spool.sqlite3"
LOCK_NAME = "lock"
DISK_MARGIN_BYTES = 128 * 1024  # never filled with batches: room for the journal of a delete or insert

T = TypeVar("T")


class SpoolError(ServiceError, RuntimeError):
    """The spool directory cannot be used (not writable, or owned by another running agent)."""


class SpoolDiskFull(SpoolError):
    """The spool's disk has no room for the batch, even with every droppable batch dropped."""


_ROOM_SLACK_BYTES = 16 * 1024  # freed beyond the batch's own size: SQLite's pages and index entries
_MAX_ROOM_ROUNDS = 64


@dataclass(frozen=True)
class Stored:
    seq: int
    samples: int
    payload: bytes


@dataclass(frozen=True)
class Appended:
    seq: int
    samples: int
    size_bytes: int
    dropped_samples: int  # by the cap (or to make room on a full disk), in this append
    dropped_batches: int
    payload: bytes
    disk_full: bool = False  # the spool's disk was full: room was made first
    promoted: tuple[Stored, ...] = ()  # recorded batches moved into the sequence (seqs before ``seq``)

    def stored(self) -> Stored:
        return Stored(self.seq, self.samples, self.payload)


@dataclass(frozen=True)
class Deleted:
    batches: int
    samples: int


@dataclass(frozen=True)
class SpoolState:
    spool_id: str
    oldest_seq: int  # 0 when empty
    newest_seq: int  # 0 when empty
    batches: int
    samples: int
    bytes: int
    last_seq: int
    recorded_batches: int = 0  # the flight recorder
    recorded_samples: int = 0
    recorded_bytes: int = 0


class Spool:
    """Synchronous API; use it from one thread at a time (:class:`AsyncSpool` does that for the agent)."""

    def __init__(
        self, directory: Path, max_bytes: int = 512 * 2**20, max_age_s: float = 0.0, recorder_max_age_s: float = 0.0
    ) -> None:
        if max_bytes <= 0:
            raise ValueError(f"the spool's size cap must be positive, not {max_bytes}")
        self.directory = directory
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.recorder_max_age_s = recorder_max_age_s  # 0: nothing is recorded
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=0o750)
            self._lock_fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
        except OSError as e:
            raise SpoolError(f"cannot use spool directory {directory}: {e}") from None
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock_fd)
            raise SpoolError(f"spool directory {directory} is in use by another agent") from None
        try:
            self._db = self._open_db()
        except sqlite3.DatabaseError as e:
            self._db = self._recover(e)
        self._rec_trimmed_samples = 0  # recorded samples trimmed by age or size since the spool was opened
        self._reload_totals()
        self.spool_id = str(self._db.execute("SELECT value FROM meta WHERE key='spool_id'").fetchone()[0])
        self._page_bytes = int(self._db.execute("PRAGMA page_size").fetchone()[0])

    # ------------------------------------------------------------------ opening

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.directory / DB_NAME, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=DELETE").fetchall()  # (also turns a spool of an older agent off WAL)
        db.execute("PRAGMA synchronous=FULL")
        return db

    def _open_db(self) -> sqlite3.Connection:
        db = self._connect()
        db.execute("BEGIN IMMEDIATE")
        db.execute("CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value)")
        db.execute(
            "CREATE TABLE IF NOT EXISTS batches(seq INTEGER PRIMARY KEY, created_unix_ns INTEGER NOT NULL,"
            " samples INTEGER NOT NULL, payload BLOB NOT NULL)"
        )
        db.execute(
            "CREATE TABLE IF NOT EXISTS recorded(id INTEGER PRIMARY KEY, created_unix_ns INTEGER NOT NULL,"
            " samples INTEGER NOT NULL, payload BLOB NOT NULL)"
        )
        defaults: dict[str, object] = {
            "format_version": FORMAT_VERSION,
            "spool_id": secrets.token_hex(8),
            "last_seq": 0,
            "pending_dropped_samples": 0,
            "pending_dropped_batches": 0,
            "dropped_samples_total": 0,
            "dropped_batches_total": 0,
        }
        for key, value in defaults.items():
            db.execute("INSERT OR IGNORE INTO meta(key, value) VALUES (?, ?)", (key, value))
        db.execute("COMMIT")
        version = db.execute("SELECT value FROM meta WHERE key='format_version'").fetchone()[0]
        if int(version) != FORMAT_VERSION:
            db.close()
            raise sqlite3.DatabaseError(f"unknown spool format version {version}")
        db.execute("PRAGMA quick_check").fetchone()
        return db

    def _recover(self, error: Exception) -> sqlite3.Connection:
        aside = self.directory / f"{DB_NAME}.corrupt-{int(time.time())}"
        log.error(
            "spool %s is unreadable (%s): moved to %s; starting a new spool", self.directory / DB_NAME, error, aside
        )
        (self.directory / DB_NAME).rename(aside)
        for suffix in ("-wal", "-shm"):
            extra = self.directory / (DB_NAME + suffix)
            if extra.exists():
                extra.rename(aside.with_name(aside.name + suffix))
        return self._open_db()

    def _meta(self, key: str) -> int:
        return int(self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()[0])

    def _set_meta(self, key: str, value: object) -> None:
        self._db.execute("UPDATE meta SET value=? WHERE key=?", (value, key))

    def close(self) -> None:
        self._db.close()
        os.close(self._lock_fd)

    # ------------------------------------------------------------------ writing

    def append(
        self,
        batch: telemetry_pb2.SampleBatch,
        samples: int,
        now_ns: int | None = None,
        protect: Callable[[], tuple[int, int]] | None = None,
        dropped_elsewhere: tuple[int, int] = (0, 0),
        record: tuple[telemetry_pb2.SampleBatch, int] | None = None,
        promote_since_ns: int | None = None,
    ) -> Appended:
        """Assign the next seq, enforce the cap, store the batch durably; ``batch`` gets its seq and stats.

        ``record``: a batch of raw GPU samples and its sample count, for the flight recorder, stored in the
        same transaction. ``promote_since_ns``: first move the recorded batches created since then into
        the sequence (their seqs come before the batch's; :attr:`Appended.promoted`).

        ``protect`` tells the cap what the uplink is doing: ``(acked_through, sent_through)``. Rows up
        to ``acked_through`` are acknowledged (their delete is pending) and make room first, without
        counting as drops; rows in ``(acked_through, sent_through]`` are in flight and are not dropped.
        ``dropped_elsewhere``: (samples, batches) the agent dropped before they reached the spool (its
        memory buffer while the disk was full), counted with this batch like the cap's drops.

        On a full disk the oldest droppable rows are dropped until the batch fits (invariant 5);
        :class:`SpoolDiskFull` when nothing droppable is left.
        """
        now_ns = time.time_ns() if now_ns is None else now_ns
        made_room: tuple[int, int] = (0, 0)
        disk_full = False
        for _ in range(_MAX_ROOM_ROUNDS):
            try:
                appended = self._append(batch, samples, now_ns, protect, dropped_elsewhere, record, promote_since_ns)
            except sqlite3.Error as e:
                if not is_disk_full(e):
                    raise
                disk_full = True
                dropped = self._make_room(batch.ByteSize() + _ROOM_SLACK_BYTES, now_ns, protect)
                if dropped is None:
                    raise SpoolDiskFull(
                        f"no space left on the spool's disk ({self.directory / DB_NAME}: ENOSPC, SQLite says"
                        f" {e!s}), and no spooled batch is left to drop"
                    ) from None
                made_room = (made_room[0] + dropped[0], made_room[1] + dropped[1])
                continue
            if not disk_full:
                return appended
            return dataclasses.replace(
                appended,
                dropped_samples=appended.dropped_samples + made_room[0],
                dropped_batches=appended.dropped_batches + made_room[1],
                disk_full=True,
            )
        raise SpoolDiskFull(f"no space left on the spool's disk ({self.directory / DB_NAME}) after dropping batches")

    def _make_room(
        self, need_bytes: int, now_ns: int, protect: Callable[[], tuple[int, int]] | None
    ) -> tuple[int, int] | None:
        """Drops the oldest droppable rows worth ``need_bytes`` in a transaction of their own, counted
        as pending drops; (samples, batches) dropped, or None when nothing could be freed."""
        db = self._db
        try:
            db.execute("BEGIN IMMEDIATE")
            acked_through, sent_through = protect() if protect is not None else (0, 0)
            before = self._bytes + self._rec_bytes
            dropped_samples, dropped_batches = self._enforce_cap(
                0, now_ns, acked_through, sent_through, free_bytes=need_bytes
            )
            if self._bytes + self._rec_bytes == before:
                self._rollback()
                return None
            self._count_drops(dropped_samples, dropped_batches, pending=True)
            db.execute("COMMIT")
        except sqlite3.Error as e:
            self._rollback()
            self._reload_totals()
            log.debug("could not make room in the spool: %s", e)
            return None
        return dropped_samples, dropped_batches

    def _count_drops(self, samples: int, batches: int, pending: bool) -> None:
        """Adds drops to the lifetime totals (and, with ``pending``, to what the next batch reports)."""
        if not batches and not samples:
            return
        if pending:
            self._set_meta("pending_dropped_samples", self._meta("pending_dropped_samples") + samples)
            self._set_meta("pending_dropped_batches", self._meta("pending_dropped_batches") + batches)
        self._set_meta("dropped_samples_total", self._meta("dropped_samples_total") + samples)
        self._set_meta("dropped_batches_total", self._meta("dropped_batches_total") + batches)

    def _rollback(self) -> None:
        # SQLite rolls a transaction back by itself on some errors (a full disk at COMMIT): a second
        # ROLLBACK would fail with "no transaction is active" and hide the real error
        if self._db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")

    def _append(
        self,
        batch: telemetry_pb2.SampleBatch,
        samples: int,
        now_ns: int,
        protect: Callable[[], tuple[int, int]] | None,
        dropped_elsewhere: tuple[int, int],
        record: tuple[telemetry_pb2.SampleBatch, int] | None = None,
        promote_since_ns: int | None = None,
    ) -> Appended:
        db = self._db
        # the samples the agent dropped before the batch was made (the native sampler's ring): the batcher's
        own_dropped = batch.stats.dropped_samples
        db.execute("BEGIN IMMEDIATE")
        try:
            promoted = self._promote(promote_since_ns) if promote_since_ns is not None else []
            if record is not None:
                self._insert_recorded(record[0], record[1], now_ns)
            seq = self._meta("last_seq") + 1
            batch.seq = seq
            size_estimate = batch.ByteSize() + 32  # the stats and seq still to be filled in
            acked_through, sent_through = protect() if protect is not None else (0, 0)
            short_bytes = size_estimate + _ROOM_SLACK_BYTES - self._room_bytes()
            dropped_samples, dropped_batches = self._enforce_cap(
                size_estimate, now_ns, acked_through, sent_through, free_bytes=max(0, short_bytes)
            )
            recorded_samples = dropped_samples + dropped_elsewhere[0]
            recorded_batches = dropped_batches + dropped_elsewhere[1]
            pending_samples = self._meta("pending_dropped_samples") + recorded_samples
            pending_batches = self._meta("pending_dropped_batches") + recorded_batches
            stats = batch.stats
            stats.dropped_samples = pending_samples + own_dropped
            stats.dropped_batches = pending_batches
            stats.spool_bytes = self._bytes + self._rec_bytes + size_estimate
            payload = batch.SerializeToString()
            db.execute(
                "INSERT INTO batches(seq, created_unix_ns, samples, payload) VALUES (?, ?, ?, ?)",
                (seq, batch.created_unix_ns or now_ns, samples, payload),
            )
            self._set_meta("last_seq", seq)
            self._set_meta("pending_dropped_samples", 0)
            self._set_meta("pending_dropped_batches", 0)
            self._count_drops(recorded_samples, recorded_batches, pending=False)
            db.execute("COMMIT")
        except BaseException:
            self._rollback()
            self._reload_totals()
            batch.stats.dropped_samples = own_dropped  # as it came, for the next try
            raise
        self._batches += 1
        self._samples += samples
        self._bytes += len(payload)
        return Appended(
            seq,
            samples,
            len(payload),
            dropped_samples,
            dropped_batches,
            payload,
            disk_full=short_bytes > 0,
            promoted=tuple(promoted),
        )

    # ------------------------------------------------------------------ the flight recorder

    def record(self, batch: telemetry_pb2.SampleBatch, samples: int, now_ns: int | None = None) -> None:
        """Stores a batch of raw GPU samples in the flight recorder alone (when no batch is appended)."""
        now_ns = time.time_ns() if now_ns is None else now_ns
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            self._insert_recorded(batch, samples, now_ns)
            self._trim_recorder(now_ns, 0, 0)
            db.execute("COMMIT")
        except BaseException:
            self._rollback()
            self._reload_totals()
            raise

    def _insert_recorded(self, batch: telemetry_pb2.SampleBatch, samples: int, now_ns: int) -> None:
        """Inside the caller's transaction; nothing is recorded while the recorder is off."""
        if self.recorder_max_age_s <= 0:
            return
        payload = batch.SerializeToString()
        self._db.execute(
            "INSERT INTO recorded(created_unix_ns, samples, payload) VALUES (?, ?, ?)",
            (batch.created_unix_ns or now_ns, samples, payload),
        )
        self._rec_batches += 1
        self._rec_samples += samples
        self._rec_bytes += len(payload)

    def _trim_recorder(self, now_ns: int, incoming_bytes: int, free_bytes: int) -> int:
        """Drops the oldest recorded batches that are too old, or while the spool is over its size cap
        (both tables and ``incoming_bytes``) or ``free_bytes`` are not freed yet; the bytes freed."""
        freed = 0
        oldest_allowed_ns = now_ns - int(self.recorder_max_age_s * 1e9)
        while self._rec_batches:
            row = self._db.execute(
                "SELECT id, created_unix_ns, samples, LENGTH(payload) FROM recorded ORDER BY id LIMIT 1"
            ).fetchone()
            if row is None:
                break
            too_old = self.recorder_max_age_s <= 0 or row[1] < oldest_allowed_ns
            too_big = self._bytes + self._rec_bytes + incoming_bytes > self.max_bytes or freed < free_bytes
            if not (too_old or too_big):
                break
            self._db.execute("DELETE FROM recorded WHERE id=?", (row[0],))
            self._rec_batches -= 1
            self._rec_samples -= int(row[2])
            self._rec_bytes -= int(row[3])
            self._rec_trimmed_samples += int(row[2])
            freed += int(row[3])
        return freed

    def _promote(self, since_ns: int) -> list[Stored]:
        """Moves the recorded batches created since ``since_ns`` into the sequence, oldest first (inside
        the caller's transaction)."""
        rows = self._db.execute(
            "SELECT id, samples, payload FROM recorded WHERE created_unix_ns >= ? ORDER BY id", (since_ns,)
        ).fetchall()
        seq = self._meta("last_seq")
        out: list[Stored] = []
        for row_id, samples, payload in rows:
            seq += 1
            batch = telemetry_pb2.SampleBatch.FromString(payload)
            batch.seq = seq
            data = batch.SerializeToString()
            self._db.execute(
                "INSERT INTO batches(seq, created_unix_ns, samples, payload) VALUES (?, ?, ?, ?)",
                (seq, batch.created_unix_ns, samples, data),
            )
            self._db.execute("DELETE FROM recorded WHERE id=?", (row_id,))
            self._rec_batches -= 1
            self._rec_samples -= int(samples)
            self._rec_bytes -= len(payload)
            self._batches += 1
            self._samples += int(samples)
            self._bytes += len(data)
            out.append(Stored(seq, int(samples), data))
        if out:
            self._set_meta("last_seq", seq)
        return out

    def _room_bytes(self) -> int:
        """What the spool may still fill: free pages in the file, and the disk's free space less the margin."""
        free_pages = int(self._db.execute("PRAGMA freelist_count").fetchone()[0])
        return free_pages * self._page_bytes + free_disk_bytes(self.directory) - DISK_MARGIN_BYTES

    def _enforce_cap(
        self, incoming_bytes: int, now_ns: int, acked_through: int, sent_through: int, free_bytes: int = 0
    ) -> tuple[int, int]:
        """Make room (inside the caller's transaction); returns the (samples, batches) dropped.

        Victims, oldest first: acknowledged rows (free, not drops), then rows that were not sent yet;
        rows in flight are left alone (an acknowledgement removes them soon, or they are sent again).
        ``free_bytes``: also drop until that many payload bytes are gone (a full disk).
        """
        freed = self._trim_recorder(now_ns, incoming_bytes, free_bytes)
        free_bytes = max(0, free_bytes - freed)
        dropped_samples = dropped_batches = 0
        goal_bytes = self._bytes - free_bytes
        oldest_allowed_ns = now_ns - int(self.max_age_s * 1e9) if self.max_age_s > 0 else None
        floor = max(sent_through, acked_through)
        while self._batches:
            row = self._db.execute(
                "SELECT seq, created_unix_ns, samples, LENGTH(payload) FROM batches WHERE seq <= ? OR seq > ?"
                " ORDER BY seq LIMIT 1",
                (acked_through, floor),
            ).fetchone()
            if row is None:
                break
            too_big = self._bytes + self._rec_bytes + incoming_bytes > self.max_bytes or self._bytes > goal_bytes
            too_old = oldest_allowed_ns is not None and row[1] < oldest_allowed_ns
            acknowledged = row[0] <= acked_through
            if not (too_big or too_old or acknowledged):
                break
            self._db.execute("DELETE FROM batches WHERE seq=?", (row[0],))
            self._batches -= 1
            self._samples -= int(row[2])
            self._bytes -= int(row[3])
            if not acknowledged:
                dropped_samples += int(row[2])
                dropped_batches += 1
        return dropped_samples, dropped_batches

    def _reload_totals(self) -> None:
        row = self._db.execute(
            "SELECT COUNT(*), COALESCE(SUM(samples), 0), COALESCE(SUM(LENGTH(payload)), 0) FROM batches"
        ).fetchone()
        self._batches, self._samples, self._bytes = int(row[0]), int(row[1]), int(row[2])
        row = self._db.execute(
            "SELECT COUNT(*), COALESCE(SUM(samples), 0), COALESCE(SUM(LENGTH(payload)), 0) FROM recorded"
        ).fetchone()
        self._rec_batches, self._rec_samples, self._rec_bytes = int(row[0]), int(row[1]), int(row[2])

    def delete_through(self, seq: int) -> Deleted:
        """Remove every batch with ``seq <=`` the given one (they are acknowledged)."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute(
                "SELECT COUNT(*), COALESCE(SUM(samples), 0), COALESCE(SUM(LENGTH(payload)), 0) FROM batches"
                " WHERE seq <= ?",
                (seq,),
            ).fetchone()
            db.execute("DELETE FROM batches WHERE seq <= ?", (seq,))
            db.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise
        self._batches -= int(row[0])
        self._samples -= int(row[1])
        self._bytes -= int(row[2])
        return Deleted(int(row[0]), int(row[1]))

    # ------------------------------------------------------------------ reading

    def read_after(self, seq: int, limit: int) -> list[Stored]:
        rows = self._db.execute(
            "SELECT seq, samples, payload FROM batches WHERE seq > ? ORDER BY seq LIMIT ?", (seq, limit)
        ).fetchall()
        return [Stored(int(r[0]), int(r[1]), bytes(r[2])) for r in rows]

    def state(self) -> SpoolState:
        row = self._db.execute("SELECT MIN(seq), MAX(seq) FROM batches").fetchone()
        return SpoolState(
            spool_id=self.spool_id,
            oldest_seq=int(row[0] or 0),
            newest_seq=int(row[1] or 0),
            batches=self._batches,
            samples=self._samples,
            bytes=self._bytes,
            last_seq=self._meta("last_seq"),
            recorded_batches=self._rec_batches,
            recorded_samples=self._rec_samples,
            recorded_bytes=self._rec_bytes,
        )

    def dropped_totals(self) -> tuple[int, int]:
        """(samples, batches) dropped by the cap over the spool's whole life."""
        return self._meta("dropped_samples_total"), self._meta("dropped_batches_total")

    @property
    def bytes(self) -> int:
        return self._bytes

    @property
    def batches(self) -> int:
        return self._batches

    @property
    def recorded(self) -> tuple[int, int, int]:
        """The flight recorder's (batches, samples, bytes)."""
        return self._rec_batches, self._rec_samples, self._rec_bytes

    @property
    def recorder_trimmed_samples(self) -> int:
        """Recorded samples trimmed by age or size since the spool was opened (not drops)."""
        return self._rec_trimmed_samples


class Unspooled:
    """Batches that wait in memory while the spool cannot take them (its disk is full), oldest first.

    At most ``max_bytes`` of serialized batches are held (the newest batch always is): beyond that
    the oldest are dropped, and :attr:`dropped` keeps their count until the spool records it with
    the next batch it takes.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._batches: collections.deque[tuple[telemetry_pb2.SampleBatch, int, int]] = collections.deque()
        self.samples = 0
        self.bytes = 0
        self.dropped: tuple[int, int] = (0, 0)  # (samples, batches) not yet recorded by the spool

    def __len__(self) -> int:
        return len(self._batches)

    def append(self, batch: telemetry_pb2.SampleBatch, samples: int) -> None:
        size = batch.ByteSize()
        self._batches.append((batch, samples, size))
        self.samples += samples
        self.bytes += size

    def oldest(self) -> tuple[telemetry_pb2.SampleBatch, int]:
        batch, samples, _ = self._batches[0]
        return batch, samples

    def spooled(self) -> None:
        """The oldest batch is in the spool now, and with it the count of what was dropped here."""
        _, samples, size = self._batches.popleft()
        self.samples -= samples
        self.bytes -= size
        self.dropped = (0, 0)

    def bound(self) -> tuple[int, int]:
        """Drops the oldest batches beyond ``max_bytes`` (never the newest); (samples, batches) dropped."""
        dropped_samples = dropped_batches = 0
        while len(self._batches) > 1 and self.bytes > self.max_bytes:
            _, samples, size = self._batches.popleft()
            self.samples -= samples
            self.bytes -= size
            dropped_samples += samples
            dropped_batches += 1
        self.dropped = (self.dropped[0] + dropped_samples, self.dropped[1] + dropped_batches)
        return dropped_samples, dropped_batches


class UplinkSpool(Protocol):
    """What the uplink (agent/uplink.py) needs of a spool: :class:`AsyncSpool` on disk for the agent,
    :class:`MemorySpool` for synthetic agents and tests."""

    @property
    def bytes(self) -> int: ...

    @property
    def batches(self) -> int: ...

    async def state(self) -> SpoolState: ...

    async def read_after(self, seq: int, limit: int) -> list[Stored]: ...

    async def delete_through(self, seq: int) -> Deleted: ...


class MemorySpool:
    """A spool in memory: the seqs and acknowledgements of :class:`Spool` without its disk, cap or
    recorder, for the load generator (app/loadgen.py) and the uplink's tests."""

    def __init__(self, spool_id: str | None = None) -> None:
        self.spool_id = spool_id or secrets.token_hex(8)
        self._stored: collections.deque[Stored] = collections.deque()  # in seq order
        self.last_seq = 0
        self.bytes = 0
        self.samples = 0

    @property
    def batches(self) -> int:
        return len(self._stored)

    def append(self, seq: int, samples: int, payload: bytes) -> Stored:
        """Stores a serialized ``SampleBatch`` that carries ``seq``, beyond every seq stored before."""
        if seq <= self.last_seq:
            raise ValueError(f"seq {seq} is not beyond the last one, {self.last_seq}")
        stored = Stored(seq, samples, payload)
        self._stored.append(stored)
        self.last_seq = seq
        self.bytes += len(payload)
        self.samples += samples
        return stored

    async def state(self) -> SpoolState:
        oldest, newest = (self._stored[0].seq, self._stored[-1].seq) if self._stored else (0, 0)
        return SpoolState(self.spool_id, oldest, newest, len(self._stored), self.samples, self.bytes, self.last_seq)

    async def read_after(self, seq: int, limit: int) -> list[Stored]:
        after = (stored for stored in self._stored if stored.seq > seq)
        return [stored for _, stored in zip(range(limit), after, strict=False)]

    async def delete_through(self, seq: int) -> Deleted:
        batches = samples = 0
        while self._stored and self._stored[0].seq <= seq:
            stored = self._stored.popleft()
            self.bytes -= len(stored.payload)
            self.samples -= stored.samples
            batches += 1
            samples += stored.samples
        return Deleted(batches, samples)


class AsyncSpool:
    """The spool for the event loop: every call runs in one dedicated thread, in order."""

    def __init__(self, spool: Spool) -> None:
        self.spool = spool
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuprobe-spool")

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    @property
    def bytes(self) -> int:
        return self.spool.bytes

    @property
    def batches(self) -> int:
        return self.spool.batches

    async def append(
        self,
        batch: telemetry_pb2.SampleBatch,
        samples: int,
        protect: Callable[[], tuple[int, int]] | None = None,
        dropped_elsewhere: tuple[int, int] = (0, 0),
        record: tuple[telemetry_pb2.SampleBatch, int] | None = None,
        promote_since_ns: int | None = None,
    ) -> Appended:
        return await self._run(
            lambda: self.spool.append(
                batch,
                samples,
                protect=protect,
                dropped_elsewhere=dropped_elsewhere,
                record=record,
                promote_since_ns=promote_since_ns,
            )
        )

    async def record(self, batch: telemetry_pb2.SampleBatch, samples: int) -> None:
        await self._run(lambda: self.spool.record(batch, samples))

    async def read_after(self, seq: int, limit: int) -> list[Stored]:
        return await self._run(lambda: self.spool.read_after(seq, limit))

    async def delete_through(self, seq: int) -> Deleted:
        return await self._run(lambda: self.spool.delete_through(seq))

    async def state(self) -> SpoolState:
        return await self._run(self.spool.state)

    async def close(self) -> None:
        await self._run(self.spool.close)
        self._executor.shutdown(wait=True)
