"""The fitting and bookkeeping pieces on synthetic series whose answers are known exactly (fast)."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest

from gpuprobe.energy import cumulative_energy, integral_j
from gpuprobe.influx.influxql import InfluxError, parse_results, quote_string
from gpuprobe.influx.lineprotocol import encode_line
from gpuprobe.model.acoustic import calibrate, energetic_mean, pair_levels
from gpuprobe.model.cli import parse_time
from gpuprobe.model.thermal import (
    REASON_HW_THERMAL,
    REASON_SW_POWER_CAP,
    THERMAL_REASONS,
    fit_arx,
    fit_thermal,
    throttled_seconds,
)

DT_S = 0.1


def rc_series(r: float, tau: float, t_amb: float, p_idle: float, p_load: float, n: int, up: int, down: int):  # type: ignore[no-untyped-def]
    """Exact RC response at 100 ms ticks (as the simulator computes it), read as whole degrees."""
    power = np.where((np.arange(n) >= up) & (np.arange(n) < down), p_load, p_idle)
    temp = np.empty(n)
    temp[0] = t_amb + r * p_idle
    for k in range(n - 1):
        steady = t_amb + r * power[k]
        temp[k + 1] = steady + (temp[k] - steady) * math.exp(-DT_S / tau)
    t_ns = (np.arange(n) * DT_S * 1e9).astype(np.int64) + 1_700_000_000 * 10**9
    return t_ns, np.floor(temp + 0.5), power


def test_step_fit_is_unbiased_on_integer_readings() -> None:
    t_ns, temp, power = rc_series(0.07, 30.0, 30.0, 70.0, 700.0, 3600, 300, 1800)
    fit = fit_thermal(t_ns, temp, power, None, power_is_average=False)
    assert fit.step is not None and fit.chosen == "output-error" and fit.model == "rc1"
    assert fit.step.r_th_c_per_w == pytest.approx(0.07, rel=0.01)
    assert fit.step.tau_s == pytest.approx(30.0, rel=0.01)
    assert fit.step.t_amb_c == pytest.approx(30.0, abs=0.3)


def test_arx_needs_resampling_on_100_ms_integer_readings() -> None:
    """What docs/models.md says: regressing raw 100 ms integer readings biases τ; 1 s bin means do not."""
    t_ns, temp, power = rc_series(0.07, 30.0, 30.0, 70.0, 700.0, 3600, 300, 1800)
    raw, binned = fit_arx(t_ns, temp, power, 0.1), fit_arx(t_ns, temp, power, 1.0)
    assert raw is not None and raw.rc is not None and binned is not None and binned.rc is not None
    raw_err, binned_err = abs(raw.rc.tau_s / 30 - 1), abs(binned.rc.tau_s / 30 - 1)
    assert binned_err < 0.01 and binned.rc.r_th_c_per_w == pytest.approx(0.07, rel=0.01)
    assert raw_err > 2 * binned_err


def test_heating_is_cut_where_thermal_slowdown_begins() -> None:
    t_ns, temp, power = rc_series(0.7, 4.0, 30.0, 16.0, 65.6, 400, 40, 250)
    reasons = np.zeros(len(t_ns), dtype=np.int64)
    reasons[150:250] = REASON_HW_THERMAL
    power = power.copy()
    power[150:250] *= 0.8  # what slowdown does to power; the RC fit must not see it
    fit = fit_thermal(t_ns, temp, power, reasons, power_is_average=False)
    heating = next(f for f in fit.step_fits if f.direction == "heating")
    assert heating.samples == 110
    assert any("slowdown" in n for n in fit.notes)
    assert fit.step is not None and fit.step.tau_s == pytest.approx(4.0, rel=0.05)


def test_no_load_step_means_no_step_fit() -> None:
    t_ns = (np.arange(200) * 1e8).astype(np.int64)
    fit = fit_thermal(t_ns, np.full(200, 40.0), np.full(200, 50.0), None, power_is_average=False)
    assert fit.step is None and fit.step_fits == [] and "no load step" in fit.notes[0]


def test_energy_counter_reset_is_bridged_with_power() -> None:
    t_ns = (np.arange(101) * 1e8).astype(np.int64)
    power = np.full(101, 200.0)
    counter = 1000.0 + 20.0 * np.arange(101)  # 200 W for 0.1 s = 20 J per sample
    counter[60:] = 20.0 * np.arange(41)  # the driver reloaded: the counter starts again from 0
    energy = cumulative_energy(t_ns, counter, power)
    assert energy.source == "counter" and energy.counter_resets == 1
    assert energy.between(int(t_ns[0]), int(t_ns[-1])) == pytest.approx(200.0 * 10.0)
    assert energy.between(int(t_ns[10]) + 50_000_000, int(t_ns[20])) == pytest.approx(200.0 * 0.95)
    assert integral_j(t_ns, power, int(t_ns[0]), int(t_ns[-1])) == pytest.approx(2000.0)


def test_energy_without_a_counter_integrates_power() -> None:
    t_ns = (np.arange(11) * 1e9).astype(np.int64)
    energy = cumulative_energy(t_ns, np.full(11, np.nan), np.full(11, 50.0))
    assert energy.source == "integral" and energy.between(int(t_ns[0]), int(t_ns[-1])) == pytest.approx(500.0)


def test_throttled_time_holds_each_sample_until_the_next() -> None:
    t_ns = (np.arange(11) * 5e8).astype(np.int64)  # 0.5 s apart
    reasons = np.array(
        [
            0,
            0,
            REASON_HW_THERMAL,
            REASON_HW_THERMAL | REASON_SW_POWER_CAP,
            0,
            REASON_SW_POWER_CAP,
            0,
            0,
            0,
            0,
            REASON_HW_THERMAL,
        ]
    )
    assert throttled_seconds(t_ns, reasons, THERMAL_REASONS) == pytest.approx(1.0)  # the last sample has no length
    assert throttled_seconds(t_ns, reasons, REASON_SW_POWER_CAP) == pytest.approx(1.0)


def test_calibration_recovers_offset_slope_and_r2() -> None:
    rng = np.random.default_rng(3)
    proxy = rng.uniform(45, 75, 200)
    mic = 0.9 * proxy + 10.0 + rng.normal(0, 0.3, 200)
    c = calibrate(mic, proxy)
    assert c is not None and c.pairs == 200
    assert c.slope == pytest.approx(0.9, abs=0.01) and c.intercept_db == pytest.approx(10.0, abs=0.6)
    assert c.r2 is not None and c.r2 > 0.99
    assert c.offset_db == pytest.approx(float(np.mean(mic - proxy)))
    # the fan law's exponent the microphone supports, stored with the calibration: 0.9 of the proxy's 50
    assert c.fan_law_db_per_decade == pytest.approx(0.9 * 50, abs=0.5)
    assert calibrate(mic[:4], proxy[:4]) is None


def test_microphone_windows_pair_with_the_proxy_of_the_same_second() -> None:
    proxy_t = (np.arange(100) * 1e8).astype(np.int64)  # 10 Hz over 10 s
    proxy = np.where(proxy_t < 5 * 10**9, 50.0, 60.0)
    mic_t = (np.arange(1, 11) * 1e9).astype(np.int64)  # LAeq over the second ending here
    mics, proxies = pair_levels(mic_t, np.full(10, 70.0), proxy_t, proxy)
    assert len(mics) == 10
    assert proxies[3] == pytest.approx(50.0) and proxies[6] == pytest.approx(60.0)
    assert proxies[4] == pytest.approx(energetic_mean(np.array([50.0] * 9 + [60.0])))


def test_energetic_mean_weights_loud_moments() -> None:
    assert energetic_mean(np.array([60.0, 60.0])) == pytest.approx(60.0)
    assert energetic_mean(np.array([50.0, 60.0])) == pytest.approx(10 * math.log10((1e5 + 1e6) / 2))


def test_chunked_answers_are_joined_per_series() -> None:
    chunk = {
        "results": [
            {
                "statement_id": 0,
                "series": [
                    {
                        "name": "gpu",
                        "tags": {"host": "a"},
                        "columns": ["time", "v"],
                        "values": [[1, 1.0]],
                        "partial": True,
                    }
                ],
                "partial": True,
            }
        ]
    }
    last = {
        "results": [
            {
                "statement_id": 0,
                "series": [{"name": "gpu", "tags": {"host": "a"}, "columns": ["time", "v"], "values": [[2, 2.0]]}],
            }
        ]
    }
    series = parse_results(json.dumps(chunk) + "\n" + json.dumps(last) + "\n")
    assert len(series) == 1 and series[0].column("v") == [1.0, 2.0]
    with pytest.raises(InfluxError, match="database not found"):
        parse_results(json.dumps({"results": [{"statement_id": 0, "error": "database not found: x"}]}))


def test_line_protocol_and_influxql_quoting() -> None:
    fields = {"tau_s": 3.5, "n": 2, "m": "step"}
    text = encode_line("model", {"host": "rack 1,a=b", "gpu": "", "kind": "thermal"}, fields, 7)
    assert text == 'model,host=rack\\ 1\\,a\\=b,kind=thermal tau_s=3.5,n=2i,m="step" 7\n'
    assert quote_string("it's") == "'it\\'s'"
    numpy_fields = {"x": np.float64(1.5), "n": np.int64(3), "b": np.bool_(True)}
    assert encode_line("m", {"a": "b"}, numpy_fields, 1) == "m,a=b x=1.5,n=3i,b=true 1\n"


def test_times_from_the_command_line() -> None:
    assert parse_time("2025-06-01T12:00:00Z") == 1748779200 * 10**9
    assert parse_time("2025-06-01T12:00:00") == 1748779200 * 10**9  # no zone: UTC
    assert parse_time("1748779200.5") == 1748779200_500_000_000
    assert abs(parse_time("now-2h") - (time.time_ns() - 7200 * 10**9)) < 10**9
    assert abs(parse_time("-30m") - (time.time_ns() - 1800 * 10**9)) < 10**9
    with pytest.raises(ValueError, match="not a time"):
        parse_time("yesterday")
