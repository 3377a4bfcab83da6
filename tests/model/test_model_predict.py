"""``gpuprobe model predict``: a fitted model applied to another window, or asked what a GPU reaches at a power.

In process on a two-stage node with the node's inlet simulated here (fitted on one window, predicting
another with other loads), and on the real eight-H100 recordings of the shared realdata folder (skipped
where absent): both imported with ``gpuprobe import nvidia-smi`` into a test InfluxDB, the model fitted on
the 1 348 s recording with ``gpuprobe model`` predicting the 266 s one through ``gpuprobe model predict``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from test_model_stages import Truth, fit_node, simulate_node

from gpuprobe.devservices import InfluxDBDatabase
from gpuprobe.model.output import _clean
from gpuprobe.model.predict import load_fitted, predict_window, steady_answer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "importer"))
from import_helpers import influx_args, realdata  # the importer tests' realdata lookup

pytestmark = pytest.mark.slow  # seconds per GPU

TRUTH = Truth()  # two stages and the node's inlet, no fan


def fitted_document(samples: list[dict[str, np.ndarray]]) -> dict[str, object]:
    """What `gpuprobe model` writes of each GPU's thermal fit (the JSON's own cleaning)."""
    fits = fit_node(samples, with_fan=False)
    gpus = [
        {"host": "sim", "gpu": str(i), "slowdown_c": 87.0, "thermal": _clean(dataclasses.asdict(f))}
        for i, f in enumerate(fits)
    ]
    return {"gpus": gpus}


@pytest.fixture(scope="module")
def fitted() -> dict[str, object]:
    return fitted_document(simulate_node(TRUTH))


def test_a_fitted_model_predicts_another_window_of_other_loads(fitted: dict[str, object]) -> None:
    gpus, skipped = load_fitted(fitted)
    assert len(gpus) == 4 and skipped == []
    other = simulate_node(TRUTH, seed=7, phases_s=(40.0, 60.0, 200.0, 150.0), levels_w=[(90, 250, 500)] * 4)
    for g, s in zip(gpus, other, strict=True):
        result = predict_window(
            g, s["t_ns"], s["temp"], s["power"], power_is_average=False, node_w=s["node"], fan_pct=None
        )
        assert result is not None
        # whole-degree readings alone are 0.29 °C RMS and 0.5 °C at most
        assert result.rmse_c < 0.45 and abs(result.bias_c) < 0.25 and result.max_abs_error_c < 1.2, result
        assert result.samples == len(s["t_ns"])
    # an inlet model without the node's power cannot be driven: said, not guessed
    s = other[0]
    assert (
        predict_window(gpus[0], s["t_ns"], s["temp"], s["power"], power_is_average=False, node_w=None, fan_pct=None)
        is None
    )


def test_the_steady_temperature_at_a_power_and_the_time_to_reach_it_follow_the_truth(fitted: dict[str, object]) -> None:
    gpus, _ = load_fitted(fitted)
    power_w, within_c = 600.0, 1.0
    for g in gpus:
        answer = steady_answer(g, power_w, node_gpus=4, within_c=within_c)
        stages = [
            (TRUTH.r_fast, TRUTH.tau_fast_s, power_w),
            (TRUTH.r_slow, TRUTH.tau_slow_s, power_w),
            (TRUTH.k_in, TRUTH.tau_in_s, 4 * power_w),
        ]
        true_steady = TRUTH.t_amb_c + sum(r * p for r, _, p in stages)
        assert answer.steady_c == pytest.approx(true_steady, abs=1.0)
        assert answer.headroom_c == pytest.approx(87.0 - answer.steady_c)
        # the truth's own step from the fitted window's idle power: first time within 1 °C of its steady value
        assert g.power_low_w is not None
        t_s = np.arange(0, 3000, 0.1)
        gap = sum(r * p * (1 - g.power_low_w / power_w) * np.exp(-t_s / tau) for r, tau, p in stages)
        true_reach = float(t_s[np.argmax(gap <= within_c)])
        assert answer.time_to_within_s == pytest.approx(true_reach, rel=0.15)
        # a given inlet temperature replaces T_amb and the node's air
        at_inlet = steady_answer(g, power_w, node_gpus=4, inlet_c=30.0)
        assert at_inlet.steady_c == pytest.approx(30.0 + (TRUTH.r_fast + TRUTH.r_slow) * power_w, abs=1.0)


H100_COLUMNS = "time=timestamp,gpu=gpu_index,temp_c=temperature_C,power_w=power_W"
LONG = ("h100x8_voltagepark_nanogptPR643_b443a1c3_1348s.csv", "2025-09-24T03:17:04Z", "2025-09-24T03:39:33Z")
NEXT = (
    "h100x8_voltagepark_nanogptPR643_f4f827dd_idle_to_690W_266s.csv",
    "2025-09-24T03:41:43Z",
    "2025-09-24T03:46:10Z",
)
MEDIAN_RMSE_GOAL_C = 2.0  # issue 24: the 1 348 s recording's models predict the 266 s one to this median RMS


def gpuprobe(*args: str | Path) -> int:
    from gpuprobe.app.cli import main

    return main([str(a) for a in args])


def test_real_h100_model_of_the_long_recording_predicts_the_next(
    influxdb: InfluxDBDatabase, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logs = [realdata(name) for name, _, _ in (LONG, NEXT)]
    for log in logs:
        assert (
            gpuprobe("import", "nvidia-smi", "--host", "h100", "--columns", H100_COLUMNS, *influx_args(influxdb), log)
            == 0
        )
    fit_args = ("--hosts", "h100", "--holdout", "0.4", "--no-write-model", *influx_args(influxdb))
    assert gpuprobe("model", "--from", LONG[1], "--to", LONG[2], "--out", tmp_path / "fit", *fit_args) == 0
    (fitted_json,) = (tmp_path / "fit").glob("*.json")
    capsys.readouterr()
    out_json = tmp_path / "predict.json"
    status = gpuprobe(
        "model",
        "predict",
        fitted_json,
        "--from",
        NEXT[1],
        "--to",
        NEXT[2],
        "--hosts",
        "h100",
        "--json",
        out_json,
        "--out",
        tmp_path / "predict",
        *influx_args(influxdb),
    )
    printed = capsys.readouterr().out
    assert status == 0, printed
    document = json.loads(out_json.read_text())
    gpus = document["gpus"]
    assert sorted(int(g["gpu"]) for g in gpus) == list(range(8)), document["notes"]
    for g in gpus:
        assert {"host", "gpu", "rmse_c", "bias_c", "max_abs_error_c"} <= g.keys()
        assert g["host"] == "h100" and math.isfinite(g["rmse_c"]) and g["max_abs_error_c"] >= g["rmse_c"]
    median = float(np.median([g["rmse_c"] for g in gpus]))
    assert median == pytest.approx(document["median_rmse_c"])
    each = ", ".join(f"{g['gpu']}: {g['rmse_c']:.2f} ({g['bias_c']:+.2f})" for g in gpus)
    print(f"median RMS predicting the 266 s recording: {median:.2f} °C; RMS (bias) per GPU {each}", file=sys.stderr)
    assert median <= MEDIAN_RMSE_GOAL_C, [round(g["rmse_c"], 2) for g in gpus]
    assert f"median RMS {median:.2f}" in printed
    (page,) = (tmp_path / "predict").glob("predict-*.html")
    assert page.read_text().count("<img") == 1  # one node: one plot
    # the operator's question on the same fitted JSON: steady temperature, time to reach it, headroom
    steady_json = tmp_path / "steady.json"
    assert gpuprobe("model", "predict", fitted_json, "--power-w", "700", "--inlet-c", "30", "--json", steady_json) == 0
    answers = json.loads(steady_json.read_text())["gpus"]
    assert len(answers) == 8
    for a in answers:
        assert 30.0 + 0.02 * 700 < a["steady_c"] < 30.0 + 0.2 * 700, a  # R_th of an H100: a few hundredths °C/W
        assert a["time_to_within_s"] is not None and a["time_to_within_s"] > 0
        assert a["headroom_c"] == pytest.approx(a["slowdown_c"] - a["steady_c"])


def test_predict_options_need_the_predict_action(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpuprobe("model", "--from", "now-1h", "--power-w", "700") == 2
    assert "is for `gpuprobe model predict`" in capsys.readouterr().err
    assert gpuprobe("model", "predict", "missing.json", "--power-w", "700") == 2
    assert "missing.json" in capsys.readouterr().err
