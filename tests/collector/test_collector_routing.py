"""Routing by ``cluster`` tag (``--influx-route CLUSTER=URL[/DATABASE]``), against two real InfluxDB
processes: each line lands in its cluster's InfluxDB, one that is down holds back only its own lines
(and, with ``--ack-after sink``, only the acks of batches that have lines for it), everything arrives
exactly once after it comes back, and a cluster value no route names (however hostile) goes to the
default."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest
import support
from collector_helpers import FAST_SINK, RecordingServer, collector_config, running, wait_until
from test_collector_faults import assert_exactly_once

from gpuprobe.app.loadgen import AgentSpec, SyntheticAgent
from gpuprobe.collector.backends import V1Backend
from gpuprobe.collector.cli import config_from_options
from gpuprobe.collector.metrics import Metrics
from gpuprobe.collector.routing import Destination, cluster_of
from gpuprobe.collector.settings import CollectorConfigError, InfluxRoute, parse_route
from gpuprobe.collector.sink import Sink
from gpuprobe.collector.wal import WriteAheadLog
from gpuprobe.devservices import InfluxDBServer
from gpuprobe.influx.lineprotocol import encode_line

T0 = 1_700_000_000_000_000_000


def test_the_cluster_tag_is_read_as_written_not_from_a_lookalike_in_another_value() -> None:
    assert cluster_of(b"gpu,cluster=eu-west,host=a v=1i 1\n") == b"eu-west"
    assert cluster_of(b"gpu,host=a v=1i 1\n") is None
    assert cluster_of(b"gpu v=1i 1\n") is None
    # another tag's value that looks like the tag, escaped as the encoder writes it
    line = encode_line("gpu", {"host": "x,cluster=eu-west", "cluster": "us east"}, {"v": 1}, 1).encode()
    assert cluster_of(line) == b"us\\ east"
    line = encode_line("gpu", {"host": "x,cluster=eu-west"}, {"v": 1}, 1).encode()
    assert cluster_of(line) is None
    assert cluster_of(b"my\\,gpu,cluster=a v=1i 1\n") == b"a"  # an escaped comma in the measurement


def test_a_batch_is_routed_whole_unless_its_lines_differ_or_a_value_looks_like_the_tag() -> None:
    from gpuprobe.collector.routing import _row_cluster

    def body(*lines: str) -> bytes:
        return "".join(line + "\n" for line in lines).encode()

    batch = body("gpu,cluster=eu,host=a v=1i 1", "node,cluster=eu,host=a v=2i 1", "probe,cluster=eu,probe=p v=3i 2")
    assert _row_cluster(batch, 3) == b"eu"
    assert _row_cluster(body("gpu,host=a v=1i 1", "node,host=a v=2i 1"), 2) == b""
    mixed = body("gpu,cluster=eu,host=a v=1i 1", "gpu,cluster=us,host=a v=1i 1")
    assert _row_cluster(mixed, 2) is None  # read line by line
    # the tag's text inside a string field of a line without the tag is not taken for it
    lookalike = body('gpu_process,cluster=us,host=a command="x,cluster=eu,y" 1', "node,host=a v=1i 1")
    assert _row_cluster(lookalike, 2) is None
    assert _row_cluster(body('gpu_process,host=a command="x,cluster=eu,y" 1'), 1) is None


def test_a_route_names_a_cluster_a_url_and_optionally_the_database() -> None:
    assert parse_route("eu-west=http://influx-eu:8086") == InfluxRoute("eu-west", "http://influx-eu:8086", "")
    assert parse_route("eu-west=https://influx-eu:8086/gpuprobe") == InfluxRoute(
        "eu-west", "https://influx-eu:8086", "gpuprobe"
    )
    assert parse_route("a=b=http://h/proxy/db") == InfluxRoute("a=b", "http://h/proxy", "db")
    for bad in ("eu-west", "=http://h", "eu=influx-eu:8086", "eu=ftp://h"):
        with pytest.raises(CollectorConfigError, match="CLUSTER=URL"):
            parse_route(bad)


def test_a_cluster_routed_twice_is_a_configuration_error(tmp_path: Path) -> None:
    from gpuprobe.collector.options import OPTIONS

    values = {opt.name: opt.default for opt in OPTIONS}
    values.update(insecure=True, wal=tmp_path, influx_route=["eu=http://a:8086", "eu=http://b:8086"])
    with pytest.raises(CollectorConfigError, match="routed twice"):
        config_from_options(values)
    values["influx_route"] = ["eu=http://a:8086/x", "eu-2=http://a:8086/x"]
    assert [r.cluster for r in config_from_options(values).routes] == ["eu", "eu-2"]


HOSTILE = ["eu west", "eu,west", "eu=west", "eu-wëst ☃", "x" * 65536]


def test_lines_land_in_the_influxdb_of_their_cluster_and_unknown_clusters_in_the_default(
    private_influxdb: InfluxDBServer, second_influxdb: InfluxDBServer, tmp_path: Path
) -> None:
    private_influxdb.create_database("main")
    second_influxdb.create_database("eu")

    clusters = ["eu-west", "us-east", "eu-north", *HOSTILE, ""]  # "": a line without the tag
    sent = {b * 100 + i: clusters[(b + i) % len(clusters)] for b in range(10) for i in range(40)}

    def line(v: int) -> str:
        tags = {"cluster": sent[v], "host": f"h{v % 3}"} if sent[v] else {"host": "none"}
        return encode_line("m", tags, {"v": v}, T0 + v)

    batches = ["".join(line(b * 100 + i) for i in range(40)) for b in range(10)]

    async def scenario() -> Metrics:
        wal = WriteAheadLog(tmp_path / "wal.sqlite")
        wal.start()
        for seq, text in enumerate(batches, start=1):
            await wal.append("agent", "spool", seq, text.encode(), text.count("\n"))
        metrics = Metrics()
        eu = V1Backend(second_influxdb.url, "eu")
        routes = [Destination("eu", eu, frozenset({"eu-west", "eu-north"}))]
        sink = Sink(wal, V1Backend(private_influxdb.url, "main"), metrics, FAST_SINK, routes)
        await sink.start()
        try:
            await wait_until(lambda: wal.depth_rows == 0, 30, "the WAL to drain")
        finally:
            await sink.stop()
            await asyncio.to_thread(wal.close)
        return metrics

    metrics = asyncio.run(scenario())

    def stored(server: InfluxDBServer, db: str) -> dict[int, str]:
        got: dict[int, str] = {}
        for series in server.query(db, 'SELECT "v", "cluster" FROM "m"'):
            for row in series.rows():
                got[int(str(row["v"]))] = str(row["cluster"] or "")
        return got

    in_eu, in_main = stored(second_influxdb, "eu"), stored(private_influxdb, "main")
    assert in_eu == {v: c for v, c in sent.items() if c in ("eu-west", "eu-north")}
    # every other line, hostile values included, went to the default; a 64 KiB tag value is longer
    # than InfluxDB 1.x's series key may be: refused there (quarantined), never sent to the route
    too_long = {v for v, c in sent.items() if len(c) > 60000}
    assert in_main == {v: c for v, c in sent.items() if c not in ("eu-west", "eu-north") and v not in too_long}
    # (InfluxDB 1.x does not name them: the sink's search by halves quarantines at least these)
    assert metrics.value("gpuprobe_collector_quarantined_lines_total", {"reason": "refused_lines"}) >= len(too_long)
    assert metrics.value("gpuprobe_collector_destination_written_lines_total", {"destination": "eu"}) == len(in_eu)
    assert metrics.value("gpuprobe_collector_destination_up", {"destination": "default"}) == 1


def test_a_region_that_is_down_holds_back_only_its_own_lines_and_acks_then_gets_them_exactly_once(
    private_influxdb: InfluxDBServer, second_influxdb: InfluxDBServer, tmp_path: Path
) -> None:
    private_influxdb.create_database("main")
    second_influxdb.create_database("eu")
    config = collector_config(
        tmp_path,
        private_influxdb.url,
        "main",
        ack_after="sink",
        routes=(InfluxRoute("eu-west", second_influxdb.url, "eu"),),
        sink=replace(FAST_SINK, concurrency=2),
    )
    second_influxdb.stop()
    route_name = f"{second_influxdb.url}/eu"

    async def scenario() -> None:
        async with running(config) as collector:
            target = f"127.0.0.1:{collector.port}"
            eu = SyntheticAgent(target, AgentSpec("eu-1", gpus=2, cluster="eu-west"), window=64)
            us = SyntheticAgent(target, AgentSpec("us-1", gpus=2, cluster="us-east"), window=64)
            tasks = [asyncio.create_task(agent.run()) for agent in (eu, us)]
            sent: dict[str, list[object]] = {"eu-1": [], "us-1": []}
            last = {}
            for _ in range(12):  # interleaved: the us batches sit between eu batches in the WAL
                for agent in (eu, us):
                    batch = agent.factory.batch(samples_per_gpu=5)
                    sent[agent.spec.id].extend(batch.gpu_samples)
                    last[agent.spec.id] = agent.enqueue(batch)
                await asyncio.sleep(0.05)
            # the default region has every us batch and acked it, although eu is down
            await us.wait_acked(last["us-1"], 30)
            assert eu.acked_seq == 0
            assert collector.metrics.value("gpuprobe_collector_destination_up", {"destination": route_name}) == 0
            assert collector.metrics.value("gpuprobe_collector_destination_up", {"destination": "default"}) == 1
            assert collector.metrics.value("gpuprobe_collector_sink_up") == 0
            assert collector.wal.depth_rows > 0  # the eu lines wait in the WAL
            await asyncio.to_thread(second_influxdb.start)
            await eu.wait_acked(last["eu-1"], 30)
            await wait_until(lambda: collector.wal.depth_rows == 0, 30, "the WAL to drain")
            assert collector.metrics.value("gpuprobe_collector_destination_up", {"destination": route_name}) == 1
            for agent in (eu, us):
                await agent.close()
            await asyncio.gather(*tasks)
            assert_exactly_once(second_influxdb, "eu", {"eu-1": sent["eu-1"]})  # type: ignore[dict-item]
            assert_exactly_once(private_influxdb, "main", {"us-1": sent["us-1"]})  # type: ignore[dict-item]

    asyncio.run(scenario())


def test_while_a_destination_is_down_the_batches_without_its_lines_are_written_and_acked_past_it(
    recording_server: RecordingServer, tmp_path: Path
) -> None:
    """One request in flight per lane and one row per request: the down lane's reader runs out of room
    after two rows, reads on without keeping them, and still lets the later us batches be acked."""
    from gpuprobe.devservices.ports import free_port

    async def scenario() -> None:
        wal = WriteAheadLog(tmp_path / "wal.sqlite")
        wal.start()
        rows = {}
        for seq in range(1, 21):
            cluster = "eu" if seq % 4 == 1 else "us"  # eu, us, us, us, eu, ...
            text = encode_line("m", {"cluster": cluster, "host": "h"}, {"v": seq}, T0 + seq)
            rows[seq] = (cluster, await wal.append("agent", "spool", seq, text.encode(), 1))
        down = V1Backend(f"http://127.0.0.1:{free_port()}", "eu", timeout_s=1.0)  # nobody listens
        settings = replace(FAST_SINK, batch_lines=1, concurrency=1, linger_s=0.0)
        routes = [Destination("eu", down, frozenset({"eu"}))]
        sink = Sink(wal, V1Backend(recording_server.url, "main"), Metrics(), settings, routes)
        await sink.start()
        try:
            for cluster, row_id in rows.values():
                assert row_id is not None
                if cluster == "us":
                    await asyncio.wait_for(sink.written(row_id), 10)
            first_eu = rows[1][1]
            assert first_eu is not None
            waiting = asyncio.ensure_future(sink.written(first_eu))
            # nothing deleted: eu has not taken row 1 (its writes time out after 1 s and are retried)
            await support.stays_async(
                lambda: not waiting.done() and wal.depth_rows == 20,
                0.5,
                "row 1 unwritten and every row in the WAL",
                describe=lambda: (waiting.done(), wal.depth_rows),
            )
            waiting.cancel()
        finally:
            await sink.stop()
            await asyncio.to_thread(wal.close)
        us_lines = [line for r in recording_server.writes() for line in r.lines]
        assert len(us_lines) == 15

    asyncio.run(scenario())
