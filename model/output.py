"""Part: model. The results as JSON, as ``model`` points for InfluxDB, and as the terminal's summary table.

``model`` points (storage schema: tags ``probe``, ``host``, ``gpu``, ``kind``; the node's points have
no ``gpu`` tag) carry the window's end as their timestamp, so running the model again on the same
probe overwrites them instead of adding a second set. Every field is a float except the counts
(integers) and ``method`` and ``model`` (strings), and absent values are left out, so the field types never
change between runs (InfluxDB refuses a field whose type changes within a shard).
"""

from __future__ import annotations

import dataclasses
import math
import textwrap
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


def _f(value: float | None, spec: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return format(value, spec)


#: the width the terminal summary keeps within (its table rows, and the text lines, which wrap)
TERMINAL_COLUMNS = 120
# The summary's columns: name and alignment; "<" left, ">" right.
_COLUMNS = (
    ("gpu", ">"), ("model", "<"), ("R_th °C/W", ">"), ("R_th 90 %", ">"), ("τ s", ">"), ("T_amb", ">"),
    ("fit", ">"), ("RMS", ">"), ("held", ">"), ("T@limit", ">"), ("headroom", ">"), ("dBA", ">"),
    ("samples/s", ">"), ("J/sample", ">"), ("energy J", ">"),
)  # fmt: skip
#: the columns the terminal leaves to the HTML report and the JSON, in this order, while its table is wider
#: than TERMINAL_COLUMNS (the GPU model then shortens to what is left, "…" where it is cut)
TERMINAL_DROP_ORDER = ("T_amb", "held", "J/sample", "R_th 90 %")
_MODEL_MIN = 12  # the narrowest the GPU model column gets before columns go
_INDENT = "  "  # a host's rows under its heading


def short_model(name: str) -> str:
    """A GPU model as the terminal shows it: without the "NVIDIA " every NVML name starts with."""
    return name.removeprefix("NVIDIA ").strip() or name


def _gpu_cells(g: GpuResult) -> list[str]:
    rc, e = g.thermal.rc, g.efficiency
    interval = g.thermal.intervals.get("r_th_c_per_w")
    return [
        g.gpu, short_model(g.model), _f(rc.r_th_c_per_w if rc else None, ".4f"),
        interval.text(".4f") if interval else "—", _f(rc.tau_s if rc else None, ".2f"),
        _f(rc.t_amb_c if rc else None, ".1f"), g.thermal.model, _f(g.thermal.fit_rmse_c, ".2f"),
        _f(g.thermal.holdout_rmse_c, ".2f"), _f(g.t_pred_at_limit_c, ".1f"), _f(g.headroom_c, ".1f"),
        _f(g.acoustic.steady_db if g.acoustic else None, ".1f"), _f(e.samples_per_s, ".1f"),
        _f(e.j_per_sample, ".4f"), _f(e.probe_energy_j, ".0f"),
    ]  # fmt: skip


def _node_cells(n: NodeResult) -> list[str]:
    return [
        "all", f"{n.gpus} GPUs", _f(n.r_th_mean_c_per_w, ".4f"), "", _f(n.tau_mean_s, ".2f"),
        _f(n.t_amb_mean_c, ".1f"), "", "", "", _f(n.t_pred_at_limit_max_c, ".1f"), _f(n.headroom_min_c, ".1f"),
        _f(n.acoustic.steady_db if n.acoustic else None, ".1f"), _f(n.samples_per_s, ".1f"),
        _f(n.j_per_sample, ".4f"), _f(n.probe_energy_j, ".0f"),
    ]  # fmt: skip


def _gpu_flags(g: GpuResult) -> list[str]:
    flags = [*g.flags, *([f"can't tell: {g.thermal.cannot_tell}"] if g.thermal.cannot_tell else [])]
    return flags + [f"{k} {v.text('g')}" for k, v in g.thermal.intervals.items() if v.at_bound]


def _layout(rows: list[list[str]], width: int) -> tuple[list[int], list[int], list[str]]:
    """Which columns the terminal shows, their widths, and the ones left to the HTML and the JSON: the
    columns of TERMINAL_DROP_ORDER go one by one while the rows are wider than ``width``, then the GPU
    model column narrows to what is left."""
    widths = [max([len(name), *(len(r[i]) for r in rows)]) for i, (name, _) in enumerate(_COLUMNS)]
    model = [name for name, _ in _COLUMNS].index("model")
    keep = list(range(len(_COLUMNS)))
    dropped: list[str] = []

    def total(model_width: int) -> int:
        return len(_INDENT) + sum(model_width if i == model else widths[i] for i in keep) + len(keep) - 1

    for name in TERMINAL_DROP_ORDER:
        if total(min(widths[model], _MODEL_MIN)) <= width:
            break
        keep.remove([n for n, _ in _COLUMNS].index(name))
        dropped.append(name)
    widths[model] = max(len("model"), min(widths[model], widths[model] - (total(widths[model]) - width)))
    return keep, widths, dropped


def _cells_line(cells: list[str], keep: list[int], widths: list[int]) -> str:
    out = []
    for i in keep:
        cell, w = cells[i], widths[i]
        cell = cell if len(cell) <= w else cell[: w - 1] + "…"
        out.append(cell.ljust(w) if _COLUMNS[i][1] == "<" else cell.rjust(w))
    return (_INDENT + " ".join(out)).rstrip()


def wrapped(lines: list[str], width: int = TERMINAL_COLUMNS) -> list[str]:
    """Text lines wrapped to ``width``, each continuation 4 spaces deeper than its line (so that it never
    reads as the next line of a list)."""
    out: list[str] = []
    for line in lines:
        indent = " " * (len(line) - len(line.lstrip()) + 4)
        out.extend(textwrap.wrap(line, width, subsequent_indent=indent, break_on_hyphens=False) or [""])
    return out


def summary_table(results: Results, width: int = TERMINAL_COLUMNS) -> str:
    """The table printed on the terminal, within ``width`` columns: each host heads its GPUs' rows and the
    node's row (``all``), a GPU's flags on the line under its row; then the fleet totals, the outliers and
    the notes. The GPU model loses its "NVIDIA " and the least needed columns go to the HTML report and
    the JSON (:data:`TERMINAL_DROP_ORDER`, named on a line above the table) when the rows would be wider."""
    hosts = list(dict.fromkeys([*(g.host for g in results.gpus), *(n.host for n in results.nodes)]))
    gpu_rows = {id(g): _gpu_cells(g) for g in results.gpus}
    node_rows = {n.host: _node_cells(n) for n in results.nodes}
    keep, widths, dropped = _layout([*gpu_rows.values(), *node_rows.values()], width)
    head = _cells_line([name for name, _ in _COLUMNS], keep, widths)
    above = [f"in the HTML report and the JSON only: {', '.join(dropped)}"] if dropped else []
    rows = [*wrapped(above, width), head, _INDENT + "-" * (len(head) - len(_INDENT))]
    for host in hosts:
        rows.append(host)
        for g in (g for g in results.gpus if g.host == host):
            rows.append(_cells_line(gpu_rows[id(g)], keep, widths))
            flags = _gpu_flags(g)
            if flags:
                rows += wrapped([f"{_INDENT}    flags: {', '.join(flags)}"], width)
        n = next((n for n in results.nodes if n.host == host), None)
        if n is None:
            continue
        rows.append(_cells_line(node_rows[host], keep, widths))
        if n.calibration is not None:
            c = n.calibration
            slope = "—" if c.slope is None else f"{c.slope:.3f} (fan law {c.fan_law_db_per_decade:.0f} dB/decade)"
            r2 = "—" if c.r2 is None else f"{c.r2:.3f}"
            rows += wrapped(
                [
                    f"{_INDENT}    microphone: proxy + {c.offset_db:.2f} dB (±{c.offset_stderr_db:.2f}); "
                    f"slope {slope}, R² {r2}, {c.pairs} pairs"
                ],
                width,
            )
    f = results.fleet
    cost = "—" if f.cost is None else f"{f.cost:.2f} (at {f.price_per_gpu_hour:g}/GPU-hour)"
    text = [
        f"fleet: {f.gpus} GPUs on {f.nodes} nodes, {f.duration_s:.0f} s; energy {f.probe_energy_j:.0f} J = "
        f"{f.kwh:.6f} kWh (PUE {f.pue:g}); {f.kg_co2e * 1000:.2f} g CO2e at {f.grid_kg_per_kwh:g} kg/kWh; "
        f"{f.gpu_hours:.4f} GPU-hours, cost {cost}",
        *(f"stands out: {o.host} gpu {o.gpu} is {o.kind}: {o.text}" for o in results.outliers),
        *(f"note: {n}" for n in results.notes),
    ]
    return "\n".join(rows + wrapped(text, width))
