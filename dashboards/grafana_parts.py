"""Part: dashboards. The building blocks of the generated Grafana dashboards: the data source, the InfluxQL
snippets, the template variables, the panel layout and the dashboard frame. ``dashboards/grafana.py`` and
``dashboards/grafana_health.py`` build their dashboards from them (one place, no import between the two)."""

from __future__ import annotations

from typing import Any

from gpuprobe.influx.retention import EVENTS_RP, rp_variable_query

DATASOURCE = {"type": "influxdb", "uid": "gpuprobe-influxdb"}
SCHEMA_VERSION = 39
HOST = '"host" =~ /^$host$/'
GPU = '"gpu" =~ /^$gpu$/'
PROBE = '"probe" =~ /^$probe$/'
TF = "$timeFilter"
BY_TIME = "GROUP BY time($__interval)"
THERMAL_BITS = 0x20 | 0x40  # SW thermal, HW thermal (nvmlClocksEventReasons; docs/schema.md: & 96)
POWER_BITS = 0x04 | 0x80  # SW power cap, HW power brake
# gpu and node series in the retention policy the $rp variable picks for the time range: raw, rollup_10s or
# rollup_1m (gpuprobe collector --init-db; docs/dashboards.md). The rollups keep the raw field names.
GPU_M = '"$rp"."gpu"'
NODE_M = '"$rp"."node"'
# the event measurements (probe, trainer, gpu_info, gpu_event, model) in the policy the $erp variable
# names: `events` (kept 400 days) where --init-db made it, else the default policy (docs/dashboards.md)
PROBE_M = '"$erp"."probe"'
TRAINER_M = '"$erp"."trainer"'
GPU_EVENT_M = '"$erp"."gpu_event"'
MODEL_M = '"$erp"."model"'


def target(query: str, ref: str = "A", fmt: str = "time_series", alias: str = "") -> dict[str, Any]:
    t: dict[str, Any] = {
        "refId": ref,
        "datasource": DATASOURCE,
        "query": query,
        "rawQuery": True,
        "resultFormat": fmt,
    }
    if alias:
        t["alias"] = alias
    return t


class Layout:
    """Places panels left to right, 24 columns wide, wrapping into new rows."""

    def __init__(self) -> None:
        self.x = self.y = self.row_h = 0
        self.next_id = 1

    def place(self, w: int, h: int) -> dict[str, int]:
        if self.x + w > 24:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        pos = {"x": self.x, "y": self.y, "w": w, "h": h}
        self.x += w
        self.row_h = max(self.row_h, h)
        return pos

    def panel(
        self,
        title: str,
        kind: str,
        targets: list[dict[str, Any]],
        *,
        w: int = 12,
        h: int = 8,
        unit: str = "",
        description: str = "",
        decimals: int | None = None,
    ) -> dict[str, Any]:
        defaults: dict[str, Any] = {}
        if unit:
            defaults["unit"] = unit
        if decimals is not None:
            defaults["decimals"] = decimals
        p: dict[str, Any] = {
            "id": self.next_id,
            "type": kind,
            "title": title,
            "datasource": DATASOURCE,
            "gridPos": self.place(w, h),
            "targets": targets,
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": {},
        }
        if description:
            p["description"] = description
        if kind == "timeseries":
            p["options"] = {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}}
        elif kind == "stat":
            p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}
        elif kind == "bargauge":
            p["options"] = {
                "orientation": "horizontal",
                "displayMode": "basic",
                "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            }
        self.next_id += 1
        return p

    def text(self, title: str, content: str, *, w: int = 24, h: int = 6) -> dict[str, Any]:
        p = {
            "id": self.next_id,
            "type": "text",
            "title": title,
            "gridPos": self.place(w, h),
            "options": {"mode": "markdown", "content": content},
        }
        self.next_id += 1
        return p


def variable(name: str, query: str, label: str, *, multi: bool = True) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": query,
        "definition": query,
        "refresh": 2,  # on time range change
        "multi": multi,
        "includeAll": multi,
        "sort": 3,  # numerically ascending
        "regex": "",
        "current": {},
        "options": [],
        "hide": 0,
    }


RP_VAR = variable("rp", rp_variable_query(), "data", multi=False)
RP_VAR["sort"] = 0  # one value: the policy for the range's length
RP_VAR["description"] = "raw samples, 10 s or 1 min rollups, by the length of the time range (rp_config)"
# SHOW RETENTION POLICIES is the one InfluxQL statement that tells whether a policy exists without failing
# when it does not: Grafana's InfluxDB data source takes its first column (the names) for a variable and
# the regex keeps `events`. A database without it leaves the variable without options, which Grafana
# substitutes as "" ("None"), and FROM ""."probe" is InfluxDB's default policy: the raw data, as before.
# A constant `events` would break every event query on such a database (retention policy not found).
ERP_VAR = variable("erp", "SHOW RETENTION POLICIES", "events from", multi=False)
ERP_VAR["regex"] = f"/^{EVENTS_RP}$/"
ERP_VAR["refresh"] = 1  # on dashboard load: policies do not change with the time range
ERP_VAR["sort"] = 0
ERP_VAR["hide"] = 2  # one value, nothing to choose
ERP_VAR["description"] = (
    "the retention policy of probe, trainer, gpu_info, gpu_event and model: events (400 days) where "
    "gpuprobe collector --init-db made it, else the default policy"
)
HOST_VAR = variable("host", f'SHOW TAG VALUES FROM {GPU_M} WITH KEY = "host"', "host")
ONE_HOST_VAR = variable("host", f'SHOW TAG VALUES FROM {GPU_M} WITH KEY = "host"', "host", multi=False)
GPU_VAR = variable("gpu", f'SHOW TAG VALUES FROM {GPU_M} WITH KEY = "gpu" WHERE "host" =~ /^$host$/', "gpu")
PROBE_VAR = variable("probe", f'SHOW TAG VALUES FROM {PROBE_M} WITH KEY = "probe"', "probe", multi=False)

PHASE_ANNOTATION = {
    "name": "probe phases",
    "datasource": DATASOURCE,
    "enable": True,
    "iconColor": "#8ab8ff",
    "query": f'SELECT "phase", "kind", "host" FROM {PROBE_M} WHERE $timeFilter',
    "textColumn": "phase",
    "tagsColumn": "host",
}


def with_erp(variables: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The variables with ``$erp`` added (after ``$rp``, before the variables that read it): every
    dashboard has the probe-phase annotation, which reads ``"$erp"."probe"``."""
    if any(v["name"] == ERP_VAR["name"] for v in variables):
        return variables
    at = 1 if variables and variables[0]["name"] == RP_VAR["name"] else 0
    return [*variables[:at], ERP_VAR, *variables[at:]]


def dashboard(
    uid: str,
    title: str,
    description: str,
    panels: list[dict[str, Any]],
    variables: list[dict[str, Any]],
    time_from: str = "now-1h",
) -> dict[str, Any]:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["gpuprobe"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "refresh": "10s",
        "time": {"from": time_from, "to": "now"},
        "templating": {"list": with_erp(variables)},
        "annotations": {"list": [PHASE_ANNOTATION]},
        "links": [{"type": "dashboards", "tags": ["gpuprobe"], "asDropdown": True, "title": "gpuprobe"}],
        "panels": panels,
    }
