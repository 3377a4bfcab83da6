"""The models recover the simulator's ground truth from a probe stored in a real InfluxDB.

The probe (simprobe.py): node-a with four L4s (one with a 30 % larger R_th), node-b with two H100s,
an A100 and an RTX 4090 (fans), time constants shortened to 3-5 s; the readings go through pynvml
at 10 Hz, as integer degrees and ~100 ms piecewise-constant power, exactly what the agent stores.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from simprobe import GRID_KG_PER_KWH, MIC_HOST, MIC_OFFSET_DB, PRICE_PER_GPU_HOUR, PUE, ProbeRun

from gpuprobe.model import InfluxSettings, ModelSettings, ReportPaths, fit
from gpuprobe.model.analysis import GpuResult, find_outliers
from gpuprobe.sim import thermal

pytestmark = pytest.mark.slow


def _gpu(report: ReportPaths, host: str, gpu: int) -> GpuResult:
    return next(g for g in report.results.gpus if (g.host, g.gpu) == (host, str(gpu)))


def test_thermal_fit_recovers_r_th_and_tau_within_5_percent(probe_run: ProbeRun, report: ReportPaths) -> None:
    profiles = set()
    for truth in probe_run.truths:
        g = _gpu(report, truth.host, truth.gpu)
        p = truth.profile
        profiles.add(p.name)
        for method, rc in (
            ("chosen", g.thermal.rc),
            ("step", g.thermal.step),
            ("arx", g.thermal.arx and g.thermal.arx.rc),
        ):
            assert rc, f"{truth.host}/{truth.gpu}: no {method} fit ({g.thermal.notes})"
            assert rc.r_th_c_per_w == pytest.approx(p.r_th_c_per_w, rel=0.05), (truth.host, truth.gpu, method)
            assert rc.tau_s == pytest.approx(p.tau_s, rel=0.05), (truth.host, truth.gpu, method)
            assert rc.t_amb_c == pytest.approx(p.ambient_c, abs=1.0), (truth.host, truth.gpu, method)
        # the predicted steady temperature at the power limit and the headroom follow from the fit
        limit = p.limit_default_w
        assert g.power_limit_w == pytest.approx(limit)
        assert g.t_pred_at_limit_c == pytest.approx(thermal.steady_temp_c(p, limit), abs=1.5)
        assert g.slowdown_c == p.slowdown_c and g.slowdown_source == "gpu"  # the gpu_info point, not a table
        assert g.headroom_c == pytest.approx(p.slowdown_c - thermal.steady_temp_c(p, limit), abs=1.5)
    assert {"L4", "H100-SXM5-80GB", "A100-SXM4-80GB", "RTX-4090"} <= profiles


def test_both_fits_simulate_the_measured_curve_and_the_output_error_model_is_chosen(report: ReportPaths) -> None:
    """On clean step responses both second opinions reproduce the measured temperature to within the integer
    rounding (RMS < 0.5 °C); the reported model is the output-error one, first order on this first-order
    physics (the parsimony rule), and it simulates the curve at least as well as the better second opinion."""
    for g in report.results.gpus:
        t = g.thermal
        assert t.step_sim_rmse_c is not None and t.step_sim_rmse_c < 0.5, (g.host, g.gpu)
        assert t.arx_sim_rmse_c is not None and t.arx_sim_rmse_c < 0.5, (g.host, g.gpu)
        assert t.chosen == "output-error" and t.model == "rc1", (g.host, g.gpu, t.candidates)
        assert t.fit_rmse_c is not None and t.fit_rmse_c <= min(t.step_sim_rmse_c, t.arx_sim_rmse_c) + 0.05
        assert t.holdout_rmse_c is not None and t.holdout_rmse_c == t.rc1_holdout_rmse_c
        assert t.rc is not None and t.r_th_c_per_w == t.rc.r_th_c_per_w and len(t.stages) == 1
        assert {f.direction for f in t.step_fits} == {"heating", "cooling"}


def test_time_throttled_matches_the_simulator(probe_run: ProbeRun, report: ReportPaths) -> None:
    """Thermal slowdown (node-a GPU 3, R_th 1.0 °C/W, reaches 92 °C) and the power cap (node-b: H100 at 100 %
    wants 760 W of 700, A100 at 90 % 401.5 W of 400) are counted from the clock-event reasons."""
    for truth in probe_run.truths:
        g = _gpu(report, truth.host, truth.gpu)
        slowed = truth.slowed_s(probe_run.start_ns, probe_run.end_ns)
        assert g.thermal_throttled_s == pytest.approx(slowed, abs=1.0), (truth.host, truth.gpu)
        assert (slowed > 1) == ((truth.host, truth.gpu) == ("node-a", 3))
        loaded_s = (truth.unload_tick_ns - truth.load_tick_ns) / 1e9
        p = truth.profile
        capped = p.idle_w + (p.peak_demand_w - p.idle_w) * truth.util_pct / 100 > p.limit_default_w
        expected = loaded_s if capped else 0.0
        assert capped == ((truth.host, truth.gpu) in {("node-b", 0), ("node-b", 2)})
        assert g.power_capped_s == pytest.approx(expected, abs=0.5), (truth.host, truth.gpu)


def test_probe_energy_within_1_percent_of_ground_truth(probe_run: ProbeRun, report: ReportPaths) -> None:
    total = 0.0
    for truth in probe_run.truths:
        g = _gpu(report, truth.host, truth.gpu)
        expected = truth.energy_j(probe_run.start_ns, probe_run.end_ns)
        total += expected
        assert g.efficiency.energy_source == "counter"
        assert g.efficiency.probe_energy_j == pytest.approx(expected, rel=0.01), (truth.host, truth.gpu)
        steady = (probe_run.steady_ns[truth.host], probe_run.cooldown_ns[truth.host])
        steady_j, steady_s = truth.energy_j(*steady), (steady[1] - steady[0]) / 1e9
        assert g.efficiency.steady_energy_j == pytest.approx(steady_j, rel=0.01)
        assert g.efficiency.mean_power_w == pytest.approx(steady_j / steady_s, rel=0.01)
        assert g.efficiency.idle_power_w == pytest.approx(truth.idle_w, rel=0.01)
        assert g.efficiency.samples_per_s == pytest.approx(truth.samples_per_s)
        samples = truth.samples_per_s * steady_s
        assert g.efficiency.samples_per_j == pytest.approx(samples / steady_j, rel=0.01)
        assert g.efficiency.j_per_sample == pytest.approx(steady_j / samples, rel=0.01)
    fleet = report.results.fleet
    assert fleet.probe_energy_j == pytest.approx(total, rel=0.01)
    kwh = total / 3.6e6 * PUE
    assert fleet.kwh == pytest.approx(kwh, rel=0.01)
    assert fleet.kg_co2e == pytest.approx(kwh * GRID_KG_PER_KWH, rel=0.01)
    hours = 8 * (probe_run.end_ns - probe_run.start_ns) / 3.6e12
    assert fleet.gpu_hours == pytest.approx(hours, rel=1e-3)
    assert fleet.cost == pytest.approx(hours * PRICE_PER_GPU_HOUR, rel=1e-3)


def test_microphone_calibration_recovers_the_offset_within_1_db(report: ReportPaths) -> None:
    nodes = {n.host: n for n in report.results.nodes}
    calibration = nodes[MIC_HOST].calibration
    assert calibration is not None and calibration.pairs >= 30
    assert calibration.offset_db == pytest.approx(MIC_OFFSET_DB, abs=1.0)
    assert calibration.slope == pytest.approx(1.0, abs=0.1)
    assert calibration.r2 is not None and calibration.r2 > 0.9
    others = [n for h, n in nodes.items() if h != MIC_HOST]
    assert others and all(n.calibration is None and n.mic is None for n in others)


def test_the_gpu_with_the_larger_r_th_stands_out_and_only_it(report: ReportPaths) -> None:
    flagged = [(o.host, o.gpu, o.kind) for o in report.results.outliers]
    assert flagged == [("node-a", "3", "hotter")]
    assert _gpu(report, "node-a", 3).flags == ["hotter"]
    assert "stands out: node-a gpu 3 is hotter" in report.summary


def test_outlier_threshold_is_an_option(probe_run: ProbeRun, report: ReportPaths) -> None:
    """The thresholds are options of the model run: a lenient R_th threshold drops the hotter L4, a strict
    samples/J one flags a less efficient L4. The outliers are decided on the fitted GPUs
    (``find_outliers``, which ``analyze`` calls with the run's settings), so this asks the session's fits
    with other settings instead of fitting the probe twice more (40 s in the last CI run)."""
    influx = InfluxSettings(url=probe_run.server.url, database=probe_run.db)
    base = ModelSettings(influx=influx, probe=probe_run.probe_id)
    # the run reports the thresholds it used: the defaults here
    assert report.results.thresholds == {
        "outlier_r_th_pct": base.outlier_r_th_pct,
        "outlier_dba": base.outlier_dba,
        "outlier_samples_per_j_pct": base.outlier_samples_per_j_pct,
    }
    gpus = report.results.gpus
    assert find_outliers(gpus, base) == report.results.outliers  # what the run found, decided the same way
    lenient = find_outliers(gpus, dataclasses.replace(base, outlier_r_th_pct=60.0))
    assert lenient == []
    strict = find_outliers(gpus, dataclasses.replace(base, outlier_samples_per_j_pct=1.5))
    assert {(o.host, o.gpu) for o in strict if o.kind == "less efficient"} == {("node-a", "1")}


def test_json_holds_every_number_and_matches_the_model_points(probe_run: ProbeRun, report: ReportPaths) -> None:
    document = json.loads(report.json.read_text())
    assert document["probe"] == probe_run.probe_id
    assert len(document["gpus"]) == 8 and len(document["nodes"]) == 2
    for g in document["gpus"]:
        rc = g["thermal"]["rc"]
        assert {"r_th_c_per_w", "tau_s", "t_amb_c"} <= rc.keys()
        assert g["thermal"]["arx"]["rc"]["tau_s"] > 0 and len(g["thermal"]["step_fits"]) == 2
        for key in (
            "samples_per_s",
            "mean_power_w",
            "peak_power_w",
            "steady_energy_j",
            "j_per_sample",
            "samples_per_j",
            "idle_power_w",
            "probe_energy_j",
            "kwh",
            "kg_co2e",
            "gpu_hours",
            "cost",
        ):
            assert isinstance(g["efficiency"][key], float), key
        for key in ("t_pred_at_limit_c", "headroom_c", "power_limit_w", "slowdown_c", "temp_max_c"):
            assert isinstance(g[key], float), key
        assert isinstance(g["acoustic"]["steady_db"], float)
    # every field of every `model` point written to InfluxDB is in the JSON with the same value
    series = probe_run.server.query(probe_run.db, f'SELECT * FROM "model" WHERE "probe" = \'{probe_run.probe_id}\'')
    rows = [r for s in series for r in s.rows()]
    assert len(rows) == 8 * 3 + 2 * 3
    where = {
        "thermal": lambda g: {**g["thermal"]["rc"], **g},
        "acoustic": lambda g: g["acoustic"],
        "efficiency": lambda g: g["efficiency"],
    }
    checked = 0
    for row in rows:
        if not row.get("gpu"):
            continue
        g = next(x for x in document["gpus"] if (x["host"], x["gpu"]) == (row["host"], row["gpu"]))
        source = where[row["kind"]](g)
        for name in ("r_th_c_per_w", "tau_s", "t_amb_c", "headroom_c", "samples_per_j", "probe_energy_j"):
            if row.get(name) is not None and name in source:
                assert math.isclose(row[name], source[name], rel_tol=1e-12), (row["host"], row["gpu"], name)
                checked += 1
        if row["kind"] == "acoustic":
            assert math.isclose(row["steady_dba"], source["steady_db"], rel_tol=1e-12)
            checked += 1
    assert checked >= 8 * 4


def test_running_the_model_again_overwrites_its_points(probe_run: ProbeRun, report: ReportPaths, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A second run writes its points over the first run's instead of beside them. The second run is of
    node-b alone (the cheaper node to fit: 16 s against 135 s for node-a, 2026-12-04 at load average 10),
    with the session's settings, so that what it writes equals what was there: node-b's share of the
    first run's points, and the count of every GPU's and node's points unchanged."""
    from gpuprobe.model import run
    from gpuprobe.model.output import model_lines

    settings = ModelSettings(
        influx=InfluxSettings(url=probe_run.server.url, database=probe_run.db),
        probe=probe_run.probe_id,
        hosts=("node-b",),
        out_dir=tmp_path,
        price_per_gpu_hour=PRICE_PER_GPU_HOUR,
        pue=PUE,
        grid_kg_per_kwh=GRID_KG_PER_KWH,
    )
    again = run(settings)
    first = model_lines(report.results)
    assert report.model_points_written == len(first)
    assert again.model_points_written == sum(",host=node-b," in line for line in first) > 0
    count = probe_run.server.query(probe_run.db, 'SELECT count("tau_s") FROM "model" WHERE "kind" = \'thermal\'')
    assert count[0].values[0][1] == 8 + 2


def test_a_time_range_without_a_probe_gives_the_same_fits(probe_run: ProbeRun, report: ReportPaths) -> None:
    settings = ModelSettings(
        influx=InfluxSettings(url=probe_run.server.url, database=probe_run.db),
        start_ns=probe_run.start_ns,
        end_ns=probe_run.end_ns,
        hosts=("node-b",),
    )
    _, ranged = fit(settings)
    assert ranged.probe is None and ranged.label.startswith("range-")
    assert {g.host for g in ranged.gpus} == {"node-b"}
    for g in ranged.gpus:
        truth = probe_run.truth(g.host, int(g.gpu))
        assert g.thermal.rc is not None
        assert g.thermal.rc.r_th_c_per_w == pytest.approx(truth.profile.r_th_c_per_w, rel=0.05)
        assert g.thermal.rc.tau_s == pytest.approx(truth.profile.tau_s, rel=0.05)
        assert g.efficiency.probe_energy_j == pytest.approx(
            truth.energy_j(probe_run.start_ns, probe_run.end_ns), rel=0.01
        )
        # without phases the loaded part of the power series stands in for the steady phase
        assert g.efficiency.mean_power_w == pytest.approx(truth.load_w, rel=0.01)
        assert g.efficiency.idle_power_w == pytest.approx(truth.idle_w, rel=0.01)
