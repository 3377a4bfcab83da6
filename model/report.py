"""Part: model. The self-contained HTML report: matplotlib PNGs embedded as base64, a table for every number.

Nothing is loaded from the network (no scripts, fonts or styles from elsewhere), so the file can be
mailed, archived or opened on an air-gapped machine. Plots: per node the temperature of each GPU
with the chosen thermal model (simulated from the measured power) and the step fits, per node the
held-out part of each GPU's temperature against the prediction of the model fitted without it, per node the power
and the cumulative energy, the acoustic levels (proxy, and microphone where there is one, with the
calibration's scatter), and the efficiency per GPU and node.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from gpuprobe.energy import cumulative_energy
from gpuprobe.model.analysis import SIMULATED_NOTE, GpuResult, Results
from gpuprobe.model.data import Dataset, GpuSeries
from gpuprobe.model.html import Section, page, utc_text
from gpuprobe.model.html import fmt as _fmt
from gpuprobe.model.html import img as _img
from gpuprobe.model.html import png as _png
from gpuprobe.model.html import pyplot as _pyplot
from gpuprobe.model.html import table as _table
from gpuprobe.model.thermal import AVERAGE_DELAY_S, predicted_temperature, simulate
from gpuprobe.model.thermal_stages import Interval

MAX_POINTS = 2500
PHASE_COLOURS = {"idle": "#e8f0fe", "warmup": "#fff4e0", "steady": "#e6f4ea", "cooldown": "#f3e8fd"}


def _thin(n: int) -> slice:
    return slice(None, None, max(1, math.ceil(n / MAX_POINTS)))


def _shade_phases(ax: Any, results: Results, host: str) -> None:
    for p in results.phases.get(host, []):
        colour = PHASE_COLOURS.get(str(p["phase"]))
        if colour:
            start = (int(str(p["start_ns"])) - results.start_ns) / 1e9
            end = (int(str(p["end_ns"])) - results.start_ns) / 1e9
            ax.axvspan(start, end, color=colour, zorder=0, lw=0)


def legend_beside(ax: Any) -> None:
    """The panel's legend to its right, outside the axes, so that it covers no point or line (the
    constrained layout makes room for it); the study report's plots use it too."""
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)


def phase_legend(fig: Any, phases: Iterable[Mapping[str, Any]], axes: Iterable[Any] = ()) -> list[str]:
    """One key under the figure's plots (outside them, so it covers no data): the lines of ``axes`` (each
    label once: panels that draw the same things share it), then a swatch per shaded phase that
    ``phases`` has, in the order the phases run; returns the labels."""
    from matplotlib.patches import Patch

    handles, labels = [], []
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    present = {str(p["phase"]) for p in phases}
    for name in PHASE_COLOURS:
        if name in present:
            handles.append(Patch(facecolor=PHASE_COLOURS[name], edgecolor="#9aa0a6"))
            labels.append(f"{name} phase")
    if labels:
        fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 6), fontsize=7, frameon=False)
    return labels


def _series(ds: Dataset, g: GpuResult) -> GpuSeries:
    series = next(s for s in ds.gpus if (s.host, s.gpu) == (g.host, g.gpu))
    return series.inside(ds.window.start_ns, ds.window.end_ns)


def thermal_figure(ds: Dataset, results: Results, host: str) -> str:
    plt = _pyplot()
    gpus = [g for g in results.gpus if g.host == host]
    cols = 2 if len(gpus) > 1 else 1
    rows = math.ceil(len(gpus) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.2 * cols, 2.9 * rows), squeeze=False, layout="constrained")
    for ax in axes.flat[len(gpus) :]:
        ax.set_visible(False)
    for ax, g in zip(axes.flat, gpus, strict=False):
        s = _series(ds, g)
        temp = s.field("temp_c")
        power, _ = s.power()
        ok = np.isfinite(temp) & np.isfinite(power)
        t = (s.t_ns[ok] - results.start_ns) / 1e9
        _shade_phases(ax, results, host)
        sl = _thin(len(t))
        ax.plot(t[sl], temp[ok][sl], ".", ms=2, color="#444", label="measured (integer °C)")
        rc = g.thermal.rc
        curve = _prediction(ds, g, held_out=False)
        if curve is not None:
            tc = (curve[0] - results.start_ns) / 1e9
            slc = _thin(len(tc))
            ax.plot(tc[slc], curve[2][slc], "-", color="#d93025", lw=1.4, label=f"model {g.thermal.model}")
        elif rc is not None and ok.sum() > 1:
            t0 = float(np.mean(temp[ok][:5]))
            model = simulate(s.t_ns[ok], power[ok], rc, t0)
            ax.plot(t[sl], model[sl], "-", color="#d93025", lw=1.4, label=f"RC model ({g.thermal.chosen})")
        for f in g.thermal.step_fits:
            x0 = (f.t_step_ns - results.start_ns) / 1e9
            x = np.linspace(0, f.duration_s, 200)
            step_curve = f.t_inf_c + (f.t_start_c - f.t_inf_c) * np.exp(-x / f.tau_s)
            ax.plot(
                x0 + x,
                step_curve,
                "--",
                color="#1a73e8",
                lw=1,
                label=f"{f.direction} fit" if f.direction == "heating" else None,
            )
        title = f"GPU {g.gpu} {g.model}"
        if rc is not None:
            title += f": {g.thermal.model} R {rc.r_th_c_per_w:.4f} °C/W, τ {rc.tau_s:.2f} s, T_amb {rc.t_amb_c:.1f} °C"
        elif g.thermal.cannot_tell:
            title += f": can't tell ({g.thermal.cannot_tell})"
        ax.set_title(title, fontsize=8)
        ax.set_xlabel("s since start", fontsize=8)
        ax.set_ylabel("°C", fontsize=8)
        ax.tick_params(labelsize=7)
    phase_legend(fig, results.phases.get(host, []), axes.flat[: len(gpus)])
    fig.suptitle(f"{host}: GPU temperature and the fitted thermal model", fontsize=10)
    return _png(fig)


def _prediction(ds: Dataset, g: GpuResult, *, held_out: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The chosen model's temperature at the GPU's samples, from the measured power (and node power, fan)."""
    s = _series(ds, g)
    power, is_average = s.power()
    node_w, _ = ds.node_power(g.host, s.t_ns, AVERAGE_DELAY_S)
    fan = s.field("fan_pct")
    return predicted_temperature(
        g.thermal,
        s.t_ns,
        s.field("temp_c"),
        power,
        power_is_average=is_average,
        node_w=node_w,
        fan_pct=fan,
        held_out=held_out,
    )


def holdout_figure(ds: Dataset, results: Results, host: str) -> str | None:
    """Per GPU of the host: the measured temperature over the held-out part and what the model fitted on the
    rest predicts for it from the measured power."""
    gpus = [g for g in results.gpus if g.host == host and g.thermal.holdout_start_ns is not None]
    if not gpus:
        return None
    plt = _pyplot()
    cols = 2 if len(gpus) > 1 else 1
    rows = math.ceil(len(gpus) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.2 * cols, 2.7 * rows), squeeze=False, layout="constrained")
    for ax in axes.flat[len(gpus) :]:
        ax.set_visible(False)
    for ax, g in zip(axes.flat, gpus, strict=False):
        curve = _prediction(ds, g, held_out=True)
        if curve is None:
            ax.set_axis_off()
            continue
        t_ns, measured, predicted = curve
        held = t_ns > (g.thermal.holdout_start_ns or 0)
        t = (t_ns[held] - results.start_ns) / 1e9
        sl = _thin(len(t))
        ax.plot(t[sl], measured[held][sl], ".", ms=2, color="#444", label="measured (integer °C)")
        ax.plot(t[sl], predicted[held][sl], "-", color="#d93025", lw=1.4, label=f"predicted ({g.thermal.model})")
        ax.set_title(
            f"GPU {g.gpu} {g.model}: held-out RMS {_fmt(g.thermal.holdout_rmse_c, 3)} °C "
            f"(first order {_fmt(g.thermal.rc1_holdout_rmse_c, 3)} °C)",
            fontsize=8,
        )
        ax.set_xlabel("s since start", fontsize=8)
        ax.set_ylabel("°C", fontsize=8)
        ax.tick_params(labelsize=7)
    phase_legend(fig, [], axes.flat[: len(gpus)])
    fig.suptitle(f"{host}: held-out temperature, measured and predicted from the measured power", fontsize=10)
    return _png(fig)


def power_figure(ds: Dataset, results: Results, host: str) -> str:
    plt = _pyplot()
    fig, (ax_p, ax_e) = plt.subplots(2, 1, figsize=(11, 5.2), sharex=True, layout="constrained")
    _shade_phases(ax_p, results, host)
    _shade_phases(ax_e, results, host)
    for g in (g for g in results.gpus if g.host == host):
        s = _series(ds, g)
        power, _ = s.power()
        ok = np.isfinite(power)
        t = (s.t_ns[ok] - results.start_ns) / 1e9
        sl = _thin(len(t))
        ax_p.plot(t[sl], power[ok][sl], lw=1, label=f"GPU {g.gpu}")
        energy = cumulative_energy(s.t_ns[ok], s.field("energy_j")[ok], power[ok])
        ax_e.plot(t[sl], energy.cumulative_j[sl] / 1000, lw=1, label=f"GPU {g.gpu} ({energy.source})")
    ax_p.set_ylabel("power W", fontsize=8)
    ax_e.set_ylabel("energy kJ", fontsize=8)
    ax_e.set_xlabel("s since start", fontsize=8)
    for ax in (ax_p, ax_e):
        ax.tick_params(labelsize=7)
        legend_beside(ax)
    phase_legend(fig, results.phases.get(host, []))
    fig.suptitle(f"{host}: power and cumulative energy (NVML counter)", fontsize=10)
    return _png(fig)


def acoustic_figure(ds: Dataset, results: Results) -> str | None:
    plt = _pyplot()
    hosts = [n.host for n in results.nodes if any(a.host == n.host for a in ds.acoustic)]
    if not hosts:
        return None
    calibrated = [n for n in results.nodes if n.calibration is not None]
    cols = 2 if calibrated else 1
    fig, axes = plt.subplots(
        len(hosts), cols, figsize=(6.2 * cols, 2.8 * len(hosts)), squeeze=False, layout="constrained"
    )
    for row, host in enumerate(hosts):
        ax = axes[row][0]
        _shade_phases(ax, results, host)
        for a in (a for a in ds.acoustic if a.host == host):
            t = (a.t_ns - results.start_ns) / 1e9
            sl = _thin(len(t))
            if a.source == "mic":
                ax.plot(t[sl], a.laeq_db[sl], "o", ms=3, color="#d93025", label="microphone LAeq 1 s")
            elif a.gpu == "":
                ax.plot(t[sl], a.est_dba[sl], "-", lw=1.6, color="#202124", label="node proxy")
            else:
                ax.plot(t[sl], a.est_dba[sl], "-", lw=0.7, alpha=0.7, label=f"GPU {a.gpu} proxy")
        ax.set_title(f"{host}: acoustic level (proxy = estimate)", fontsize=8)
        ax.set_ylabel("dBA", fontsize=8)
        ax.set_xlabel("s since start", fontsize=8)
        ax.tick_params(labelsize=7)
        legend_beside(ax)
        if cols == 2:
            node = next(n for n in results.nodes if n.host == host)
            ax2 = axes[row][1]
            c = node.calibration
            if c is None:
                ax2.set_axis_off()
                ax2.text(0.5, 0.5, "no microphone on this node", ha="center", va="center", fontsize=8)
                continue
            from gpuprobe.model.acoustic import pair_levels

            mic = next(a for a in ds.acoustic if a.host == host and a.source == "mic" and a.gpu == "")
            proxy = next(a for a in ds.acoustic if a.host == host and a.source == "proxy" and a.gpu == "")
            m, p = pair_levels(mic.t_ns, mic.laeq_db, proxy.t_ns, proxy.est_dba)
            ax2.plot(p, m, "o", ms=3, color="#1a73e8", label="1 s pairs")
            xs = np.linspace(float(p.min()), float(p.max()), 10)
            ax2.plot(xs, xs + c.offset_db, "-", color="#d93025", lw=1, label=f"proxy + {c.offset_db:.2f} dB")
            if c.slope is not None and c.intercept_db is not None:
                ax2.plot(xs, c.slope * xs + c.intercept_db, "--", color="#188038", lw=1, label=f"slope {c.slope:.3f}")
            ax2.set_xlabel("proxy dBA", fontsize=8)
            ax2.set_ylabel("microphone dBA", fontsize=8)
            ax2.set_title(f"{host}: calibration against the microphone", fontsize=8)
            ax2.tick_params(labelsize=7)
            legend_beside(ax2)
    phase_legend(fig, [p for host in hosts for p in results.phases.get(host, [])])
    return _png(fig)


def efficiency_figure(results: Results) -> str:
    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 3.6), layout="constrained")
    labels = [f"{g.host}/{g.gpu}" for g in results.gpus]
    hosts = sorted({g.host for g in results.gpus})
    colours = [f"C{hosts.index(g.host)}" for g in results.gpus]
    values = [g.efficiency.samples_per_j or 0.0 for g in results.gpus]
    ax1.bar(range(len(values)), values, color=colours)
    ax1.set_xticks(range(len(values)), labels, rotation=45, ha="right", fontsize=7)
    ax1.set_ylabel("samples per J (steady)", fontsize=8)
    ax1.set_title("efficiency per GPU (colour = node)", fontsize=9)
    ax1.tick_params(labelsize=7)
    nodes = results.nodes
    x = np.arange(len(nodes))
    ax2.bar(x - 0.2, [n.probe_energy_j / 1000 for n in nodes], 0.4, label="probe energy kJ")
    ax2.bar(x + 0.2, [(n.steady_energy_j or 0) / 1000 for n in nodes], 0.4, label="steady-phase energy kJ")
    ax2.set_xticks(x, [n.host for n in nodes], fontsize=7)
    ax2.set_title("energy per node", fontsize=9)
    ax2.tick_params(labelsize=7)
    legend_beside(ax2)
    return _png(fig)


# --- HTML ----------------------------------------------------------------------------------------

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1400px;
padding:0 24px;color:#202124}
h1{font-size:22px;margin:0 0 4px} h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #dadce0}
h3{font-size:15px;margin:18px 0 6px} table{border-collapse:collapse;margin:6px 0 12px;font-size:12px}
th,td{border:1px solid #dadce0;padding:3px 5px;text-align:right} th{background:#f1f3f4}
td.l,th.l{text-align:left} .wide{overflow-x:auto} .flag{color:#b3261e;font-weight:600}
img{max-width:100%;display:block;margin:8px 0}
.muted{color:#5f6368;font-size:12px} .box{background:#f8f9fa;border:1px solid #dadce0;padding:8px 12px;margin:8px 0}
.box.sim{background:#fff8e1;border-color:#f0c36d;color:#9a5b00}
"""


def render_html(ds: Dataset, results: Results, settings: dict[str, Any]) -> str:
    sections = [
        _header(results),
        _summary(results),
        _outliers(results),
        _thermal(ds, results),
        _power(ds, results),
        _acoustics(ds, results),
        _efficiency(results),
        _phases(results),
        _notes(results),
        _settings(settings),
    ]
    return page(sections)


def _header(r: Results) -> Section:
    f = r.fleet
    start, end = utc_text(r.start_ns, milliseconds=True), utc_text(r.end_ns, milliseconds=True)
    return [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        f"<title>gpuprobe model report: {html.escape(r.label)}</title><style>{CSS}</style></head><body>",
        f"<h1>gpuprobe model report: {html.escape(r.label)}</h1>",
        f'<p class="muted">{start} → {end} ({f.duration_s:.1f} s); workload '
        f"{_fmt(r.workload)}; status {_fmt(r.status)}; {f.gpus} GPUs on {f.nodes} nodes. "
        "Acoustic proxy levels are <b>estimates</b>, not measurements. Methods: docs/models.md.</p>",
        *(
            [f'<p class="box sim" id="simulated"><b>{html.escape(SIMULATED_NOTE)}</b>.</p>']
            if SIMULATED_NOTE in r.notes
            else []
        ),
    ]


def _summary(r: Results) -> Section:
    f = r.fleet
    return [
        "<h2>Summary</h2>",
        _table(
            ["quantity", "value", "unit"],
            [
                ["probe energy (NVML counter, all GPUs)", f.probe_energy_j, "J"],
                ["energy incl. PUE", f.kwh, "kWh"],
                ["PUE", f.pue, ""],
                ["grid intensity", f.grid_kg_per_kwh, "kg CO2e/kWh"],
                ["carbon", f.kg_co2e, "kg CO2e"],
                ["GPU-hours", f.gpu_hours, "h"],
                ["price per GPU-hour", f.price_per_gpu_hour, ""],
                ["cost", f.cost, ""],
                ["fleet samples per J (steady)", f.samples_per_j, "samples/J"],
            ],
        ),
    ]


def _outliers(r: Results) -> Section:
    thresholds = r.thresholds
    parts = [
        "<h2>GPUs that stand out</h2>",
        f'<p class="muted">Compared with the median of the GPUs of the same model (at least 3): hotter = R_th above '
        f"+{thresholds['outlier_r_th_pct']:g} %, louder = steady proxy level above +{thresholds['outlier_dba']:g} dB, "
        f"less efficient = samples/J below -{thresholds['outlier_samples_per_j_pct']:g} %.</p>",
    ]
    if not r.outliers:
        return [*parts, "<p>None.</p>"]
    table = _table(
        ["host", "gpu", "model", "stands out as", "value", "fleet median", "threshold", "unit", "why"],
        [[o.host, o.gpu, o.model, o.kind, o.value, o.fleet_median, o.threshold, o.unit, o.text] for o in r.outliers],
        left=4,
    )
    return [*parts, table]


def _thermal(ds: Dataset, r: Results) -> Section:
    holdout = next((g.thermal.holdout_fraction for g in r.gpus if g.thermal.holdout_fraction), None)
    parts = [
        "<h2>Thermal model per GPU</h2>",
        '<p class="muted">Output-error fits driven by the measured power: <i>rc1</i> one RC stage; <i>rc2</i> a fast '
        "and a slow stage in series (Foster); <i>+inlet</i> a stage driven by the node's total GPU power (the air "
        "every GPU of the node breathes); <i>+fan</i> the slow stage's conductance grows with the fan speed. Each "
        f"candidate is fitted on the first {_fmt(None if holdout is None else 1 - holdout, 3)} of the window and "
        "scored by its RMS predicting the rest; a more complex one is chosen only when it lowers that by more than "
        "10 % (and 0.02 °C), and the choice is refitted on the whole window. R is the total own-power resistance "
        "(at the steady fan speed), τ the slow stage, T_amb the temperature at zero own and node power.</p>",
        _stage_models_table(r),
        "<h3>Candidates</h3>",
        _candidates_table(r),
        "<h3>Second opinions: first-order step and ARX fits</h3>",
        '<p class="muted">C·dT/dt = P - (T - T_amb)/R, τ = R·C. <i>step</i>: curve_fit of the heating and cooling '
        "responses (biased when the load has more than one level); <i>arx</i>: least squares on "
        "T[k+1] = a·T[k] + b·P[k] + c over 1 s bin means.</p>",
        _thermal_fits_table(r),
        _thermal_limits_table(r),
        "<h3>Step responses</h3>",
        _step_responses_table(r),
    ]
    notes = [(g.host, g.gpu, n) for g in r.gpus for n in g.thermal.notes]
    if notes:
        parts.append(_table(["host", "gpu", "note"], notes, left=3))
    parts.append(_thermal_nodes_table(r))
    parts.extend(_img(thermal_figure(ds, r, n.host), f"temperature of {n.host}") for n in r.nodes)
    parts.append("<h3>Held-out prediction</h3>")
    parts.extend(_img(holdout_figure(ds, r, n.host), f"held-out temperature of {n.host}") for n in r.nodes)
    return parts


def _interval(interval: Interval | None, spec: str) -> str | None:
    return interval.text(spec) if interval is not None else None


def _stage_models_table(r: Results) -> str:
    headers = [
        "host",
        "gpu",
        "model",
        "chosen",
        "method",
        "R total °C/W",
        "R total 90 %",
        "τ slow s",
        "τ slow 90 %",
        "T_amb °C",
        "T_amb 90 %",
        "fast R °C/W",
        "fast τ s",
        "slow R °C/W",
        "slow τ s",
        "inlet °C/W(node)",
        "inlet τ s",
        "fan floor",
        "steady fan %",
        "fit RMS °C",
        "held-out RMS °C",
        "first-order held-out RMS °C",
    ]
    rows = []
    for g in r.gpus:
        t = g.thermal
        fast = t.stages[0] if len(t.stages) == 2 else None
        slow = t.stages[-1] if t.stages else None
        rows.append(
            [
                g.host,
                g.gpu,
                g.model,
                t.model,
                t.chosen,
                t.r_th_c_per_w,
                _interval(t.intervals.get("r_th_c_per_w"), ".4f"),
                t.tau_s,
                _interval(t.intervals.get("tau_s"), ".3g"),
                t.t_amb_c,
                _interval(t.intervals.get("t_amb_c"), ".1f"),
                fast.r_c_per_w if fast else None,
                fast.tau_s if fast else None,
                slow.r_c_per_w if slow else None,
                slow.tau_s if slow else None,
                t.inlet.c_per_w if t.inlet else None,
                t.inlet.tau_s if t.inlet else None,
                t.fan_floor,
                t.steady_fan_pct,
                t.fit_rmse_c,
                t.holdout_rmse_c,
                t.rc1_holdout_rmse_c,
            ]
        )
    return _table(headers, rows, left=5)


def _candidates_table(r: Results) -> str:
    headers = [
        "host",
        "gpu",
        "candidate",
        "chosen",
        "train RMS °C",
        "held-out RMS °C",
        "R °C/W",
        "τ slow s",
        "T_amb °C",
    ]
    rows = [
        [
            g.host,
            g.gpu,
            c.model,
            c.model == g.thermal.model,
            c.train_rmse_c,
            c.holdout_rmse_c,
            c.r_total_c_per_w,
            c.tau_slow_s,
            c.t_amb_c,
        ]
        for g in r.gpus
        for c in g.thermal.candidates
    ]
    return _table(headers, rows, left=3)


def _thermal_fits_table(r: Results) -> str:
    headers = [
        "host",
        "gpu",
        "model",
        "chosen",
        "step R °C/W",
        "step τ s",
        "step T_amb °C",
        "step sim RMS °C",
        "ARX R °C/W",
        "ARX τ s",
        "ARX T_amb °C",
        "ARX sim RMS °C",
        "ARX 1-step RMS °C",
    ]
    rows = []
    for g in r.gpus:
        t = g.thermal
        st, ax = t.step, (t.arx.rc if t.arx else None)
        rows.append(
            [
                g.host,
                g.gpu,
                g.model,
                t.chosen,
                st.r_th_c_per_w if st else None,
                st.tau_s if st else None,
                st.t_amb_c if st else None,
                t.step_sim_rmse_c,
                ax.r_th_c_per_w if ax else None,
                ax.tau_s if ax else None,
                ax.t_amb_c if ax else None,
                t.arx_sim_rmse_c,
                t.arx.one_step_rmse_c if t.arx else None,
            ]
        )
    return _table(headers, rows, left=4)


def _thermal_limits_table(r: Results) -> str:
    headers = [
        "host",
        "gpu",
        "model",
        "power limit W",
        "T_ss at limit °C",
        "slowdown °C",
        "threshold from",
        "headroom °C",
        "max T °C",
        "thermal slowdown s",
        "power-capped s",
        "flags",
    ]
    rows = [
        [
            g.host,
            g.gpu,
            g.model,
            g.power_limit_w,
            g.t_pred_at_limit_c,
            g.slowdown_c,
            g.slowdown_source,
            g.headroom_c,
            g.temp_max_c,
            g.thermal_throttled_s,
            g.power_capped_s,
            ", ".join(g.flags),
        ]
        for g in r.gpus
    ]
    return _table(headers, rows, left=3)


def _step_responses_table(r: Results) -> str:
    headers = [
        "host",
        "gpu",
        "direction",
        "mean power W",
        "T start °C",
        "T∞ °C",
        "± °C",
        "τ s",
        "± s",
        "fit RMS °C",
        "samples",
        "duration s",
    ]
    rows = [
        [
            g.host,
            g.gpu,
            sf.direction,
            sf.power_w,
            sf.t_start_c,
            sf.t_inf_c,
            sf.t_inf_stderr_c,
            sf.tau_s,
            sf.tau_stderr_s,
            sf.rmse_c,
            sf.samples,
            sf.duration_s,
        ]
        for g in r.gpus
        for sf in g.thermal.step_fits
    ]
    return _table(headers, rows, left=3)


def _thermal_nodes_table(r: Results) -> str:
    headers = [
        "node",
        "GPUs",
        "mean R °C/W",
        "mean τ s",
        "mean T_amb °C",
        "hottest T_ss at limit °C",
        "least headroom °C",
        "thermal slowdown s",
        "power-capped s",
    ]
    rows = [
        [
            n.host,
            n.gpus,
            n.r_th_mean_c_per_w,
            n.tau_mean_s,
            n.t_amb_mean_c,
            n.t_pred_at_limit_max_c,
            n.headroom_min_c,
            n.thermal_throttled_s,
            n.power_capped_s,
        ]
        for n in r.nodes
    ]
    return _table(headers, rows)


def _power(ds: Dataset, r: Results) -> Section:
    return [
        "<h2>Power and energy</h2>",
        *(_img(power_figure(ds, r, n.host), f"power and energy of {n.host}") for n in r.nodes),
    ]


def _acoustics(ds: Dataset, r: Results) -> Section:
    return [
        "<h2>Acoustics</h2>",
        _acoustic_gpus_table(r),
        _acoustic_nodes_table(r),
        _img(acoustic_figure(ds, r), "acoustic levels"),
    ]


def _acoustic_gpus_table(r: Results) -> str:
    rows = [
        [
            g.host,
            g.gpu,
            g.model,
            *(
                [g.acoustic.mean_db, g.acoustic.max_db, g.acoustic.idle_db, g.acoustic.steady_db, g.acoustic.samples]
                if g.acoustic
                else [None] * 5
            ),
        ]
        for g in r.gpus
    ]
    return _table(
        ["host", "gpu", "model", "proxy mean dBA", "proxy max dBA", "idle dBA", "steady dBA", "samples"], rows, left=3
    )


def _acoustic_nodes_table(r: Results) -> str:
    headers = [
        "node",
        "proxy from",
        "proxy mean dBA",
        "proxy steady dBA",
        "proxy max dBA",
        "mic mean dBA",
        "mic - proxy dB",
        "± dB",
        "slope",
        "intercept dB",
        "R²",
        "RMS dB",
        "pairs",
    ]
    rows = []
    for n in r.nodes:
        a, m, c = n.acoustic, n.mic, n.calibration
        rows.append(
            [
                n.host,
                n.acoustic_source,
                a.mean_db if a else None,
                a.steady_db if a else None,
                a.max_db if a else None,
                m.mean_db if m else None,
                c.offset_db if c else None,
                c.offset_stderr_db if c else None,
                c.slope if c else None,
                c.intercept_db if c else None,
                c.r2 if c else None,
                c.rmse_db if c else None,
                c.pairs if c else None,
            ]
        )
    return _table(headers, rows, left=2)


def _efficiency(r: Results) -> Section:
    return [
        "<h2>Efficiency</h2>",
        _efficiency_gpus_table(r),
        _efficiency_nodes_table(r),
        _img(efficiency_figure(r), "efficiency"),
    ]


def _efficiency_gpus_table(r: Results) -> str:
    headers = [
        "host",
        "gpu",
        "model",
        "steady s",
        "samples/s",
        "mean W",
        "peak W",
        "steady J",
        "J/sample",
        "samples/J",
        "idle W",
        "probe J (counter)",
        "probe J (∫P dt)",
        "energy from",
        "counter resets",
        "kWh incl. PUE",
        "kg CO2e",
        "GPU-hours",
        "cost",
    ]
    rows = [
        [
            g.host,
            g.gpu,
            g.model,
            e.steady_s,
            e.samples_per_s,
            e.mean_power_w,
            e.peak_power_w,
            e.steady_energy_j,
            e.j_per_sample,
            e.samples_per_j,
            e.idle_power_w,
            e.probe_energy_j,
            e.probe_energy_integral_j,
            e.energy_source,
            e.counter_resets,
            e.kwh,
            e.kg_co2e,
            e.gpu_hours,
            e.cost,
        ]
        for g in r.gpus
        for e in [g.efficiency]
    ]
    return _table(headers, rows, left=3)


def _efficiency_nodes_table(r: Results) -> str:
    rows = [
        [
            n.host,
            n.samples_per_s,
            n.mean_power_w,
            n.steady_energy_j,
            n.samples_per_j,
            n.j_per_sample,
            n.idle_power_w,
            n.probe_energy_j,
        ]
        for n in r.nodes
    ]
    return _table(["node", "samples/s", "mean W", "steady J", "samples/J", "J/sample", "idle W", "probe J"], rows)


def _phases(r: Results) -> Section:
    rows = [
        [
            h,
            p["phase"],
            utc_text(int(str(p["start_ns"])), milliseconds=True),
            utc_text(int(str(p["end_ns"])), milliseconds=True),
            (int(str(p["end_ns"])) - int(str(p["start_ns"]))) / 1e9,
        ]
        for h, ps in r.phases.items()
        for p in ps
    ]
    return ["<h2>Phases</h2>", _table(["node", "phase", "start", "end", "duration s"], rows, left=4)]


def _notes(r: Results) -> Section:
    notes = [n for n in r.notes if n != SIMULATED_NOTE]  # that one opens the report (_header)
    if not notes:
        return []
    return ["<h2>Notes</h2><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>"]


def _settings(settings: dict[str, Any]) -> Section:
    return [
        "<h2>Settings</h2>",
        _table(["setting", "value"], [[k, v] for k, v in settings.items()]),
        '<p class="muted">Every number is also in the JSON file next to this report.</p></body></html>',
    ]
