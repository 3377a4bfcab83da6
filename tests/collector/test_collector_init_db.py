"""``gpuprobe collector --init-db``: retention policies, rollups and continuous queries on a real InfluxDB
1.x, safe to run again; the rollups hold what docs/schema.md says, computed by the real continuous queries."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import support

from gpuprobe.devservices import InfluxDBDatabase, InfluxDBServer
from gpuprobe.influx.client import InfluxClient
from gpuprobe.influx.retention import (
    GPU_10S,
    NODE_FIELDS,
    ROLLUP_1M,
    ROLLUP_10S,
    InitDbError,
    RetentionPlan,
    backfill,
    continuous_queries,
    init_db,
)
from gpuprobe.influx.settings import InfluxSettings

SCHEMA = (Path(__file__).resolve().parents[2] / "docs" / "schema.md").read_text()
NS = 10**9
IDENTITY = "cluster=c,host=node-a,virt=bare_metal"


def gpu_line(gpu: int, t_ns: int, i: int) -> str:
    temp = 40.0 + (i % 20)
    return (
        f"gpu,{IDENTITY},gpu={gpu},model=H100,uuid=GPU-{gpu} util_pct={float(i % 101)},mem_util_pct=10.0,"
        f"mem_used_bytes={1000 + i}i,mem_total_bytes=80000i,power_w={100.0 + i % 50},power_instant_w={90.0 + i % 70},"
        f"energy_j={1000.0 + 10 * i},temp_c={temp},mem_temp_c={temp + 5},sm_clock_mhz={1980 - (i % 3)}i,"
        f"mem_clock_mhz=2619i,power_limit_w=700.0,clock_event_reasons={0 if i % 7 else 64}i,"
        f"pcie_tx_bytes_per_s=1.5,pcie_rx_bytes_per_s=2.5,fan_pct=30.0 {t_ns}"
    )


def node_line(t_ns: int, i: int) -> str:
    return (
        f"node,{IDENTITY} cpu_pct={float(i % 100)},mem_used_bytes={5000 + i}i,mem_total_bytes=9000i,load1=1.5,"
        f"hwmon_coretemp_package_id_0_c={50.0 + i % 4} {t_ns}"
    )


@pytest.fixture
def client(influxdb: InfluxDBDatabase) -> Iterator[InfluxClient]:
    with InfluxClient(InfluxSettings(url=influxdb.server.url, database="")) as c:
        yield c


def policies(influxdb: InfluxDBDatabase) -> dict[str, tuple[str, str, bool]]:
    answer = influxdb.server.execute(f'SHOW RETENTION POLICIES ON "{influxdb.name}"')
    return {row[0]: (row[1], row[2], row[4]) for s in answer for row in s.values}


def gpuprobe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*support.gpuprobe_command(), "collector", *args],
        capture_output=True,
        text=True,
        env=support.clean_env(),
        timeout=60,
    )


def test_init_db_creates_policies_and_queries_and_is_safe_to_run_again(influxdb: InfluxDBDatabase) -> None:
    base = ["--init-db", "--influx-url", influxdb.server.url, "--influx-db", influxdb.name]
    first = gpuprobe(*base)
    assert first.returncode == 0, first.stderr
    assert "created   retention policy rollup_10s (duration 90d)" in first.stdout
    assert "changed   retention policy autogen (duration 7d, default)" in first.stdout
    assert "created   continuous query gpu_rollup_10s" in first.stdout
    assert policies(influxdb) == {
        "autogen": ("168h0m0s", "24h0m0s", True),
        "rollup_10s": ("2160h0m0s", "24h0m0s", False),
        "rollup_1m": ("9600h0m0s", "168h0m0s", False),
        "forever": ("0s", "168h0m0s", False),
        "events": ("9600h0m0s", "168h0m0s", False),
    }
    assert "created   retention policy events (duration 400d)" in first.stdout
    cqs = {
        row[0]
        for s in influxdb.server.execute("SHOW CONTINUOUS QUERIES")
        if s.name == influxdb.name
        for row in s.values
    }
    assert cqs == {
        "gpu_rollup_10s",
        "gpu_aggregates_rollup_10s",
        "gpu_rollup_1m",
        "node_rollup_10s",
        "node_rollup_1m",
    }

    again = gpuprobe(*base)
    assert again.returncode == 0, again.stderr
    assert "done: nothing to change" in again.stdout
    assert not re.search(r"^\s+(created|changed)", again.stdout, re.M), again.stdout

    changed = gpuprobe(*base, "--retention-raw", "1d", "--retention-1m", "0")
    assert changed.returncode == 0, changed.stderr
    assert "changed   retention policy autogen (duration 1d, default)" in changed.stdout
    assert "changed   retention policy rollup_1m (duration INF)" in changed.stdout
    assert "unchanged retention policy rollup_10s" in changed.stdout
    assert policies(influxdb)["autogen"] == ("24h0m0s", "1h0m0s", True)
    assert policies(influxdb)["rollup_1m"][0] == "0s"


def test_init_db_uses_influx_rp_as_the_raw_policy_and_creates_it(influxdb: InfluxDBDatabase) -> None:
    done = gpuprobe(
        "--init-db", "--influx-url", influxdb.server.url, "--influx-db", influxdb.name, "--influx-rp", "raw"
    )
    assert done.returncode == 0, done.stderr
    assert "created   retention policy raw (duration 7d, default)" in done.stdout
    assert policies(influxdb)["raw"][2] is True
    answer = influxdb.query('SELECT "rp" FROM "forever"."rp_config" WHERE "min_range_ms" = 0')
    assert [row[1] for s in answer for row in s.values] == ["raw"]
    cqs = [
        row[1]
        for s in influxdb.server.execute("SHOW CONTINUOUS QUERIES")
        if s.name == influxdb.name
        for row in s.values
    ]
    assert any(f"FROM {influxdb.name}.raw.gpu" in q for q in cqs), cqs


def test_a_changed_continuous_query_is_replaced(influxdb: InfluxDBDatabase, client: InfluxClient) -> None:
    plan = RetentionPlan(database=influxdb.name)
    init_db(client, plan)
    influxdb.server.execute(f'DROP CONTINUOUS QUERY "gpu_rollup_10s" ON "{influxdb.name}"')
    influxdb.server.execute(
        f'CREATE CONTINUOUS QUERY "gpu_rollup_10s" ON "{influxdb.name}" BEGIN SELECT mean("power_w") INTO '
        f'"{influxdb.name}"."rollup_10s"."gpu" FROM "{influxdb.name}"."autogen"."gpu" GROUP BY time(10s), * END'
    )
    report = init_db(client, plan)
    assert "changed   continuous query gpu_rollup_10s (every 10s, for 30s)" in report.lines
    assert not init_db(client, plan).changed


def test_errors_say_what_is_wrong(influxdb: InfluxDBDatabase) -> None:
    down = gpuprobe("--init-db", "--influx-url", "http://127.0.0.1:9", "--influx-db", "x")
    assert down.returncode == 1
    assert "error: cannot reach InfluxDB at http://127.0.0.1:9" in down.stderr
    v2 = gpuprobe("--init-db", "--influx-api", "v2", "--influx-org", "o", "--influx-bucket", "b", "--influx-token", "t")
    assert v2.returncode == 2 and "--init-db sets up InfluxDB 1.x" in v2.stderr
    bad = gpuprobe("--init-db", "--influx-url", influxdb.server.url, "--influx-db", influxdb.name, "--influx-rp", "a-b")
    assert bad.returncode == 1 and "letters, digits and _ only" in bad.stderr
    with pytest.raises(InitDbError, match="cannot be named 'rollup_10s'"):
        RetentionPlan(database="x", raw_rp=ROLLUP_10S).check()


def test_backfill_computes_the_rollups_the_schema_documents(influxdb: InfluxDBDatabase, client: InfluxClient) -> None:
    plan = RetentionPlan(database=influxdb.name, raw_s=None)
    init_db(client, plan)
    start = (time.time_ns() // (60 * NS) - 5) * 60 * NS  # five whole minutes ago: outside the CQs' window
    lines = [gpu_line(g, start + i * NS // 10 + g, i) for i in range(1200) for g in (0, 1)]  # 2 minutes at 10 Hz
    lines += [node_line(start + i * NS, i) for i in range(120)]
    influxdb.write_lines(lines)
    backfill(client, plan, start, start + 2 * 60 * NS)

    ten = influxdb.query(f'SELECT * FROM "{ROLLUP_10S}"."gpu" WHERE "gpu" = \'0\' ORDER BY time')[0].rows()
    assert len(ten) == 12 and ten[0]["time"] == start
    raw = influxdb.query(
        f'SELECT mean("power_w"), max("temp_c"), last("energy_j"), count("temp_c"), max("clock_event_reasons") '
        f'FROM "gpu" WHERE "gpu" = \'0\' AND time >= {start} AND time < {start + 10 * NS}'
    )[0].rows()[0]
    assert ten[0]["power_w"] == pytest.approx(raw["mean"])
    assert ten[0]["temp_c_max"] == raw["max"] and ten[0]["energy_j"] == raw["last"]
    assert ten[0]["samples"] == raw["count"] == 100 and ten[0]["clock_event_reasons"] == raw["max_1"] == 64
    assert ten[0]["host"] == "node-a" and ten[0]["uuid"] == "GPU-0" and ten[0]["model"] == "H100"  # tags kept

    minute = influxdb.query(f'SELECT * FROM "{ROLLUP_1M}"."gpu" WHERE "gpu" = \'1\' ORDER BY time')[0].rows()
    assert [row["samples"] for row in minute] == [600, 600]
    raw_minute = influxdb.query(
        f'SELECT mean("temp_c"), min("temp_c"), last("energy_j") FROM "gpu" WHERE "gpu" = \'1\' '
        f"AND time >= {start} AND time < {start + 60 * NS}"
    )[0].rows()[0]
    assert minute[0]["temp_c"] == pytest.approx(raw_minute["mean"])
    assert minute[0]["temp_c_min"] == raw_minute["min"] and minute[0]["energy_j"] == raw_minute["last"]

    node = influxdb.query(f'SELECT * FROM "{ROLLUP_1M}"."node" ORDER BY time')[0].rows()
    assert len(node) == 2 and node[0]["mean_hwmon_coretemp_package_id_0_c"] == pytest.approx(51.5)
    assert node[0]["cpu_pct"] == pytest.approx(29.5) and node[0]["mem_total_bytes"] == 9000

    # the types docs/schema.md gives for the rollups
    rows = re.findall(r"^\| `(gpu|node)` \| `([a-z0-9_<>]+)` \| (float|integer) \|", SCHEMA, re.M)
    documented = {f"{m}.{f}": t for m, f, t in rows}
    for measurement, fields in (("gpu", GPU_10S), ("node", NODE_FIELDS)):
        for rp in (ROLLUP_10S, ROLLUP_1M):
            keys = influxdb.query(f'SHOW FIELD KEYS FROM "{rp}"."{measurement}"')[0].values
            types = {str(k): str(t) for k, t in keys}
            if measurement == "node":
                assert types.pop("mean_hwmon_coretemp_package_id_0_c") == documented["node.mean_hwmon_<sensor>_c"]
            documented_here = {f: documented[f"{measurement}.{f}"] for f, _, _ in fields}
            assert types == documented_here, (measurement, rp)


def aggregate_line(gpu: int, start_ns: int, i: int) -> str:
    """One 1 s aggregate point as the collector stores the agent's GpuAggregate (docs/schema.md)."""
    mean = 100.0 + i % 50
    return (
        f"gpu,{IDENTITY},gpu={gpu},model=H100,res=1s,uuid=GPU-{gpu} power_w={mean},power_w_min={mean - 20 - i % 3},"
        f"power_w_max={mean + 30 + i % 5},power_w_last={mean + 1},temp_c={50.0 + i % 7},temp_c_min={45.0 + i % 7},"
        f"temp_c_max={58.0 + i % 11},energy_j={1000.0 + 100 * i},clock_event_reasons={64 if i % 4 == 0 else 0}i,"
        f"samples=10i {start_ns}"
    )


def test_rollups_of_aggregate_points_combine_their_extremes_and_counts(
    influxdb: InfluxDBDatabase, client: InfluxClient
) -> None:
    """The agent's 1 s aggregates (``res`` tag) roll up by their own ``_min``/``_max``/``samples`` fields:
    a 10 s window's minimum is the lowest 1 s minimum (not the lowest mean), its count the sum of the
    counts; raw points beside them in the same window roll up as before, into their own series."""
    plan = RetentionPlan(database=influxdb.name, raw_s=None)
    init_db(client, plan)
    start = (time.time_ns() // (60 * NS) - 5) * 60 * NS
    lines = [aggregate_line(1, start + i * NS, i) for i in range(120)]
    lines += [gpu_line(0, start + i * NS // 10, i) for i in range(1200)]
    influxdb.write_lines(lines)
    backfill(client, plan, start, start + 2 * 60 * NS)

    ten = influxdb.query(f'SELECT * FROM "{ROLLUP_10S}"."gpu" WHERE "res" = \'1s\' ORDER BY time')[0].rows()
    assert len(ten) == 12 and all(row["gpu"] == "1" for row in ten)
    window = influxdb.query(
        'SELECT mean("power_w") AS mean, min("power_w_min") AS p_min, max("power_w_max") AS p_max, '
        'min("temp_c_min") AS t_min, max("temp_c_max") AS t_max, sum("samples") AS n, last("energy_j") AS e, '
        f'min("power_w") AS lowest_mean FROM "gpu" WHERE "res" = \'1s\' '
        f"AND time >= {start} AND time < {start + 10 * NS}"
    )[0].rows()[0]
    assert ten[0]["power_w"] == pytest.approx(window["mean"])
    assert ten[0]["power_w_min"] == window["p_min"] < window["lowest_mean"]  # the 1 s minima, not the means
    assert ten[0]["power_w_max"] == window["p_max"] and ten[0]["temp_c_max"] == window["t_max"]
    assert ten[0]["temp_c_min"] == window["t_min"] and ten[0]["energy_j"] == window["e"]
    assert ten[0]["samples"] == window["n"] == 100
    assert ten[0]["clock_event_reasons"] == 64

    raw = influxdb.query(f'SELECT * FROM "{ROLLUP_10S}"."gpu" WHERE "gpu" = \'0\' ORDER BY time')[0].rows()
    assert len(raw) == 12 and raw[0]["samples"] == 100 and not raw[0].get("res")
    minute = influxdb.query(f'SELECT * FROM "{ROLLUP_1M}"."gpu" WHERE "res" = \'1s\' ORDER BY time')[0].rows()
    assert [row["samples"] for row in minute] == [600, 600]
    raw_minute = influxdb.query(
        f'SELECT min("power_w_min") FROM "gpu" WHERE "res" = \'1s\' AND time >= {start} AND time < {start + 60 * NS}'
    )[0].rows()[0]
    assert minute[0]["power_w_min"] == raw_minute["min"]


@pytest.mark.slow
def test_the_continuous_queries_run_on_influxdbs_schedule(influxdb: InfluxDBDatabase, client: InfluxClient) -> None:
    """Not the backfill: InfluxDB itself runs gpu_rollup_10s (every 10 s, over the last 30 s)."""
    init_db(client, RetentionPlan(database=influxdb.name, raw_s=None))
    now = time.time_ns()
    # 25 s of samples up to now: at least one whole 10 s window, which the next runs (over the last 30 s) cover
    influxdb.write_lines([gpu_line(0, now - 25 * NS + i * NS // 10, i) for i in range(250)])

    def full_window() -> bool:
        series = influxdb.query(f'SELECT "samples", "power_w" FROM "{ROLLUP_10S}"."gpu"')
        return bool(series) and any(row[1] == 100 for row in series[0].values)

    support.wait_until(
        full_window,
        40,
        "a 10 s rollup of a full window",
        interval_s=1.0,
        describe=lambda: influxdb.query(f'SELECT "samples", "power_w" FROM "{ROLLUP_10S}"."gpu"'),
    )


def test_every_continuous_query_is_a_valid_select_into(influxdb: InfluxDBDatabase, client: InfluxClient) -> None:
    plan = RetentionPlan(database=influxdb.name)
    init_db(client, plan)
    for cq in continuous_queries(plan):
        client.execute(cq.over(0, 10 * NS), database=influxdb.name)  # no data there: runs, writes nothing


def test_backfill_option_computes_late_data_into_the_rollups(influxdb: InfluxDBDatabase) -> None:
    start = (time.time_ns() // (60 * NS) - 8) * 60 * NS  # older than the CQs' windows
    influxdb.write_lines([gpu_line(0, start + i * NS // 10, i) for i in range(600)])
    base = ["--init-db", "--influx-url", influxdb.server.url, "--influx-db", influxdb.name, "--retention-raw", "0"]
    done = gpuprobe(*base, "--backfill", "15m")
    assert done.returncode == 0, done.stderr
    assert "rollups of the last 15m (computed again)" in done.stdout
    ten = influxdb.query(f'SELECT "samples" FROM "{ROLLUP_10S}"."gpu"')[0].values
    assert [row[1] for row in ten] == [100] * 6
    assert influxdb.query(f'SELECT "samples" FROM "{ROLLUP_1M}"."gpu"')[0].values[0][1] == 600


class AuthInfluxDB(InfluxDBServer):
    """influxd with authentication on (influxd reads INFLUXDB_* variables over its config file)."""

    def _environment(self) -> dict[str, str]:
        return {**super()._environment(), "INFLUXDB_HTTP_AUTH_ENABLED": "true"}


def test_a_user_without_admin_rights_is_told_so(tmp_path: Path) -> None:
    with AuthInfluxDB(tmp_path) as server:
        server.execute("CREATE USER \"admin\" WITH PASSWORD 'secret-admin' WITH ALL PRIVILEGES")  # the first user
        base = ["--init-db", "--influx-url", server.url, "--influx-db", "tel"]
        admin = ["--influx-username", "admin", "--influx-password", "secret-admin"]
        done = gpuprobe(*base, *admin)
        assert done.returncode == 0, done.stderr
        with InfluxClient(InfluxSettings(url=server.url, database="", username="admin", password="secret-admin")) as c:
            c.execute("CREATE USER \"writer\" WITH PASSWORD 'secret-writer'")
            c.execute('GRANT WRITE ON "tel" TO "writer"')
        refused = gpuprobe(*base, "--influx-username", "writer", "--influx-password", "secret-writer")
        assert refused.returncode == 1
        assert "give an admin user" in refused.stderr and "not authorized" in refused.stderr, refused.stderr


def probe_batch(agent: object, probe: str, t_ns: int) -> object:
    """A batch with GPU samples, a probe's start, a trainer sample and an XID (points of ``events``)."""
    from gpuprobe.v1 import common_pb2, telemetry_pb2

    batch = agent.factory.batch(samples_per_gpu=2)  # type: ignore[attr-defined]
    batch.probe_events.append(
        telemetry_pb2.ProbeEvent(
            time_unix_ns=t_ns,
            probe_id=probe,
            workload="matmul",
            kind=telemetry_pb2.PROBE_EVENT_KIND_START,
            phase=common_pb2.PROBE_PHASE_IDLE_BASELINE,
            status=common_pb2.PROBE_STATUS_RUNNING,
        )
    )
    batch.trainer_samples.append(
        telemetry_pb2.TrainerSample(
            time_unix_ns=t_ns + 1,
            probe_id=probe,
            workload="matmul",
            gpu_index=0,
            step=10,
            samples_per_s=1234.5,
            batch_size=64,
            phase=common_pb2.PROBE_PHASE_IDLE_BASELINE,
        )
    )
    batch.gpu_events.append(
        telemetry_pb2.GpuEvent(time_unix_ns=t_ns + 2, gpu_index=0, kind=telemetry_pb2.GPU_EVENT_KIND_XID, data=79)
    )
    return batch


def test_probe_points_go_to_the_events_policy_too_and_readers_still_find_them(
    influxdb: InfluxDBDatabase, tmp_path: Path
) -> None:
    """Before --init-db the collector writes probe points into the default policy only; --init-db
    creates ``events`` and copies them there; a collector started afterwards writes them into both,
    and ``gpuprobe model``'s probe query and the dashboards' probe annotation (both reading ``events``)
    find every probe, which ``events`` keeps for 400 days."""
    import asyncio

    from collector_helpers import collector_config, running

    from gpuprobe.app.loadgen import AgentSpec, SyntheticAgent
    from gpuprobe.dashboards.grafana_health import XID_ANNOTATION
    from gpuprobe.dashboards.grafana_parts import PHASE_ANNOTATION
    from gpuprobe.influx.retention import EVENTS_RP, events_policy, write_with_events
    from gpuprobe.model.data import find_probe

    def send(probe: str, wal: str) -> dict[str, float]:
        config = collector_config(tmp_path / wal, influxdb.server.url, influxdb.name)

        async def scenario() -> dict[str, float]:
            async with running(config) as collector:
                agent = SyntheticAgent(f"127.0.0.1:{collector.port}", AgentSpec(f"node-{probe}", gpus=1), window=4)
                task = asyncio.create_task(agent.run())
                last = agent.enqueue(probe_batch(agent, probe, time.time_ns()))  # type: ignore[arg-type]
                await agent.wait_acked(last, 20)
                await agent.close()
                await task
                await support.wait_until_async(
                    lambda: collector.wal.depth_rows == 0, 20, "the WAL written into InfluxDB"
                )
                return {
                    "events_lane_up": collector.metrics.value(
                        "gpuprobe_collector_destination_up", {"destination": f"default ({EVENTS_RP})"}
                    ),
                }

        return asyncio.run(scenario())

    def count(rp: str, measurement: str, probe: str) -> int:
        series = influxdb.query(f'SELECT count(*) FROM "{rp}"."{measurement}" WHERE "probe" = \'{probe}\'')
        return max((int(v) for s in series for v in s.values[0][1:] if v is not None), default=0)

    assert send("before", "wal-1") == {"events_lane_up": 0}  # no events policy: no lane
    assert count("autogen", "probe", "before") == 1

    done = gpuprobe("--init-db", "--influx-url", influxdb.server.url, "--influx-db", influxdb.name)
    assert done.returncode == 0, done.stderr
    assert "created   retention policy events (duration 400d)" in done.stdout
    assert re.search(
        r"changed\s+\d+ points of probe, trainer, gpu_info, gpu_event, model copied from autogen", done.stdout
    )
    assert count(EVENTS_RP, "probe", "before") == 1 and count(EVENTS_RP, "trainer", "before") == 1

    assert send("after", "wal-2") == {"events_lane_up": 1}
    for measurement in ("probe", "trainer"):
        assert count(EVENTS_RP, measurement, "after") == 1, measurement
        assert count("autogen", measurement, "after") == 1, measurement  # where today's readers look
    assert count(EVENTS_RP, "gpu", "after") == 0  # the 10 Hz telemetry stays in the raw policy only
    assert len(influxdb.query(f'SELECT * FROM "{EVENTS_RP}"."gpu_event" WHERE "host" = \'node-after\'')) == 1

    with InfluxClient(InfluxSettings(url=influxdb.server.url, database=influxdb.name)) as reader:
        for probe in ("before", "after"):  # gpuprobe model's reader
            assert find_probe(reader, probe).hosts == [f"node-{probe}"]
        # the dashboards' annotations of probe phases and XIDs, as generated, with $erp = events
        span = "time > now() - 1h"
        for annotation in (PHASE_ANNOTATION, XID_ANNOTATION):
            query = str(annotation["query"]).replace("$timeFilter", span).replace('"$erp".', f'"{EVENTS_RP}".')
            assert len(reader.query(query)[0].values) == 2, query
        assert events_policy(reader) == EVENTS_RP
        # gpuprobe model and study write their results the same way
        written = write_with_events(reader, f"model,probe=after,kind=thermal,host=h r_th=0.1 {time.time_ns()}\n")
        assert written == 1 and count(EVENTS_RP, "model", "after") == 1 and count("autogen", "model", "after") == 1
