"""The dashboards show probes and GPU events that are only in the `events` retention policy (their raw
copy expired after `--retention-raw`, 7 days), and read a database without `events` as before.

Every dashboard's ``$erp`` is resolved from its own query the way Grafana does (test_dashboards.py's
``variable_values``), then its annotations and the probe variable are run as Grafana would run them
against a real InfluxDB.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from test_dashboards import load_dashboards, substitute, variable_values

from gpuprobe.devservices import InfluxDBDatabase
from gpuprobe.influx.client import InfluxClient
from gpuprobe.influx.lineprotocol import encode_line
from gpuprobe.influx.retention import EVENTS_RP, RetentionPlan, init_db
from gpuprobe.influx.settings import InfluxSettings

PROBE = "p-old"
MINUTE_NS = 60 * 10**9


def probe_lines(t0_ns: int) -> list[str]:
    tags = {"host": "node-old", "probe": PROBE}
    return [
        encode_line("probe", tags, {"kind": "start", "phase": "idle", "status": "running"}, t0_ns),
        encode_line("probe", tags, {"kind": "phase_change", "phase": "load", "status": "running"}, t0_ns + MINUTE_NS),
        encode_line(
            "gpu_event",
            {"host": "node-old", "gpu": "0", "kind": "xid"},
            {"xid": 79, "text": "fell off the bus"},
            t0_ns + 2 * MINUTE_NS,
        ),
    ]


def erp_of(dashboard: dict[str, Any], db: InfluxDBDatabase) -> str:
    (var,) = [v for v in dashboard["templating"]["list"] if v["name"] == "erp"]
    (value,) = variable_values(var, db.query(var["query"]))
    return str(value)


def annotations(dashboard: dict[str, Any], db: InfluxDBDatabase, erp: str, t0_ns: int) -> dict[str, list[Any]]:
    """Each annotation's rows over the ten minutes from ``t0_ns``."""
    time_filter = f"time >= {t0_ns // 10**6}ms and time <= {(t0_ns + 10 * MINUTE_NS) // 10**6}ms"
    return {
        a["name"]: [row for s in db.query(substitute(a["query"], {"erp": [erp]}, time_filter)) for row in s.rows()]
        for a in dashboard["annotations"]["list"]
    }


@pytest.mark.slow
def test_the_annotations_and_the_probe_list_show_what_only_the_events_policy_has(influxdb: InfluxDBDatabase) -> None:
    with InfluxClient(InfluxSettings(url=influxdb.server.url, database="")) as admin:
        init_db(admin, RetentionPlan(database=influxdb.name))
    t0_ns = time.time_ns() - 3600 * 10**9
    influxdb.server.write_lines(influxdb.name, probe_lines(t0_ns), retention_policy=EVENTS_RP)
    assert influxdb.query('SELECT count("kind") FROM "autogen"."probe"') == []  # as after the raw policy's expiry

    dashboards = load_dashboards()
    for name, dashboard in dashboards.items():
        assert erp_of(dashboard, influxdb) == EVENTS_RP, name
        shown = annotations(dashboard, influxdb, EVENTS_RP, t0_ns)
        if name == "gpu-health.json":  # its one annotation: the XID errors
            assert [(r["xid"], r["text"]) for r in shown["XID errors"]] == [(79, "fell off the bus")]
        else:
            phases = [(r["phase"], r["host"]) for r in shown["probe phases"]]
            assert phases == [("idle", "node-old"), ("load", "node-old")], name
    (probe_var,) = [v for v in dashboards["probe-efficiency.json"]["templating"]["list"] if v["name"] == "probe"]
    listed = influxdb.query(substitute(probe_var["query"], {"erp": [EVENTS_RP]}, ""))
    assert variable_values(probe_var, listed) == [PROBE]
    # what the dashboards did before $erp: the default policy, where the probe is gone
    assert annotations(dashboards["node-detail.json"], influxdb, "", t0_ns)["probe phases"] == []


@pytest.mark.slow
def test_without_the_events_policy_the_dashboards_read_the_default_one(influxdb: InfluxDBDatabase) -> None:
    t0_ns = time.time_ns() - 3600 * 10**9
    influxdb.server.write_lines(influxdb.name, probe_lines(t0_ns))
    for name, dashboard in load_dashboards().items():
        assert erp_of(dashboard, influxdb) == "", name  # Grafana's "None": FROM ""."probe"
        shown = annotations(dashboard, influxdb, "", t0_ns)
        expected = {"XID errors": 1} if name == "gpu-health.json" else {"probe phases": 2}
        assert {a: len(rows) for a, rows in shown.items()} == expected, name
