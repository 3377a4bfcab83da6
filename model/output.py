"""The results as JSON, as ``model`` points for InfluxDB, and as the terminal's summary table.

``model`` points (storage schema: tags ``probe``, ``host``, ``gpu``, ``kind``; the node's points have
no ``gpu`` tag) carry the window's end as their timestamp, so running the model again on the same
probe overwrites them instead of adding a second set. Every field is a float except the counts
(integers) and ``method`` and ``model`` (strings), and absent values are left out, so the field types never
change between runs (InfluxDB refuses a field whose type changes within a shard).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from gpuprobe.influx.lineprotocol import encode_line
from gpuprobe.model.analysis import GpuResult, NodeResult, Results

MEASUREMENT = "model"


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return _clean(value.item())
    return value


def to_jsonable(results: Results, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every number of the run as plain JSON types (NaN and infinities as null)."""
    document: dict[str, Any] = _clean(dataclasses.asdict(results))
    if extra:
        document.update(_clean(extra))
    return document


Fields = dict[str, float | int | bool | str]


def _put(fields: Fields, name: str, value: float | int | str | None) -> None:
    if value is None:
        return
    if isinstance(value, float) and not math.isfinite(value):
        return
    fields[name] = value


def _gpu_fields(g: GpuResult) -> dict[str, Fields]:
    thermal: Fields = {}
    fit = g.thermal
    if fit.rc is not None:
        _put(thermal, "r_th_c_per_w", fit.rc.r_th_c_per_w)
        _put(thermal, "tau_s", fit.rc.tau_s)
        _put(thermal, "t_amb_c", fit.rc.t_amb_c)
        thermal["method"] = fit.chosen
        thermal["model"] = fit.model
    if fit.cannot_tell is not None:
        # no parameters: the recording cannot give them (thermal.can_tell), and says why
        thermal["identifiable"] = False
        thermal["cannot_tell"] = fit.cannot_tell
        thermal["cannot_tell_detail"] = fit.cannot_tell_detail or ""
    _put(thermal, "fit_rmse_c", fit.fit_rmse_c)
    _put(thermal, "holdout_rmse_c", fit.holdout_rmse_c)
    _put(thermal, "rc1_holdout_rmse_c", fit.rc1_holdout_rmse_c)
    if len(fit.stages) == 2:
        _put(thermal, "r_fast_c_per_w", fit.stages[0].r_c_per_w)
        _put(thermal, "tau_fast_s", fit.stages[0].tau_s)
        _put(thermal, "r_slow_c_per_w", fit.stages[1].r_c_per_w)
    if fit.inlet is not None:
        _put(thermal, "inlet_c_per_w", fit.inlet.c_per_w)
        _put(thermal, "inlet_tau_s", fit.inlet.tau_s)
    _put(thermal, "fan_floor", fit.fan_floor)
    for figure, interval in fit.intervals.items():
        low, high, bound = interval.field_names(figure)
        _put(thermal, low, interval.low)
        _put(thermal, high, interval.high)
        _put(thermal, bound, interval.at_bound)
    if fit.step is not None:
        _put(thermal, "step_r_th_c_per_w", fit.step.r_th_c_per_w)
        _put(thermal, "step_tau_s", fit.step.tau_s)
        _put(thermal, "step_t_amb_c", fit.step.t_amb_c)
        _put(thermal, "step_sim_rmse_c", fit.step_sim_rmse_c)
    if fit.arx is not None and fit.arx.rc is not None:
        _put(thermal, "arx_r_th_c_per_w", fit.arx.rc.r_th_c_per_w)
        _put(thermal, "arx_tau_s", fit.arx.rc.tau_s)
        _put(thermal, "arx_t_amb_c", fit.arx.rc.t_amb_c)
        _put(thermal, "arx_sim_rmse_c", fit.arx_sim_rmse_c)
        _put(thermal, "arx_one_step_rmse_c", fit.arx.one_step_rmse_c)
    _put(thermal, "power_limit_w", g.power_limit_w)
    _put(thermal, "t_pred_at_limit_c", g.t_pred_at_limit_c)
    _put(thermal, "slowdown_c", g.slowdown_c)
    _put(thermal, "headroom_c", g.headroom_c)
    _put(thermal, "temp_max_c", g.temp_max_c)
    _put(thermal, "thermal_throttled_s", g.thermal_throttled_s)
    _put(thermal, "power_capped_s", g.power_capped_s)
    thermal["outlier"] = "hotter" in g.flags
    acoustic: Fields = {}
    if g.acoustic is not None:
        _put(acoustic, "mean_dba", g.acoustic.mean_db)
        _put(acoustic, "max_dba", g.acoustic.max_db)
        _put(acoustic, "idle_dba", g.acoustic.idle_db)
        _put(acoustic, "steady_dba", g.acoustic.steady_db)
        acoustic["outlier"] = "louder" in g.flags
    e = g.efficiency
    efficiency: Fields = {}
    for name in (
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
        value = getattr(e, name)
        _put(efficiency, name, None if value is None else float(value))
    efficiency["outlier"] = "less efficient" in g.flags
    return {"thermal": thermal, "acoustic": acoustic, "efficiency": efficiency}


def _node_fields(n: NodeResult) -> dict[str, Fields]:
    thermal: Fields = {}
    _put(thermal, "r_th_c_per_w", n.r_th_mean_c_per_w)
    _put(thermal, "tau_s", n.tau_mean_s)
    _put(thermal, "t_amb_c", n.t_amb_mean_c)
    _put(thermal, "t_pred_at_limit_c", n.t_pred_at_limit_max_c)
    _put(thermal, "headroom_c", n.headroom_min_c)
    _put(thermal, "thermal_throttled_s", n.thermal_throttled_s)
    _put(thermal, "power_capped_s", n.power_capped_s)
    acoustic: Fields = {}
    if n.acoustic is not None:
        _put(acoustic, "mean_dba", n.acoustic.mean_db)
        _put(acoustic, "max_dba", n.acoustic.max_db)
        _put(acoustic, "idle_dba", n.acoustic.idle_db)
        _put(acoustic, "steady_dba", n.acoustic.steady_db)
    if n.mic is not None:
        _put(acoustic, "mic_mean_db", n.mic.mean_db)
        _put(acoustic, "mic_steady_db", n.mic.steady_db)
    c = n.calibration
    if c is not None:
        acoustic["mic_pairs"] = int(c.pairs)
        _put(acoustic, "mic_offset_db", c.offset_db)
        _put(acoustic, "mic_slope", c.slope)
        _put(acoustic, "mic_fan_law_db_per_decade", c.fan_law_db_per_decade)
        _put(acoustic, "mic_intercept_db", c.intercept_db)
        _put(acoustic, "mic_r2", c.r2)
        _put(acoustic, "mic_rmse_db", c.rmse_db)
    efficiency: Fields = {}
    for name in (
        "samples_per_s",
        "mean_power_w",
        "steady_energy_j",
        "samples_per_j",
        "j_per_sample",
        "idle_power_w",
        "probe_energy_j",
    ):
        value = getattr(n, name)
        _put(efficiency, name, None if value is None else float(value))
    return {"thermal": thermal, "acoustic": acoustic, "efficiency": efficiency}


def model_lines(results: Results) -> list[str]:
    """The ``model`` measurement's points for this run, one line each (ending in ``\\n``), written
    exactly as the collector writes its points."""
    out = []
    t = results.end_ns
    for g in results.gpus:
        for kind, fields in _gpu_fields(g).items():
            if fields:
                out.append(
                    encode_line(
                        MEASUREMENT, {"probe": results.label, "host": g.host, "gpu": g.gpu, "kind": kind}, fields, t
                    )
                )
    for n in results.nodes:
        for kind, fields in _node_fields(n).items():
            if fields:
                out.append(encode_line(MEASUREMENT, {"probe": results.label, "host": n.host, "kind": kind}, fields, t))
    return out


def _f(value: float | None, spec: str, width: int) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—".rjust(width)
    return format(value, spec).rjust(width)


def summary_table(results: Results) -> str:
    """The table printed on the terminal: one row per GPU, one per node, then the fleet totals."""
    head = (
        f"{'host':<12} {'gpu':>3} {'model':<24} {'R_th °C/W':>9} {'R_th 90 %':>13} {'τ s':>6} {'T_amb':>6} {'fit':>13} "
        f"{'RMS':>4} {'held':>4} "
        f"{'T@limit':>7} {'headroom':>8} {'dBA':>5} {'samples/s':>9} {'J/sample':>9} {'energy J':>9}  flags"
    )
    rows = [head, "-" * len(head)]
    for g in results.gpus:
        rc = g.thermal.rc
        e = g.efficiency
        flags = [*g.flags, *([f"can't tell: {g.thermal.cannot_tell}"] if g.thermal.cannot_tell else [])]
        r_interval = g.thermal.intervals.get("r_th_c_per_w")
        flags += [f"{k} {v.text('g')}" for k, v in g.thermal.intervals.items() if v.at_bound]
        rows.append(
            f"{g.host:<12.12} {g.gpu:>3} {g.model:<24.24} {_f(rc.r_th_c_per_w if rc else None, '.4f', 9)} "
            f"{(r_interval.text('.4f') if r_interval else '—')[:13]:>13} "
            f"{_f(rc.tau_s if rc else None, '.2f', 6)} {_f(rc.t_amb_c if rc else None, '.1f', 6)} "
            f"{g.thermal.model:>13} {_f(g.thermal.fit_rmse_c, '.2f', 4)} {_f(g.thermal.holdout_rmse_c, '.2f', 4)} "
            f"{_f(g.t_pred_at_limit_c, '.1f', 7)} {_f(g.headroom_c, '.1f', 8)} "
            f"{_f(g.acoustic.steady_db if g.acoustic else None, '.1f', 5)} {_f(e.samples_per_s, '.1f', 9)} "
            f"{_f(e.j_per_sample, '.4f', 9)} {_f(e.probe_energy_j, '.0f', 9)}  {', '.join(flags)}"
        )
    rows.append("-" * len(head))
    for n in results.nodes:
        rows.append(
            f"{n.host:<12.12} {'all':>3} {f'{n.gpus} GPUs':<24} {_f(n.r_th_mean_c_per_w, '.4f', 9)} {'':>13} "
            f"{_f(n.tau_mean_s, '.2f', 6)} {_f(n.t_amb_mean_c, '.1f', 6)} {'':>13} {'':>4} {'':>4} "
            f"{_f(n.t_pred_at_limit_max_c, '.1f', 7)} "
            f"{_f(n.headroom_min_c, '.1f', 8)} {_f(n.acoustic.steady_db if n.acoustic else None, '.1f', 5)} "
            f"{_f(n.samples_per_s, '.1f', 9)} {_f(n.j_per_sample, '.4f', 9)} {_f(n.probe_energy_j, '.0f', 9)}"
        )
        if n.calibration is not None:
            c = n.calibration
            slope = "—" if c.slope is None else f"{c.slope:.3f} (fan law {c.fan_law_db_per_decade:.0f} dB/decade)"
            r2 = "—" if c.r2 is None else f"{c.r2:.3f}"
            rows.append(
                f"{'':<12} microphone: proxy + {c.offset_db:.2f} dB (±{c.offset_stderr_db:.2f}); "
                f"slope {slope}, R² {r2}, {c.pairs} pairs"
            )
    f = results.fleet
    cost = "—" if f.cost is None else f"{f.cost:.2f} (at {f.price_per_gpu_hour:g}/GPU-hour)"
    rows.append(
        f"fleet: {f.gpus} GPUs on {f.nodes} nodes, {f.duration_s:.0f} s; energy {f.probe_energy_j:.0f} J = "
        f"{f.kwh:.6f} kWh (PUE {f.pue:g}); {f.kg_co2e * 1000:.2f} g CO2e at {f.grid_kg_per_kwh:g} kg/kWh; "
        f"{f.gpu_hours:.4f} GPU-hours, cost {cost}"
    )
    for o in results.outliers:
        rows.append(f"stands out: {o.host} gpu {o.gpu} is {o.kind}: {o.text}")
    rows.extend(f"note: {n}" for n in results.notes)
    return "\n".join(rows)
