"""The ``model`` points: written with the collector's line-protocol writer and read back from the
real InfluxDB bit for bit, floats included (fast: no probe, a hand-made result)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from gpuprobe.devservices import InfluxDBDatabase
from gpuprobe.influx.client import InfluxClient
from gpuprobe.influx.lineprotocol import float_text
from gpuprobe.influx.settings import InfluxSettings
from gpuprobe.model.acoustic import LevelStats
from gpuprobe.model.analysis import FleetTotals, NodeResult, Results
from gpuprobe.model.output import model_lines

END_NS = 1_700_000_000_123_456_789

# floats whose shortest text differs between repr and orjson (2.5e-05 / 0.000025, 1e-07 / 1e-7), that
# are not exact in binary, subnormal, the largest double, integral (InfluxDB's JSON drops the ".0"),
# and numpy's float64 as the fits return it
THERMAL = {
    "r_th_c_per_w": 0.1 + 0.2,
    "tau_s": np.float64(1 / 3),
    "t_amb_c": 2.5e-05,
    "t_pred_at_limit_c": 1e-07,
    "headroom_c": -12.345678901234567,
    "thermal_throttled_s": 5e-324,
    "power_capped_s": 1.7976931348623157e308,
}
EFFICIENCY = {
    "samples_per_s": 123456789.12345679,
    "mean_power_w": 71.0,
    "steady_energy_j": 1e16,
    "samples_per_j": float(np.float64(2 / 3)),
    "j_per_sample": 1.5,
    "idle_power_w": 9007199254740993.0,
    "probe_energy_j": 18446744.073,
}
ACOUSTIC = {"mean_dba": 47.25, "max_dba": 61.8, "idle_dba": 30.000000000000004, "steady_dba": 52.1}


def node_result() -> NodeResult:
    proxy = LevelStats(ACOUSTIC["mean_dba"], ACOUSTIC["max_dba"], ACOUSTIC["idle_dba"], ACOUSTIC["steady_dba"], 10)
    return NodeResult(
        host="rack 1,node=a",  # a tag value that needs escaping
        gpus=0,
        r_th_mean_c_per_w=THERMAL["r_th_c_per_w"],
        tau_mean_s=THERMAL["tau_s"],
        t_amb_mean_c=THERMAL["t_amb_c"],
        t_pred_at_limit_max_c=THERMAL["t_pred_at_limit_c"],
        headroom_min_c=THERMAL["headroom_c"],
        thermal_throttled_s=THERMAL["thermal_throttled_s"],
        power_capped_s=THERMAL["power_capped_s"],
        acoustic=proxy,
        acoustic_source="proxy",
        mic=None,
        calibration=None,
        samples_per_s=EFFICIENCY["samples_per_s"],
        mean_power_w=EFFICIENCY["mean_power_w"],
        steady_energy_j=EFFICIENCY["steady_energy_j"],
        samples_per_j=EFFICIENCY["samples_per_j"],
        j_per_sample=EFFICIENCY["j_per_sample"],
        idle_power_w=EFFICIENCY["idle_power_w"],
        probe_energy_j=EFFICIENCY["probe_energy_j"],
    )


def results() -> Results:
    fleet = FleetTotals(0, 1, 60.0, 1.0, 1.0, 1.0, 0.4, 0.4, 0.0, None, None, None)
    return Results(
        "p-roundtrip", "p-roundtrip", None, None, END_NS - 60 * 10**9, END_NS, {}, [], [node_result()], fleet, [], {}
    )


def test_model_points_are_written_as_the_collector_writes_floats() -> None:
    lines = model_lines(results())
    assert len(lines) == 3 and all(line.endswith(f" {END_NS}\n") for line in lines)
    text = "".join(lines)
    for name, value in {**THERMAL, **EFFICIENCY}.items():
        assert f"{name}={float_text(float(value))}" in text, name
    assert "t_amb_c=0.000025" in text and "mean_power_w=71.0" in text  # a float stays a float field
    assert "host=rack\\ 1\\,node\\=a" in text


def test_model_points_read_back_bit_for_bit(influxdb: InfluxDBDatabase) -> None:
    settings = InfluxSettings(url=influxdb.server.url, database=influxdb.name)
    with InfluxClient(settings) as client:
        assert client.write("".join(model_lines(results()))) == 3
        series = client.query('SELECT * FROM "model" GROUP BY "kind"')
    rows = {s.tags["kind"]: s.rows()[0] for s in series}
    assert rows.keys() == {"thermal", "acoustic", "efficiency"}
    for kind, expected in (("thermal", THERMAL), ("acoustic", ACOUSTIC), ("efficiency", EFFICIENCY)):
        row = rows[kind]
        assert row["time"] == END_NS and row["host"] == "rack 1,node=a" and row["probe"] == "p-roundtrip"
        for name, value in expected.items():
            assert float(row[name]).hex() == float(value).hex(), (kind, name, row[name], value)


def test_model_prints_no_library_lines_at_the_default_log_level(influxdb: InfluxDBDatabase, tmp_path: Path) -> None:
    """It printed about 14 `INFO httpx: HTTP Request: ...` lines, one per query."""
    base = [sys.executable, "-m", "gpuprobe.app"]
    args = ["model", "--from", "now-1h", "--influx-url", influxdb.server.url, "--influx-db", influxdb.name]
    args += ["--out", str(tmp_path / "out")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")}
    quiet = subprocess.run([*base, *args], capture_output=True, text=True, timeout=120, env=env)
    lines = (quiet.stdout + quiet.stderr).splitlines()
    assert not [line for line in lines if re.search(r" (INFO|DEBUG) (httpx|httpcore|urllib3)\b", line)], lines
    # the same run with --log-level debug (anywhere on the line) shows them: the queries were made
    loud = subprocess.run([*base, *args, "--log-level", "debug"], capture_output=True, text=True, timeout=120, env=env)
    assert "HTTP Request: " in loud.stderr, loud.stderr[-2000:]
