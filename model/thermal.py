"""Part: model. Thermal models of one GPU: the output-error stage models (:mod:`.thermal_stages`, chosen by their
error on held-out data) and two first-order second opinions, the step fit and the ARX fit.

The reported model (``ThermalFit.rc``, ``model``, ``stages``, ``inlet``) is the output-error model
chosen by :func:`~gpuprobe.model.thermal_stages.fit_staged_node`: ``r_th_c_per_w`` is its total own-power
resistance (at the steady-load fan speed for fan models), ``tau_s`` its slow (dominant) stage and
``t_amb_c`` the temperature at zero own and zero node power. Only when that fit is impossible does the
better of the step and ARX fits stand in (as before).

The first-order model (lumped RC; the compact-RC reference is HotSpot)::

    C·dT/dt = P - (T - T_amb)/R        T_ss = T_amb + R·P        τ = R·C
    after a step to constant P at t_s:  T(t) = T_ss + (T(t_s) - T_ss)·exp(-(t - t_s)/τ)

**Step fit** (second opinion). The load step up and the step down are found in the power series (a
threshold halfway between the idle and the load level, runs shorter than ``min_run_s`` ignored).
Each response is fitted with ``scipy.optimize.curve_fit`` over its *whole* segment, three free
parameters ``T∞``, ``T_start`` and ``τ``: a free ``T_start`` absorbs the unknown step instant
within one sampling interval, and fitting the whole curve — where the true temperature sweeps
through many integer degrees — makes the rounding of NVML's integer readings average out instead
of biasing ``T∞`` (which a plateau read at one integer would do by up to 0.5 °C). The two
asymptotes give ``R = (T∞,up - T∞,down) / (P_up - P_down)`` and ``T_amb = T∞,down - R·P_down``;
``τ`` is the inverse-variance mean of the two fits. With only one response, the other level is
the mean temperature over the last seconds before the step (assumed steady; noted). Samples taken
while the GPU is slowed down (HW slowdown, SW/HW thermal, power brake) end the heating segment: the
constant-power step response does not hold there. Under multi-level loads (a warm-up at a lower load
than the steady phase, as the trainer runs) one exponential per segment does not describe the curve
and the step fit is biased (7-20 % on real traces); the output-error fit models the measured power.

**ARX fit** (second opinion): least squares on ``T[k+1] = a·T[k] + b·P[k] + c`` over the whole
window, then ``τ = -Δt/ln a``, ``R = b/(1-a)``, ``T_amb = c/(1-a)``. On raw 100 ms integer data
this is badly biased: per step the temperature changes by a fraction of a degree, so the rounding
error (uniform, ±0.5 °C) is of the order of the signal in the regressor ``T[k]`` (errors in
variables attenuate ``1-a``), and NVML's power is piecewise constant per ~100 ms. The series is
therefore first reduced to means over ``resample_s`` (default 1 s) bins, which both averages the
rounding and makes each step's change several degrees; the input of a pair is the mean power over
the two bins (block means of a first-order system are exactly first-order when the input is
constant over the two bins; the mean over both is the best single value at a step).

Of these two, whichever simulates the measured temperature better from the measured power (the RMS
of an output-error simulation over the whole window) is the fallback when the output-error fit fails.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpuprobe.model.thermal_stages import (
    TAU_MAX_S,
    Candidate,
    Inlet,
    Interval,
    Stage,
    StagedFit,
    StagedInput,
    StageModel,
    fit_staged_node,
)

# nvmlClocksEventReasons
REASON_SW_POWER_CAP = 0x4
REASON_HW_SLOWDOWN = 0x8
REASON_SW_THERMAL = 0x20
REASON_HW_THERMAL = 0x40
REASON_HW_POWER_BRAKE = 0x80
# thermal throttling, as docs/schema.md counts it (`& 96`); HW slowdown (0x8) alone may also be a power brake
THERMAL_REASONS = REASON_SW_THERMAL | REASON_HW_THERMAL
# any slowdown that lowers clocks and power below what the load asks for (ends a heating step response)
SLOWDOWN_REASONS = REASON_HW_SLOWDOWN | REASON_SW_THERMAL | REASON_HW_THERMAL | REASON_HW_POWER_BRAKE
POWER_REASONS = REASON_SW_POWER_CAP | REASON_HW_POWER_BRAKE

# group delay of NVML's 1 s power average: the mean of the last n = 1 s / Δ updates lags by (n - 1)·Δ/2
AVERAGE_DELAY_S = 0.45
# when a GPU reported no slowdown threshold (no `gpu_info` point with `temp_slowdown_c`): the lowest
# SLOWDOWN threshold of public `nvidia-smi -q` dumps (V100-PCIE-32GB 87 °C; A100 and H800 89 °C), so
# the headroom errs on the safe side (docs/models.md, "Derived")
DEFAULT_SLOWDOWN_C = 87.0


def slowdown_for(override_c: float | None, reported_c: float | None) -> tuple[float, str]:
    """The slowdown threshold to use and where it came from: ``option`` (``--slowdown-c``), ``gpu`` (the
    GPU's own threshold, from its latest ``gpu_info`` point) or ``default`` (:data:`DEFAULT_SLOWDOWN_C`)."""
    if override_c is not None:
        return override_c, "option"
    if reported_c is not None:
        return reported_c, "gpu"
    return DEFAULT_SLOWDOWN_C, "default"


def headroom_c(slowdown_c: float | None, steady_c: float | None) -> float | None:
    """gpuprobe's one *headroom* (model report, ``model predict``, study report; docs/models.md, "Derived"):
    the GPU's slowdown threshold minus the temperature it settles at under a sustained load, the °C
    that load keeps from throttling; negative: it would throttle. Not the peak of a window, which a window
    shorter than a few time constants ends well below the steady temperature (an A100 studied in 20 s
    windows showed 35 °C where its steady temperature left 14.6 °C). ``gpuprobe model`` takes the fit's
    steady temperature at the power limit, a study point the one its window was heading to
    (:func:`window_steady_c`)."""
    if slowdown_c is None or steady_c is None:
        return None
    return slowdown_c - steady_c


# a window's step fit is believed only while its τ is within this many window lengths (beyond, the
# curve is nearly a straight line and its asymptote could be anywhere) and its asymptote's standard
# error under STEADY_STDERR_C
STEADY_TAU_WINDOWS = 2.0
STEADY_STDERR_C = 2.0


def window_steady_c(t_ns: np.ndarray, temp_c: np.ndarray, power_w: np.ndarray) -> tuple[float | None, bool]:
    """The steady temperature a window of nearly constant power was heading to, and whether it is the step
    response's fitted asymptote (:func:`fit_step`, True) or only the median of the window's last quarter
    (False: the fit failed or is not to be believed, see ``STEADY_TAU_WINDOWS``; a lower bound while the
    GPU still warmed up). None without temperature readings."""
    keep = np.isfinite(temp_c)
    t, temp = t_ns[keep], temp_c[keep]
    if len(temp) == 0:
        return None, False
    power = np.where(np.isfinite(power_w[keep]), power_w[keep], 0.0)
    quarter = max(1, len(temp) // 4)
    last = float(np.median(temp[-quarter:]))
    if abs(last - float(np.median(temp[:quarter]))) <= 1.0:  # within the readings' 1 °C steps: settled
        return last, True
    step = fit_step("heating", t, temp, power, int(t[0]), 0.0)
    duration_s = (int(t[-1]) - int(t[0])) / 1e9
    if (
        step is not None
        and step.tau_s <= STEADY_TAU_WINDOWS * duration_s
        and math.isfinite(step.t_inf_stderr_c)
        and step.t_inf_stderr_c < STEADY_STDERR_C
    ):
        return step.t_inf_c, True
    return last, False


@dataclass(frozen=True)
class RC:
    r_th_c_per_w: float
    tau_s: float
    t_amb_c: float

    def steady_c(self, power_w: float) -> float:
        return self.t_amb_c + self.r_th_c_per_w * power_w


@dataclass(frozen=True)
class StepFit:
    """One fitted step response."""

    direction: str  # "heating" or "cooling"
    t_step_ns: int
    power_w: float  # mean power during the segment
    t_inf_c: float
    t_start_c: float
    tau_s: float
    tau_stderr_s: float
    t_inf_stderr_c: float
    rmse_c: float
    samples: int
    duration_s: float


@dataclass(frozen=True)
class ArxFit:
    a: float
    b: float
    c: float
    rc: RC | None
    resample_s: float
    one_step_rmse_c: float
    pairs: int
    tau_stderr_s: float | None
    r_stderr_c_per_w: float | None


@dataclass
class ThermalFit:
    """Everything fitted and derived for one GPU."""

    step: RC | None = None
    step_fits: list[StepFit] = field(default_factory=list)
    step_sim_rmse_c: float | None = None
    arx: ArxFit | None = None
    arx_sim_rmse_c: float | None = None
    chosen: str = "none"  # the method: "output-error", else (fallback) "step" or "arx"
    rc: RC | None = None  # total own R, slow τ, T_amb of the chosen model
    model: str = "none"  # rc1, rc2, rc2+inlet, rc2+fan, rc2+inlet+fan (or rc1 for the step/ARX fallback)
    r_th_c_per_w: float | None = None
    tau_s: float | None = None
    t_amb_c: float | None = None
    method: str = "none"
    fit_rmse_c: float | None = None  # the chosen model simulated over the whole window
    holdout_rmse_c: float | None = None  # fitted on the first 1-F, error over the last F
    rc1_holdout_rmse_c: float | None = None  # the first-order model's, for comparison
    holdout_fraction: float | None = None
    holdout_start_ns: int | None = None
    stages: list[Stage] = field(default_factory=list)  # fast first; at the steady-load fan speed
    inlet: Inlet | None = None
    fan_floor: float | None = None  # slow-stage conductance at zero fan relative to full fan (fan models)
    steady_fan_pct: float | None = None
    fitted: StageModel | None = None  # the chosen model as fitted on the whole window
    held_out: StageModel | None = None  # the same model fitted on the first 1-F only
    candidates: list[Candidate] = field(default_factory=list)
    grid_s: float | None = None
    inlet_source: str | None = None  # "node": the inlet stage fitted jointly with every GPU of the node
    power_low_w: float | None = None
    power_high_w: float | None = None
    power_source: str = "power_instant_w"
    notes: list[str] = field(default_factory=list)
    # why the recording cannot give this GPU's parameters (then rc and its numbers are None): no load
    # step, a parameter at a solver bound, or R_th and T_amb not separable (can_tell)
    cannot_tell: str | None = None
    cannot_tell_detail: str | None = None
    # 90 % intervals of the output-error model's figures (thermal_stages.intervals), by figure name
    intervals: dict[str, Interval] = field(default_factory=dict)


# --- helpers ---------------------------------------------------------------------------------------


def _runs(flags: np.ndarray) -> list[tuple[int, int, bool]]:
    """(start, end, value) of each run of equal values; end exclusive."""
    out: list[tuple[int, int, bool]] = []
    start = 0
    for i in range(1, len(flags) + 1):
        if i == len(flags) or flags[i] != flags[start]:
            out.append((start, i, bool(flags[start])))
            start = i
    return out


def detect_steps(
    t_s: np.ndarray, power_w: np.ndarray, min_run_s: float = 2.0, min_step_w: float = 5.0
) -> tuple[tuple[int, int] | None, tuple[int, int] | None, float, float]:
    """The heating segment (first loaded run after an unloaded one) and the cooling segment after it.

    Returns ``(heating, cooling, low_w, high_w)``; a segment is ``(start, end)`` sample indices, end
    exclusive, or None. Levels are the 10th and 90th percentiles of power.
    """
    low, high = float(np.percentile(power_w, 10)), float(np.percentile(power_w, 90))
    if high - low < max(min_step_w, 0.1 * high):
        return None, None, low, high
    above = power_w >= (low + high) / 2
    runs = _runs(above)
    # merge runs shorter than min_run_s into their neighbours (brief dips and spikes of a real workload)
    merged: list[list[Any]] = []
    for start, end, value in runs:
        short = t_s[end - 1] - t_s[start] < min_run_s and merged
        if merged and (short or merged[-1][2] == value):
            merged[-1][1] = end
        else:
            merged.append([start, end, value])
    heating = cooling = None
    for k in range(1, len(merged)):
        if merged[k][2] and not merged[k - 1][2]:
            heating = (merged[k][0], merged[k][1])
            if k + 1 < len(merged):
                cooling = (merged[k + 1][0], merged[k + 1][1])
            break
    if heating is None and len(merged) >= 2 and merged[0][2] and not merged[1][2]:
        cooling = (merged[1][0], merged[1][1])
    return heating, cooling, low, high


def _step_model(x: np.ndarray, t_inf: float, t_start: float, tau: float) -> np.ndarray:
    result: np.ndarray = t_inf + (t_start - t_inf) * np.exp(-x / tau)
    return result


def fit_step(
    direction: str, t_ns: np.ndarray, temp_c: np.ndarray, power_w: np.ndarray, t_step_ns: int, skip_power_s: float
) -> StepFit | None:
    """curve_fit of one step response over the whole segment (see the module docstring)."""
    from scipy.optimize import curve_fit

    if len(t_ns) < 10:
        return None
    x = (t_ns - t_step_ns) / 1e9
    duration = float(x[-1] - x[0])
    if duration < 1.0:
        return None
    t_start0, t_inf0 = float(temp_c[0]), float(np.mean(temp_c[-max(1, len(temp_c) // 10) :]))
    target = t_start0 + 0.632 * (t_inf0 - t_start0)
    crossed = np.nonzero((temp_c - target) * np.sign(t_inf0 - t_start0 or 1.0) >= 0)[0]
    tau0 = float(max(x[crossed[0]], 0.1)) if len(crossed) else duration / 3
    try:
        popt, pcov = curve_fit(
            _step_model,
            x,
            temp_c,
            p0=[t_inf0, t_start0, tau0],
            bounds=([-100.0, -100.0, 0.01], [300.0, 300.0, 1e6]),
            maxfev=20000,
        )
    except (RuntimeError, ValueError):
        return None
    residuals = temp_c - _step_model(x, *popt)
    errors = np.sqrt(np.abs(np.diag(pcov))) if np.all(np.isfinite(pcov)) else np.full(3, math.nan)
    keep = x >= x[0] + skip_power_s
    power = float(np.mean(power_w[keep] if np.any(keep) else power_w))
    return StepFit(
        direction=direction,
        t_step_ns=int(t_step_ns),
        power_w=power,
        t_inf_c=float(popt[0]),
        t_start_c=float(popt[1]),
        tau_s=float(popt[2]),
        tau_stderr_s=float(errors[2]),
        t_inf_stderr_c=float(errors[0]),
        rmse_c=float(np.sqrt(np.mean(residuals**2))),
        samples=len(x),
        duration_s=duration,
    )


def simulate(t_ns: np.ndarray, power_w: np.ndarray, rc: RC, t0_c: float) -> np.ndarray:
    """The RC model's temperature at each sample, driven by the measured power (held between samples)."""
    out = np.empty(len(t_ns))
    out[0] = t0_c
    dt = np.diff(t_ns) / 1e9
    decay = np.exp(-dt / rc.tau_s)
    steady = rc.t_amb_c + rc.r_th_c_per_w * power_w
    for k in range(1, len(t_ns)):
        out[k] = steady[k - 1] + (out[k - 1] - steady[k - 1]) * decay[k - 1]
    return out


def sim_rmse(t_ns: np.ndarray, temp_c: np.ndarray, power_w: np.ndarray, rc: RC) -> float:
    t0 = float(np.mean(temp_c[: min(len(temp_c), 5)]))
    predicted = simulate(t_ns, power_w, rc, t0)
    return float(np.sqrt(np.mean((predicted - temp_c) ** 2)))


def fit_arx(t_ns: np.ndarray, temp_c: np.ndarray, power_w: np.ndarray, resample_s: float) -> ArxFit | None:
    """Least squares on T[k+1] = a·T[k] + b·P[k] + c over ``resample_s`` bin means (module docstring)."""
    if len(t_ns) < 3:
        return None
    bins = ((t_ns - t_ns[0]) // int(resample_s * 1e9)).astype(np.int64)
    n_bins = int(bins[-1]) + 1
    counts = np.bincount(bins, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        temp = np.bincount(bins, weights=temp_c, minlength=n_bins) / counts
        power = np.bincount(bins, weights=power_w, minlength=n_bins) / counts
    valid = counts > 0
    k = np.nonzero(valid[:-1] & valid[1:])[0]
    if len(k) < 5:
        return None
    p_in = (power[k] + power[k + 1]) / 2
    x = np.column_stack([temp[k], p_in, np.ones(len(k))])
    y = temp[k + 1]
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    a, b, c = (float(v) for v in coef)
    residuals = y - x @ coef
    rmse = float(np.sqrt(np.mean(residuals**2)))
    rc = None
    tau_err = r_err = None
    if 0.0 < a < 1.0:
        tau = -resample_s / math.log(a)
        rc = RC(r_th_c_per_w=b / (1 - a), tau_s=tau, t_amb_c=c / (1 - a))
        dof = max(1, len(k) - 3)
        try:
            cov = (residuals @ residuals / dof) * np.linalg.inv(x.T @ x)
            d_tau_da = resample_s / (a * math.log(a) ** 2)
            tau_err = float(abs(d_tau_da) * math.sqrt(max(cov[0, 0], 0.0)))
            grad = np.array([b / (1 - a) ** 2, 1 / (1 - a)])
            r_err = float(math.sqrt(max(float(grad @ cov[:2, :2] @ grad), 0.0)))
        except np.linalg.LinAlgError:
            pass
    return ArxFit(a, b, c, rc, resample_s, rmse, len(k), tau_err, r_err)


def _level_before(t_ns: np.ndarray, values: np.ndarray, index: int, seconds: float) -> float:
    start_ns = t_ns[index] - seconds * 1e9
    window = values[(t_ns >= start_ns) & (np.arange(len(t_ns)) < index)]
    return float(np.mean(window)) if len(window) else float(values[max(0, index - 1)])


def fit_thermal(
    t_ns: np.ndarray,
    temp_c: np.ndarray,
    power_w: np.ndarray,
    reasons: np.ndarray | None,
    *,
    power_is_average: bool,
    resample_s: float = 1.0,
    min_run_s: float = 2.0,
    node_w: np.ndarray | None = None,
    fan_pct: np.ndarray | None = None,
    steady_mask: np.ndarray | None = None,
    holdout: float = 0.3,
) -> ThermalFit:
    """Every fit of one GPU over the window (module docstring).

    ``node_w``: the node's summed GPU power at the same timestamps (already advanced like ``power_w``
    when that is an average), for the inlet models; ``fan_pct`` for the fan models; ``steady_mask``
    marks the steady-load samples whose median fan speed the fan models are evaluated at (default: the
    samples above the midpoint of the power's 10th and 90th percentiles). One GPU alone has no inlet
    candidate: :func:`fit_thermal_node` fits a node's GPUs together, the inlet shared.
    """
    return fit_thermal_node(
        [
            ThermalInput(
                t_ns, temp_c, power_w, reasons, power_is_average, resample_s, min_run_s, node_w, fan_pct, steady_mask
            )
        ],
        holdout=holdout,
    )[0]


@dataclass(frozen=True)
class ThermalInput:
    """One GPU's series for :func:`fit_thermal_node` (the arguments of :func:`fit_thermal`)."""

    t_ns: np.ndarray
    temp_c: np.ndarray
    power_w: np.ndarray
    reasons: np.ndarray | None
    power_is_average: bool
    resample_s: float = 1.0
    min_run_s: float = 2.0
    node_w: np.ndarray | None = None
    fan_pct: np.ndarray | None = None
    steady_mask: np.ndarray | None = None
    mem_temp_c: np.ndarray | None = None  # the memory's temperature (NVML field 82), for the node's inlet


def fit_thermal_node(
    inputs: list[ThermalInput],
    *,
    holdout: float = 0.3,
    progress: Callable[[str], None] | None = None,
    names: Sequence[str] = (),
) -> list[ThermalFit]:
    """Every fit of every GPU of one node: the step and ARX fits per GPU, the output-error stage models
    of the node together (:func:`~gpuprobe.model.thermal_stages.fit_staged_node`: with two GPUs or more
    with the node's power, the inlet candidate is fitted jointly, its stage shared by all of them).
    ``progress`` hears each stage as it starts (``names``: the GPUs as messages call them)."""
    say = progress or (lambda _message: None)
    results, members = [], []
    for i, x in enumerate(inputs):
        say(f"GPU {names[i] if i < len(names) else i}: step and ARX fits")
        result, member = _second_opinions(x)
        results.append(result)
        members.append(member)
    ready = [i for i, m in enumerate(members) if m is not None]
    if ready:
        say(f"output-error models of {'the GPU' if len(ready) == 1 else f'its {len(ready)} GPUs together'}")
    staged = fit_staged_node([m for m in members if m is not None], holdout=holdout) if ready else []
    fits: list[StagedFit | None] = [None] * len(inputs)
    for i, st in zip(ready, staged, strict=True):
        fits[i] = st
    for result, member, st in zip(results, members, fits, strict=True):
        if member is None:
            continue
        if st is not None:
            _apply_staged(result, st)
            if result.inlet is not None:
                result.inlet_source = "node"
        else:
            result.notes.append(
                "the output-error fit was not possible: the better of the step and ARX fits is reported"
            )
        if result.rc is not None:
            result.r_th_c_per_w, result.tau_s, result.t_amb_c = (
                result.rc.r_th_c_per_w,
                result.rc.tau_s,
                result.rc.t_amb_c,
            )
            result.method = result.chosen
        reason = can_tell(member, result)
        if reason is not None:
            result.cannot_tell, result.cannot_tell_detail = reason
            result.notes.append(f"can't tell: {reason[0]} ({reason[1]}); no parameters reported")
            result.rc = result.step = result.arx = None  # the second opinions' numbers are no better
            result.step_sim_rmse_c = result.arx_sim_rmse_c = None
            result.r_th_c_per_w = result.tau_s = result.t_amb_c = None
            result.stages, result.inlet, result.fan_floor = [], None, None
            result.intervals = {}
            result.method = "not identifiable"
    return results


#: The power must move by this much (5th to 95th percentile) for the temperature's response to tell
#: R_th from T_amb: T = T_amb + R_th·P at a steady P has one equation for two unknowns. The larger of an
#: absolute floor (integer-watt readings of an idle GPU wander by a few W) and a share of the power.
NO_STEP_MIN_W, NO_STEP_MIN_SHARE = 20.0, 0.15
#: |correlation| of the R_th and T_amb estimates above which one cannot be told from the other
#: (the linear first-order model at the fitted slow τ: T = T_amb + R_th·y(t) + d·e^(-t/τ), y the power
#: through the stage). The real H100 recordings with a step give 0.91-0.98; a warm start at one power
#: gives 1.0000.
INSEPARABLE_CORRELATION = 0.995


def can_tell(member: StagedInput, fit: ThermalFit) -> tuple[str, str] | None:
    """None when the window can give this GPU's R_th, τ and T_amb; else (reason, detail)."""
    power = member.power_w[np.isfinite(member.power_w)]
    if len(power) == 0:
        return None
    p5, p95 = (float(v) for v in np.percentile(power, [5, 95]))
    needed = max(NO_STEP_MIN_W, NO_STEP_MIN_SHARE * p95)
    if p95 - p5 < needed:
        return (
            "not identifiable (no load step)",
            f"power stayed within {p5:.0f}-{p95:.0f} W (5th-95th percentile), a step of {needed:.0f} W or more "
            "is needed to tell R_th from T_amb",
        )
    model = fit.fitted
    if model is not None:
        at = _at_bound(model)
        if at:
            return "a parameter at the solver's bound", f"{at}: a limit of the search, not a measurement"
    if fit.rc is not None:
        corr = rth_tamb_correlation(member.t_ns, member.power_w, fit.rc.tau_s)
        if corr is not None and abs(corr) > INSEPARABLE_CORRELATION:
            return (
                "R_th and T_amb not separable",
                f"their estimates correlate {corr:+.4f} in this recording (the power hardly moves against its "
                "level): a longer recording with a load step is needed",
            )
    return None


def _at_bound(model: StageModel) -> str:
    """The first parameter of the fitted model at a bound of the search (thermal_stages._bounds)."""
    span = 1e-3
    if model.t_amb_c <= -50.0 + span or model.t_amb_c >= 150.0 - span:
        return f"T_amb {model.t_amb_c:.1f} °C"
    # a fast stage at its lower τ bound is a stage the data does not need, not a wrong number
    if model.tau_slow_s >= TAU_MAX_S * 0.999:
        return f"τ {model.tau_slow_s:.0f} s"
    for stage in model.stages:
        if stage.r_c_per_w >= 20.0 - span:
            return f"R {stage.r_c_per_w:.3g} °C/W"
    return ""


def rth_tamb_correlation(t_ns: np.ndarray, power_w: np.ndarray, tau_s: float) -> float | None:
    """The correlation of the least-squares estimates of T_amb and R_th in T = T_amb + R_th·y + d·e^(-t/τ)
    (y: the power through a first-order stage of time constant τ from zero): near ±1 when the data
    cannot tell a higher T_amb from a lower R_th. None when it cannot be computed."""
    if len(t_ns) < 3 or not tau_s > 0:
        return None
    ok = np.isfinite(power_w)
    t_s, p = (t_ns[ok] - t_ns[ok][0]) / 1e9, power_w[ok]
    y = np.empty(len(t_s))
    y[0] = 0.0
    decay = np.exp(-np.diff(t_s) / tau_s)
    for k in range(1, len(t_s)):
        y[k] = p[k - 1] + (y[k - 1] - p[k - 1]) * decay[k - 1]
    x = np.column_stack([np.ones(len(t_s)), y, np.exp(-t_s / tau_s)])
    try:
        cov = np.linalg.inv(x.T @ x)
    except np.linalg.LinAlgError:
        return 1.0
    denominator = math.sqrt(cov[0, 0] * cov[1, 1])
    return float(cov[0, 1] / denominator) if denominator > 0 else None


def _second_opinions(x: ThermalInput) -> tuple[ThermalFit, StagedInput | None]:
    """The step and ARX fits of one GPU, and its input to the stage models (None: too few samples)."""
    t_ns, temp_c, power_w, reasons = x.t_ns, x.temp_c, x.power_w, x.reasons
    power_is_average, resample_s, min_run_s = x.power_is_average, x.resample_s, x.min_run_s
    node_w, fan_pct, steady_mask, mem_c = x.node_w, x.fan_pct, x.steady_mask, x.mem_temp_c
    result = ThermalFit(power_source="power_w" if power_is_average else "power_instant_w")
    ok = np.isfinite(temp_c) & np.isfinite(power_w)
    t_ns, temp_c, power_w = t_ns[ok], temp_c[ok], power_w[ok]
    reasons = reasons[ok] if reasons is not None else None
    node_w = node_w[ok] if node_w is not None else None
    fan_pct = fan_pct[ok] if fan_pct is not None else None
    steady_mask = steady_mask[ok] if steady_mask is not None else None
    mem_c = mem_c[ok] if mem_c is not None else None
    if len(t_ns) < 20:
        result.notes.append("too few samples for a thermal fit")
        return result, None
    if power_is_average:
        # NVML's 1 s average lags the power that heats the die by its group delay; reading it that much
        # later centres its ramp on the true step (otherwise the ARX fit and the simulation shorten τ)
        power_w = np.interp(t_ns + AVERAGE_DELAY_S * 1e9, t_ns, power_w)
        result.notes.append(f"power from the 1 s average power_w, advanced by {AVERAGE_DELAY_S:g} s")
    t_s = (t_ns - t_ns[0]) / 1e9
    heating, cooling, low, high = detect_steps(t_s, power_w, min_run_s=min_run_s)
    result.power_low_w, result.power_high_w = low, high
    skip = 1.0 if power_is_average else 0.0
    fits: dict[str, StepFit] = {}
    for direction, segment in (("heating", heating), ("cooling", cooling)):
        if segment is None:
            continue
        start, end = segment
        if direction == "heating" and reasons is not None:
            throttled = np.nonzero(reasons[start:end] & SLOWDOWN_REASONS)[0]
            if len(throttled):
                end = start + int(throttled[0])
                result.notes.append("heating segment cut where a slowdown began")
        if end - start < 10:
            continue
        t_step = int((t_ns[start - 1] + t_ns[start]) // 2) if start > 0 else int(t_ns[start])
        fit = fit_step(direction, t_ns[start:end], temp_c[start:end], power_w[start:end], t_step, skip)
        if fit is not None:
            fits[direction] = fit
            if fit.tau_s > fit.duration_s:
                result.notes.append(f"{direction} segment ({fit.duration_s:.0f} s) shorter than τ: T∞ extrapolated")
    result.step_fits = list(fits.values())
    if not fits:
        result.notes.append("no load step found in the power series: no step fit")
    else:
        up, down = fits.get("heating"), fits.get("cooling")
        if up is not None and down is not None:
            hi_t, hi_p, lo_t, lo_p = up.t_inf_c, up.power_w, down.t_inf_c, down.power_w
        elif up is not None:
            index = int(np.searchsorted(t_ns, up.t_step_ns))
            hi_t, hi_p = up.t_inf_c, up.power_w
            lo_t, lo_p = _level_before(t_ns, temp_c, index, 5.0), _level_before(t_ns, power_w, index, 5.0)
            result.notes.append("no cooling response: idle level taken from the seconds before the load step")
        else:
            assert down is not None
            index = int(np.searchsorted(t_ns, down.t_step_ns))
            lo_t, lo_p = down.t_inf_c, down.power_w
            hi_t, hi_p = _level_before(t_ns, temp_c, index, 5.0), _level_before(t_ns, power_w, index, 5.0)
            result.notes.append("no heating response: load level taken from the seconds before the step down")
        if abs(hi_p - lo_p) > 1e-6:
            r = (hi_t - lo_t) / (hi_p - lo_p)
            weights = [
                1 / f.tau_stderr_s**2 if f.tau_stderr_s > 0 and math.isfinite(f.tau_stderr_s) else 1.0
                for f in fits.values()
            ]
            tau = float(np.average([f.tau_s for f in fits.values()], weights=weights))
            result.step = RC(r_th_c_per_w=r, tau_s=tau, t_amb_c=lo_t - r * lo_p)
            result.step_sim_rmse_c = sim_rmse(t_ns, temp_c, power_w, result.step)
    result.arx = fit_arx(t_ns, temp_c, power_w, resample_s)
    if result.arx is not None and result.arx.rc is not None:
        result.arx_sim_rmse_c = sim_rmse(t_ns, temp_c, power_w, result.arx.rc)
    candidates = [
        (rmse, name, rc)
        for rmse, name, rc in (
            (result.step_sim_rmse_c, "step", result.step),
            (result.arx_sim_rmse_c, "arx", result.arx.rc if result.arx else None),
        )
        if rmse is not None and rc is not None and math.isfinite(rmse)
    ]
    if candidates:
        _, result.chosen, result.rc = min(candidates, key=lambda c: (c[0], c[1] != "step"))
        result.model = "rc1"
        result.fit_rmse_c = min(c[0] for c in candidates)
    if heating is not None and _multi_level(power_w[heating[0] : heating[1]]):
        result.notes.append("power varies within the loaded segment (multi-level load): the step fit is biased")
    steady_fan = None
    if fan_pct is not None and np.any(np.isfinite(fan_pct)):
        loaded = steady_mask if steady_mask is not None and np.any(steady_mask) else power_w >= (low + high) / 2
        fans = fan_pct[loaded & np.isfinite(fan_pct)]
        # the later half of the steady load: the fan where the load settles it (the spec's ground truth)
        steady_fan = float(np.median(fans[len(fans) // 2 :])) if len(fans) else None
    guesses = [(rc.r_th_c_per_w, rc.tau_s, rc.t_amb_c) for _, _, rc in candidates]
    member = StagedInput(t_ns, temp_c, power_w, node_w, fan_pct, steady_fan, guesses, mem_c)
    return result, member


def _multi_level(power_w: np.ndarray) -> bool:
    """More than one load level in a segment: its first and last quarters differ by over 10 %."""
    if len(power_w) < 8:
        return False
    q = len(power_w) // 4
    first, last = float(np.median(power_w[:q])), float(np.median(power_w[-q:]))
    return abs(last - first) > 0.1 * max(abs(first), abs(last), 1e-9)


def _apply_staged(result: ThermalFit, staged: StagedFit) -> None:
    model = staged.chosen
    result.chosen = "output-error"
    result.model = model.name
    result.fitted, result.held_out = model, staged.held_out
    result.stages = list(model.effective_stages())
    result.inlet = model.inlet
    if model.fan is not None:
        result.fan_floor, result.steady_fan_pct = model.fan.floor, model.fan.steady_fan_pct
    result.rc = RC(r_th_c_per_w=model.r_total_c_per_w, tau_s=model.tau_slow_s, t_amb_c=model.t_amb_c)
    result.fit_rmse_c = staged.fit_rmse_c
    result.holdout_rmse_c = staged.holdout_rmse_c
    result.rc1_holdout_rmse_c = staged.rc1_holdout_rmse_c
    result.holdout_fraction = staged.holdout_fraction
    result.holdout_start_ns = staged.split_ns
    result.candidates = staged.candidates
    result.intervals = dict(staged.intervals)
    result.grid_s = staged.grid_s
    result.notes.extend(staged.notes)


def throttled_seconds(t_ns: np.ndarray, reasons: np.ndarray, mask: int) -> float:
    """Time during which any of ``mask``'s reasons was active: each sample's bits hold until the next."""
    if len(t_ns) < 2:
        return 0.0
    dt = np.diff(t_ns) / 1e9
    active = (reasons[:-1].astype(np.int64) & mask) != 0
    return float(np.sum(dt[active]))


def predicted_temperature(
    fit: ThermalFit,
    t_ns: np.ndarray,
    temp_c: np.ndarray,
    power_w: np.ndarray,
    *,
    power_is_average: bool,
    node_w: np.ndarray | None = None,
    fan_pct: np.ndarray | None = None,
    held_out: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``(t_ns, measured, predicted)`` of the chosen output-error model driven by the measured power, over
    the window as :func:`fit_thermal` saw it; ``held_out``: the model fitted on the first 1-F only (what
    the holdout RMS scores). None without an output-error fit."""
    from gpuprobe.model.thermal_stages import make_problem, predict

    model = fit.held_out if held_out else fit.fitted
    if model is None or fit.grid_s is None:
        return None
    node = node_w if model.inlet is not None else None
    fan = fan_pct if model.fan is not None else None
    ok = np.isfinite(temp_c) & np.isfinite(power_w)
    if power_is_average:
        power_w = power_w.copy()
        power_w[ok] = np.interp(t_ns[ok] + AVERAGE_DELAY_S * 1e9, t_ns[ok], power_w[ok])
    for extra in (node, fan):
        if extra is not None:
            ok &= np.isfinite(extra)
    if ok.sum() < 2:
        return None
    t_ns, temp_c, power_w = t_ns[ok], temp_c[ok], power_w[ok]
    problem = make_problem(
        t_ns, temp_c, power_w, node[ok] if node is not None else None, fan[ok] if fan is not None else None, fit.grid_s
    )
    return t_ns, temp_c, predict(model, problem)
