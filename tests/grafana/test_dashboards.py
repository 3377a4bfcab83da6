"""Every query of every shipped dashboard runs against a real InfluxDB holding a probe's data.

The data: two simulated nodes through a probe (tests/model/simprobe.py) plus the `model` points that
`gpuprobe.model.run` wrote for it. Grafana's substitutions are done the way Grafana does them for the
InfluxDB data source: a template variable inside ``/^$var$/`` becomes ``(v1|v2)`` of its values
(regex-escaped as Grafana's ``escapeRegex``), ``$timeFilter`` becomes ``time >= Nms and time <= Nms``
and ``$__interval`` the data source's minimum interval (1 s). Variable values come from the
variables' own ``SHOW TAG VALUES`` queries against the same database.

The retention policy variable ``$rp`` (``"$rp"."gpu"``) is given each policy in turn: empty (a
database without ``--init-db``: the default policy), the raw policy, and the two rollups, which hold
what the continuous queries of ``gpuprobe collector --init-db`` computed from the probe's data;
``$__interval`` is then the rollup's resolution. A query that reads ``$rp`` must return data from each.

The event measurements (``probe``, ``trainer``, ``gpu_event``, ``model``) are read from ``"$erp"``,
whose value comes from its own ``SHOW RETENTION POLICIES`` as Grafana takes it (the names, filtered by
the variable's regex; none: ``""``, the default policy): ``events`` in the databases set up by
``--init-db`` (the probe's and the GPU health fleet's, whose points ``--init-db`` copied there), the
default policy in the study's.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest
from gpuhealth_fleet import HealthFleet
from simprobe import ProbeRun
from study_synthetic import H100, L4, StudyRun

from gpuprobe.dashboards import grafana, grafana_parts
from gpuprobe.devservices import InfluxDBError
from gpuprobe.influx.retention import EVENT_MEASUREMENTS, EVENTS_RP, rp_variable_query

ROOT = Path(__file__).resolve().parent.parent.parent
DASHBOARDS = ROOT / "deploy" / "grafana" / "dashboards"
PROVISIONING = ROOT / "deploy" / "grafana" / "provisioning"
VARIABLE = re.compile(r"\$(\w+)")
GRAFANA_REGEX_SPECIALS = re.compile(r"[\\^$*+?.()|\[\]{}/]")
#: a FROM of an event measurement in the default policy, where dashboards must read "$erp"
EVENT_FROM = re.compile(r'FROM "(' + "|".join(EVENT_MEASUREMENTS) + ')"')


def load_dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def panels_of(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # collapsed rows
    return out


def queries_of(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, query) of every panel target and annotation."""
    found = []
    for panel in panels_of(dashboard):
        for t in panel.get("targets", []):
            found.append((f"panel {panel['title']!r} target {t['refId']}", t["query"]))
    for a in dashboard.get("annotations", {}).get("list", []):
        if "query" in a:
            found.append((f"annotation {a['name']!r}", a["query"]))
    return found


def escape_regex(value: str) -> str:
    return GRAFANA_REGEX_SPECIALS.sub(lambda m: "\\" + m.group(0), value)


#: each value of $rp the tests give (empty: no --init-db, the default policy) and its $__interval
RP_INTERVALS = {"": "1s", "autogen": "1s", "rollup_10s": "10s", "rollup_1m": "1m"}


def substitute(query: str, values: dict[str, list[str]], time_filter: str) -> str:
    (rp,) = values.get("rp", [""])
    (erp,) = values.get("erp", [""])
    text = query.replace("$timeFilter", time_filter).replace("$__interval", RP_INTERVALS[rp])
    text = text.replace('"$rp".', f'"{rp}".').replace('"$erp".', f'"{erp}".')
    for ms in re.finditer(r"time >= (\d+)ms and time <= (\d+)ms", time_filter):
        text = text.replace("${__from}", ms.group(1)).replace("${__to}", ms.group(2))
    for name, chosen in values.items():
        text = text.replace(f"/^${name}$/", "/^(" + "|".join(escape_regex(v) for v in chosen) + ")$/")
    left = VARIABLE.findall(text)
    assert not left, f"unsubstituted variables {left} in {query}"
    return text


def non_empty(series: list[Any]) -> bool:
    """At least one value that is not the time and not null (fill(null) intervals alone do not count)."""
    for s in series:
        for row in s.values:
            for column, value in zip(s.columns, row, strict=True):
                if column != "time" and value is not None:
                    return True
    return False


def variable_combinations(
    dashboard: dict[str, Any], run: ProbeRun | StudyRun | HealthFleet, time_filter: str, rp: str | None = None
) -> list[dict[str, list[str]]]:
    """Every choice Grafana allows that matters: multi-value variables get all their values (All),
    single-value ones each of their values in turn; ``$rp`` the given policy (None: its own query's)."""
    options: list[list[tuple[str, list[str]]]] = []
    resolved: dict[str, list[str]] = {}
    for var in dashboard["templating"]["list"]:
        if var["name"] == "rp" and rp is not None:
            resolved["rp"] = [rp]
            options.append([("rp", [rp])])
            continue
        query = substitute(var["query"], resolved, time_filter)
        values = variable_values(var, run.server.query(run.db, query))
        assert values, f"variable ${var['name']} has no values: {query}"
        resolved[var["name"]] = values
        if var["multi"]:
            options.append([(var["name"], values)])
        else:
            options.append([(var["name"], [v]) for v in values])
    return [dict(combo) for combo in itertools.product(*options)]


def variable_values(var: dict[str, Any], answer: list[Any]) -> list[str]:
    """A query variable's values as Grafana's InfluxDB data source makes them: the second column (the tag
    value of SHOW TAG VALUES), but the first (the name) for SHOW RETENTION POLICIES; kept when the
    variable's regex matches; none at all is the value "" (Grafana's "None")."""
    first = var["query"].upper().startswith("SHOW RETENTION POLICIES")
    values = sorted({str(row[0] if first else row[1]) for s in answer for row in s.values})
    if var.get("regex"):
        pattern = re.compile(var["regex"].strip("/"))
        values = [v for v in values if pattern.search(v)]
    if not values and first:
        return [""]
    return values


# the dashboards of one study read its report's `model` points (kind=study), which the simulated probe has not;
# the GPU health dashboard reads the health fields and measurements of a fleet with faults (gpuhealth_fleet.py)
DATA = {"study.json": "reported_study", "gpu-health.json": "gpu_health_fleet"}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(grafana.DASHBOARDS))
def test_every_panel_query_returns_data(name: str, request: pytest.FixtureRequest) -> None:
    run: ProbeRun | StudyRun | HealthFleet = request.getfixturevalue(DATA.get(name, "rolled_up_probe"))
    dashboard = load_dashboards()[name]
    from_ms, to_ms = run.start_ns // 10**6 - 60_000, run.end_ns // 10**6 + 60_000
    time_filter = f"time >= {from_ms}ms and time <= {to_ms}ms"
    has_rp = any(v["name"] == "rp" for v in dashboard["templating"]["list"])
    policies: list[str | None] = list(RP_INTERVALS) if has_rp else [None]
    empty = []
    for where, query in queries_of(dashboard):
        # a query that does not read $rp answers the same for every policy: asked once
        for rp in policies if "$rp" in query else policies[:1]:
            answers = []
            for values in variable_combinations(dashboard, run, time_filter, rp):
                text = substitute(query, values, time_filter)
                try:
                    answers.append(non_empty(run.server.query(run.db, text)))
                except InfluxDBError as e:
                    pytest.fail(f"{name}: {where} fails with {values}: {e}\n{text}")
            if not any(answers) and not (rp and "difference(" in query and windows_per_gpu(run, rp) < 2):
                empty.append(f"{where} (rp {rp!r}): {query}")
    assert not empty, f"{name}: queries without data:\n" + "\n".join(empty)


def windows_per_gpu(run: ProbeRun | StudyRun | HealthFleet, rp: str) -> int:
    """The most points one GPU has in a policy: a difference needs two (the probe lasts about 45 s, so
    it may fall into one 1 min window)."""
    answer = run.server.query(run.db, f'SELECT count("power_w") FROM "{rp}"."gpu" GROUP BY "host", "gpu"')
    return max((int(row[1]) for s in answer for row in s.values), default=0)


@pytest.mark.slow
def test_the_rp_variable_picks_the_policy_by_the_length_of_the_range(rolled_up_probe: ProbeRun) -> None:
    run = rolled_up_probe
    (rp_var,) = [v for v in load_dashboards()["node-detail.json"]["templating"]["list"] if v["name"] == "rp"]
    to_ms = run.end_ns // 10**6
    hour = 3_600_000
    expected = {
        15 * 60_000: "autogen",
        3 * hour: "autogen",
        3 * hour + 1: "rollup_10s",
        24 * hour: "rollup_10s",
        48 * hour: "rollup_10s",
        48 * hour + 1: "rollup_1m",
        90 * 24 * hour: "rollup_1m",
        5 * 365 * 24 * hour: "rollup_1m",
    }
    for span, rp in expected.items():
        time_filter = f"time >= {to_ms - span}ms and time <= {to_ms}ms"
        answer = run.server.query(run.db, substitute(rp_var["query"], {}, time_filter))
        assert [row[1] for s in answer for row in s.values] == [rp], span


def test_committed_dashboards_are_what_the_generator_writes() -> None:
    rendered = grafana.render()
    committed = {p.name: p.read_text() for p in DASHBOARDS.glob("*.json")}
    assert committed.keys() == rendered.keys(), "run: python -m gpuprobe.dashboards.grafana"
    for file_name, text in rendered.items():
        assert committed[file_name] == text, f"{file_name} is stale; run: python -m gpuprobe.dashboards.grafana"


def test_dashboards_follow_the_query_conventions() -> None:
    dashboards = load_dashboards()
    assert {d["uid"] for d in dashboards.values()} == {
        "gpuprobe-fleet",
        "gpuprobe-node",
        "gpuprobe-gpu-thermal",
        "gpuprobe-acoustics",
        "gpuprobe-probe-efficiency",
        "gpuprobe-health",
        "gpuprobe-gpu-health",
        "gpuprobe-study",
    }
    for name, d in dashboards.items():
        variables = {v["name"] for v in d["templating"]["list"]}
        for v in d["templating"]["list"]:
            if v["name"] == "rp":
                assert v["query"] == rp_variable_query() and not v["multi"] and not v["includeAll"]
                continue
            if v["name"] == "erp":
                assert v["query"] == "SHOW RETENTION POLICIES" and v["regex"] == f"/^{EVENTS_RP}$/"
                assert not v["multi"] and not v["includeAll"]
                continue
            assert v["query"].startswith("SHOW TAG VALUES FROM"), (name, v["name"])
            assert v["datasource"]["uid"] == grafana_parts.DATASOURCE["uid"]
        ids = [p["id"] for p in panels_of(d)]
        assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids"
        for panel in panels_of(d):
            pos = panel["gridPos"]
            assert pos["x"] + pos["w"] <= 24, (name, panel["title"])
            if panel["type"] == "text":
                continue
            assert panel["targets"], f"{name}: panel {panel['title']!r} has no query"
            for t in panel["targets"]:
                assert t["rawQuery"] and t["datasource"]["uid"] == grafana_parts.DATASOURCE["uid"]
        for v in d["templating"]["list"]:  # the variables' queries read the events' policy too
            assert not EVENT_FROM.search(v["query"]), f"{name}: ${v['name']} reads an event measurement without $erp"
        for where, query in queries_of(d):
            assert not EVENT_FROM.search(query), f"{name}: {where} reads an event measurement without $erp"
            assert "$timeFilter" in query, f"{name}: {where} ignores the time range"
            used = {m for m in VARIABLE.findall(query) if m not in ("timeFilter", "__interval")}
            assert used <= variables, f"{name}: {where} uses undefined variables {used - variables}"
            if "rp" in used:  # only as the retention policy of a gpu or node query
                assert query.count("$rp") == query.count('"$rp"."gpu"') + query.count('"$rp"."node"'), (name, where)
                used.discard("rp")
            if "erp" in used:  # only as the retention policy of an event measurement
                in_erp = sum(query.count(f'"$erp"."{m}"') for m in EVENT_MEASUREMENTS)
                assert query.count("$erp") == in_erp, (name, where)
                used.discard("erp")
            for var in used:
                assert query.count(f"/^${var}$/") == query.count(f"${var}"), f"{name}: {where}: ${var} outside /^$…$/"


def test_provisioning_points_grafana_at_influxql_and_the_dashboards() -> None:
    datasource = (PROVISIONING / "datasources" / "gpuprobe.yaml").read_text()
    assert re.search(r"^\s+type: influxdb$", datasource, re.M)
    assert re.search(rf"^\s+uid: {grafana_parts.DATASOURCE['uid']}$", datasource, re.M)
    assert re.search(r"^\s+version: InfluxQL$", datasource, re.M)
    assert re.search(r"^\s+dbName: \$\{GPUPROBE_INFLUX_DB\}$", datasource, re.M)
    assert re.search(r"^\s+timeInterval: 1s$", datasource, re.M)  # what the query test substitutes
    provider = (PROVISIONING / "dashboards" / "gpuprobe.yaml").read_text()
    assert re.search(r"^\s+type: file$", provider, re.M)
    assert re.search(r"^\s+path: /\S+$", provider, re.M)


def test_the_study_dashboard_shows_each_group_of_the_report(reported_study: StudyRun) -> None:
    """The study dashboard's bar gauges give every group of the report (kind=study `model` points) its
    samples/J and samples/s, and its trainer panels the study's points."""
    run = reported_study
    dashboard = load_dashboards()["study.json"]
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["erp", "probe", "host"]
    time_filter = f"time >= {run.start_ns // 10**6 - 60_000}ms and time <= {run.end_ns // 10**6 + 60_000}ms"
    (values,) = variable_combinations(dashboard, run, time_filter)
    assert values == {"erp": [""], "probe": [run.study], "host": ["node-a", "node-b"]}  # no events: default
    panels = {p["title"]: p for p in panels_of(dashboard)}

    def answer(title: str) -> list[Any]:
        (t,) = panels[title]["targets"]
        return run.server.query(run.db, substitute(t["query"], values, time_filter))

    per_joule = {
        (s.tags["gpu_model"], s.tags["virt"], s.tags["batch_size"], s.tags["power_limit"]): s.values[0][1]
        for s in answer("Samples per joule per group (gpuprobe study report)")
    }
    assert len(per_joule) == 11  # the group of the refused point has no samples/J
    assert per_joule[(H100, "bare_metal", "128", "60%")] == pytest.approx(3.0, rel=0.005)
    assert per_joule[(L4, "vgpu", "64", "60%")] == pytest.approx(250 / 43, rel=0.005)
    rates = {
        (s.tags["gpu_model"], s.tags["virt"], s.tags["batch_size"], s.tags["power_limit"]): s.values[0][1]
        for s in answer("Throughput per GPU per group (gpuprobe study report)")
    }
    assert rates[(H100, "vgpu", "128", "")] == pytest.approx(1260.0)
    table = answer("Groups (gpuprobe study report)")
    assert len(table) == 12 and "simulated" in table[0].columns
    by_point = answer("Steady throughput by point (trainer reports)")
    assert {row[1] for s in by_point for row in s.values} == {0, 1, 2, 3}
    refused = answer("Refused points")
    assert [s.tags["host"] for s in refused] == ["node-b"] and refused[0].rows()[0]["point"] == 3
