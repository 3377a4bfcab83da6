"""The collector's v2 write path (``--influx-api v2``) against what InfluxDB 3 (Core, Enterprise,
Clustered) and InfluxDB Cloud document for ``POST /api/v2/write``.

No InfluxDB 2.x or 3.x can be installed here (Debian ships 1.6.7; PyPI and npm have InfluxDB 3 clients,
no server), so :class:`InfluxDB3WriteDouble` stands in for one. It is a **protocol double, not
InfluxDB**: a few dozen lines that implement the documented contract of the endpoint and nothing
else (docs/operations.md, "InfluxDB 2.x, 3.x and Cloud", cites the documentation of each behaviour):

- ``Authorization: Token …`` checked (401 without a valid token, 403 for a token without write
  permission on the bucket); ``bucket`` names a database that must exist (404 otherwise);
  ``org`` and ``precision`` recorded; a ``Content-Encoding: gzip`` body decompressed;
- 204 when every line is stored; a body above ``max_body_bytes`` is 413 and nothing is stored;
- a line that does not parse, or whose field type conflicts with an earlier write, is rejected
  while the other lines of the request are stored (InfluxDB 3's partial write), answered 400 with a
  JSON body naming at most 100 rejected lines, in InfluxDB 3 Core's form
  (``{"error": …, "data": [{"original_line", "line_number", "error_message"}]}``) or Cloud
  Serverless's (``{"code": "invalid", "line": N, "message": …}``: the first rejected line only);
- answers scripted by a test first (429 and 503 with ``Retry-After``, 500).

Stored points are kept by series and timestamp, so a point written twice is stored once, as in
InfluxDB. The tests run the real sink (and one a whole in-process collector) against it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from collector_helpers import FAST_SINK, Recorded, RecordingServer, collector_config, running, wait_until

from gpuprobe.app.loadgen import AgentSpec, SyntheticAgent
from gpuprobe.collector.backends import V2Backend
from gpuprobe.collector.metrics import Metrics
from gpuprobe.collector.settings import SinkSettings
from gpuprobe.collector.sink import Sink
from gpuprobe.collector.wal import WriteAheadLog
from gpuprobe.influx.settings import InfluxSettings

T0 = 1_700_000_000_000_000_000
TOKEN = "write-token"
_MOST_NAMED = 100  # "error details about rejected points, up to 100 points"
# measurement and tags, fields, timestamp: separated by unescaped spaces (quoted strings aside)
_LINE = re.compile(r'^((?:[^\\ ]|\\.)+) ((?:[^\\ "]|\\.|"(?:[^\\"]|\\.)*")+) (-?\d+)$')
_FIELD = re.compile(r'((?:[^\\=,]|\\.)+)=("(?:[^\\"]|\\.)*"|[^,]+)')


def _field_type(value: str) -> str:
    if value.startswith('"'):
        return "string"
    if value in ("t", "T", "true", "True", "TRUE", "f", "F", "false", "False", "FALSE"):
        return "boolean"
    if value.endswith("i"):
        return "integer"
    float(value)  # ValueError: not a number
    return "float"


@dataclass
class InfluxDB3WriteDouble:
    """A protocol double of ``POST /api/v2/write`` as InfluxDB 3 and Cloud document it (not InfluxDB)."""

    buckets: set[str]
    token: str = TOKEN
    read_only_tokens: set[str] = field(default_factory=set)
    max_body_bytes: int = 50 << 20
    dialect: str = "core"  # "core": every rejected line by number (up to 100); "cloud": the first only
    #: answered before anything else, one per request: (status, headers, JSON body)
    script: list[tuple[int, dict[str, str], dict[str, object]]] = field(default_factory=list)
    points: dict[tuple[str, str, int], str] = field(default_factory=dict)  # (bucket, series, ns) -> fields
    _types: dict[tuple[str, str, str], str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, request: Recorded) -> tuple[int, dict[str, str], bytes]:
        status, headers, document = self._answer(request)
        request.status = status  # type: ignore[attr-defined]
        return status, headers, json.dumps(document).encode() if document is not None else b""

    def _answer(self, request: Recorded) -> tuple[int, dict[str, str], dict[str, object] | None]:
        with self._lock:
            if request.path != "/api/v2/write":
                return 404, {}, {"code": "not found", "message": "path not found"}
            if self.script:
                return self.script.pop(0)
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            if scheme not in ("Token", "Bearer") or token not in {self.token, *self.read_only_tokens}:
                return 401, {}, {"code": "unauthorized", "message": "unauthorized access"}
            bucket = request.query.get("bucket", "")
            if bucket not in self.buckets:
                return 404, {}, {"code": "not found", "message": f'bucket "{bucket}" not found'}
            if token in self.read_only_tokens:
                return 403, {}, {"code": "forbidden", "message": f"insufficient permissions for write to {bucket}"}
            if len(request.raw_body) > self.max_body_bytes:
                return 413, {}, {"code": "request too large", "message": "request body too large"}
            rejected = [
                (number, line, problem)
                for number, line in enumerate(request.body.decode().split("\n"), start=1)
                if line and (problem := self._store(bucket, line)) is not None
            ]
            if not rejected:
                return 204, {}, None
            if self.dialect == "cloud":
                number, _, problem = rejected[0]
                return (
                    400,
                    {},
                    {"code": "invalid", "line": number, "message": f"failed to parse line {number}: {problem}"},
                )
            data = [
                {"original_line": line, "line_number": number, "error_message": problem}
                for number, line, problem in rejected[:_MOST_NAMED]
            ]
            return 400, {}, {"error": "partial write of line protocol occurred", "data": data}

    def _store(self, bucket: str, line: str) -> str | None:
        """Stores one line; returns why it is rejected instead (None: stored)."""
        match = _LINE.match(line)
        if match is None:
            return "invalid line protocol: expected 'measurement[,tags] fields timestamp'"
        series, fields, timestamp = match.groups()
        measurement = re.split(r"(?<!\\),", series, maxsplit=1)[0]
        found = _FIELD.findall(fields)
        if not found:
            return "invalid line protocol: no field"
        types = {}
        for key, value in found:
            try:
                types[key] = _field_type(value)
            except ValueError:
                return f"invalid field value {value!r}"
            known = self._types.get((bucket, measurement, key))
            if known is not None and known != types[key]:
                return f"invalid column type for column '{key}', expected {known}, got {types[key]}"
        for key, kind in types.items():
            self._types[(bucket, measurement, key)] = kind
        self.points[(bucket, series, int(timestamp))] = fields
        return None

    def stored(self, bucket: str) -> list[str]:
        return sorted(f"{s} {f} {t}" for (b, s, t), f in self.points.items() if b == bucket)


@pytest.fixture
def influxdb3(recording_server: RecordingServer) -> tuple[InfluxDB3WriteDouble, RecordingServer]:
    double = InfluxDB3WriteDouble(buckets={"gpu"})
    recording_server.answer = double
    return double, recording_server


def lines_of(start: int, count: int, measurement: str = "m") -> list[str]:
    return [f"{measurement},host=h{i % 4} v={i}i {T0 + i}" for i in range(start, start + count)]


@dataclass
class Drained:
    metrics: Metrics
    quarantine: list[tuple[int, int | None, str, bytes]]
    seconds: float

    @property
    def quarantined(self) -> list[str]:
        return sorted(row[3].decode().rstrip("\n") for row in self.quarantine)


def drain(
    tmp_path: Path,
    url: str,
    batches: Sequence[Sequence[str]],
    *,
    bucket: str = "gpu",
    token: str = TOKEN,
    settings: SinkSettings = FAST_SINK,
    during: object = None,
    timeout_s: float = 30.0,
) -> Drained:
    """Stores ``batches`` in a WAL and runs the real sink (v2 backend) until the WAL is empty."""

    async def scenario() -> Drained:
        wal = WriteAheadLog(tmp_path / "wal.sqlite")
        wal.start()
        for seq, batch in enumerate(batches, start=1):
            await wal.append("agent", "spool", seq, "".join(line + "\n" for line in batch).encode(), len(batch))
        metrics = Metrics()
        sink = Sink(wal, V2Backend(url, "my-org", bucket, token), metrics, settings)
        started = time.monotonic()
        await sink.start()
        try:
            if callable(during):
                await during(sink)
            await wait_until(lambda: wal.depth_rows == 0, timeout_s, "the WAL to drain")
        finally:
            seconds = time.monotonic() - started
            await sink.stop()
        quarantine = wal.quarantine_rows(100_000)
        await asyncio.to_thread(wal.close)
        return Drained(metrics, quarantine, seconds)

    return asyncio.run(scenario())


def writes(server: RecordingServer) -> list[Recorded]:
    return [r for r in server.requests if r.path == "/api/v2/write"]


def test_the_request_form_gzip_precision_token_org_and_bucket_from_a_real_collector(
    influxdb3: tuple[InfluxDB3WriteDouble, RecordingServer], tmp_path: Path
) -> None:
    double, server = influxdb3
    influx = InfluxSettings(url=server.url, api="v2", org="my-org", bucket="gpu", token=TOKEN)
    config = collector_config(tmp_path, server.url, "unused", influx=influx, ack_after="sink")

    async def scenario() -> int:
        async with running(config) as collector:
            agent = SyntheticAgent(f"127.0.0.1:{collector.port}", AgentSpec("v2-1", gpus=2), window=8)
            task = asyncio.create_task(agent.run())
            count = 0
            for _ in range(3):
                batch = agent.factory.batch(samples_per_gpu=4)
                count += len(batch.gpu_samples)
                last = agent.enqueue(batch)
            await agent.wait_acked(last, 30)  # --ack-after sink: the double answered 204
            await agent.close()
            await task
            return count

    samples = asyncio.run(scenario())
    requests = writes(server)
    assert requests
    for request in requests:
        assert request.method == "POST"
        assert request.query == {"org": "my-org", "bucket": "gpu", "precision": "ns"}
        assert request.headers["authorization"] == f"Token {TOKEN}"
        assert request.headers["content-encoding"] == "gzip" and request.raw_body[:2] == b"\x1f\x8b"
    gpu_points = [p for p in double.stored("gpu") if p.startswith("gpu,")]
    assert len(gpu_points) == samples
    assert all(int(p.rsplit(" ", 1)[1]) > T0 for p in gpu_points)  # ns timestamps, sent as they are


def test_a_partial_write_stores_the_good_lines_and_only_the_named_ones_are_quarantined(
    influxdb3: tuple[InfluxDB3WriteDouble, RecordingServer], tmp_path: Path
) -> None:
    double, server = influxdb3
    good = lines_of(0, 30)
    bad = [
        "m,host=h0 v=1.5 1700000000000000100",
        "m,host=h1 1700000000000000101",
        'm,host=h2 v="s" 1700000000000000102',
    ]
    batch = good[:10] + bad[:1] + good[10:20] + bad[1:] + good[20:]
    drained = drain(tmp_path, server.url, [batch])
    assert double.stored("gpu") == sorted(good)
    assert drained.quarantined == sorted(bad)
    assert len(writes(server)) == 1  # every rejected line was named: nothing is sent again
    reasons = " ".join(row[2] for row in drained.quarantine)
    assert "invalid column type" in reasons and all(row[1] == 400 for row in drained.quarantine)


def test_more_rejected_lines_than_an_answer_names_are_all_found(
    influxdb3: tuple[InfluxDB3WriteDouble, RecordingServer], tmp_path: Path
) -> None:
    """InfluxDB 3 names "up to 100" rejected points: the rest are found by sending the others again."""
    double, server = influxdb3
    good = lines_of(0, 200)
    bad = [f"m,host=h{i} v={i}.5 {T0 + 1000 + i}" for i in range(150)]  # float into the integer column
    double.points[("gpu", "m,host=h0", T0 - 1)] = "v=0i"
    double._types[("gpu", "m", "v")] = "integer"
    drained = drain(tmp_path, server.url, [good[:100] + bad + good[100:]], settings=SinkSettings(linger_s=0.0))
    assert [p for p in double.stored("gpu") if p != f"m,host=h0 v=0i {T0 - 1}"] == sorted(good)
    assert drained.quarantined == sorted(bad)


def test_cloud_names_only_the_first_rejected_line_and_the_sink_finds_the_others(
    influxdb3: tuple[InfluxDB3WriteDouble, RecordingServer], tmp_path: Path
) -> None:
    double, server = influxdb3
    double.dialect = "cloud"
    good = lines_of(0, 40)
    bad = [f"m,host=h9 {T0 + 500 + i}" for i in range(3)]  # no field
    drained = drain(tmp_path, server.url, [good[:5] + bad[:1] + good[5:30] + bad[1:] + good[30:]])
    assert double.stored("gpu") == sorted(good)
    assert drained.quarantined == sorted(bad)


def test_413_splits_the_request_until_each_part_fits(
    influxdb3: tuple[InfluxDB3WriteDouble, RecordingServer], tmp_path: Path
) -> None:
    double, server = influxdb3
    double.max_body_bytes = 1500  # compressed bytes
    good = [f"m,host=h{i % 50},rack=r{i * 7919 % 1000} v={i * 2654435761 % 10**9}i {T0 + i}" for i in range(2000)]
    drained = drain(tmp_path, server.url, [good], settings=SinkSettings(linger_s=0.0))
    assert double.stored("gpu") == sorted(good)
    assert drained.quarantine == []
    assert drained.metrics.value("gpuprobe_collector_sink_splits_total") >= 3
    assert any(getattr(r, "status", 0) == 413 for r in writes(server))


@pytest.mark.parametrize("status", [429, 503])
def test_throttled_answers_are_retried_after_retry_after(
    influxdb3: tuple[InfluxDB3WriteDouble, RecordingServer], tmp_path: Path, status: int
) -> None:
    double, server = influxdb3
    double.script = [(status, {"Retry-After": "1"}, {"code": "too many requests", "message": "over quota"})] * 2
    good = lines_of(0, 20)
    drained = drain(tmp_path, server.url, [good], settings=SinkSettings(linger_s=0.0, backoff_initial_s=0.01))
    times = [r.at_s for r in writes(server)]
    assert len(times) == 3 and times[1] - times[0] >= 0.95 and times[2] - times[1] >= 0.95
    assert double.stored("gpu") == sorted(good) and drained.quarantine == []
    assert drained.metrics.value("gpuprobe_collector_sink_retries_total", {"outcome": "throttled"}) == 2


def test_500_is_retried_with_backoff_and_nothing_is_quarantined(
    influxdb3: tuple[InfluxDB3WriteDouble, RecordingServer], tmp_path: Path
) -> None:
    double, server = influxdb3
    double.script = [(500, {}, {"code": "internal error", "message": "ingester unavailable"})] * 3
    good = lines_of(0, 20)
    drained = drain(tmp_path, server.url, [good], settings=SinkSettings(linger_s=0.0, backoff_initial_s=0.05))
    times = [r.at_s for r in writes(server)]
    assert len(times) == 4 and times[-1] - times[0] >= 0.1  # waited between the tries
    assert double.stored("gpu") == sorted(good) and drained.quarantine == []
    assert drained.metrics.value("gpuprobe_collector_sink_retries_total", {"outcome": "retry"}) == 3


@pytest.mark.parametrize(
    ("problem", "status", "says"),
    [
        ("token", 401, "unauthorized access"),
        ("read-only token", 403, "insufficient permissions"),
        ("bucket", 404, 'bucket \\"gpu\\" not found'),
    ],
)
def test_credentials_permissions_and_a_missing_bucket_stop_the_writes_and_say_why(
    influxdb3: tuple[InfluxDB3WriteDouble, RecordingServer],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    problem: str,
    status: int,
    says: str,
) -> None:
    """Nothing is quarantined or lost: the lines wait in the WAL, an ERROR line names the answer, and
    the writes go through once the operator fixed it."""
    double, server = influxdb3
    token = TOKEN
    if problem == "token":
        double.token = "another-token"
    elif problem == "read-only token":
        double.read_only_tokens = {"reader"}
        token = "reader"
    else:
        double.buckets = set()
    seen: dict[str, float] = {}

    async def check_then_fix(sink: Sink) -> None:
        await wait_until(lambda: len(writes(server)) >= 2, 10, "the sink to try again")
        seen["up"] = sink.metrics.value("gpuprobe_collector_sink_up")
        seen["alerts"] = sink.metrics.value("gpuprobe_collector_sink_alerts_total", {"status": str(status)})
        seen["queued"] = sink.wal.depth_lines
        double.token, double.read_only_tokens, double.buckets = token, set(), {"gpu"}

    good = lines_of(0, 10)
    with caplog.at_level(logging.ERROR, logger="gpuprobe.collector.sink"):
        drained = drain(
            tmp_path,
            server.url,
            [good],
            token=token,
            settings=SinkSettings(linger_s=0.0, backoff_initial_s=0.05, backoff_max_s=0.1),
            during=check_then_fix,
        )
    assert seen == {"up": 0, "alerts": seen["alerts"], "queued": 10} and seen["alerts"] >= 1
    message = next(r.getMessage() for r in caplog.records if f"HTTP {status}" in r.getMessage())
    assert says in message and "check --influx-url" in message
    assert double.stored("gpu") == sorted(good) and drained.quarantine == []
