"""Part: dashboards. The GPU health dashboard and the Grafana alert rules of ``deploy/grafana/provisioning/alerting/``.

``python -m gpuprobe.dashboards.grafana`` writes both with the other dashboards (docs/dashboards.md); the
tests compare the committed files with what this module generates and run every query against a real
InfluxDB holding what the collector writes for the health fields, ``gpu_event``, ``gpu_process``,
``gpu_nvlink`` and ``gpu_mig``.

Which retention policy a query reads: the continuous queries of ``--init-db`` roll up only the fields
listed in :data:`gpuprobe.influx.retention.GPU_10S`, and none of the health fields (ECC, remapping,
violations, GPM utilization, NVLink, ``health``) nor the health measurements. Those queries read the
default (raw) policy, ``FROM "gpu"``; only ``util_pct`` reads ``"$rp"."gpu"``. Health panels are
therefore empty for times older than the raw retention (a week by default), except the ``gpu_event``
ones (the XID annotation, the event table and counts): they read ``"$erp"."gpu_event"``, the ``events``
policy (400 days) where ``--init-db`` made it. The alert rules cannot use dashboard variables and look
at the last minutes only: they read the default policy, which has every recent point.

The alert rules use Grafana's file-provisioning format (``apiVersion: 1``, ``groups`` of ``rules``),
one InfluxQL query per rule (refId ``A``, with ``$timeFilter``, whose span is the rule's
``relativeTimeRange``), then a *reduce* (``B``, last value per series) and a *threshold* (``C``, the
condition) server-side expression. Every query groups by ``host`` (and ``gpu``), so each GPU or host
is an alert instance of its own.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuprobe.dashboards.grafana_parts import (
    BY_TIME,
    DATASOURCE,
    GPU,
    GPU_EVENT_M,
    GPU_M,
    GPU_VAR,
    HOST,
    HOST_VAR,
    RP_VAR,
    TF,
    Layout,
    dashboard,
    target,
)
from gpuprobe.influx.retention import GPU_10S

UID = "gpuprobe-gpu-health"
FILE_NAME = "gpu-health.json"
ALERTING_FILE = "gpuprobe.yaml"
#: the folder of the dashboard provider (deploy/grafana/provisioning/dashboards/gpuprobe.yaml)
FOLDER = "gpuprobe"
#: the raw `gpu` points: the default retention policy (the health fields are not rolled up)
RAW_GPU = '"gpu"'
ROLLED_UP = frozenset(name for name, _, _ in GPU_10S)
HEALTH_COLORS = {"healthy": "green", "degraded": "orange", "failed": "red"}

XID_ANNOTATION = {
    "name": "XID errors",
    "datasource": DATASOURCE,
    "enable": True,
    "iconColor": "red",
    "query": f'SELECT "text", "xid", "host", "gpu" FROM {GPU_EVENT_M} WHERE "kind" = \'xid\' AND $timeFilter',
    "textColumn": "text",
    "tagsColumn": "host,gpu",
}


def _raw(field: str) -> str:
    """The policy a `gpu` field is read from: ``$rp`` if the rollups carry it, else the raw one."""
    return GPU_M if field in ROLLED_UP else RAW_GPU


def gpu_health_dashboard() -> dict[str, Any]:
    lay = Layout()
    where = f"{HOST} AND {GPU} AND {TF}"
    per_gpu = '"host", "gpu"'
    gpu_alias = "$tag_host GPU $tag_gpu"

    def series(
        title: str,
        fields: list[tuple[str, str]],
        unit: str,
        *,
        agg: str = "mean",
        measurement: str = "gpu",
        by: str = per_gpu,
        alias: str = gpu_alias,
        w: int = 12,
        description: str = "",
    ) -> dict[str, Any]:
        """A time series panel: one target per (field, label), ``agg`` per interval."""
        targets = []
        for i, (field, label) in enumerate(fields):
            source = _raw(field) if measurement == "gpu" else f'"{measurement}"'
            if agg == "derivative_us":  # a µs counter -> % of the time
                select = f'non_negative_derivative(max("{field}"), 1s) / 10000'
            elif agg == "difference":  # a counter -> its increase per interval
                select = f'non_negative_difference(max("{field}"))'
            else:
                select = f'{agg}("{field}")'
            fill = "" if agg in ("derivative_us", "difference") else " fill(null)"
            targets.append(
                target(
                    f"SELECT {select} FROM {source} WHERE {where} {BY_TIME}, {by}{fill}",
                    chr(ord("A") + i),
                    alias=f"{label} {alias}".strip(),
                )
            )
        return lay.panel(title, "timeseries", targets, w=w, unit=unit, description=description)

    health_now = lay.panel(
        "Health now",
        "table",
        [
            target(
                f'SELECT last("health") AS "health", "health_reason" AS "reason" FROM {RAW_GPU} WHERE {where} '
                'GROUP BY "host", "gpu", "model"',
                fmt="table",
            )
        ],
        w=12,
        h=8,
        description="The agent's latest verdict per GPU and why (docs/schema.md): the time column is when it was "
        "last judged",
    )
    _color_values(health_now, "health")
    timeline = lay.panel(
        "Health over time",
        "state-timeline",
        [
            target(
                f'SELECT last("health") FROM {RAW_GPU} WHERE {where} {BY_TIME}, {per_gpu} fill(previous)',
                alias=gpu_alias,
            )
        ],
        w=12,
        h=8,
    )
    timeline["options"] = {"showValue": "never", "mergeValues": True, "rowHeight": 0.8}
    _color_values(timeline)
    panels = [
        health_now,
        timeline,
        lay.panel(
            "GPU events",
            "table",
            [
                target(
                    f'SELECT "kind", "xid", "data", "text", "gpu_instance" FROM {GPU_EVENT_M} '
                    f"WHERE {where} GROUP BY {per_gpu} ORDER BY time DESC",
                    fmt="table",
                )
            ],
            w=14,
            h=9,
            description="Every NVML event (gpu_event): XID code and text, ECC, clock and power-source changes, "
            "lost and recovered GPUs; newest first",
        ),
        lay.panel(
            "Events per interval",
            "timeseries",
            [
                target(
                    f'SELECT count("xid") FROM {GPU_EVENT_M} WHERE "kind" = \'xid\' AND {where} {BY_TIME}, {per_gpu} '
                    "fill(none)",
                    "A",
                    alias=f"XID {gpu_alias}",
                ),
                target(
                    f'SELECT count("data") FROM {GPU_EVENT_M} WHERE "kind" != \'xid\' AND {where} {BY_TIME}, '
                    f'"kind", {per_gpu} fill(none)',
                    "B",
                    alias=f"$tag_kind {gpu_alias}",
                ),
            ],
            w=10,
            h=9,
            unit="none",
        ),
        lay.panel(
            "ECC, page retirement and row remapping (latest)",
            "table",
            [
                target(
                    'SELECT last("ecc_corrected_volatile") AS "ECC corrected (volatile)", '
                    'last("ecc_uncorrected_volatile") AS "ECC uncorrected (volatile)", '
                    'last("ecc_corrected_aggregate") AS "ECC corrected (aggregate)", '
                    'last("ecc_uncorrected_aggregate") AS "ECC uncorrected (aggregate)", '
                    'last("retired_pages_sbe") AS "retired pages SBE", '
                    'last("retired_pages_dbe") AS "retired pages DBE", '
                    'last("retired_pages_pending") AS "retirement pending", '
                    'last("remapped_rows_correctable") AS "rows remapped (correctable)", '
                    'last("remapped_rows_uncorrectable") AS "rows remapped (uncorrectable)", '
                    'last("remap_pending") AS "remap pending", last("remap_failure") AS "remap failure", '
                    f'last("pcie_replay_count") AS "PCIe replays" FROM {RAW_GPU} WHERE {where} GROUP BY {per_gpu}',
                    fmt="table",
                )
            ],
            w=24,
            h=8,
            description="Counters since the driver loaded (volatile) or over the GPU's life (aggregate); a pending "
            "retirement or remap needs a GPU reset, a remap failure needs service",
        ),
        series(
            "ECC errors since the driver loaded",
            [("ecc_corrected_volatile", "corrected"), ("ecc_uncorrected_volatile", "uncorrected")],
            "none",
            agg="max",
        ),
        series("PCIe replays per interval", [("pcie_replay_count", "")], "none", agg="difference"),
        series(
            "Clock violation time (share of each interval)",
            [
                ("power_violation_us", "power"),
                ("thermal_violation_us", "thermal"),
                ("sync_boost_violation_us", "sync boost"),
            ],
            "percent",
            agg="derivative_us",
            w=24,
            description="The rate of NVML's violation counters (µs held down by the power cap, a thermal limit, "
            "sync boost): 100 % = the whole interval",
        ),
        series(
            "True utilization (GPM) next to NVML utilization",
            [
                ("util_pct", "util (NVML)"),
                ("sm_active_pct", "SM active"),
                ("tensor_active_pct", "tensor active"),
                ("dram_bw_util_pct", "DRAM bandwidth"),
            ],
            "percent",
            w=24,
            description="util (NVML) is the share of time any kernel ran; SM active, tensor active and DRAM "
            "bandwidth are NVML GPM metrics (Hopper and newer): how busy the GPU really is",
        ),
        series(
            "Pipe activity and SM occupancy (GPM)",
            [
                ("fp16_active_pct", "FP16"),
                ("fp32_active_pct", "FP32"),
                ("fp64_active_pct", "FP64"),
                ("sm_occupancy_pct", "SM occupancy"),
            ],
            "percent",
        ),
        series("Fan speed", [("fan_rpm", "")], "rotrpm"),
        series(
            "NVLink throughput per link",
            [("tx_bytes_per_s", "tx"), ("rx_bytes_per_s", "rx")],
            "Bps",
            measurement="gpu_nvlink",
            by=f'{per_gpu}, "link"',
            alias=f"{gpu_alias} link $tag_link",
        ),
        series(
            "NVLink throughput per GPU (all links)",
            [("nvlink_tx_bytes_per_s", "tx"), ("nvlink_rx_bytes_per_s", "rx")],
            "Bps",
        ),
        lay.panel(
            "NVLink error counters per link (latest)",
            "table",
            [
                target(
                    'SELECT last("crc_flit_errors") AS "CRC flit", last("crc_data_errors") AS "CRC data", '
                    'last("replay_errors") AS "replay", last("recovery_errors") AS "recovery" FROM "gpu_nvlink" '
                    f'WHERE {where} GROUP BY {per_gpu}, "link"',
                    fmt="table",
                )
            ],
            description="Error counters since the driver loaded",
        ),
        series(
            "NVLink errors per interval",
            [
                ("crc_flit_errors", "CRC flit"),
                ("crc_data_errors", "CRC data"),
                ("replay_errors", "replay"),
                ("recovery_errors", "recovery"),
            ],
            "none",
            agg="difference",
            measurement="gpu_nvlink",
            by=f'{per_gpu}, "link"',
            alias=f"{gpu_alias} link $tag_link",
        ),
        lay.panel(
            "Processes",
            "table",
            [
                target(
                    'SELECT last("command") AS "command", last("cgroup") AS "cgroup", '
                    'last("used_memory_bytes") AS "GPU memory", max("used_memory_bytes") AS "peak GPU memory", '
                    'mean("sm_pct") AS "SM share %", last("energy_j") AS "energy J", last("ended") AS "ended" '
                    f'FROM "gpu_process" WHERE {where} GROUP BY {per_gpu}, "pid"',
                    fmt="table",
                )
            ],
            w=24,
            h=9,
            description="Every process seen on the GPUs in the range: the SM share is NVML's per-process "
            "utilization, the energy the GPU's energy split by SM share since the agent first saw the process",
        ),
        series(
            "GPU memory per process",
            [("used_memory_bytes", "")],
            "bytes",
            agg="last",
            measurement="gpu_process",
            by=f'{per_gpu}, "pid"',
            alias=f"{gpu_alias} pid $tag_pid",
        ),
        series(
            "SM share per process",
            [("sm_pct", "")],
            "percent",
            measurement="gpu_process",
            by=f'{per_gpu}, "pid"',
            alias=f"{gpu_alias} pid $tag_pid",
        ),
        lay.panel(
            "MIG instances",
            "table",
            [
                target(
                    'SELECT last("name") AS "profile", last("mem_used_bytes") AS "memory used", '
                    'last("mem_total_bytes") AS "memory", last("multiprocessor_count") AS "SMs" FROM "gpu_mig" '
                    f'WHERE {where} GROUP BY {per_gpu}, "gpu_instance", "mig_uuid"',
                    fmt="table",
                )
            ],
            w=24,
            h=6,
            description="GPU instances of MIG-enabled GPUs (empty without MIG)",
        ),
    ]
    board = dashboard(
        UID,
        "gpuprobe / GPU health",
        "Per GPU: the agent's health verdict, NVML events (XID), ECC and remapping, PCIe replays, clock "
        "violations, true utilization, NVLink, processes. Health fields are raw data only (not rolled up).",
        panels,
        [RP_VAR, HOST_VAR, GPU_VAR],
        time_from="now-1h",
    )
    board["annotations"] = {"list": [XID_ANNOTATION]}
    return board


def _color_values(panel: dict[str, Any], column: str = "") -> None:
    """Green, orange, red for the health verdicts (a value mapping; in a table, colored cells)."""
    mapping = {
        "type": "value",
        "options": {v: {"color": c, "index": i} for i, (v, c) in enumerate(HEALTH_COLORS.items())},
    }
    if not column:
        panel["fieldConfig"]["defaults"]["mappings"] = [mapping]
        panel["fieldConfig"]["defaults"]["color"] = {"mode": "thresholds"}
        return
    panel["fieldConfig"]["overrides"] = [
        {
            "matcher": {"id": "byName", "options": column},
            "properties": [
                {"id": "mappings", "value": [mapping]},
                {"id": "custom.cellOptions", "value": {"type": "color-background"}},
            ],
        }
    ]


# --- alert rules ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AlertRule:
    """One rule: its InfluxQL query (refId A) over the last ``range_s`` seconds, reduced to the last
    value per series and compared with ``threshold`` (``op``: gt or lt)."""

    uid: str
    title: str
    query: str
    range_s: int
    op: str
    threshold: float
    for_: str
    severity: str
    summary: str
    description: str
    #: the dashboard (uid) and panel (title) the alert links to
    dashboard: str = UID
    panel: str = ""


ALERT_RULES: tuple[AlertRule, ...] = (
    AlertRule(
        uid="gpuprobe-gpu-xid",
        title="New XID error",
        query='SELECT count("xid") FROM "gpu_event" WHERE "kind" = \'xid\' AND $timeFilter GROUP BY "host", "gpu"',
        range_s=60,
        op="gt",
        threshold=0,
        for_="0s",
        severity="critical",
        summary="XID error on {{ $labels.host }} GPU {{ $labels.gpu }}",
        description="{{ $values.B }} XID event(s) in the last minute; the code and text are in the GPU events "
        "table of the GPU health dashboard",
        panel="GPU events",
    ),
    AlertRule(
        uid="gpuprobe-gpu-failed",
        title="GPU failed",
        query='SELECT count("health") FROM "gpu" WHERE "health" = \'failed\' AND $timeFilter GROUP BY "host", "gpu"',
        range_s=60,
        op="gt",
        threshold=0,
        for_="0s",
        severity="critical",
        summary="{{ $labels.host }} GPU {{ $labels.gpu }} is failed",
        description="The agent judged the GPU failed (fell off the bus, uncorrectable ECC, row-remap failure) in "
        "the last minute; the reason is in the GPU health dashboard. Probes refuse it.",
        panel="Health now",
    ),
    AlertRule(
        uid="gpuprobe-gpu-degraded",
        title="GPU degraded",
        query='SELECT count("health") FROM "gpu" WHERE "health" = \'degraded\' AND $timeFilter GROUP BY "host", "gpu"',
        range_s=300,
        op="gt",
        threshold=0,
        for_="5m",
        severity="warning",
        summary="{{ $labels.host }} GPU {{ $labels.gpu }} is degraded",
        description="The agent has judged the GPU degraded (pending remap or retirement, sustained thermal "
        "slowdown, NVLink errors) for 5 minutes; the reason is in the GPU health dashboard",
        panel="Health now",
    ),
    AlertRule(
        uid="gpuprobe-gpu-thermal-slowdown",
        title="GPU thermal slowdown",
        # (r & 32) / 32 and (r & 64) / 64 are 0 or 1 (SW, HW thermal); a + b - a·b is their OR, so the
        # mean is the share of samples with a thermal bit (clock_event_reasons & 96 > 0)
        query='SELECT mean("thermal") FROM (SELECT ("clock_event_reasons" & 32) / 32 + ("clock_event_reasons" & 64) '
        '/ 64 - ("clock_event_reasons" & 32) / 32 * ("clock_event_reasons" & 64) / 64 AS "thermal" FROM "gpu" '
        'WHERE $timeFilter GROUP BY "host", "gpu") WHERE $timeFilter GROUP BY "host", "gpu"',
        range_s=300,
        op="gt",
        threshold=0.5,
        for_="0s",
        severity="warning",
        summary="{{ $labels.host }} GPU {{ $labels.gpu }} is throttled for heat",
        description="More than half of the samples of the last 5 minutes had a thermal clock-event reason "
        "(SW or HW thermal slowdown, clock_event_reasons & 96); share {{ $values.B }}",
        panel="Clock violation time (share of each interval)",
    ),
    AlertRule(
        uid="gpuprobe-agent-silent",
        title="Agent silent",
        # the agent points per 10 s over the hour, filled with 0 up to now; the moving sum of 6 of them (the
        # last one partial) is the count of the last 50-60 s: 0 for a host that sent points in the hour but
        # none since. (An aggregate of the filled subquery, such as sum() over the last minute, comes back
        # empty from InfluxDB 1.x; a transformation of its rows does not.)
        query='SELECT moving_average("points", 6) * 6 FROM (SELECT count("spool_bytes") AS "points" FROM "agent" '
        'WHERE $timeFilter GROUP BY time(10s), "host" fill(0)) WHERE $timeFilter GROUP BY "host"',
        range_s=3600,
        op="lt",
        threshold=1,
        for_="0s",
        severity="critical",
        summary="No data from {{ $labels.host }} for a minute",
        description="The agent of {{ $labels.host }} sent points in the last hour but none in the last 50 to 60 s "
        "(every batch it delivers writes an agent point): the agent, its network or the collector is down",
        dashboard="gpuprobe-health",
        panel="Agent batches reporting (stats points per 10 s)",
    ),
    AlertRule(
        uid="gpuprobe-agent-clock-off",
        title="Agent clock off",
        query='SELECT abs(last("clock_offset_s")) FROM "agent" WHERE $timeFilter GROUP BY "host"',
        range_s=300,
        op="gt",
        threshold=1,
        for_="0s",
        severity="warning",
        summary="The clock of {{ $labels.host }} is {{ $values.B }} s off its collector's",
        description="The node's time synchronisation has failed (chrony/ntpd, a dead RTC battery, a VM resumed "
        "from suspension): its samples are stored on the collector's clock, moved in whole seconds, but its "
        "signed commands and probe slots run on its own clock (docs/operations.md, A node with a wrong clock)",
        dashboard="gpuprobe-health",
        panel="Agent spool",
    ),
    AlertRule(
        uid="gpuprobe-agent-spool-growing",
        title="Agent spool growing",
        query='SELECT last("spool_bytes") - first("spool_bytes") FROM "agent" WHERE $timeFilter GROUP BY "host"',
        range_s=300,
        op="gt",
        threshold=0,
        for_="0s",
        severity="warning",
        summary="The spool of {{ $labels.host }} grew by {{ $values.B }} bytes in 5 minutes",
        description="The agent buffers more than it delivers: the collector or InfluxDB is slow or refusing",
        dashboard="gpuprobe-health",
        panel="Agent spool",
    ),
)


Dashboards = Mapping[str, Callable[[], dict[str, Any]]]  # file name -> builder (dashboards/grafana.py DASHBOARDS)


def panel_ids(dashboards: Dashboards) -> dict[tuple[str, str], int]:
    """(dashboard uid, panel title) -> panel id, of every generated dashboard."""
    ids = {}
    for build in dashboards.values():
        board = build()
        for panel in board["panels"]:
            ids[(board["uid"], panel["title"])] = panel["id"]
    return ids


def _rule(rule: AlertRule, panels: dict[tuple[str, str], int]) -> dict[str, Any]:
    expr = {"type": "__expr__", "uid": "__expr__"}
    return {
        "uid": rule.uid,
        "title": rule.title,
        "condition": "C",
        "data": [
            {
                "refId": "A",
                "relativeTimeRange": {"from": rule.range_s, "to": 0},
                "datasourceUid": DATASOURCE["uid"],
                "model": {
                    "refId": "A",
                    "datasource": DATASOURCE,
                    "query": rule.query,
                    "rawQuery": True,
                    "resultFormat": "time_series",
                },
            },
            {
                "refId": "B",
                "datasourceUid": "__expr__",
                "model": {
                    "refId": "B",
                    "datasource": expr,
                    "type": "reduce",
                    "expression": "A",
                    "reducer": "last",
                    "settings": {"mode": "dropNN"},
                },
            },
            {
                "refId": "C",
                "datasourceUid": "__expr__",
                "model": {
                    "refId": "C",
                    "datasource": expr,
                    "type": "threshold",
                    "expression": "B",
                    "conditions": [{"evaluator": {"type": rule.op, "params": [rule.threshold]}}],
                },
            },
        ],
        # no series at all: nothing is wrong (no XID, no failed GPU, no host seen in the last hour)
        "noDataState": "OK",
        "execErrState": "Error",
        "for": rule.for_,
        # the rule's link to a panel (Grafana keeps them as the annotations __dashboardUid__ and __panelId__)
        "dashboardUid": rule.dashboard,
        "panelId": panels[(rule.dashboard, rule.panel)],
        "annotations": {"summary": rule.summary, "description": rule.description},
        "labels": {"severity": rule.severity, "source": "gpuprobe"},
        "isPaused": False,
    }


def alerting(dashboards: Dashboards) -> dict[str, Any]:
    """The alert rule provisioning file's content; the rules link to panels of ``dashboards``."""
    panels = panel_ids(dashboards)
    return {
        "apiVersion": 1,
        "groups": [
            {
                "orgId": 1,
                "name": "gpuprobe-gpu-health",
                "folder": FOLDER,
                "interval": "1m",
                "rules": [_rule(r, panels) for r in ALERT_RULES],
            }
        ],
    }


ALERTING_HEADER = """\
# Grafana alert rules for gpuprobe (docs/dashboards.md#alert-rules), generated by
# `python -m gpuprobe.dashboards.grafana` from dashboards/grafana_health.py: edit that, not this file.
# Copy into Grafana's provisioning/alerting/. They query the data source gpuprobe-influxdb
# (provisioning/datasources/gpuprobe.yaml) and live in the folder gpuprobe.
"""


def to_yaml(value: Any, indent: int = 0) -> str:
    """Block-style YAML of JSON-like data; scalars as JSON (a double-quoted JSON string is a valid YAML
    double-quoted scalar, and JSON numbers, booleans and null are YAML's)."""
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                lines.append(f"{pad}{key}:")
                lines.append(to_yaml(item, indent + 2))
            else:
                lines.append(f"{pad}{key}: {_scalar(item)}")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, (dict, list)) and item:
                text = to_yaml(item, indent + 2)
                lines.append(f"{pad}- {text[indent + 2 :]}")
            else:
                lines.append(f"{pad}- {_scalar(item)}")
    else:
        lines.append(pad + _scalar(value))
    return "\n".join(lines)


#: plain words YAML would read as something else than a string
YAML_WORDS = frozenset(("true", "false", "yes", "no", "on", "off", "null", "y", "n"))


def _scalar(value: Any) -> str:
    """A plain word as it is, everything else as JSON (quoted strings, numbers, booleans)."""
    plain = isinstance(value, str) and value.replace("-", "").replace("_", "").isalnum() and value[:1].isalpha()
    if plain and value.lower() not in YAML_WORDS:
        return str(value)
    return json.dumps(value, ensure_ascii=False)


def render_alerting(dashboards: Dashboards) -> dict[str, str]:
    """File name -> YAML text of the alert rule provisioning files."""
    return {ALERTING_FILE: ALERTING_HEADER + to_yaml(alerting(dashboards)) + "\n"}
