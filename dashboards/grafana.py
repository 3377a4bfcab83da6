"""Part: dashboards. The Grafana dashboards of ``deploy/grafana/dashboards/``, generated here so they stay consistent.

``python -m gpuprobe.dashboards.grafana [--out DIR] [--alerting-out DIR]`` writes them (default: the
repository's ``deploy/grafana/dashboards``) and the alert rules of ``dashboards/grafana_health.py``
(default: ``deploy/grafana/provisioning/alerting``); a test fails when the committed files differ
from what this module generates, and another runs every panel's query against a real InfluxDB
(docs/dashboards.md).

Conventions every query follows (the tests rely on them):

- raw InfluxQL (``rawQuery``), the data source ``gpuprobe-influxdb`` (provisioned by
  ``deploy/grafana/provisioning/datasources/gpuprobe.yaml``);
- a template variable only ever appears as ``/^$name$/`` (Grafana writes a regex of the chosen
  values there, escaped), and every query has ``$timeFilter``; the two exceptions are retention
  policies: ``"$rp"."gpu"``/``"$rp"."node"`` (raw or a rollup) and ``"$erp"."probe"`` for the event
  measurements ``probe``, ``trainer``, ``gpu_event`` and ``model`` (``events`` where it exists);
- ``$__interval`` for the GROUP BY time of time series; subqueries repeat ``$timeFilter`` outside.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gpuprobe.dashboards.grafana_health import gpu_health_dashboard, render_alerting
from gpuprobe.dashboards.grafana_parts import (
    BY_TIME,
    GPU,
    GPU_M,
    GPU_VAR,
    HOST,
    HOST_VAR,
    MODEL_M,
    NODE_M,
    ONE_HOST_VAR,
    POWER_BITS,
    PROBE,
    PROBE_M,
    PROBE_VAR,
    RP_VAR,
    TF,
    THERMAL_BITS,
    TRAINER_M,
    Layout,
    dashboard,
    target,
    variable,
)


def _sum_of_gpus(field: str, where: str, by: str = "") -> str:
    """A fleet or node total: the per-GPU means summed per interval (subquery)."""
    group = f', "{by}"' if by else ""
    return (
        f'SELECT sum("mean") FROM (SELECT mean("{field}") FROM {GPU_M} WHERE {where} AND {TF} '
        f'{BY_TIME}, "host", "gpu") WHERE {TF} {BY_TIME}{group} fill(none)'
    )


def fleet() -> dict[str, Any]:
    lay = Layout()
    where = f"{HOST} AND {TF}"
    panels = [
        lay.panel(
            "GPUs reporting",
            "stat",
            [
                target(
                    f'SELECT count("last") FROM (SELECT last("power_w") FROM {GPU_M} WHERE {where} GROUP BY "host", '
                    '"gpu") '
                    f"WHERE {TF}"
                )
            ],
            w=4,
            h=4,
            description="GPUs with at least one sample in the time range",
        ),
        lay.panel(
            "Fleet power now",
            "stat",
            [
                target(
                    f'SELECT sum("last") FROM (SELECT last("power_w") FROM {GPU_M} WHERE {where} '
                    f'GROUP BY "host", "gpu") WHERE {TF}'
                )
            ],
            w=5,
            h=4,
            unit="watt",
        ),
        lay.panel(
            "Energy in the range (NVML counters)",
            "stat",
            [
                target(
                    f'SELECT sum("spread") FROM (SELECT spread("energy_j") FROM {GPU_M} WHERE {where} GROUP BY "host", '
                    '"gpu") '
                    f"WHERE {TF}"
                )
            ],
            w=5,
            h=4,
            unit="joule",
            description="Sum over GPUs of (last - first) energy counter; a counter reset makes it too low",
        ),
        lay.panel(
            "Hottest GPU",
            "stat",
            [target(f'SELECT max("temp_c") FROM {GPU_M} WHERE {where}')],
            w=5,
            h=4,
            unit="celsius",
            description="On long ranges (rollups): the hottest 10 s or 1 min mean",
        ),
        lay.panel(
            "Loudest node (proxy estimate)",
            "stat",
            [target(f'SELECT max("est_dba") FROM "acoustic" WHERE "source" = \'proxy\' AND "gpu" = \'\' AND {where}')],
            w=5,
            h=4,
            unit="dBA",
            decimals=1,
        ),
        lay.panel("Fleet power", "timeseries", [target(_sum_of_gpus("power_w", HOST), alias="fleet")], unit="watt"),
        lay.panel(
            "Power per node",
            "timeseries",
            [target(_sum_of_gpus("power_w", HOST, "host"), alias="$tag_host")],
            unit="watt",
        ),
        lay.panel(
            "Hottest GPU per node",
            "timeseries",
            [
                target(
                    f'SELECT max("temp_c") FROM {GPU_M} WHERE {where} {BY_TIME}, "host" fill(null)', alias="$tag_host"
                )
            ],
            unit="celsius",
        ),
        lay.panel(
            "Mean GPU utilization per node",
            "timeseries",
            [
                target(
                    f'SELECT mean("util_pct") FROM {GPU_M} WHERE {where} {BY_TIME}, "host" fill(null)',
                    alias="$tag_host",
                )
            ],
            unit="percent",
        ),
        lay.panel(
            "Acoustic level per node (proxy estimate)",
            "timeseries",
            [
                target(
                    f'SELECT mean("est_dba") FROM "acoustic" WHERE "source" = \'proxy\' AND "gpu" = \'\' AND {where} '
                    f'{BY_TIME}, "host" fill(null)',
                    alias="$tag_host",
                )
            ],
            unit="dBA",
        ),
        lay.panel(
            "GPU samples with thermal slowdown or power cap",
            "timeseries",
            [
                target(
                    f'SELECT count("power_w") FROM "gpu" WHERE "clock_event_reasons" & {THERMAL_BITS} > 0 AND {where} '
                    f'{BY_TIME}, "host" fill(0)',
                    "A",
                    alias="thermal $tag_host",
                ),
                target(
                    f'SELECT count("power_w") FROM "gpu" WHERE "clock_event_reasons" & {POWER_BITS} > 0 AND {where} '
                    f'{BY_TIME}, "host" fill(0)',
                    "B",
                    alias="power cap $tag_host",
                ),
            ],
            description="Samples per interval whose clock-event reasons carry a thermal (0x60) or power (0x84) bit "
            "(raw samples only: empty beyond the raw retention)",
        ),
        lay.panel(
            "GPUs now",
            "table",
            [
                target(
                    f'SELECT last("temp_c") AS "temp °C", last("power_w") AS "power W", last("util_pct") AS "util %", '
                    f'last("clock_event_reasons") AS "reasons" FROM {GPU_M} WHERE {where} GROUP BY "host", "gpu", '
                    '"model"',
                    fmt="table",
                )
            ],
            w=24,
            h=9,
        ),
        lay.panel(
            "Latest thermal fits (gpuprobe model)",
            "table",
            [
                target(
                    'SELECT last("r_th_c_per_w") AS "R_th °C/W", last("tau_s") AS "τ s", last("t_amb_c") AS "T_amb '
                    '°C", '
                    f'last("headroom_c") AS "headroom °C", last("outlier") AS "hotter" FROM {MODEL_M} '
                    f'WHERE "kind" = \'thermal\' AND "gpu" != \'\' AND {where} GROUP BY "probe", "host", "gpu"',
                    fmt="table",
                )
            ],
            w=24,
            h=9,
        ),
    ]
    return dashboard(
        "gpuprobe-fleet",
        "gpuprobe / Fleet overview",
        "Every node at a glance: power, energy, temperature, utilization, acoustics, throttling.",
        panels,
        [RP_VAR, HOST_VAR],
    )


def node() -> dict[str, Any]:
    lay = Layout()
    where = f"{HOST} AND {TF}"

    def per_gpu(title: str, field: str, unit: str, agg: str = "mean") -> dict[str, Any]:
        return lay.panel(
            title,
            "timeseries",
            [
                target(
                    f'SELECT {agg}("{field}") FROM {GPU_M} WHERE {where} {BY_TIME}, "gpu" fill(null)',
                    alias="GPU $tag_gpu",
                )
            ],
            unit=unit,
        )

    panels = [
        per_gpu("GPU temperature", "temp_c", "celsius"),
        per_gpu("Memory temperature", "mem_temp_c", "celsius"),
        per_gpu("Power (NVML power usage)", "power_w", "watt"),
        per_gpu("Instantaneous power (field 186)", "power_instant_w", "watt"),
        per_gpu("Utilization", "util_pct", "percent"),
        per_gpu("SM clock", "sm_clock_mhz", "MHz"),
        per_gpu("Memory used", "mem_used_bytes", "bytes"),
        per_gpu("Fan (GPUs with their own fans)", "fan_pct", "percent"),
        lay.panel(
            "PCIe throughput",
            "timeseries",
            [
                target(
                    f'SELECT mean("pcie_rx_bytes_per_s") FROM {GPU_M} WHERE {where} {BY_TIME}, "gpu" fill(null)',
                    "A",
                    alias="rx GPU $tag_gpu",
                ),
                target(
                    f'SELECT mean("pcie_tx_bytes_per_s") FROM {GPU_M} WHERE {where} {BY_TIME}, "gpu" fill(null)',
                    "B",
                    alias="tx GPU $tag_gpu",
                ),
            ],
            unit="Bps",
        ),
        lay.panel(
            "Energy per interval (NVML counter)",
            "timeseries",
            [
                target(
                    f'SELECT non_negative_difference(last("energy_j")) FROM {GPU_M} WHERE {where} {BY_TIME}, "gpu"',
                    alias="GPU $tag_gpu",
                )
            ],
            unit="joule",
        ),
        lay.panel(
            "Clock-event reasons (bitmask, max per interval)",
            "timeseries",
            [
                target(
                    f'SELECT max("clock_event_reasons") FROM {GPU_M} WHERE {where} {BY_TIME}, "gpu" fill(null)',
                    alias="GPU $tag_gpu",
                )
            ],
            description="0x1 idle, 0x4 SW power cap, 0x8 HW slowdown, 0x20 SW thermal, "
            "0x40 HW thermal, 0x80 power brake",
        ),
        lay.panel(
            "Host CPU and load",
            "timeseries",
            [
                target(f'SELECT mean("cpu_pct") FROM {NODE_M} WHERE {where} {BY_TIME} fill(null)', "A", alias="cpu %"),
                target(f'SELECT mean("load1") FROM {NODE_M} WHERE {where} {BY_TIME} fill(null)', "B", alias="load1"),
            ],
        ),
        lay.panel(
            "Host memory used",
            "timeseries",
            [target(f'SELECT mean("mem_used_bytes") FROM {NODE_M} WHERE {where} {BY_TIME} fill(null)', alias="used")],
            unit="bytes",
        ),
        lay.panel(
            "Host hwmon temperatures",
            "timeseries",
            [target(f"SELECT mean(/^(mean_)?hwmon_.*_c$/) FROM {NODE_M} WHERE {where} {BY_TIME} fill(null)")],
            description="Rollups name these fields mean_hwmon_<sensor>_c",
            unit="celsius",
        ),
        lay.panel(
            "Acoustic level (proxy estimates; microphone where present)",
            "timeseries",
            [
                target(
                    f'SELECT mean("est_dba") FROM "acoustic" WHERE "source" = \'proxy\' AND {where} '
                    f'{BY_TIME}, "gpu" fill(null)',
                    "A",
                    alias="proxy GPU $tag_gpu",
                ),
                target(
                    f'SELECT mean("laeq_db") FROM "acoustic" WHERE "source" = \'mic\' AND {where} {BY_TIME} fill(null)',
                    "B",
                    alias="microphone LAeq",
                ),
            ],
            w=24,
            unit="dBA",
            description="The proxy series without a GPU number is the node's estimate",
        ),
    ]
    return dashboard(
        "gpuprobe-node",
        "gpuprobe / Node detail",
        "One node: every GPU's telemetry, the host and its acoustics.",
        panels,
        [RP_VAR, ONE_HOST_VAR],
    )


def gpu_thermal() -> dict[str, Any]:
    lay = Layout()
    where = f"{HOST} AND {GPU} AND {TF}"
    model_where = f"\"kind\" = 'thermal' AND {HOST} AND {GPU} AND {TF}"
    panels = [
        lay.panel(
            "GPU and memory temperature",
            "timeseries",
            [
                target(
                    f'SELECT mean("temp_c") FROM {GPU_M} WHERE {where} {BY_TIME}, "gpu" fill(null)',
                    "A",
                    alias="GPU $tag_gpu",
                ),
                target(
                    f'SELECT mean("mem_temp_c") FROM {GPU_M} WHERE {where} {BY_TIME}, "gpu" fill(null)',
                    "B",
                    alias="memory $tag_gpu",
                ),
            ],
            w=24,
            unit="celsius",
        ),
        lay.panel(
            "Power driving the temperature",
            "timeseries",
            [
                target(
                    f'SELECT mean("power_instant_w") FROM {GPU_M} WHERE {where} {BY_TIME}, "gpu" fill(null)',
                    alias="GPU $tag_gpu",
                )
            ],
            unit="watt",
        ),
        lay.panel(
            "SM clock",
            "timeseries",
            [
                target(
                    f'SELECT mean("sm_clock_mhz") FROM {GPU_M} WHERE {where} {BY_TIME}, "gpu" fill(null)',
                    alias="GPU $tag_gpu",
                )
            ],
            unit="MHz",
        ),
        lay.panel(
            "Thermal slowdown and power cap (samples per interval)",
            "timeseries",
            [
                target(
                    f'SELECT count("temp_c") FROM "gpu" WHERE "clock_event_reasons" & {THERMAL_BITS} > 0 AND {where} '
                    f'{BY_TIME}, "gpu" fill(0)',
                    "A",
                    alias="thermal GPU $tag_gpu",
                ),
                target(
                    f'SELECT count("temp_c") FROM "gpu" WHERE "clock_event_reasons" & {POWER_BITS} > 0 AND {where} '
                    f'{BY_TIME}, "gpu" fill(0)',
                    "B",
                    alias="power cap GPU $tag_gpu",
                ),
            ],
            description="Raw samples only: empty beyond the raw retention",
        ),
        lay.panel(
            "Fan",
            "timeseries",
            [
                target(
                    f'SELECT mean("fan_pct") FROM {GPU_M} WHERE {where} {BY_TIME}, "gpu" fill(null)',
                    alias="GPU $tag_gpu",
                )
            ],
            unit="percent",
            description="Empty for passively cooled GPUs (NVML: not supported)",
        ),
        lay.panel(
            "Headroom to the slowdown threshold (latest fit)",
            "stat",
            [
                target(
                    f'SELECT last("headroom_c") FROM {MODEL_M} WHERE {model_where} GROUP BY "gpu"', alias="GPU $tag_gpu"
                )
            ],
            w=8,
            unit="celsius",
            description="slowdown threshold - predicted steady temperature at the power limit",
        ),
        lay.panel(
            "Predicted steady temperature at the power limit",
            "stat",
            [
                target(
                    f'SELECT last("t_pred_at_limit_c") FROM {MODEL_M} WHERE {model_where} GROUP BY "gpu"',
                    alias="GPU $tag_gpu",
                )
            ],
            w=8,
            unit="celsius",
        ),
        lay.panel(
            "Time throttled in the last probe",
            "stat",
            [
                target(
                    f'SELECT last("thermal_throttled_s") FROM {MODEL_M} WHERE {model_where} GROUP BY "gpu"',
                    "A",
                    alias="thermal GPU $tag_gpu",
                ),
                target(
                    f'SELECT last("power_capped_s") FROM {MODEL_M} WHERE {model_where} GROUP BY "gpu"',
                    "B",
                    alias="power cap GPU $tag_gpu",
                ),
            ],
            w=8,
            unit="s",
        ),
        lay.panel(
            "Fitted RC parameters per probe (gpuprobe model)",
            "table",
            [
                target(
                    'SELECT last("r_th_c_per_w") AS "R_th °C/W", last("tau_s") AS "τ s", last("t_amb_c") AS "T_amb '
                    '°C", '
                    f'last("method") AS "fit", last("step_sim_rmse_c") AS "step RMS °C", '
                    f'last("arx_sim_rmse_c") AS "ARX RMS °C", last("power_limit_w") AS "limit W", '
                    f'last("t_pred_at_limit_c") AS "T_ss at limit °C", last("slowdown_c") AS "slowdown °C", '
                    f'last("headroom_c") AS "headroom °C" FROM {MODEL_M} WHERE {model_where} GROUP BY "probe", "gpu"',
                    fmt="table",
                )
            ],
            w=24,
            h=9,
        ),
    ]
    return dashboard(
        "gpuprobe-gpu-thermal",
        "gpuprobe / GPU thermal",
        "Temperatures, the power that drives them, throttling, and the fitted RC model.",
        panels,
        [RP_VAR, ONE_HOST_VAR, GPU_VAR],
    )


def acoustics() -> dict[str, Any]:
    lay = Layout()
    where = f"{HOST} AND {TF}"
    model_where = f"\"kind\" = 'acoustic' AND {HOST} AND {TF}"
    panels = [
        lay.panel(
            "Node level: proxy estimate and microphone",
            "timeseries",
            [
                target(
                    f'SELECT mean("est_dba") FROM "acoustic" WHERE "source" = \'proxy\' AND "gpu" = \'\' AND '
                    f'{where} {BY_TIME}, "host" fill(null)',
                    "A",
                    alias="proxy $tag_host",
                ),
                target(
                    f'SELECT mean("laeq_db") FROM "acoustic" WHERE "source" = \'mic\' AND {where} '
                    f'{BY_TIME}, "host" fill(null)',
                    "B",
                    alias="microphone $tag_host",
                ),
            ],
            w=24,
            unit="dBA",
        ),
        lay.panel(
            "Per-GPU proxy (estimate)",
            "timeseries",
            [
                target(
                    f'SELECT mean("est_dba") FROM "acoustic" WHERE "source" = \'proxy\' AND "gpu" != \'\' AND {where} '
                    f'{BY_TIME}, "host", "gpu" fill(null)',
                    alias="$tag_host GPU $tag_gpu",
                )
            ],
            unit="dBA",
        ),
        lay.panel(
            "Microphone LAeq (1 s) and LAF (fast)",
            "timeseries",
            [
                target(
                    f'SELECT mean("laeq_db") FROM "acoustic" WHERE "source" = \'mic\' AND {where} '
                    f'{BY_TIME}, "host" fill(null)',
                    "A",
                    alias="LAeq $tag_host",
                ),
                target(
                    f'SELECT max("laf_db") FROM "acoustic" WHERE "source" = \'mic\' AND {where} '
                    f'{BY_TIME}, "host" fill(null)',
                    "B",
                    alias="LAF max $tag_host",
                ),
            ],
            unit="dBA",
        ),
        lay.panel(
            "Power over the TDP threshold (tdp_flag samples per interval)",
            "timeseries",
            [
                target(
                    f'SELECT count("tdp_flag") FROM "acoustic" WHERE "tdp_flag" = true AND {where} {BY_TIME}, "host" '
                    "fill(0)",
                    alias="$tag_host",
                )
            ],
            description="Lulla et al. (2025): power above k·TDP as a fan-noise flag",
        ),
        lay.panel(
            "Proxy levels per GPU (gpuprobe model)",
            "table",
            [
                target(
                    'SELECT last("idle_dba") AS "idle dBA", last("steady_dba") AS "steady dBA", last("max_dba") AS '
                    '"max dBA", '
                    f'last("outlier") AS "louder" FROM {MODEL_M} WHERE {model_where} AND "gpu" != \'\' '
                    f'GROUP BY "probe", "host", "gpu"',
                    fmt="table",
                )
            ],
        ),
        lay.panel(
            "Calibration against the microphone (gpuprobe model)",
            "table",
            [
                target(
                    f'SELECT last("mic_offset_db") AS "mic - proxy dB", last("mic_slope") AS "slope", '
                    'last("mic_intercept_db") AS "intercept dB", last("mic_r2") AS "R²", last("mic_rmse_db") AS "RMS '
                    'dB", '
                    f'last("mic_pairs") AS "pairs" FROM {MODEL_M} WHERE {model_where} AND "gpu" = \'\' GROUP BY '
                    '"probe", "host"',
                    fmt="table",
                )
            ],
            w=24,
            h=7,
        ),
    ]
    return dashboard(
        "gpuprobe-acoustics",
        "gpuprobe / Acoustics",
        "Acoustic proxy estimates per GPU and node, microphone levels, and their calibration.",
        panels,
        [RP_VAR, HOST_VAR],
    )


def probe_efficiency() -> dict[str, Any]:
    lay = Layout()
    eff = f"\"kind\" = 'efficiency' AND {PROBE} AND {HOST} AND {TF}"
    panels = [
        lay.panel(
            "Throughput",
            "timeseries",
            [
                target(
                    f'SELECT mean("samples_per_s") FROM {TRAINER_M} WHERE {PROBE} AND {HOST} AND {TF} '
                    f'{BY_TIME}, "host", "gpu" fill(null)',
                    alias="$tag_host GPU $tag_gpu",
                )
            ],
            unit="samples/s",
        ),
        lay.panel(
            "Power per node",
            "timeseries",
            [target(_sum_of_gpus("power_w", HOST, "host"), alias="$tag_host")],
            unit="watt",
        ),
        lay.panel(
            "Probe events",
            "table",
            [
                target(
                    f'SELECT "phase", "kind", "status", "workload" FROM {PROBE_M} WHERE {PROBE} AND {HOST} AND {TF} '
                    f'GROUP BY "host"',
                    fmt="table",
                )
            ],
            w=24,
            h=7,
        ),
        lay.panel(
            "Samples per joule per GPU (steady phase)",
            "bargauge",
            [
                target(
                    f'SELECT last("samples_per_j") FROM {MODEL_M} WHERE {eff} AND "gpu" != \'\' GROUP BY "host", "gpu"',
                    alias="$tag_host GPU $tag_gpu",
                )
            ],
            unit="samples/J",
        ),
        lay.panel(
            "Energy per node (NVML counter)",
            "bargauge",
            [
                target(
                    f'SELECT last("probe_energy_j") FROM {MODEL_M} WHERE {eff} AND "gpu" = \'\' GROUP BY "host"',
                    "A",
                    alias="$tag_host whole probe",
                ),
                target(
                    f'SELECT last("steady_energy_j") FROM {MODEL_M} WHERE {eff} AND "gpu" = \'\' GROUP BY "host"',
                    "B",
                    alias="$tag_host steady phase",
                ),
            ],
            unit="joule",
        ),
        lay.panel(
            "Carbon",
            "stat",
            [
                target(
                    f'SELECT sum("kg") FROM (SELECT last("kg_co2e") AS "kg" FROM {MODEL_M} WHERE {eff} '
                    f'AND "gpu" != \'\' GROUP BY "host", "gpu") WHERE {TF}'
                )
            ],
            w=6,
            h=4,
            unit="kg CO2e",
            decimals=4,
        ),
        lay.panel(
            "Cost",
            "stat",
            [
                target(
                    f'SELECT sum("c") FROM (SELECT last("cost") AS "c" FROM {MODEL_M} WHERE {eff} AND "gpu" != \'\' '
                    f'GROUP BY "host", "gpu") WHERE {TF}'
                )
            ],
            w=6,
            h=4,
            decimals=2,
            description="Empty when the model ran without --price-per-gpu-hour",
        ),
        lay.panel(
            "Idle power (baseline)",
            "stat",
            [
                target(
                    f'SELECT last("idle_power_w") FROM {MODEL_M} WHERE {eff} AND "gpu" = \'\' GROUP BY "host"',
                    alias="$tag_host",
                )
            ],
            w=12,
            h=4,
            unit="watt",
        ),
        lay.panel(
            "Efficiency per GPU (gpuprobe model)",
            "table",
            [
                target(
                    f'SELECT last("samples_per_s") AS "samples/s", last("mean_power_w") AS "mean W", '
                    f'last("peak_power_w") AS "peak W", last("samples_per_j") AS "samples/J", '
                    f'last("j_per_sample") AS "J/sample", last("idle_power_w") AS "idle W", '
                    f'last("steady_energy_j") AS "steady J", last("probe_energy_j") AS "probe J", '
                    f'last("kg_co2e") AS "kg CO2e", last("outlier") AS "less efficient" FROM {MODEL_M} '
                    f'WHERE {eff} AND "gpu" != \'\' GROUP BY "host", "gpu"',
                    fmt="table",
                )
            ],
            w=24,
            h=9,
        ),
        lay.panel(
            "Thermal fits of the probe (gpuprobe model)",
            "table",
            [
                target(
                    'SELECT last("r_th_c_per_w") AS "R_th °C/W", last("tau_s") AS "τ s", last("t_amb_c") AS "T_amb '
                    '°C", '
                    f'last("headroom_c") AS "headroom °C" FROM {MODEL_M} WHERE "kind" = \'thermal\' AND {PROBE} AND '
                    f"{HOST} "
                    f'AND "gpu" != \'\' AND {TF} GROUP BY "host", "gpu"',
                    fmt="table",
                )
            ],
            w=24,
            h=9,
        ),
    ]
    return dashboard(
        "gpuprobe-probe-efficiency",
        "gpuprobe / Probe efficiency",
        "One probe: throughput, power, energy, samples per joule, carbon and cost.",
        panels,
        [PROBE_VAR, RP_VAR, HOST_VAR],
        time_from="now-3h",
    )


STUDY_VAR = variable(
    "probe", f'SHOW TAG VALUES FROM {MODEL_M} WITH KEY = "probe" WHERE "kind" = \'study\'', "study", multi=False
)
STUDY_HOST_VAR = variable(
    "host", f'SHOW TAG VALUES FROM {PROBE_M} WITH KEY = "host" WHERE "probe" =~ /^$probe$/', "host"
)
STUDY_GROUP = '"gpu_model", "instance_type", "virt", "region", "workload", "batch_size", "power_limit"'
STUDY_ALIAS = "$tag_gpu_model $tag_virt $tag_instance_type $tag_workload b$tag_batch_size $tag_power_limit"


def study() -> dict[str, Any]:
    lay = Layout()
    groups = f"\"kind\" = 'study' AND {PROBE} AND {TF}"
    trainer = f"{PROBE} AND {HOST} AND {TF}"
    panels = [
        lay.panel(
            "Samples per joule per group (gpuprobe study report)",
            "bargauge",
            [
                target(
                    f'SELECT last("samples_per_j") FROM {MODEL_M} WHERE {groups} GROUP BY {STUDY_GROUP}',
                    alias=STUDY_ALIAS,
                )
            ],
            unit="samples/J",
            description="Sum of samples/s over the sum of mean power of the group's GPUs in their steady windows",
        ),
        lay.panel(
            "Throughput per GPU per group (gpuprobe study report)",
            "bargauge",
            [
                target(
                    f'SELECT last("samples_per_s") FROM {MODEL_M} WHERE {groups} GROUP BY {STUDY_GROUP}',
                    alias=STUDY_ALIAS,
                )
            ],
            unit="samples/s",
        ),
        lay.panel(
            "Groups (gpuprobe study report)",
            "table",
            [
                target(
                    'SELECT last("point") AS "point", last("samples_per_s") AS "samples/s per GPU", '
                    'last("samples_per_j") AS "samples/J", last("j_per_sample") AS "J/sample", '
                    'last("mean_power_w") AS "mean W", last("power_limit_w") AS "enforced limit W", '
                    'last("peak_temp_c") AS "peak °C", last("headroom_c") AS "headroom °C", '
                    'last("est_dba") AS "proxy dBA", last("cost_per_million_samples_usd") AS "USD per 1M samples", '
                    'last("virt_overhead_pct") AS "virt overhead %", last("gpus") AS "GPUs", '
                    'last("refusals") AS "refused", last("energy_optimal") AS "energy-optimal", '
                    f'last("time_optimal") AS "time-optimal", last("simulated") AS "simulated" FROM {MODEL_M} '
                    f"WHERE {groups} GROUP BY {STUDY_GROUP}",
                    fmt="table",
                )
            ],
            w=24,
            h=10,
            description="simulated = the throughput is the GPU simulator's performance model (trainer device=sim)",
        ),
    ]
    throughput = lay.panel(
        "Throughput and the study point",
        "timeseries",
        [
            target(
                f'SELECT mean("samples_per_s") FROM {TRAINER_M} WHERE {trainer} {BY_TIME}, "host", "gpu" fill(null)',
                "A",
                alias="$tag_host GPU $tag_gpu samples/s",
            ),
            target(
                f'SELECT max("point") FROM {TRAINER_M} WHERE {trainer} {BY_TIME}, "host" fill(null)',
                "B",
                alias="point $tag_host",
            ),
        ],
        w=24,
        unit="samples/s",
        description="The trainers' samples_per_s; the point index each node ran (right axis)",
    )
    throughput["fieldConfig"]["overrides"] = [
        {
            "matcher": {"id": "byFrameRefID", "options": "B"},
            "properties": [
                {"id": "custom.axisPlacement", "value": "right"},
                {"id": "unit", "value": "none"},
                {"id": "custom.lineInterpolation", "value": "stepAfter"},
            ],
        }
    ]
    by_point = lay.panel(
        "Steady throughput by point (trainer reports)",
        "xychart",
        [
            target(
                f'SELECT "point", "samples_per_s" FROM {TRAINER_M} WHERE {trainer} AND "phase" = \'steady\' '
                'GROUP BY "host", "gpu"',
                fmt="table",
            )
        ],
        unit="samples/s",
        description="Every steady report of the study: x the point index, y samples/s (device=sim: simulated)",
    )
    by_point["options"] = {"dims": {"x": "point"}, "series": [], "seriesMapping": "auto"}
    panels += [throughput, by_point]
    panels += [
        lay.panel(
            "Refused points",
            "table",
            [
                target(
                    f'SELECT "gpu", "point", "workload", "batch_size", "power_limit", "message" FROM {PROBE_M} WHERE '
                    f'{PROBE} AND {HOST} AND "kind" = \'point_refused\' AND {TF} GROUP BY "host"',
                    fmt="table",
                )
            ],
            description="Points a node could not run, with its reason",
        ),
        lay.panel(
            "Study events",
            "table",
            [
                target(
                    'SELECT "kind", "phase", "status", "gpu", "point", "batch_size", "power_limit", "power_limit_w", '
                    f'"message" FROM {PROBE_M} WHERE {PROBE} AND {HOST} AND {TF} GROUP BY "host"',
                    fmt="table",
                )
            ],
            w=24,
            h=9,
        ),
    ]
    return dashboard(
        "gpuprobe-study",
        "gpuprobe / Study",
        "One study: samples per joule and throughput per group and point, the points each node ran, refusals.",
        panels,
        [STUDY_VAR, STUDY_HOST_VAR],
        time_from="now-7d",
    )


COLLECTOR_NOTE = """\
**Collector health is not in InfluxDB.** The collector's self-metrics are Prometheus metrics on
`--metrics-listen` (`gpuprobe_collector_streams_open`, `gpuprobe_collector_batches_received`,
`gpuprobe_collector_lines_accepted`, WAL and sink counters; docs of the collector). Add a Prometheus
data source scraping it to chart them. The panels here show what reaches InfluxDB: sample rates and
the freshness of each host's data (a stalled agent *or* collector shows up as a rate that drops to
zero), and the agents' own counters (`agent` measurement, written by the collector from each batch's
stats: deltas per batch, `spool_bytes` a gauge)."""


def health() -> dict[str, Any]:
    lay = Layout()
    where = f"{HOST} AND {TF}"
    panels = [
        lay.text("About this dashboard", COLLECTOR_NOTE, h=6),
        lay.panel(
            "GPU samples per second per host",
            "timeseries",
            [
                target(
                    f'SELECT count("temp_c") / 10 FROM "gpu" WHERE {where} GROUP BY time(10s), "host" fill(0)',
                    alias="$tag_host",
                )
            ],
            unit="samples/s",
            description="Counted in 10 s windows; 10 Hz · GPUs when healthy",
        ),
        lay.panel(
            "Other measurements: points per 10 s per host",
            "timeseries",
            [
                target(
                    f'SELECT count("cpu_pct") FROM "node" WHERE {where} GROUP BY time(10s), "host" fill(0)',
                    "A",
                    alias="node $tag_host",
                ),
                target(
                    f'SELECT count("est_dba") FROM "acoustic" WHERE {where} GROUP BY time(10s), "host" fill(0)',
                    "B",
                    alias="acoustic $tag_host",
                ),
            ],
        ),
        lay.panel(
            "Last sample per GPU",
            "table",
            [
                target(
                    f'SELECT last("temp_c") AS "temp °C" FROM "gpu" WHERE {where} GROUP BY "host", "gpu"', fmt="table"
                )
            ],
            description="The time column is the newest sample: its age is how far behind that GPU's data is",
        ),
        lay.panel(
            "Agent spool",
            "timeseries",
            [
                target(
                    f'SELECT last("spool_bytes") FROM "agent" WHERE {where} {BY_TIME}, "host" fill(previous)',
                    alias="$tag_host",
                )
            ],
            unit="bytes",
            description="Bytes waiting in the agent's durable spool",
        ),
        lay.panel(
            "Agent drops and errors",
            "timeseries",
            [
                target(
                    f'SELECT sum("dropped_samples") FROM "agent" WHERE {where} {BY_TIME}, "host" fill(0)',
                    "A",
                    alias="dropped samples $tag_host",
                ),
                target(
                    f'SELECT sum("dropped_batches") FROM "agent" WHERE {where} {BY_TIME}, "host" fill(0)',
                    "B",
                    alias="dropped batches $tag_host",
                ),
                target(
                    f'SELECT sum("read_errors") FROM "agent" WHERE {where} {BY_TIME}, "host" fill(0)',
                    "C",
                    alias="read errors $tag_host",
                ),
                target(
                    f'SELECT sum("missed_ticks") FROM "agent" WHERE {where} {BY_TIME}, "host" fill(0)',
                    "D",
                    alias="missed ticks $tag_host",
                ),
            ],
            description="Counters are per-batch deltas, so a sum per interval is the count in it",
        ),
        lay.panel(
            "Agent batches reporting (stats points per 10 s)",
            "timeseries",
            [
                target(
                    f'SELECT count("spool_bytes") FROM "agent" WHERE {where} GROUP BY time(10s), "host" fill(0)',
                    alias="$tag_host",
                )
            ],
        ),
    ]
    return dashboard(
        "gpuprobe-health",
        "gpuprobe / Agent and collector health",
        "What reaches InfluxDB per host, and the agents' own counters.",
        panels,
        [RP_VAR, HOST_VAR],
        time_from="now-15m",
    )


DASHBOARDS = {
    "fleet-overview.json": fleet,
    "node-detail.json": node,
    "gpu-thermal.json": gpu_thermal,
    "acoustics.json": acoustics,
    "probe-efficiency.json": probe_efficiency,
    "health.json": health,
    "gpu-health.json": gpu_health_dashboard,
    "study.json": study,
}


def render() -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    return {name: json.dumps(build(), indent=2, ensure_ascii=False) + "\n" for name, build in DASHBOARDS.items()}


def default_out() -> Path:
    return Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "dashboards"


def default_alerting_out() -> Path:
    return Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "provisioning" / "alerting"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m gpuprobe.dashboards.grafana", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="folder to write into (default: deploy/grafana/dashboards)"
    )
    parser.add_argument(
        "--alerting-out",
        type=Path,
        default=None,
        help="folder for the alert rules (default: deploy/grafana/provisioning/alerting)",
    )
    args = parser.parse_args(argv)
    for out, files in (
        (args.out or default_out(), render()),
        (args.alerting_out or default_alerting_out(), render_alerting(DASHBOARDS)),
    ):
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (out / name).write_text(text, encoding="utf-8")
            print(out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
