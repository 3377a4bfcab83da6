"""A recording that cannot give a GPU's R_th, τ and T_amb says "can't tell" instead of numbers.

T = T_amb + R_th·P at one steady power is one equation for two unknowns: a GPU that never leaves idle,
or a short recording at one load (a warm start), gets no parameters (a solver would return its bounds
or any pair on the line), and the reason. Checked on a first-order GPU simulated here (1 Hz, whole
degrees, whole watts), and on the real logs of the shared realdata folder beside the clone (skipped
where it is absent), read through the importer's own reader.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from gpuprobe.importer.formats import ReadOptions, Row, open_source, parse_columns
from gpuprobe.importer.timeparse import parse_timezone
from gpuprobe.model.analysis import GpuResult, ModelSettings, find_outliers
from gpuprobe.model.efficiency import GpuEfficiency
from gpuprobe.model.output import _gpu_fields
from gpuprobe.model.thermal import ThermalFit, ThermalInput, fit_thermal_node, rth_tamb_correlation

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "importer"))
from import_helpers import extract_single, realdata  # the importer tests' realdata lookup

pytestmark = pytest.mark.slow  # seconds per GPU

T0_NS = 1_700_000_000 * 10**9
R_TH, TAU_S, T_AMB = 0.12, 60.0, 27.0


def first_order(power_w: np.ndarray, t0_c: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """t_ns, whole-degree temperature and whole-watt power of a first-order GPU at 1 Hz."""
    rng = np.random.default_rng(seed)
    power = np.round(power_w + rng.normal(0, 0.4, len(power_w)))
    temp = np.empty(len(power))
    x, decay = t0_c, np.exp(-1.0 / TAU_S)
    for k, p in enumerate(power):
        temp[k] = x
        steady = T_AMB + R_TH * p
        x = steady + (x - steady) * decay
    t_ns = T0_NS + np.arange(len(power), dtype=np.int64) * 10**9
    return t_ns, np.round(temp), power


def fit(*gpus: tuple[np.ndarray, np.ndarray, np.ndarray]) -> list[ThermalFit]:
    return fit_thermal_node([ThermalInput(t, temp, p, None, True) for t, temp, p in gpus], holdout=0.4)


def test_an_idle_gpu_and_a_warm_start_at_one_load_get_no_parameters_a_step_gets_them() -> None:
    idle = first_order(np.full(1800, 62.0), T_AMB + R_TH * 62)
    step = first_order(np.concatenate([np.full(300, 60.0), np.full(900, 315.0), np.full(600, 60.0)]), T_AMB + 7.2)
    warm = first_order(np.full(160, 400.0) + 8 * np.sin(np.arange(160) / 9), 60.0)  # heating up at ~400 W
    fits = fit(idle, step)
    for f in (fits[0], fit(warm)[0]):
        assert f.cannot_tell == "not identifiable (no load step)", f.notes
        assert f.rc is None and f.step is None and f.arx is None
        assert (f.r_th_c_per_w, f.tau_s, f.t_amb_c) == (None, None, None)
        assert "a step of" in (f.cannot_tell_detail or "") and any(n.startswith("can't tell") for n in f.notes)
    good = fits[1]
    assert good.cannot_tell is None and good.rc is not None
    assert good.rc.r_th_c_per_w == pytest.approx(R_TH, rel=0.05)
    assert good.rc.tau_s == pytest.approx(TAU_S, rel=0.1)
    assert good.rc.t_amb_c == pytest.approx(T_AMB, abs=1.0)


def gpu_result(gpu: str, thermal: ThermalFit) -> GpuResult:
    efficiency = GpuEfficiency(
        0.0, None, None, None, None, None, None, None, None, 0.0, 0.0, "", 0, 0.0, 0.0, 0.0, None
    )  # fmt: skip
    return GpuResult("h", gpu, "H100", "", 0, thermal, None, 87.0, "", None, None, None, 0.0, 0.0, None, efficiency)


def test_a_gpu_it_cannot_tell_has_no_parameters_in_the_json_and_is_never_flagged() -> None:
    idle = first_order(np.full(1200, 62.0), T_AMB + R_TH * 62)
    load = np.concatenate([np.full(200, 60.0), np.full(600, 315.0), np.full(400, 60.0)])
    fits = fit(idle, *(first_order(load, T_AMB + 7.2, seed) for seed in (1, 2, 3)))
    results = [gpu_result(str(i), f) for i, f in enumerate(fits)]
    fields = _gpu_fields(results[0])["thermal"]
    assert fields["identifiable"] is False and fields["cannot_tell"] == "not identifiable (no load step)"
    assert not {"r_th_c_per_w", "tau_s", "t_amb_c"} & fields.keys()
    assert "identifiable" not in _gpu_fields(results[1])["thermal"]
    # three GPUs with parameters and one without: nothing is hotter or cooler than its peers
    assert find_outliers(results, ModelSettings()) == []


def test_the_r_th_t_amb_correlation_tells_one_load_from_a_step() -> None:
    t_ns = T0_NS + np.arange(1000, dtype=np.int64) * 10**9
    one_load = 400 + 5 * np.sin(np.arange(1000) / 20)
    with_step = np.where((np.arange(1000) > 200) & (np.arange(1000) < 700), 690.0, 75.0)
    one = rth_tamb_correlation(t_ns, one_load, TAU_S)
    stepped = rth_tamb_correlation(t_ns, with_step, TAU_S)
    assert one is not None and abs(one) > 0.995
    assert stepped is not None and abs(stepped) < 0.99


def real_gpus(
    path: Path, gpus: tuple[str, ...], columns: str = "", expect: str = "nvidia"
) -> list[tuple[np.ndarray, ...]]:
    """Each GPU's time, temperature and power, read by the importer's reader (``expect``: its command's
    format, ``amd`` for ``import amd-smi``)."""
    parsed = parse_columns([columns] if columns else [])
    options = ReadOptions(zone=parse_timezone("UTC"), host="h", columns=parsed, expect=expect)
    series: dict[str, list[tuple[int, float, float]]] = {gpu: [] for gpu in gpus}
    for row in open_source(path, options).rows():
        if isinstance(row, Row) and row.gpu in series and {"temp_c", "power_w"} <= row.fields.keys():
            series[row.gpu].append((row.time_ns, float(row.fields["temp_c"]), float(row.fields["power_w"])))
    out = []
    for gpu in gpus:
        a = np.array(series[gpu])
        out.append((a[:, 0].astype(np.int64), a[:, 1], a[:, 2]))
    return out


def fit_real_node(path: Path, gpus: tuple[str, ...], columns: str = "", expect: str = "nvidia") -> list[ThermalFit]:
    """A real node's GPUs fitted together, as ``gpuprobe model`` does (the node's power: their sum, so the
    inlet stage is fitted; held-out F = 0.4)."""
    data = real_gpus(path, gpus, columns, expect)
    times = data[0][0]
    node = sum(np.interp(times, t, p) for t, _, p in data)
    inputs = [ThermalInput(t, temp, p, None, True, node_w=np.interp(t, times, node)) for t, temp, p in data]
    return fit_thermal_node(inputs, holdout=0.4)


def test_real_h100nvl_idle_gpu_cannot_tell_and_the_loaded_one_fits(tmp_path: Path) -> None:
    log = extract_single(realdata("h100nvl_x4_hibagus_sc26_2gpu_idle_load_idle_nvdmon.csv.tar.gz"), tmp_path)
    idle, loaded = fit(*real_gpus(log, ("0", "2")))
    assert idle.cannot_tell == "not identifiable (no load step)" and idle.rc is None
    # before: R_th 1.37 °C/W and T_amb -50 °C, a solver bound, flagged as 84 % hotter than its peers
    assert loaded.cannot_tell is None and loaded.rc is not None
    assert 0.10 < loaded.rc.r_th_c_per_w < 0.15 and 40 < loaded.rc.tau_s < 80
    assert loaded.holdout_rmse_c is not None and loaded.holdout_rmse_c <= 1.0


def test_real_h100_short_warm_start_cannot_tell_the_longer_recording_can() -> None:
    columns = "time=timestamp,gpu=gpu_index,temp_c=temperature_C,power_w=power_W"
    short = realdata("h100x8_voltagepark_nanogptPR643_16a680b7_400W_heatup_158s.csv")
    longer = realdata("h100x8_voltagepark_nanogptPR643_f4f827dd_idle_to_690W_266s.csv")
    (warm,) = fit(*real_gpus(short, ("0",), columns))
    # before: R_th 0.037 °C/W, T_amb 33 °C, against 0.063-0.066 °C/W from the recordings with a step
    assert warm.cannot_tell == "not identifiable (no load step)" and warm.rc is None
    (stepped,) = fit(*real_gpus(longer, ("0",), columns))
    assert stepped.rc is not None and 0.055 < stepped.rc.r_th_c_per_w < 0.075
