"""The GPU health dashboard and the alert rules against what the collector writes for a fleet with faults.

The data (gpuhealth_fleet.py) are SampleBatch messages with the health fields, GPU events, processes,
NVLink links and MIG instances, encoded by the collector's own StreamEncoder: the panels and rules
read what the collector writes, not a hand-made copy of it. That every panel query runs and returns
data (for every ``$rp``) is test_dashboards.py's ``test_every_panel_query_returns_data``; here the
values are checked, and each alert rule is evaluated the way Grafana does (its query over its
``relativeTimeRange`` up to now, the last value of each series, the threshold): it fires for the
faulty GPU or host and for no other.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpuhealth_fleet import FAIL_AT_S, FAULTY, XID_79, HealthFleet, write_health_fleet
from test_dashboards import DASHBOARDS, PROVISIONING, panels_of, substitute, variable_combinations

from gpuprobe.dashboards import grafana, grafana_health
from gpuprobe.devservices import InfluxDBDatabase
from gpuprobe.influx.retention import GPU_10S

ALERTING = PROVISIONING / "alerting"
ROLLED_UP = {name for name, _, _ in GPU_10S}
FIELD = re.compile(r'\w+\("([a-z0-9_]+)"\)')


def health_dashboard() -> dict[str, Any]:
    return json.loads((DASHBOARDS / grafana_health.FILE_NAME).read_text())


def answer_of(fleet: HealthFleet, title: str, ref: str = "A") -> list[Any]:
    """The series of one panel target over the whole fleet (All hosts, All GPUs, raw policy)."""
    dashboard = health_dashboard()
    time_filter = f"time >= {fleet.start_ns // 10**6 - 60_000}ms and time <= {fleet.end_ns // 10**6 + 60_000}ms"
    (values,) = variable_combinations(dashboard, fleet, time_filter, rp="")
    (panel,) = [p for p in panels_of(dashboard) if p["title"] == title]
    (t,) = [t for t in panel["targets"] if t["refId"] == ref]
    return fleet.server.query(fleet.db, substitute(t["query"], values, time_filter))


def by_gpu(series: list[Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """(host, gpu) -> the last row of each series, as a dict."""
    return {(s.tags["host"], s.tags["gpu"]): s.rows()[-1] for s in series}


@pytest.mark.slow
def test_the_health_panels_show_each_gpus_state_and_reason(gpu_health_fleet: HealthFleet) -> None:
    fleet = gpu_health_fleet
    assert fleet.kinds == {
        "GPU_EVENT_KIND_XID",
        "GPU_EVENT_KIND_ECC_DOUBLE_BIT",
        "GPU_EVENT_KIND_LOST",
        "GPU_EVENT_KIND_CLOCK_CHANGE",
    }
    health = by_gpu(answer_of(fleet, "Health now"))
    assert {gpu: row["health"] for gpu, row in health.items()} == {
        ("node-h1", "0"): "healthy",
        ("node-h1", "1"): "failed",
        ("node-h2", "0"): "degraded",
        ("node-h3", "0"): "healthy",
    }
    assert health[("node-h1", "1")]["reason"] == f"XID 79: {XID_79}"
    assert health[("node-h1", "0")]["reason"] is None  # the reason of the latest verdict, not an older one
    timeline = {
        (s.tags["host"], s.tags["gpu"]): [row[1] for row in s.values] for s in answer_of(fleet, "Health over time")
    }
    assert "healthy" in timeline[("node-h1", "1")] and timeline[("node-h1", "1")][-1] == "failed"

    events = answer_of(fleet, "GPU events")
    rows = [row for s in events for row in s.rows()]
    xids = {(row["xid"], row["text"]) for row in rows if row["kind"] == "xid"}
    assert xids == {(79, XID_79), (13, "Graphics Engine Exception")}
    assert {row["kind"] for row in rows} == {"xid", "ecc_dbe", "lost", "clock_change"}
    assert [row["gpu_instance"] for row in rows if row["kind"] == "clock_change"] == [1]
    times = [row["time"] for s in events for row in s.rows()]
    assert all(s.rows()[0]["time"] >= s.rows()[-1]["time"] for s in events) and times  # newest first

    ecc = by_gpu(answer_of(fleet, "ECC, page retirement and row remapping (latest)"))
    failed = ecc[("node-h1", "1")]
    assert failed["ECC uncorrected (volatile)"] == 2 and failed["remap failure"] is True
    assert failed["retirement pending"] is True and failed["rows remapped (uncorrectable)"] == 1
    assert ecc[("node-h2", "0")]["remap pending"] is True and ecc[("node-h1", "0")]["remap failure"] is False


@pytest.mark.slow
def test_the_counter_panels_turn_counters_into_rates(gpu_health_fleet: HealthFleet) -> None:
    fleet = gpu_health_fleet
    thermal = answer_of(fleet, "Clock violation time (share of each interval)", "B")
    shares = {(s.tags["host"], s.tags["gpu"]): [row[1] for row in s.values if row[1] is not None] for s in thermal}
    assert max(shares[("node-h2", "0")]) == pytest.approx(90.0)  # 0.9 s held down per second
    assert max(shares[("node-h1", "0")]) == 0
    power = answer_of(fleet, "Clock violation time (share of each interval)", "A")
    assert all(v == pytest.approx(10.0) for s in power for row in s.values if (v := row[1]) is not None)
    replays = answer_of(fleet, "PCIe replays per interval")
    per_gpu = {(s.tags["host"], s.tags["gpu"]): sum(row[1] for row in s.values if row[1]) for s in replays}
    assert per_gpu[("node-h2", "0")] > 0 and per_gpu[("node-h1", "0")] == 0

    links = {
        (s.tags["host"], s.tags["gpu"], s.tags["link"]): s.rows()[-1]
        for s in answer_of(fleet, "NVLink error counters per link (latest)")
    }
    assert len(links) == 8
    assert links[("node-h2", "0", "1")]["CRC flit"] > 0 and links[("node-h2", "0", "0")]["CRC flit"] == 0
    throughput = answer_of(fleet, "NVLink throughput per link")
    assert {s.tags["link"] for s in throughput} == {"0", "1"}

    utilization = {
        ref: {
            (s.tags["host"], s.tags["gpu"]): {row[1] for row in s.values if row[1] is not None}
            for s in answer_of(fleet, "True utilization (GPM) next to NVML utilization", ref)
        }
        for ref in "ABCD"
    }
    busy = ("node-h1", "0")
    assert utilization["A"][busy] == {90.0}  # NVML: a kernel ran all the time
    assert utilization["B"][busy] == {62.0}  # but the SMs were 62 % active
    assert utilization["C"][busy] == {44.0}


@pytest.mark.slow
def test_the_process_and_mig_tables(gpu_health_fleet: HealthFleet) -> None:
    fleet = gpu_health_fleet
    processes = {(s.tags["host"], s.tags["gpu"], s.tags["pid"]): s.rows()[0] for s in answer_of(fleet, "Processes")}
    assert len(processes) == 4
    row = processes[("node-h1", "1", "4001")]
    assert row["command"] == "python" and row["cgroup"] == "/kubepods/burstable/pod-node-h1-1"
    assert row["GPU memory"] == 38 * 1024**3 and row["SM share %"] == pytest.approx(93.0)
    assert row["energy J"] == pytest.approx(350.0 * 239) and row["ended"] is False
    mig = answer_of(fleet, "MIG instances")
    assert sorted(s.tags["gpu_instance"] for s in mig) == ["1", "2"]
    assert mig[0].rows()[0]["SMs"] == 60


def test_health_queries_read_the_policy_that_has_their_fields() -> None:
    """The rollups carry only GPU_10S's fields: a query reads `"$rp"."gpu"` exactly when every field it
    reads is rolled up; the health fields and measurements are read from the default (raw) policy."""
    for panel in panels_of(health_dashboard()):
        for t in panel.get("targets", []):
            query = t["query"]
            fields = set(FIELD.findall(query))
            if '"$rp"."gpu"' in query:
                assert fields <= ROLLED_UP, (panel["title"], fields - ROLLED_UP)
            elif 'FROM "gpu"' in query:
                assert fields - ROLLED_UP, (panel["title"], "rolled-up fields read from the raw policy only")
    variables = [v["name"] for v in health_dashboard()["templating"]["list"]]
    assert variables == ["rp", "erp", "host", "gpu"]


# --- alert rules -----------------------------------------------------------------------------------


def load_alerting() -> dict[str, Any]:
    (path,) = ALERTING.glob("*.yaml")
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


def rules() -> dict[str, dict[str, Any]]:
    return {rule["uid"]: rule for group in load_alerting()["groups"] for rule in group["rules"]}


def test_committed_alert_rules_are_what_the_generator_writes() -> None:
    rendered = grafana_health.render_alerting(grafana.DASHBOARDS)
    committed = {p.name: p.read_text() for p in ALERTING.glob("*.yaml")}
    assert committed == rendered, "stale; run: python -m gpuprobe.dashboards.grafana"
    # the YAML is exact
    assert yaml.safe_load(rendered[grafana_health.ALERTING_FILE]) == grafana_health.alerting(grafana.DASHBOARDS)


def test_alert_rules_name_only_what_provisioning_defines() -> None:
    """The alerting file parses as Grafana's file-provisioning format and refers only to the data source and
    folder that the other provisioning files create."""
    datasources = yaml.safe_load((PROVISIONING / "datasources" / "gpuprobe.yaml").read_text())
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "gpuprobe.yaml").read_text())
    uids = {d["uid"] for d in datasources["datasources"]}
    folders = {p["folder"] for p in providers["providers"]}
    dashboards = {d["uid"]: d for d in map(json.loads, map(Path.read_text, DASHBOARDS.glob("*.json")))}
    alerting = load_alerting()
    assert alerting["apiVersion"] == 1 and alerting["groups"]
    seen: set[str] = set()
    for group in alerting["groups"]:
        assert group["folder"] in folders and group["orgId"] == 1 and re.fullmatch(r"\d+[smh]", group["interval"])
        for rule in group["rules"]:
            assert rule["uid"] not in seen and len(rule["uid"]) <= 40
            seen.add(rule["uid"])
            refs = {d["refId"] for d in rule["data"]}
            assert rule["condition"] in refs
            queries = [d for d in rule["data"] if d["datasourceUid"] != "__expr__"]
            assert len(queries) == 1, rule["uid"]
            (query,) = queries
            assert query["datasourceUid"] in uids and query["model"]["datasource"]["uid"] in uids
            assert query["model"]["rawQuery"] and "$timeFilter" in query["model"]["query"]
            assert query["relativeTimeRange"]["from"] > 0 and query["relativeTimeRange"]["to"] == 0
            for expr in rule["data"]:
                if expr["datasourceUid"] == "__expr__":
                    assert expr["model"]["expression"] in refs - {expr["refId"]}
            assert rule["panelId"] in {p["id"] for p in panels_of(dashboards[rule["dashboardUid"]])}, rule["uid"]
            assert rule["noDataState"] in ("OK", "NoData", "Alerting") and rule["execErrState"] in ("Error", "Alerting")
            assert not any("$" in str(v) for v in rule["labels"].values())  # labels are env-interpolated
    assert seen == {r.uid for r in grafana_health.ALERT_RULES}


def evaluate(db: InfluxDBDatabase, rule: dict[str, Any], now_ms: int) -> dict[tuple[str, ...], float]:
    """What Grafana computes: the query over [now - from, now], the last non-null value of each series
    (reduce, dropNN), keyed by the series' host (and gpu) labels."""
    (query,) = [d for d in rule["data"] if d["datasourceUid"] != "__expr__"]
    span_ms = query["relativeTimeRange"]["from"] * 1000
    text = query["model"]["query"].replace("$timeFilter", f"time >= {now_ms - span_ms}ms and time <= {now_ms}ms")
    out = {}
    for s in db.query(text):
        values = [row[1] for row in s.values if row[1] is not None]
        if values:
            out[tuple(s.tags[k] for k in ("host", "gpu") if k in s.tags)] = float(values[-1])
    return out


def fires(rule: dict[str, Any], value: float) -> bool:
    (condition,) = [d for d in rule["data"] if d["refId"] == rule["condition"]]
    (cond,) = condition["model"]["conditions"]
    op, (threshold,) = cond["evaluator"]["type"], cond["evaluator"]["params"]
    return bool(value > threshold if op == "gt" else value < threshold)


RULE_FAULT = {
    "gpuprobe-gpu-xid": "xid",
    "gpuprobe-gpu-failed": "failed",
    "gpuprobe-gpu-degraded": "degraded",
    "gpuprobe-gpu-thermal-slowdown": "thermal",
    "gpuprobe-agent-silent": "silent",
    "gpuprobe-agent-spool-growing": "spool",
    "gpuprobe-agent-clock-off": "clock",
}


@pytest.mark.slow
def test_each_alert_fires_for_the_faulty_gpu_or_host_only(influxdb: InfluxDBDatabase) -> None:
    """The fleet written just now (its last samples are now): each rule, evaluated now, returns a value over
    its threshold for the faulty GPU or host, and none for a healthy one."""
    fleet = write_health_fleet(influxdb.server, influxdb.name, time.time_ns())
    now_ms = time.time_ns() // 10**6
    assert now_ms - fleet.end_ns // 10**6 < FAIL_AT_S * 1000 // 3, "writing took too long for the 1 min windows"
    every_gpu = {("node-h1", "0"), ("node-h1", "1"), ("node-h2", "0"), ("node-h3", "0")}
    every_host = {("node-h1",), ("node-h2",), ("node-h3",)}
    assert set(RULE_FAULT) == set(rules())
    for uid, rule in rules().items():
        values = evaluate(influxdb, rule, now_ms)
        firing = {key for key, value in values.items() if fires(rule, value)}
        assert firing == FAULTY[RULE_FAULT[uid]], (uid, values)
        assert set(values) <= every_gpu | every_host, (uid, values)
        if uid == "gpuprobe-gpu-thermal-slowdown":  # every GPU has a value: healthy ones under the threshold
            assert set(values) == every_gpu, (uid, values)
        if uid in ("gpuprobe-agent-silent", "gpuprobe-agent-spool-growing", "gpuprobe-agent-clock-off"):
            assert set(values) == every_host, (uid, values)


@pytest.mark.slow
def test_no_alert_fires_for_a_healthy_fleet(influxdb: InfluxDBDatabase) -> None:
    """Before the faults (evaluated as of the fleet's 15th second), only what is already wrong then fires."""
    fleet = write_health_fleet(influxdb.server, influxdb.name, time.time_ns())
    early_ms = fleet.start_ns // 10**6 + 15_000  # no XID yet, no failure, no throttling, no spool
    for uid, rule in rules().items():
        firing = {key for key, value in evaluate(influxdb, rule, early_ms).items() if fires(rule, value)}
        expected = FAULTY["degraded"] if uid == "gpuprobe-gpu-degraded" else set()  # node-h2 is degraded throughout
        assert firing == expected, (uid, firing)


def test_the_generator_writes_the_alerting_folder(tmp_path: Path) -> None:
    assert grafana.main(["--out", str(tmp_path / "d"), "--alerting-out", str(tmp_path / "a")]) == 0
    assert {p.name for p in (tmp_path / "a").iterdir()} == {grafana_health.ALERTING_FILE}
    assert (tmp_path / "d" / grafana_health.FILE_NAME).is_file()
