"""A node that stores only the basics (no instantaneous power, no energy counter, no acoustics, no
trainer, no probe): the model still fits and reports, and says what it fell back to."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pytest

from gpuprobe.devservices import InfluxDBDatabase
from gpuprobe.model import InfluxSettings, ModelSettings, NoDataError, run

R, TAU, T_AMB = 0.1, 5.0, 25.0


def test_time_range_with_only_temperature_and_averaged_power(influxdb: InfluxDBDatabase, tmp_path: Path) -> None:
    n, dt = 600, 0.1
    instant = np.where((np.arange(n) >= 100) & (np.arange(n) < 350), 300.0, 50.0)
    temp = np.empty(n)
    temp[0] = T_AMB + R * 50.0
    for k in range(n - 1):
        steady = T_AMB + R * instant[k]
        temp[k + 1] = steady + (temp[k] - steady) * math.exp(-dt / TAU)
    averaged = np.array([instant[max(0, k - 9) : k + 1].mean() for k in range(n)])  # NVML's 1 s average
    start_ns = (time.time_ns() - 120 * 10**9) // 10**9 * 10**9
    lines = [
        f"gpu,gpu=0,host=old-node,model=Tesla\\ V100 temp_c={float(np.floor(temp[k] + 0.5))!r},"
        f"power_w={float(averaged[k])!r} {start_ns + int(k * dt * 1e9)}"
        for k in range(n)
    ]
    influxdb.write_lines(lines)
    settings = ModelSettings(
        influx=InfluxSettings(url=influxdb.server.url, database=influxdb.name),
        start_ns=start_ns,
        end_ns=start_ns + int((n - 1) * dt * 1e9),
        out_dir=tmp_path,
    )
    paths = run(settings)
    (g,) = paths.results.gpus
    assert g.thermal.power_source == "power_w"
    assert g.thermal.rc is not None
    assert g.thermal.rc.r_th_c_per_w == pytest.approx(R, rel=0.05)
    assert g.thermal.rc.tau_s == pytest.approx(TAU, rel=0.05)
    assert g.slowdown_c == 87.0 and g.slowdown_source == "table"  # V100
    assert g.power_limit_w is None and g.headroom_c is None  # no power_limit_w stored: nothing to predict
    e = g.efficiency
    assert e.energy_source == "integral"
    assert e.probe_energy_j == pytest.approx(float(np.sum(instant[:-1]) * dt), rel=0.01)
    assert e.samples_per_s is None and e.j_per_sample is None
    assert g.acoustic is None and paths.results.nodes[0].calibration is None
    assert any("time range without a probe" in note for note in paths.results.notes)
    document = json.loads(paths.json.read_text())
    assert document["gpus"][0]["efficiency"]["samples_per_j"] is None
    assert paths.html.exists() and "old-node" in paths.html.read_text()
    with pytest.raises(NoDataError, match="no probe 'missing'"):
        run(ModelSettings(influx=settings.influx, probe="missing", out_dir=tmp_path))
