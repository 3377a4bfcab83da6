"""Part: model. ``gpuprobe model predict``: a fitted model (the JSON ``gpuprobe model`` writes) applied to another
window,
or asked for the steady temperature at a given power (docs/models.md, "Predicting with a fitted model").

**Another window.** Each GPU's chosen output-error model (``thermal.fitted``) is driven by the window's
measured power (its 1 s average read :data:`~gpuprobe.model.thermal.AVERAGE_DELAY_S` later, as the fit
reads it) and, for a model with the node's inlet stage, the node's summed power, on the grid the fit
would use for that window. It starts in equilibrium at the power of the first seconds, and the first
prediction is made the first measured temperature. Where the measured temperature holds within 1 °C
over the window's first 20 s, or until its power first moves (at least 5 s), the window starts in
equilibrium: T_amb is shifted for the whole window by the mean difference over those seconds (the air
is not the fitted window's; for whole-degree readings only what exceeds their ±0.5 °C rounding).
Otherwise (a window that starts warm, mid-transient) the slow stage's initial offset takes the
difference, and it decays with that stage. The error against the measured temperature gives the RMS,
the bias (mean of predicted - measured) and the largest absolute error.

**At a power.** Each GPU's steady temperature at ``power_w`` (every GPU of its node at that power for
the node's inlet stage), or, with ``inlet_c``, that inlet temperature plus the GPU's own rise (the
given air replaces T_amb and the node's inlet stage); the time to come within ``within_c`` of it after
a step from the fitted window's idle power (``power_low_w``), and the headroom to the GPU's slowdown
threshold.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpuprobe.errors import DataError
from gpuprobe.influx.settings import InfluxSettings
from gpuprobe.model.thermal import AVERAGE_DELAY_S, ThermalFit, headroom_c, predicted_temperature
from gpuprobe.model.thermal_stages import MAX_GRID, FanLaw, Inlet, Stage, StageModel
from gpuprobe.texttable import text_table

#: a window whose temperature holds within STEADY_START_SPAN_C (one whole-degree step: the readings'
#: rounding) over its first STEADY_START_S, or until its power first moves (at least STEADY_START_MIN_S),
#: starts in equilibrium
STEADY_START_S, STEADY_START_MIN_S, STEADY_START_SPAN_C, STEADY_START_POWER_W = 20.0, 5.0, 1.0, 20.0


class FittedError(DataError, ValueError):
    """The fitted JSON holds no usable model."""


@dataclass(frozen=True)
class FittedGpu:
    host: str
    gpu: str
    model: StageModel
    slowdown_c: float | None
    power_low_w: float | None


@dataclass(frozen=True)
class WindowError:
    host: str
    gpu: str
    model: str
    samples: int
    rmse_c: float
    bias_c: float
    max_abs_error_c: float
    start: str  # "ambient" (the window starts steady: T_amb shifted) or "transient" (the slow stage offset)
    start_shift_c: float  # the difference the first measured temperature made
    t_ns: np.ndarray = dataclasses.field(repr=False)
    measured_c: np.ndarray = dataclasses.field(repr=False)
    predicted_c: np.ndarray = dataclasses.field(repr=False)


@dataclass(frozen=True)
class SteadyAnswer:
    host: str
    gpu: str
    model: str
    power_w: float
    steady_c: float
    time_to_within_s: float | None  # None: no step from the idle power (already there)
    within_c: float
    slowdown_c: float | None
    headroom_c: float | None


def _stage_model(d: dict[str, Any]) -> StageModel:
    stages = tuple(Stage(float(s["r_c_per_w"]), float(s["tau_s"])) for s in d["stages"])
    inlet = Inlet(float(d["inlet"]["c_per_w"]), float(d["inlet"]["tau_s"])) if d.get("inlet") else None
    fan = FanLaw(float(d["fan"]["floor"]), float(d["fan"]["steady_fan_pct"])) if d.get("fan") else None
    return StageModel(
        str(d["name"]), float(d["t_amb_c"]), stages, inlet, fan, float(d["x0_offset_c"]), int(d["parameters"])
    )


def load_fitted(document: dict[str, Any], hosts: Sequence[str] = ()) -> tuple[list[FittedGpu], list[str]]:
    """The GPUs of a fitted JSON with a model (``hosts``: only these), and a note per GPU left out."""
    gpus, skipped = [], []
    for g in document.get("gpus", []):
        if hosts and g["host"] not in hosts:
            continue
        thermal = g.get("thermal", {})
        if thermal.get("cannot_tell"):
            skipped.append(f"{g['host']} gpu {g['gpu']}: no model ({thermal['cannot_tell']})")
            continue
        if not thermal.get("fitted"):
            skipped.append(f"{g['host']} gpu {g['gpu']}: no output-error model in the fitted JSON")
            continue
        gpus.append(
            FittedGpu(
                str(g["host"]),
                str(g["gpu"]),
                _stage_model(thermal["fitted"]),
                g.get("slowdown_c"),
                thermal.get("power_low_w"),
            )
        )
    if not gpus:
        raise FittedError(
            "the fitted JSON has no GPU with a thermal model" + (f" on {', '.join(hosts)}" if hosts else "")
        )
    return gpus, skipped


def predict_window(
    fitted: FittedGpu,
    t_ns: np.ndarray,
    temp_c: np.ndarray,
    power_w: np.ndarray,
    *,
    power_is_average: bool,
    node_w: np.ndarray | None,
    fan_pct: np.ndarray | None,
) -> WindowError | None:
    """One GPU's model driven by another window's measured power (module docstring); None when the window
    lacks what the model needs (too few samples, no node power for an inlet model)."""
    model = fitted.model
    if model.inlet is not None and node_w is None:
        return None
    ok = np.isfinite(temp_c) & np.isfinite(power_w)
    if ok.sum() < 2:
        return None
    t_ok = t_ns[ok]
    duration_s = (t_ok[-1] - t_ok[0]) / 1e9
    grid_s = max(float(np.median(np.diff(t_ok))) / 1e9, duration_s / MAX_GRID)
    fan = fan_pct if model.fan is not None else None
    if model.fan is not None and (fan is None or not np.any(np.isfinite(fan))):
        # no fan reading in this window: the slow stage at the fan speed the model reports its figures at
        fan = np.full(len(t_ns), model.fan.steady_fan_pct)
    start = dataclasses.replace(model, x0_offset_c=0.0)

    def run(m: StageModel) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        fit = ThermalFit(fitted=m, grid_s=grid_s)
        return predicted_temperature(
            fit, t_ns, temp_c, power_w, power_is_average=power_is_average, node_w=node_w, fan_pct=fan
        )

    first = run(start)
    if first is None:
        return None
    t, measured, predicted = first
    steady = _steady_start(t, measured, np.interp(t, t_ns[ok], power_w[ok]))
    steady_start = steady is not None
    shift = float(measured[0] - predicted[0])
    if steady is not None:
        shift = float(np.mean(measured[steady] - predicted[steady]))
        if np.all(measured == np.round(measured)):
            # whole-degree readings place a steady temperature only to ±0.5 °C: only what is beyond is the air's
            shift = math.copysign(max(abs(shift) - 0.5, 0.0), shift)
    # the first prediction made the first measured temperature: a window that starts steady is in
    # equilibrium, so the difference is its air's (T_amb shifted for the whole window); one that starts
    # moving is mid-transient, so the difference is the slow stage's, and decays with it
    second = run(
        dataclasses.replace(start, t_amb_c=model.t_amb_c + shift)
        if steady_start
        else dataclasses.replace(model, x0_offset_c=shift)
    )
    assert second is not None
    t, measured, predicted = second
    err = predicted - measured
    return WindowError(
        fitted.host,
        fitted.gpu,
        model.name,
        len(err),
        float(np.sqrt(np.mean(err**2))),
        float(np.mean(err)),
        float(np.max(np.abs(err))),
        "ambient" if steady_start else "transient",
        shift,
        t,
        measured,
        predicted,
    )


def _steady_start(t_ns: np.ndarray, temp_c: np.ndarray, power_w: np.ndarray) -> np.ndarray | None:
    """The samples of the window's steady start, or None where it starts moving: up to its first
    :data:`STEADY_START_S`, before the power first leaves its first level (by more than
    :data:`STEADY_START_POWER_W` or 10 %), at least :data:`STEADY_START_MIN_S` long, the measured temperature
    within :data:`STEADY_START_SPAN_C` throughout."""
    level = float(power_w[0])
    moved = np.flatnonzero(np.abs(power_w - level) > max(STEADY_START_POWER_W, 0.1 * abs(level)))
    end_ns = min(t_ns[0] + STEADY_START_S * 1e9, t_ns[moved[0]] if len(moved) else np.inf)
    first = t_ns < end_ns
    if first.sum() < 3 or (t_ns[first][-1] - t_ns[0]) / 1e9 < STEADY_START_MIN_S:
        return None
    return first if float(np.ptp(temp_c[first])) <= STEADY_START_SPAN_C else None


def steady_answer(
    fitted: FittedGpu, power_w: float, node_gpus: int, *, inlet_c: float | None = None, within_c: float = 1.0
) -> SteadyAnswer:
    """The steady temperature at ``power_w``, the time to come within ``within_c`` of it, the headroom."""
    model = fitted.model
    stages = [(s.r_c_per_w, s.tau_s, power_w) for s in model.effective_stages()]
    if model.inlet is not None and inlet_c is None:
        stages.append((model.inlet.c_per_w, model.inlet.tau_s, power_w * node_gpus))
    base = model.t_amb_c if inlet_c is None else inlet_c
    steady = base + sum(r * p for r, _, p in stages)
    idle_w = fitted.power_low_w
    reach: float | None = None
    if idle_w is not None and math.isfinite(idle_w):
        # each stage's remaining rise after a step from the idle power decays with its own τ
        scale = (power_w - idle_w) / power_w if power_w else 0.0
        gaps = [(r * p * scale, tau) for r, tau, p in stages]

        def gap(t_s: float) -> float:
            return abs(sum(d * math.exp(-t_s / tau) for d, tau in gaps))

        if gap(0.0) > within_c:
            lo, hi = 0.0, max(tau for _, tau in gaps)
            while gap(hi) > within_c:
                hi *= 2
            for _ in range(60):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if gap(mid) > within_c else (lo, mid)
            reach = hi
        else:
            reach = 0.0
    slowdown = fitted.slowdown_c
    return SteadyAnswer(
        fitted.host,
        fitted.gpu,
        model.name,
        power_w,
        steady,
        reach,
        within_c,
        slowdown,
        headroom_c(slowdown, steady),
    )


def window_table(errors: Sequence[WindowError], skipped: Sequence[str]) -> str:
    headers = ["host", "gpu", "model", "samples", "RMS °C", "bias °C", "max |err| °C"]
    rows = [
        [e.host, str(e.gpu), e.model, str(e.samples), f"{e.rmse_c:.2f}", f"{e.bias_c:+.2f}", f"{e.max_abs_error_c:.2f}"]
        for e in errors
    ]
    lines = text_table(headers, rows, left=1, rule=True)
    if errors:
        lines.append(f"median RMS {float(np.median([e.rmse_c for e in errors])):.2f} °C over {len(errors)} GPUs")
    lines.extend(f"note: {s}" for s in skipped)
    return "\n".join(lines)


def steady_table(answers: Sequence[SteadyAnswer], skipped: Sequence[str]) -> str:
    def maybe(value: float | None, spec: str) -> str:
        return "—" if value is None else format(value, spec)

    headers = ["host", "gpu", "model", "power W", "steady °C", "to within", "slowdown", "headroom"]
    rows = [
        [
            a.host, str(a.gpu), a.model, f"{a.power_w:.0f}", f"{a.steady_c:.1f}",
            "—" if a.time_to_within_s is None else f"{a.time_to_within_s:.0f} s (±{a.within_c:g} °C)",
            maybe(a.slowdown_c, ".1f"), maybe(a.headroom_c, ".1f"),
        ]
        for a in answers
    ]  # fmt: skip
    lines = text_table(headers, rows, left=1, rule=True)
    lines.extend(f"note: {s}" for s in skipped)
    return "\n".join(lines)


def window_json(errors: Sequence[WindowError], skipped: Sequence[str], start_ns: int, end_ns: int) -> dict[str, Any]:
    return {
        "start_ns": start_ns,
        "end_ns": end_ns,
        "gpus": [
            {
                "host": e.host,
                "gpu": e.gpu,
                "model": e.model,
                "samples": e.samples,
                "rmse_c": e.rmse_c,
                "bias_c": e.bias_c,
                "max_abs_error_c": e.max_abs_error_c,
                "start": e.start,
                "start_shift_c": e.start_shift_c,
            }
            for e in errors
        ],
        "median_rmse_c": float(np.median([e.rmse_c for e in errors])) if errors else None,
        "notes": list(skipped),
    }


def steady_json(answers: Sequence[SteadyAnswer], skipped: Sequence[str], inlet_c: float | None) -> dict[str, Any]:
    return {
        "inlet_c": inlet_c,
        "gpus": [dataclasses.asdict(a) for a in answers],
        "notes": list(skipped),
    }


def window_html(errors: Sequence[WindowError], title: str) -> str:
    """One self-contained page: per host a plot of each GPU's measured and predicted temperature."""
    import html

    from gpuprobe.model.html import img, png, pyplot
    from gpuprobe.model.report import CSS

    plt = pyplot()
    title = html.escape(title)

    parts = [f"<!doctype html><meta charset=utf-8><title>{title}</title><style>{CSS}</style><h1>{title}</h1>"]
    parts.append(f"<pre>{html.escape(window_table(errors, []))}</pre>")
    for host in sorted({e.host for e in errors}):
        fig, ax = plt.subplots(figsize=(11, 4.5))
        for e in (e for e in errors if e.host == host):
            t_s = (e.t_ns - e.t_ns[0]) / 1e9
            line = ax.plot(t_s, e.measured_c, lw=0.8, label=f"gpu {e.gpu} measured")[0]
            ax.plot(t_s, e.predicted_c, lw=1.2, ls="--", color=line.get_color(), label=f"gpu {e.gpu} predicted")
        ax.set_xlabel("time in the window, s")
        ax.set_ylabel("temperature, °C")
        ax.set_title(f"{host}: measured and predicted from the measured power")
        ax.legend(fontsize=7, ncol=4)
        parts.append(img(png(fig), f"predicted temperature of {host}"))
    return "\n".join(parts)


def write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def predict_range(
    influx: InfluxSettings, fitted: Sequence[FittedGpu], start_ns: int, end_ns: int, hosts: Sequence[str] = ()
) -> tuple[list[WindowError], list[str]]:
    """Every fitted GPU's prediction of the window [start, end] read from InfluxDB (the node's power summed
    over the GPUs the window has on that host, as ``gpuprobe model`` sums it)."""
    from gpuprobe.influx.client import InfluxClient
    from gpuprobe.model.data import load, range_window

    wanted = tuple(hosts) or tuple(sorted({g.host for g in fitted}))
    with InfluxClient(influx, user_agent="gpuprobe-model") as client:
        window = range_window(client, start_ns, end_ns, wanted, "--hosts" if hosts else "the fitted file's hosts")
        dataset = load(client, window)
    errors, skipped = [], []
    for f in fitted:
        series = next((g for g in dataset.gpus if (g.host, g.gpu) == (f.host, f.gpu)), None)
        if series is None:
            skipped.append(f"{f.host} gpu {f.gpu}: no samples in the window")
            continue
        g = series.inside(start_ns, end_ns)
        power, is_average = g.power()
        node_w, node_gpus = dataset.node_power(g.host, g.t_ns, AVERAGE_DELAY_S)
        fan = g.field("fan_pct") if g.has("fan_pct") else None
        result = predict_window(
            f,
            g.t_ns,
            g.field("temp_c"),
            power,
            power_is_average=is_average,
            node_w=node_w if node_gpus >= 2 else None,
            fan_pct=fan,
        )
        if result is None:
            skipped.append(f"{f.host} gpu {f.gpu}: the window lacks what its {f.model.name} model needs")
            continue
        errors.append(result)
    return errors, skipped
