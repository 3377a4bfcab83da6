"""The sink against every class of InfluxDB answer: a server that records requests and answers as
each test scripts it, and the real InfluxDB where it can give the answer itself."""

from __future__ import annotations

import asyncio
import email.utils
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from collector_helpers import FAST_SINK, Recorded, RecordingServer, json_error, wait_until

from gpuprobe.collector.backends import Backend, V1Backend, V2Backend
from gpuprobe.collector.metrics import Metrics
from gpuprobe.collector.settings import SinkSettings
from gpuprobe.collector.sink import Sink
from gpuprobe.collector.wal import WriteAheadLog
from gpuprobe.devservices import InfluxDBDatabase, InfluxDBServer
from gpuprobe.devservices.ports import LOOPBACK, free_port
from gpuprobe.influx.answers import Answer, Verdict, classify

T0 = 1_700_000_000_000_000_000


def lines_of(start: int, count: int, host: str = "h", t0: int = T0) -> bytes:
    return "".join(f"m,host={host} v={i}i {t0 + i}\n" for i in range(start, start + count)).encode()


class Drained:
    def __init__(
        self, wal: WriteAheadLog, metrics: Metrics, quarantine: list[tuple[int, int | None, str, bytes]]
    ) -> None:
        self.wal, self.metrics, self.quarantine = wal, metrics, quarantine

    @property
    def quarantined_lines(self) -> list[str]:
        return sorted(row[3].decode() for row in self.quarantine)


def drain(
    tmp_path: Path,
    make_backend: Callable[[], Backend],
    batches: Sequence[bytes],
    settings: SinkSettings = FAST_SINK,
    timeout_s: float = 30.0,
    during: Callable[[Sink], None] | None = None,
    during_when: Callable[[Sink], bool] = lambda sink: True,
) -> Drained:
    """Stores ``batches`` in a WAL, runs a sink until the WAL is empty; returns what it left.
    ``during(sink)`` runs once ``during_when(sink)`` holds, while the sink runs."""

    async def scenario() -> Drained:
        wal = WriteAheadLog(tmp_path / "wal.sqlite")
        wal.start()
        for seq, body in enumerate(batches, start=1):
            await wal.append("agent", "spool", seq, body, body.count(b"\n"))
        metrics = Metrics()
        sink = Sink(wal, make_backend(), metrics, settings)
        await sink.start()
        try:
            if during is not None:
                await wait_until(lambda: during_when(sink), timeout_s, "the state to check while the sink runs")
                during(sink)
            await wait_until(lambda: wal.depth_rows == 0, timeout_s, "the WAL to drain")
        finally:
            await sink.stop()
        quarantine = wal.quarantine_rows(100_000)
        await asyncio.to_thread(wal.close)
        return Drained(wal, metrics, quarantine)

    return asyncio.run(scenario())


def received_lines(server: RecordingServer, *, accepted_only: bool = True) -> list[str]:
    return [line for r in server.writes() if not accepted_only or getattr(r, "status", 204) == 204 for line in r.lines]


def answering(server: RecordingServer, answer: Callable[[Recorded], tuple[int, dict[str, str], bytes]]) -> None:
    def wrapped(request: Recorded) -> tuple[int, dict[str, str], bytes]:
        status, headers, body = answer(request)
        request.status = status  # type: ignore[attr-defined]
        return status, headers, body

    server.answer = wrapped


def v1(server: RecordingServer, **kwargs: object) -> Callable[[], Backend]:
    return lambda: V1Backend(server.url, "telemetry", **kwargs)  # type: ignore[arg-type]


def test_v1_writes_gzip_batches_of_at_most_5000_lines_several_in_flight(
    recording_server: RecordingServer, tmp_path: Path
) -> None:
    in_flight = [0, 0]  # now, most
    lock = threading.Lock()

    def slow(request: Recorded) -> tuple[int, dict[str, str], bytes]:
        with lock:
            in_flight[0] += 1
            in_flight[1] = max(in_flight[1], in_flight[0])
        time.sleep(0.15)
        with lock:
            in_flight[0] -= 1
        return 204, {}, b""

    answering(recording_server, slow)
    batches = [lines_of(i * 1000, 1000) for i in range(23)]
    drain(
        tmp_path,
        v1(recording_server, retention_policy="autogen", token="secret-token"),
        batches,
        SinkSettings(concurrency=3, linger_s=0.01),
    )

    writes = recording_server.writes()
    assert all(len(r.lines) <= 5000 for r in writes)
    assert sorted(received_lines(recording_server)) == sorted(b"".join(batches).decode().splitlines())
    first = writes[0]
    assert first.query == {"db": "telemetry", "rp": "autogen", "precision": "ns"}
    assert first.headers["content-encoding"] == "gzip" and first.raw_body != first.body
    assert first.headers["authorization"] == "Token secret-token"
    assert in_flight[1] >= 2


def test_v1_basic_auth_and_no_gzip(recording_server: RecordingServer, tmp_path: Path) -> None:
    drain(tmp_path, v1(recording_server, username="writer", password="pw", gzip_level=0), [lines_of(0, 10)])
    (write,) = recording_server.writes()
    assert write.headers["authorization"] == "Basic d3JpdGVyOnB3"
    assert "content-encoding" not in write.headers and write.raw_body == write.body


def test_400_partial_write_quarantines_the_named_lines_and_never_retries(
    recording_server: RecordingServer, tmp_path: Path
) -> None:
    bad = "m,host=h v=bad 1"
    answering(
        recording_server,
        lambda r: (
            (400, {}, json_error(f"partial write: unable to parse '{bad}': invalid boolean dropped=0"))
            if bad in r.lines
            else (204, {}, b"")
        ),
    )
    drained = drain(tmp_path, v1(recording_server), [lines_of(0, 50) + (bad + "\n").encode() + lines_of(50, 50)])
    assert len(recording_server.writes()) == 1
    assert drained.quarantined_lines == [bad]
    assert drained.quarantine[0][1] == 400 and "invalid boolean" in drained.quarantine[0][2]
    assert drained.metrics.value("gpuprobe_collector_quarantined_lines_total", {"reason": "refused_lines"}) == 1


def test_partial_write_that_names_no_line_is_isolated_by_sending_halves(
    recording_server: RecordingServer, tmp_path: Path
) -> None:
    bad = "m,host=h v=1.5 999"  # say a float where InfluxDB has an integer field
    conflict = (
        'partial write: field type conflict: input field "v" on measurement "m" is type float, '
        "already exists as type integer dropped=1"
    )
    answering(recording_server, lambda r: (400, {}, json_error(conflict)) if bad in r.lines else (204, {}, b""))
    good = lines_of(0, 300)
    drained = drain(tmp_path, v1(recording_server), [lines_of(0, 100) + (bad + "\n").encode() + lines_of(100, 200)])
    assert drained.quarantined_lines == [bad]
    assert set(received_lines(recording_server)) == set(good.decode().splitlines())
    assert len(recording_server.writes()) <= 2 * 9 + 1  # about log2(301) halvings


def test_real_influxdb_type_conflict_quarantines_only_the_conflicting_lines(
    influxdb: InfluxDBDatabase, tmp_path: Path
) -> None:
    influxdb.write_lines(f"node,host=h cpu_pct=5i {T0}")  # cpu_pct exists as an integer field
    conflicting = [f"node,host=h cpu_pct={i}.5 {T0 + i}" for i in range(1, 4)]
    body = lines_of(0, 60, host="real") + ("\n".join(conflicting) + "\n").encode() + lines_of(60, 140, host="real")
    drained = drain(tmp_path, lambda: V1Backend(influxdb.server.url, influxdb.name), [body])
    assert drained.quarantined_lines == sorted(conflicting)
    assert all(row[1] == 400 and "field type conflict" in row[2] for row in drained.quarantine)
    (series,) = influxdb.query("SELECT count(v) FROM m WHERE host = 'real'")
    assert series.values[0][1] == 200


def test_413_splits_the_request_until_it_fits_and_quarantines_a_line_that_never_fits(
    recording_server: RecordingServer, tmp_path: Path
) -> None:
    huge = 'm,host=h big="' + "x" * 5000 + '" 1'
    answering(
        recording_server,
        lambda r: (
            (413, {}, json_error("Request Entity Too Large"))
            if len(r.lines) > 700 or huge in r.lines
            else (204, {}, b"")
        ),
    )
    good = lines_of(0, 4000)
    drained = drain(tmp_path, v1(recording_server), [lines_of(0, 1500) + (huge + "\n").encode() + lines_of(1500, 2500)])
    assert drained.quarantined_lines == [huge]
    assert drained.quarantine[0][1] == 413
    assert sorted(received_lines(recording_server)) == sorted(good.decode().splitlines())
    assert drained.metrics.value("gpuprobe_collector_sink_splits_total") >= 3


def test_429_and_503_wait_as_long_as_retry_after_says(recording_server: RecordingServer, tmp_path: Path) -> None:
    answers: list[Callable[[], tuple[int, dict[str, str], bytes]]] = [
        lambda: (429, {"Retry-After": "1"}, json_error("too many requests")),
        lambda: (503, {"Retry-After": email.utils.formatdate(time.time() + 2, usegmt=True)}, json_error("unavailable")),
    ]
    answering(recording_server, lambda r: answers.pop(0)() if answers else (204, {}, b""))
    drained = drain(tmp_path, v1(recording_server), [lines_of(0, 10)])
    first, second, third = (r.at_s for r in recording_server.writes())
    assert second - first >= 0.95
    assert third - second >= 0.95  # an HTTP date: whole seconds
    assert drained.metrics.value("gpuprobe_collector_sink_retries_total", {"outcome": "throttled"}) == 2
    assert received_lines(recording_server) == lines_of(0, 10).decode().splitlines()


def test_max_series_500_is_quarantined_not_retried_forever(recording_server: RecordingServer, tmp_path: Path) -> None:
    limit = "max series per database exceeded: m,host=new-1 (1000000)"
    answering(
        recording_server,
        lambda r: (500, {}, json_error(limit)) if any("host=new" in line for line in r.lines) else (204, {}, b""),
    )
    new_series = lines_of(0, 4, host="new-1")
    drained = drain(tmp_path, v1(recording_server), [lines_of(0, 100) + new_series + lines_of(100, 100)])
    assert drained.quarantined_lines == sorted(new_series.decode().splitlines())
    assert drained.metrics.value("gpuprobe_collector_quarantined_lines_total", {"reason": "series_limit"}) == 4
    assert len(received_lines(recording_server)) == 200


def test_a_full_disk_is_waited_out_never_quarantined_whatever_the_status(
    recording_server: RecordingServer, tmp_path: Path
) -> None:
    full = [
        (400, {}, json_error("partial write: write /var/lib/influxdb/wal/_42.wal: no space left on device dropped=10")),
        (500, {}, json_error("engine: error writing WAL entry: disk quota exceeded")),
        (404, {}, json_error("open /var/lib/influxdb/meta/meta.dbtmp: ENOSPC")),
    ]
    answering(recording_server, lambda r: full.pop(0) if full else (204, {}, b""))
    settings = SinkSettings(linger_s=0.0, backoff_initial_s=0.05, backoff_max_s=0.1)
    drained = drain(tmp_path, v1(recording_server), [lines_of(0, 10)], settings)
    assert drained.quarantine == []
    assert len(recording_server.writes()) == 4  # the whole request each time: nothing was isolated
    assert drained.metrics.value("gpuprobe_collector_sink_retries_total", {"outcome": "retry"}) == 3
    assert received_lines(recording_server) == lines_of(0, 10).decode().splitlines()


def test_other_5xx_backs_off_with_growing_delays_then_delivers(
    recording_server: RecordingServer, tmp_path: Path
) -> None:
    failures = [3]

    def flaky(r: Recorded) -> tuple[int, dict[str, str], bytes]:
        if failures[0]:
            failures[0] -= 1
            return 500, {}, json_error("timeout")
        return 204, {}, b""

    answering(recording_server, flaky)
    settings = SinkSettings(linger_s=0.0, backoff_initial_s=0.2, backoff_max_s=0.5)
    drained = drain(tmp_path, v1(recording_server), [lines_of(0, 10)], settings)
    times = [r.at_s for r in recording_server.writes()]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert len(gaps) == 3
    # each wait is in [d/2, d] with d = 0.2, 0.4, 0.5 (the cap); upper bounds leave room for a busy machine
    assert 0.09 <= gaps[0] <= 1.0 and 0.19 <= gaps[1] <= 1.5 and 0.24 <= gaps[2] <= 1.5
    assert drained.metrics.value("gpuprobe_collector_sink_retries_total", {"outcome": "retry"}) == 3
    assert received_lines(recording_server) == lines_of(0, 10).decode().splitlines()


def test_401_raises_an_alert_and_keeps_buffering_until_fixed(recording_server: RecordingServer, tmp_path: Path) -> None:
    authorized = threading.Event()
    answering(
        recording_server,
        lambda r: (204, {}, b"") if authorized.is_set() else (401, {}, json_error("authorization failed")),
    )
    seen: dict[str, float] = {}

    def check_alert(sink: Sink) -> None:
        seen["alerts"] = sink.metrics.value("gpuprobe_collector_sink_alerts_total", {"status": "401"})
        seen["up"] = sink.metrics.value("gpuprobe_collector_sink_up")
        seen["queued"] = sink.wal.depth_lines
        authorized.set()

    settings = SinkSettings(linger_s=0.0, backoff_initial_s=0.05, backoff_max_s=0.1)

    def alerted(sink: Sink) -> bool:
        alerts = sink.metrics.value("gpuprobe_collector_sink_alerts_total", {"status": "401"})
        return alerts >= 1 and sink.metrics.value("gpuprobe_collector_sink_up") == 0

    drained = drain(
        tmp_path, v1(recording_server), [lines_of(0, 10)], settings, during=check_alert, during_when=alerted
    )
    assert seen["alerts"] >= 1 and seen["up"] == 0 and seen["queued"] == 10
    assert drained.metrics.value("gpuprobe_collector_sink_up") == 1
    assert drained.quarantine == []


def test_v2_sink_against_recording_server_sends_path_org_bucket_token_and_gzip(
    recording_server: RecordingServer, tmp_path: Path
) -> None:
    body = lines_of(0, 20)
    drain(tmp_path, lambda: V2Backend(recording_server.url, "my-org", "gpu-bucket", "v2-token"), [body])
    (write,) = [r for r in recording_server.requests if r.path == "/api/v2/write"]
    assert write.query["org"] == "my-org" and write.query["bucket"] == "gpu-bucket" and write.query["precision"] == "ns"
    assert write.headers["authorization"] == "Token v2-token"
    assert write.headers["content-encoding"] == "gzip" and write.raw_body != write.body
    assert write.lines == body.decode().splitlines()


def test_v2_sink_against_recording_server_handles_429_retry_after_like_v1(
    recording_server: RecordingServer, tmp_path: Path
) -> None:
    answers = [
        (429, {"Retry-After": "1"}, json_error("slow down")),
        (400, {}, json_error("partial write: unable to parse 'm,host=h v=1i 1': x")),
    ]
    answering(recording_server, lambda r: answers.pop(0) if answers else (204, {}, b""))
    drained = drain(tmp_path, lambda: V2Backend(recording_server.url, "o", "b", "t"), [b"m,host=h v=1i 1\n"])
    first, second = (r.at_s for r in recording_server.requests)
    assert second - first >= 0.95
    assert drained.quarantined_lines == ["m,host=h v=1i 1"]


def test_v2_sink_without_an_answer_retries_like_v1() -> None:
    async def write_to_nobody() -> Answer:
        backend = V2Backend(f"http://{LOOPBACK}:{free_port()}", "o", "b", "t", timeout_s=5.0)
        try:
            return await backend.write(lines_of(0, 3))
        finally:
            await backend.close()

    answer = asyncio.run(write_to_nobody())
    assert answer.status is None and "ClientConnectorError" in answer.body
    assert classify(answer) is Verdict.RETRY


def test_v1_creates_the_database_and_retention_policy_on_first_start(
    influxdb_server: InfluxDBServer, tmp_path: Path
) -> None:
    influxdb_server.start()
    database = f"created_{int(time.time() * 1000) % 10**9}"
    try:
        drained = drain(
            tmp_path,
            lambda: V1Backend(influxdb_server.url, database, "two_days", create_database=True, retention="2d"),
            [lines_of(0, 25, t0=time.time_ns() - 10**12), lines_of(25, 5)],  # the last 5: older than 2 days
        )
        assert database in influxdb_server.databases()
        policies = {
            row[0]: row[1] for s in influxdb_server.query(database, "SHOW RETENTION POLICIES") for row in s.values
        }
        assert policies["two_days"] == "48h0m0s"
        (series,) = influxdb_server.query(database, 'SELECT count(v) FROM "two_days"."m"')
        assert series.values[0][1] == 25
        # 1.x refuses points beyond the retention period with a partial write: they are quarantined
        assert drained.quarantined_lines == sorted(lines_of(25, 5).decode().splitlines())
        assert "points beyond retention policy" in drained.quarantine[0][2]
    finally:
        influxdb_server.drop_database(database)


class _GatedBackend:
    """Answers 204, but holds the request that carries ``held`` until released."""

    name = "gated"

    def __init__(self, held: bytes) -> None:
        self.held = held
        self.release = asyncio.Event()
        self.answered = 0  # requests answered, the held one not among them until released

    async def write(self, body: bytes) -> Answer:
        if self.held in body:
            await self.release.wait()
        self.answered += 1
        return Answer(204)

    async def prepare(self) -> None:
        return None

    async def on_not_found(self) -> bool:
        return False

    async def close(self) -> None:
        return None


def test_written_waits_until_influxdb_has_the_row_and_every_row_before_it(tmp_path: Path) -> None:
    """``--ack-after sink``: requests finish in any order, but a row counts as written only once every
    row before it is written too (acks are cumulative)."""

    async def scenario() -> None:
        wal = WriteAheadLog(tmp_path / "wal.sqlite")
        wal.start()
        first = await wal.append("agent", "spool", 1, lines_of(0, 3), 3)
        second = await wal.append("agent", "spool", 2, lines_of(3, 3), 3)
        assert first is not None and second is not None and second > first
        assert await wal.append("agent", "spool", 3, b"", 0) is None  # no lines, no row
        backend = _GatedBackend(lines_of(0, 3))
        sink = Sink(wal, backend, Metrics(), SinkSettings(batch_lines=3, concurrency=2, linger_s=0.0))
        await sink.start()
        try:
            waiting = asyncio.ensure_future(sink.written(second))
            await wait_until(lambda: backend.answered >= 1, 5, "the second request answered (the first is held)")
            assert not waiting.done() and sink.written_through < first
            backend.release.set()
            await asyncio.wait_for(waiting, 5)
            assert sink.written_through >= second
            await sink.written(first)  # at once
        finally:
            await sink.stop()
            await asyncio.to_thread(wal.close)

    asyncio.run(scenario())
