"""Part: core. Living with a full disk, for the two SQLite stores (the agent's spool, the collector's WAL).

Both need to tell a full disk (which frees up by itself, so waiting or dropping old data is right)
from an I/O error or a damaged file (which needs a reopen, a restart or a person).
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
from pathlib import Path

log = logging.getLogger(__name__)

DISK_FULL = "disk full"
READ_ONLY = "read-only"
CORRUPT = "corrupt"
IO_ERROR = "I/O error"
OTHER = "error"


def failure_cause(exc: BaseException) -> str:
    """One of :data:`DISK_FULL`, :data:`READ_ONLY`, :data:`CORRUPT`, :data:`IO_ERROR`, :data:`OTHER`."""
    code = getattr(exc, "sqlite_errorcode", None)  # SQLite's extended result code
    err = getattr(exc, "errno", None)
    text = str(exc).lower()
    if code == sqlite3.SQLITE_FULL or err in (errno.ENOSPC, errno.EDQUOT) or "disk is full" in text:
        return DISK_FULL
    if code == sqlite3.SQLITE_READONLY or err == errno.EROFS or "readonly" in text or "read-only" in text:
        return READ_ONLY
    if code in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB) or "malformed" in text:
        return CORRUPT
    if (code is not None and code & 0xFF == sqlite3.SQLITE_IOERR) or err == errno.EIO or "i/o error" in text:
        return IO_ERROR
    return OTHER


def is_disk_full(exc: BaseException) -> bool:
    return failure_cause(exc) == DISK_FULL


def truncate_wal_file(db: sqlite3.Connection) -> None:
    """Copies SQLite's WAL file into the database and truncates it to zero bytes.

    In WAL mode the ``-wal`` file keeps its size after a checkpoint (up to ``journal_size_limit``),
    mostly older copies of pages the database already has: on a full disk it is the first room to
    win back. Best effort: a reader that holds a snapshot keeps part of it.
    """
    try:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    except sqlite3.Error as exc:
        log.debug("checkpoint of %s failed: %s", db, exc)


def free_disk_bytes(path: Path) -> int:
    """Bytes an unprivileged process may still write on ``path``'s file system."""
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize
