"""The write-ahead log's invariants: durable before acked, remembered across restarts, one owner."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
import support

from gpuprobe.collector.compression import gunzip_bytes
from gpuprobe.collector.wal import WalError, WriteAheadLog, merge_orphans, wal_path


def run(coroutine):  # type: ignore[no-untyped-def]
    return asyncio.run(coroutine)


def test_an_appended_batch_is_committed_before_append_returns_and_survives_reopening(tmp_path: Path) -> None:
    path = tmp_path / "collector-0.sqlite"

    async def append() -> None:
        wal = WriteAheadLog(path)
        wal.start()
        await wal.append("agent-1", "spool-a", 5, b"m v=1 1\nm v=2 2\n", 2)
        # another connection sees the committed row at once: append returned after COMMIT
        other = sqlite3.connect(path)
        ((agent, seq, count, stored),) = other.execute(
            "SELECT agent_id, seq, line_count, lines FROM pending"
        ).fetchall()
        assert (agent, seq, count, gunzip_bytes(stored)) == ("agent-1", 5, 2, b"m v=1 1\nm v=2 2\n")
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        other.close()
        wal.close()

    run(append())
    reopened = WriteAheadLog(path)
    assert (reopened.depth_rows, reopened.depth_lines) == (1, 2)
    assert reopened.depth_bytes == len(reopened.read_after(0, 5000)[0].gzipped)  # what it takes on disk
    assert reopened.durable_seq("agent-1", "spool-a") == 5
    assert reopened.durable_seq("agent-1", "another-spool") == 0
    assert [r.line_count for r in reopened.read_after(0, 5000)] == [2]
    reopened.close()


def test_durable_seq_only_grows_within_a_spool_and_restarts_with_a_new_one(tmp_path: Path) -> None:
    async def scenario() -> WriteAheadLog:
        wal = WriteAheadLog(tmp_path / "w.sqlite")
        wal.start()
        await asyncio.gather(*(wal.append("a", "s1", seq, b"m v=1 1\n", 1) for seq in (3, 9, 4)))
        assert wal.durable_seq("a", "s1") == 9
        await wal.append("a", "s2", 1, b"", 0)  # a new spool: the sequence starts again
        assert wal.durable_seq("a", "s2") == 1 and wal.durable_seq("a", "s1") == 0
        wal.close()
        return wal

    run(scenario())
    reopened = WriteAheadLog(tmp_path / "w.sqlite")
    assert reopened.durable_seq("a", "s2") == 1
    assert reopened.depth_rows == 3  # the empty batch stored no row
    reopened.close()


def test_settle_deletes_delivered_rows_and_keeps_refused_lines_in_quarantine(tmp_path: Path) -> None:
    async def scenario() -> None:
        wal = WriteAheadLog(tmp_path / "w.sqlite", quarantine_max_lines=2)
        wal.start()
        for seq in (1, 2):
            await wal.append("a", "s", seq, b"m v=1 1\nm v=2 2\n", 2)
        rows = wal.read_after(0, 5000)
        await wal.settle(rows, [(b"m v=2 2", 400, "refused_lines: x"), (b"m v=3 3", 400, "y"), (b"m v=4 4", 413, "z")])
        assert (wal.depth_rows, wal.depth_lines, wal.depth_bytes) == (0, 0, 0)
        assert wal.read_after(0, 5000) == []
        assert [row[3] for row in wal.quarantine_rows()] == [b"m v=4 4", b"m v=3 3"]  # newest first, at most 2 kept
        assert wal.quarantined_lines == 3
        wal.close()

    run(scenario())


def test_a_second_collector_cannot_use_the_same_wal(tmp_path: Path) -> None:
    first = WriteAheadLog(wal_path(tmp_path, 0))
    with pytest.raises(WalError, match="in use by another collector process"):
        WriteAheadLog(wal_path(tmp_path, 0))
    first.close()
    WriteAheadLog(wal_path(tmp_path, 0)).close()  # free again


def test_read_after_returns_rows_in_order_up_to_about_the_line_target(tmp_path: Path) -> None:
    async def scenario() -> None:
        wal = WriteAheadLog(tmp_path / "w.sqlite")
        wal.start()
        for seq in range(1, 8):
            await wal.append("a", "s", seq, b"m v=1 1\n" * 1000, 1000)
        chunk = wal.read_after(0, 5000)
        assert [r.line_count for r in chunk] == [1000] * 5
        assert [r.id for r in wal.read_after(chunk[-1].id, 5000)] == [6, 7]
        big = wal.read_after(0, 10)  # a row larger than the target still goes, alone
        assert len(big) == 1
        wal.close()

    run(scenario())


def test_lines_left_by_former_workers_are_merged_into_the_remaining_ones(tmp_path: Path) -> None:
    async def fill(worker: int, seq: int) -> None:
        wal = WriteAheadLog(wal_path(tmp_path, worker))
        wal.start()
        await wal.append("a", "s", seq, f"m v={worker} {worker}\n".encode(), 1)
        wal.close()

    for worker in range(3):
        run(fill(worker, worker + 1))
    assert merge_orphans(tmp_path, workers=2) == 1  # collector-2 goes into collector-0
    assert not wal_path(tmp_path, 2).exists()
    zero = WriteAheadLog(wal_path(tmp_path, 0))
    assert [r.lines() for r in zero.read_after(0, 100)] == [b"m v=0 0\n", b"m v=2 2\n"]
    zero.close()


def test_a_connection_that_cannot_write_is_reopened_and_the_held_batch_is_committed(tmp_path: Path) -> None:
    path = tmp_path / "collector-0.sqlite"

    async def scenario() -> None:
        wal = WriteAheadLog(path)
        wal.start()
        await wal.append("agent-1", "spool-a", 1, b"m v=1 1\n", 1)
        # the writer's connection refuses writes (as after an I/O error); the file itself is fine
        wal._db.execute("PRAGMA query_only = ON")
        held = asyncio.ensure_future(wal.append("agent-1", "spool-a", 2, b"m v=2 2\n", 1))
        await support.wait_until_async(lambda: wal.failure is not None, 10, "the commit to fail")
        assert not held.done()  # neither acked nor refused while it is retried
        assert wal.failure is not None and wal.failure.cause == "read-only" and not wal.healthy
        assert wal.alive  # retrying is alive: systemd's watchdog goes on
        await asyncio.wait_for(held, 30)  # committed on the connection reopened after 3 failures
        assert wal.healthy and wal.failure is None and wal.failed_commits >= 3
        assert wal.durable_seq("agent-1", "spool-a") == 2 and wal.depth_rows == 2
        wal.close()

    run(scenario())


def test_a_wal_that_cannot_be_reopened_fails_for_good_and_says_so(tmp_path: Path) -> None:
    directory = tmp_path / "wal"
    path = directory / "collector-0.sqlite"

    async def scenario() -> None:
        wal = WriteAheadLog(path)
        state_changes: list[str] = []
        wal.on_state_change = lambda: state_changes.append(wal.state())
        wal.start()
        await wal.append("agent-1", "spool-a", 1, b"m v=1 1\n", 1)
        wal._db.execute("PRAGMA query_only = ON")
        directory.rename(tmp_path / "gone")  # (the disk went away) reopening cannot find the file
        with pytest.raises(WalError, match="cannot be reopened"):
            await asyncio.wait_for(wal.append("agent-1", "spool-a", 2, b"m v=2 2\n", 1), 30)
        assert wal.fatal is not None and not wal.alive and not wal.healthy
        assert state_changes[0].startswith("NOT WRITABLE (read-only") and state_changes[-1].startswith("FAILED")
        with pytest.raises(WalError, match="cannot be reopened"):  # and every later batch is refused at once
            await wal.append("agent-1", "spool-a", 3, b"m v=3 3\n", 1)
        wal.close()

    run(scenario())


def test_batches_appended_in_one_turn_of_the_event_loop_are_committed_together(tmp_path: Path) -> None:
    """Group commit: what the streams hand over in one turn reaches the writer as one item, so it
    costs one wake-up of the writer thread and one fsync, not one per batch."""

    async def scenario() -> list[float]:
        wal = WriteAheadLog(tmp_path / "w.sqlite")
        commits: list[float] = []
        wal.on_commit_seconds = commits.append
        wal.start()
        futures = [wal.append(f"agent-{i}", "s", 1, b"m v=1 1\n", 1) for i in range(50)]
        assert all(isinstance(f, asyncio.Future) and not f.done() for f in futures)  # no Task per batch
        row_ids = await asyncio.gather(*futures)
        assert sorted(row_ids) == list(range(1, 51)) and wal.depth_rows == 50
        wal.close()
        return commits

    assert len(run(scenario())) == 1


def test_a_batch_appended_while_closing_is_committed_before_the_writer_stops(tmp_path: Path) -> None:
    async def scenario() -> None:
        wal = WriteAheadLog(tmp_path / "w.sqlite")
        wal.start()
        held = wal.append("a", "s", 1, b"m v=1 1\n", 1)
        wal.close()  # in the same turn: the batch was not handed to the writer yet
        assert held.done() or await asyncio.wait_for(held, 10) is not None
        assert (await held) == 1

    run(scenario())
    assert WriteAheadLog(tmp_path / "w.sqlite").durable_seq("a", "s") == 1
