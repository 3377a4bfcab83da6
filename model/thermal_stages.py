"""Part: model. Output-error fits of multi-stage thermal models, chosen by their error on held-out data.

Models (all driven by the measured power, every stage a first-order lag advanced by its exact
discrete solution ``x <- R·P + (x - R·P)·exp(-Δt/τ)`` with the input held over the step)::

    rc1            T = T_amb + x1                      x1: R, τ
    rc2            T = T_amb + xf + xs                 Foster pair: fast (Rf, τf) and slow (Rs, τs), τs ≥ 2·τf
    rc2+inlet      T = T_amb + xf + xs + xin           xin: k_in·P_node, τ_in (the node's air, shared by its GPUs)
    +fan           the slow stage's conductance G = floor + (1 - floor)·fan/100 (floor fitted, 1 = no effect):
                   Rs_eff = Rs/G, τs_eff = τs/G (fixed heat capacity), Rs and τs at full fan

``P`` is the GPU's own power and ``P_node`` the summed power of all GPUs of its node. The fit
(``scipy.optimize.least_squares``, bounded, taus in log space) minimises the difference between the
simulated and the measured temperature at every sample. The simulation runs on a uniform grid of
step ``h`` (the median sampling interval, coarser only for long windows: at most ``MAX_GRID`` steps);
each step's input is the exact mean over the step of the power held from one sample to the next, and
each sample's prediction is the stage's exact solution from the step's start to the sample's time,
so irregular timestamps and gaps are handled exactly (up to a power change inside one step). Every
stage starts in equilibrium at the mean power of the first seconds; the slow (or only) own stage has
a free initial offset, so a window that starts mid-transient still fits.

Selection: each candidate is fitted on the first ``1 - F`` of the window and simulated over the whole
window from the measured power; its error over the last ``F`` is its *holdout* error. Selection compares
the holdout *score*, the RMS of the held-out errors beyond the readings' rounding (``e - 0.5·tanh(2e)``
for whole-degree readings, the plain error otherwise): a whole-degree reading is only known to ±0.5 °C,
and the plain RMS of a good model sits at the rounding's ~0.29 °C, which hides a better model.
Per GPU, ``rc1``, ``rc2`` and ``rc2+fan`` are taken in order of complexity; one replaces the current
choice only when its score is lower by more than ``max(PARSIMONY_REL · current, PARSIMONY_ABS_C)``.
The chosen model is then refitted on the whole window (starting from the held-out fit) and its
simulation over the whole window gives ``fit_rmse_c``; ``holdout_rmse_c`` is the held-out fit's plain
RMS on the held-out part.

Whole-degree readings: after the plain least-squares fit, each fit is refined with a dead zone
(:func:`dead_zone_c`: an error counts only beyond ±0.5 °C, ``e ∓ 0.5``, its corners rounded over
~0.03 °C), since an integer reading only bounds the temperature to ±0.5 °C: the constant rounding error
of long plateaus otherwise bends τ, and what the readings pin is where the curve crosses each degree
boundary. (The selection's score keeps the softer ``e - 0.5·tanh(2e)``: it compares models, it does not
place a curve.)

The node's inlet (:func:`fit_staged_node`): the inlet is the same air for every GPU of a node (the same
node power, so the same rise at every moment), so where a node has two GPUs or more with the node's
power, ``rc2+inlet`` (``rc2+inlet+fan`` for a GPU whose fan varies) is fitted **jointly**:
one least-squares problem over every GPU's samples, the inlet's ``k_in`` and ``τ_in`` shared, each GPU
with its own stages, T_amb, initial offset and fan term (Jacobian by blocks: a GPU's own parameters move
only its residuals). One GPU alone cannot tell a slow inlet from its own slow stage when all GPUs load
together; fitted together, the common rise is pinned by every GPU at once. The joint fit runs over the
whole window (τ_in at most ``INLET_SPAN_MAX`` of it: a slower stage cannot be told from a drift; and
at least ``INLET_RATIO_MIN`` times every GPU's slow τ, a steep penalty row per GPU); each
GPU's inlet candidate is then fitted on its training part with that inlet taken as given, and scored on
its held-out part. The decision is **per node**, on the pooled score (every GPU's held-out errors
together). Where every GPU's own choice has two stages, the inlet is kept for every GPU of the node unless
its pooled score is worse than that of the GPUs' own choices by more than the margin above: the node's
power does warm the air its GPUs breathe, and a two-stage model without the stage folds it into each GPU's
slow stage (τ long, R high), a bias the held-out part cannot show when the GPUs load together (both models
predict it alike). Where a GPU's own choice is first order, the inlet must beat the own choices by more
than the margin divided by the number of GPUs (it adds two parameters to the node). Caveat: ``k_in`` and
``τ_in`` have seen the held-out part (the per-GPU parameters of the scored fits have not). A node of one
GPU has no inlet candidate. Where a GPU reports its memory's temperature, the joint fit reads the inlet
there too: the memory breathes the same air, so its temperature is ``T_amb,mem + x_mem(R_mem, τ_mem; P) +
x_in``, one own stage (its own T_amb, initial offset, R and τ, all fitted) plus the same inlet: a second
reading of the node's air through a different own stage, rounded independently. The memory's parameters
are not reported.

This module never reads the simulator's constants: every parameter (the fan's effect included) is
fitted from the data.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

MAX_GRID = 1200  # most simulation steps per window (long windows get a coarser grid)
INIT_S = 2.0  # the initial equilibrium uses the mean power of the first seconds
PARSIMONY_REL = 0.10  # a more complex model must lower the holdout RMS by 10 % ...
PARSIMONY_ABS_C = 0.005  # ... and by at least 0.005 °C (scores beyond the readings' rounding, near 0 for a good fit)
MIN_FAN_SPAN_PCT = 5.0  # fan models only where the fan speed varies by more than this (10th-90th pct)
TAU_MIN_S, TAU_MAX_S = 0.02, 7200.0
FAST_RATIO_MIN = 2.0  # τs ≥ 2·τf
INLET_RATIO_MIN = 1.5  # τ_in ≥ 1.5·τs: the node's air is slower than the GPU's own heatsink
ORDER_WEIGHT = 100.0  # the joint fit's penalty per unit of ln(τ_in / (1.5·τs)) below 0
INLET_SPAN_MAX = 0.5  # τ_in ≤ half the fitted span: a slower stage cannot be told from a drift
# the memory's own one-stage fit (the inlet folded in) must describe it to this RMS to serve the node's inlet:
# the rounding of whole-degree readings alone is 0.29 °C
MEM_RMSE_MAX_C = 0.5
DEAD_ZONE_SHARPNESS = 30.0  # 1/°C: the refinement's dead zone rounds its corners over ~0.03 °C
ORDER = ("rc1", "rc2", "rc2+fan", "rc2+inlet", "rc2+inlet+fan")
Z_90 = 1.6448536269514722  # the standard normal's 95th percentile: a two-sided 90 % interval


@dataclass(frozen=True)
class Stage:
    r_c_per_w: float
    tau_s: float


@dataclass(frozen=True)
class Inlet:
    c_per_w: float  # °C per W of the node's total power
    tau_s: float


@dataclass(frozen=True)
class FanLaw:
    """Slow-stage conductance relative to full fan, ``G = floor + (1 - floor)·fan/100``."""

    floor: float
    steady_fan_pct: float  # the fan speed the reported (effective) figures are evaluated at

    def g(self, fan_pct: float | np.ndarray) -> float | np.ndarray:
        return self.floor + (1 - self.floor) * np.clip(fan_pct, 0.0, 100.0) / 100.0


@dataclass(frozen=True)
class StageModel:
    """One fitted model. ``stages`` are as fitted (fast first; for fan models at full fan)."""

    name: str
    t_amb_c: float
    stages: tuple[Stage, ...]
    inlet: Inlet | None
    fan: FanLaw | None
    x0_offset_c: float  # initial offset of the slow (or only) own stage
    parameters: int

    def effective_stages(self) -> tuple[Stage, ...]:
        """The stages at the steady-load fan speed (fan models), else as fitted."""
        if self.fan is None:
            return self.stages
        g = float(self.fan.g(self.fan.steady_fan_pct))
        *fast, slow = self.stages
        return (*fast, Stage(slow.r_c_per_w / g, slow.tau_s / g))

    @property
    def r_total_c_per_w(self) -> float:
        return float(sum(s.r_c_per_w for s in self.effective_stages()))

    @property
    def tau_slow_s(self) -> float:
        return self.effective_stages()[-1].tau_s


@dataclass(frozen=True)
class Interval:
    """A fitted figure's 90 % interval (:func:`intervals`). ``at_bound``: the figure rests on a parameter
    the solver stopped at a limit of its search (then no interval: the limit is not a measurement);
    ``undetermined``: the data do not pin it (a singular Jacobian)."""

    low: float | None
    high: float | None
    at_bound: str | None = None
    undetermined: bool = False

    def contains(self, value: float) -> bool:
        return self.low is not None and self.high is not None and self.low <= value <= self.high

    def text(self, spec: str) -> str:
        """As the terminal table and the report show it: ``low-high``, ``at bound (…)`` or ``undetermined``."""
        if self.at_bound:
            return f"at bound ({self.at_bound})"
        if self.low is None or self.high is None:
            return "undetermined"
        return f"{format(self.low, spec)}-{format(self.high, spec)}"

    @staticmethod
    def field_names(figure: str) -> tuple[str, str, str]:
        """The line-protocol fields of a figure's interval: its low and high ends (the unit kept last, as
        every field name carries it) and its at-bound note."""
        for unit in ("_c_per_w", "_s", "_c"):
            if figure.endswith(unit):
                base = figure[: -len(unit)]
                return f"{base}_low{unit}", f"{base}_high{unit}", f"{base}_at_bound"
        return f"{figure}_low", f"{figure}_high", f"{figure}_at_bound"


@dataclass(frozen=True)
class Candidate:
    """One candidate's figures: its fit on the training part and its error on the held-out part."""

    model: str
    train_rmse_c: float
    holdout_rmse_c: float
    r_total_c_per_w: float
    tau_slow_s: float
    t_amb_c: float
    holdout_score_c: float = math.nan  # what selection compares: the held-out RMS beyond the readings' rounding


@dataclass(frozen=True)
class StagedFit:
    chosen: StageModel  # refitted on the whole window
    held_out: StageModel  # the same model fitted on the training part only
    fit_rmse_c: float
    holdout_rmse_c: float
    rc1_holdout_rmse_c: float | None
    holdout_fraction: float
    split_ns: int
    candidates: list[Candidate]
    grid_s: float
    notes: list[str]
    intervals: dict[str, Interval] = field(default_factory=dict)  # 90 % intervals of the chosen model's figures


# --- the simulation --------------------------------------------------------------------------------


@dataclass
class Problem:
    """Samples and the grid their simulation runs on."""

    t0_ns: int
    h: float  # grid step, s
    m: int  # grid steps
    u: np.ndarray  # own power, mean over each step
    un: np.ndarray | None  # node power, mean over each step
    fan: np.ndarray | None  # fan %, mean over each step
    idx: np.ndarray  # each sample's grid step
    delta: np.ndarray  # each sample's time after its step's start, s
    temp: np.ndarray  # measured temperature of each sample
    u_init: float
    un_init: float
    steps: np.ndarray  # the grid steps that hold samples
    weight: np.ndarray  # 1/sqrt(samples) of each of those steps

    quantized: bool = False  # whole-degree readings: the refinement discounts errors within ±0.5 °C

    def residuals(self, predicted: np.ndarray, dead_zone: bool = False) -> np.ndarray:
        """Per grid step with samples: the summed error over sqrt(samples) (its mean error, weighted so
        that the squared sum equals the per-sample one when the error is constant within a step).
        ``dead_zone``: each error counts only beyond the ±0.5 °C of a whole-degree reading's rounding,
        ``e ∓ 0.5`` (:func:`dead_zone_c`: an interval-censored fit)."""
        err = predicted - self.temp
        if dead_zone:
            err = dead_zone_c(err)
        summed = np.bincount(self.idx, weights=err, minlength=self.m)[self.steps]
        result: np.ndarray = summed * self.weight
        return result


def dead_zone_c(err_c: np.ndarray) -> np.ndarray:
    """What is left of an error beyond the ±0.5 °C a whole-degree reading leaves open: 0 within, ``e ∓ 0.5``
    beyond, with corners rounded over ~1/``DEAD_ZONE_SHARPNESS`` °C so the least-squares solver has
    derivatives. A reading says exactly that the temperature was within its ±0.5 °C, so where a model's
    curve crosses each degree boundary is what the readings pin (to a sampling interval); a softer zone
    (``e - 0.5·tanh(2e)``, used before) still pulled every error toward 0 and let the rounding of the
    plateaus choose between nearly equal splits of the node's inlet and each GPU's slow stage."""
    k = DEAD_ZONE_SHARPNESS
    result: np.ndarray = (np.logaddexp(0.0, k * (err_c - 0.5)) - np.logaddexp(0.0, k * (-err_c - 0.5))) / k
    return result


def _held_mean(t_s: np.ndarray, values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Mean over each [edge, next edge) of ``values`` held from one sample to the next (exact)."""
    dt = np.diff(t_s)
    cum = np.concatenate(([0.0], np.cumsum(values[:-1] * dt)))
    i = np.clip(np.searchsorted(t_s, edges, side="right") - 1, 0, len(t_s) - 1)
    energy = cum[i] + values[i] * (edges - t_s[i])
    result: np.ndarray = np.diff(energy) / np.diff(edges)
    return result


def make_problem(
    t_ns: np.ndarray,
    temp_c: np.ndarray,
    power_w: np.ndarray,
    node_w: np.ndarray | None,
    fan_pct: np.ndarray | None,
    h: float,
    end_ns: int | None = None,
) -> Problem:
    """The grid over the samples up to ``end_ns`` (all when None); inputs use every sample before it."""
    t0 = int(t_ns[0])
    t_s = (t_ns - t0) / 1e9
    last = len(t_ns) if end_ns is None else int(np.searchsorted(t_ns, end_ns, side="right"))
    span = float(t_s[last - 1])
    m = max(1, math.floor(span / h) + 1)
    edges = np.arange(m + 1) * h
    u = _held_mean(t_s, power_w, edges)
    un = _held_mean(t_s, node_w, edges) if node_w is not None else None
    fan = _held_mean(t_s, fan_pct, edges) if fan_pct is not None else None
    idx = np.minimum((t_s[:last] / h).astype(np.int64), m - 1)
    delta = t_s[:last] - idx * h
    first = t_s <= min(INIT_S, span)
    u_init = float(np.mean(power_w[first]))
    un_init = float(np.mean(node_w[first])) if node_w is not None else 0.0
    counts = np.bincount(idx, minlength=m)
    steps = np.flatnonzero(counts)
    temp = temp_c[:last].astype(float)
    return Problem(
        t0,
        h,
        m,
        u,
        un,
        fan,
        idx,
        delta,
        temp,
        u_init,
        un_init,
        steps,
        1 / np.sqrt(counts[steps]),
        bool(np.all(temp == np.round(temp))),
    )


def _ltv(a: np.ndarray, b: np.ndarray, x0: float) -> np.ndarray:
    """x[0] = x0, x[j+1] = a[j]·x[j] + b[j] (0 < a ≤ 1), computed in chunks of cumulated decay ≤ 30."""
    m = len(a)
    x = np.empty(m)
    cum = np.concatenate(([0.0], np.cumsum(-np.log(a))))
    cuts = np.flatnonzero(np.diff(np.floor(cum[:m] / 30.0))) + 1
    state = x0
    for s, e in zip(np.concatenate(([0], cuts)), np.concatenate((cuts, [m])), strict=True):
        c = cum[s : e + 1] - cum[s]
        acc = np.concatenate(([state], state + np.cumsum(b[s:e] * np.exp(c[1:]))))
        vals = np.exp(-c) * acc
        x[s:e] = vals[:-1]
        state = float(vals[-1])
    return x


def _stage(p: Problem, r: float | np.ndarray, tau: float | np.ndarray, u: np.ndarray, x0: float) -> np.ndarray:
    """One stage's value at each sample (r and tau constant or per grid step)."""
    from scipy.signal import lfilter

    tau_arr = np.maximum(np.broadcast_to(np.asarray(tau, dtype=float), u.shape), 1e-9)
    r_arr = np.broadcast_to(np.asarray(r, dtype=float), u.shape)
    steady = r_arr * u
    if np.ndim(tau) == 0 and np.ndim(r) == 0:
        a = math.exp(-p.h / float(tau))
        y, _ = lfilter([1 - a], [1.0, -a], steady, zi=[a * x0])
        x = np.concatenate(([x0], y[:-1]))
    else:
        a_arr = np.maximum(np.exp(-p.h / tau_arr), 1e-13)
        x = _ltv(a_arr, (1 - a_arr) * steady, x0)
    j = p.idx
    result: np.ndarray = steady[j] + (x[j] - steady[j]) * np.exp(-p.delta / tau_arr[j])
    return result


def predict(model: StageModel, p: Problem) -> np.ndarray:
    """The model's temperature at each sample of the problem."""
    out = np.full(len(p.idx), model.t_amb_c)
    n = len(model.stages)
    for k, st in enumerate(model.stages):
        slow = k == n - 1
        r: float | np.ndarray = st.r_c_per_w
        tau: float | np.ndarray = st.tau_s
        r0 = st.r_c_per_w
        if slow and model.fan is not None and p.fan is not None:
            g = np.asarray(model.fan.g(p.fan))
            r, tau = st.r_c_per_w / g, st.tau_s / g
            r0 = st.r_c_per_w / float(g[0])
        x0 = r0 * p.u_init + (model.x0_offset_c if slow else 0.0)
        out += _stage(p, r, tau, p.u, x0)
    if model.inlet is not None and p.un is not None:
        out += _stage(p, model.inlet.c_per_w, model.inlet.tau_s, p.un, model.inlet.c_per_w * p.un_init)
    return out


def rmse(model: StageModel, p: Problem, mask: np.ndarray | None = None) -> float:
    err = predict(model, p) - p.temp
    if mask is not None:
        err = err[mask]
    return float(np.sqrt(np.mean(err**2))) if len(err) else math.nan


# --- parameter vectors -----------------------------------------------------------------------------


def _unpack(name: str, x: np.ndarray, steady_fan: float, fixed: Inlet | None = None) -> StageModel:
    t_amb, off = float(x[0]), float(x[1])
    if name == "rc1":
        return StageModel(name, t_amb, (Stage(float(x[2]), math.exp(x[3])),), None, None, off, 4)
    rf, tau_f, rs = float(x[2]), math.exp(x[3]), float(x[4])
    tau_s = tau_f * math.exp(x[5])
    inlet = None
    if "inlet" in name:
        # the inlet is the node's, fitted jointly (_fit_joint): a GPU's own fit never frees it
        if fixed is None:
            raise ValueError(f"{name}: the inlet stage is fitted per node, so a GPU's fit needs it given")
        inlet = fixed
    fan = FanLaw(float(x[6]), steady_fan) if "fan" in name else None
    return StageModel(name, t_amb, (Stage(rf, tau_f), Stage(rs, tau_s)), inlet, fan, off, len(x))


def _pack(model: StageModel) -> np.ndarray:
    """The parameters a GPU's own fit varies (never the node's inlet stage)."""
    x = [model.t_amb_c, model.x0_offset_c]
    if model.name == "rc1":
        st = model.stages[0]
        return np.array([*x, st.r_c_per_w, math.log(st.tau_s)])
    fast, slow = model.stages
    x += [fast.r_c_per_w, math.log(fast.tau_s), slow.r_c_per_w, math.log(slow.tau_s / fast.tau_s)]
    if model.fan is not None:
        x += [model.fan.floor]
    return np.array(x, dtype=float)


def _bounds(name: str) -> tuple[np.ndarray, np.ndarray]:
    lo = [-50.0, -40.0]
    hi = [150.0, 40.0]
    ln_lo, ln_hi = math.log(TAU_MIN_S), math.log(TAU_MAX_S)
    if name == "rc1":
        return np.array([*lo, 0.0, ln_lo]), np.array([*hi, 20.0, ln_hi])
    lo += [0.0, ln_lo, 0.0, math.log(FAST_RATIO_MIN)]
    hi += [20.0, math.log(TAU_MAX_S / 10), 20.0, math.log(1e5)]
    if "fan" in name:
        lo += [0.05]
        hi += [1.0]
    return np.array(lo), np.array(hi)


def _figures(model: StageModel) -> dict[str, float]:
    """The reported figures of a model whose intervals :func:`intervals` gives (taus as their logarithm)."""
    out = {"r_th_c_per_w": model.r_total_c_per_w, "tau_s": math.log(model.tau_slow_s), "t_amb_c": model.t_amb_c}
    stages = model.effective_stages()
    if len(stages) == 2:
        out["r_fast_c_per_w"] = stages[0].r_c_per_w
        out["tau_fast_s"] = math.log(stages[0].tau_s)
        out["r_slow_c_per_w"] = stages[1].r_c_per_w
    if model.fan is not None:
        out["fan_floor"] = model.fan.floor
    return out


LOG_FIGURES = ("tau_s", "tau_fast_s")  # intervals taken on ln τ (the fit's own scale), so never below zero
# the parameters of _pack, as a bound is reported
BOUND_NAMES = {
    "rc1": ("T_amb", "initial offset", "R", "τ"),
    "rc2": ("T_amb", "initial offset", "R fast", "τ fast", "R slow", "τ slow/τ fast", "fan floor"),
}


@dataclass(frozen=True)
class Series:
    """One series of residual rows of a fit (a GPU's die, its memory): where its rows are, the parameters
    its own noise is estimated after, and each row's time (s, on the node's clock)."""

    rows: slice
    parameters: int
    time_s: np.ndarray


def series_time_s(p: Problem, t0_ns: int) -> np.ndarray:
    """The time of each of a problem's residual rows (its grid steps with samples), s after ``t0_ns``."""
    result: np.ndarray = (p.t0_ns - t0_ns) / 1e9 + (p.steps + 0.5) * p.h
    return result


def memory_s(model: StageModel) -> float:
    """A model's memory: its longest time constant, the node's inlet's where it has one."""
    return max(model.tau_slow_s, model.inlet.tau_s if model.inlet is not None else 0.0)


def _correlation_time(residuals: np.ndarray) -> tuple[float, int]:
    """The integrated autocorrelation time of the residuals, in rows (``1 + 2·Σ r_k``, the lag-k
    autocorrelations summed while they stay above 0.05, at most a quarter of the series), and the lag at
    which they fall below it: how many consecutive residuals count as one independent error, and for how
    long they stay correlated. Whole-degree readings leave runs of one sign as long as a plateau."""
    r = residuals - np.mean(residuals)
    var = float(r @ r)
    if var <= 0 or len(r) < 4:
        return 1.0, 1
    spectrum = np.fft.rfft(r, 2 * len(r))
    acf = np.fft.irfft(spectrum * np.conj(spectrum))[: len(r) // 2] / var
    total, lag = 1.0, len(acf)
    for k, rho in enumerate(acf[1:], start=1):
        if rho < 0.05:
            lag = k
            break
        total += 2 * float(rho)
    return min(total, len(r) / 4), lag


def sandwich_covariance(
    jac: np.ndarray, res: np.ndarray, series: list[Series], bandwidth_s: float
) -> tuple[np.ndarray, np.ndarray] | None:
    """Two covariances of a least-squares fit's parameters (``jac``'s columns) for errors that are neither
    independent in time nor across the node's GPUs; each figure's interval takes the wider of the two
    (:func:`intervals`), as neither alone covers both ways the errors hang together.

    - Newey and West's sandwich ``H⁻¹·M·H⁻¹``: each series' rows weighted by its own residual variance
      (``H = JᵀWJ``); the scores ``JᵀW·r`` of every row summed per time bin over all series (the GPUs of
      a node, whose misfits move together as they breathe the same air and load together, count as one
      draw per bin, not as many), ``M`` their long-run covariance by overlapping batch means (Meketon and
      Schmeiser's estimator, a Bartlett kernel) over ``bandwidth_s`` (the model's memory) or, where
      longer, as long as a series' residuals stay correlated (:func:`_correlation_time`), at most half
      the window. On the real H100 logs a GPU's lag-1 autocorrelation is near 0.07 while its residuals
      stay correlated at 0.05-0.1 for tens of seconds (the means of 60-sample blocks vary three times
      more than independent errors allow), and two GPUs' residuals correlate at 0.5-0.9 on the 1 348 s
      one; a lag-1 ``n(1-r)/(1+r)`` sees none of it.
    - ``H⁻¹`` with each series' weight divided by its integrated autocorrelation time
      (:func:`_correlation_time`): a whole-degree plateau is one error however long it lasts. The
      sandwich credits such an error with little (the Jacobian is near zero on a plateau), but the
      rounding it stands for biases the fit's τ by about 1 % on a simulated GPU, and this one covers it.

    None where ``H`` is singular."""
    weight = np.ones(len(res))
    inflation = np.ones(len(res))
    lag = 1
    for sr in series:
        r = res[sr.rows]
        weight[sr.rows] = 1.0 / max(float(r @ r) / max(len(r) - sr.parameters, 1), 1e-12)
        inflation[sr.rows], series_lag = _correlation_time(r)
        lag = max(lag, series_lag)
    jw = jac * weight[:, None]
    bread = jac.T @ jw
    if len(res) <= jac.shape[1] + 2 or not np.all(np.isfinite(bread)) or np.linalg.cond(bread) >= 1e14:
        return None
    inv = np.linalg.inv(bread)
    scaled = np.linalg.inv(jac.T @ (jw / inflation[:, None]))
    times = np.concatenate([sr.time_s for sr in series])
    rows = np.concatenate([np.arange(len(res))[sr.rows] for sr in series])
    # the bins: the coarsest series' own step (the GPUs' grids are offset by their sampling instants, µs
    # apart, so the step between all the times together would make a bin per microsecond: 22 GB for five
    # GPUs over three minutes, which the OOM killer ended)
    steps = [float(np.median(np.diff(sr.time_s))) for sr in series if len(sr.time_s) > 1]
    h = max([x for x in steps if x > 0], default=1.0)
    bins = np.round((times - times.min()) / h).astype(np.int64)
    scores = np.zeros((int(bins.max()) + 1, jac.shape[1]))
    np.add.at(scores, bins, jw[rows] * res[rows, None])
    n = len(scores)
    # at least as long as the residuals stay correlated: a whole-degree plateau is one error however long
    b = max(1, min(max(math.ceil(bandwidth_s / h), lag) + 1, n // 2))
    cum = np.vstack([np.zeros(jac.shape[1]), np.cumsum(scores, axis=0)])
    window = cum[b:] - cum[:-b]
    meat = window.T @ window / b * n / (n - b + 1)
    return inv @ meat @ inv, scaled


def intervals(
    model: StageModel,
    p: Problem,
    steady_fan: float,
    own_cov: tuple[np.ndarray, np.ndarray] | None = None,
) -> dict[str, Interval]:
    """90 % intervals of a fitted model's figures from the Jacobian of its residuals at the optimum.

    The covariance of the GPU's own parameters is :func:`sandwich_covariance`'s (consecutive errors of a
    thermal fit are not independent: without it the interval would be far too narrow); each figure's
    variance follows by the delta method (its gradient by finite differences), ``±1.645`` standard
    deviations (taus on their logarithm). ``own_cov``: those covariances as the node's joint fit gives
    them (:func:`_joint_covariance`, the shared inlet's uncertainty in them), None where the GPU has no
    inlet stage (then from its own residuals). Parameters at a bound of the search are held there; a
    figure that depends on one is reported at the bound, with no interval."""
    fixed = model.inlet
    x = _pack(model)
    lo, hi = _bounds(model.name)
    span = hi - lo
    at_lo, at_hi = x <= lo + 1e-6 * span, x >= hi - 1e-6 * span
    # held at the bound; the gradients below tell which figures such a parameter touches
    pinned = at_lo | at_hi

    def unpack(v: np.ndarray) -> StageModel:
        return _unpack(model.name, v, steady_fan, fixed)

    base_fig = _figures(model)
    names = list(base_fig)
    r0 = p.residuals(predict(model, p))
    steps = 1e-6 * np.maximum(1.0, np.abs(x))
    jac = np.zeros((len(r0), len(x)))
    grad = np.zeros((len(names), len(x)))
    for c in range(len(x)):
        step = -steps[c] if x[c] + steps[c] > hi[c] else steps[c]
        x2 = x.copy()
        x2[c] += step
        m2 = unpack(x2)
        if own_cov is None:
            jac[:, c] = (p.residuals(predict(m2, p)) - r0) / step
        fig2 = _figures(m2)
        grad[:, c] = [(fig2[n] - base_fig[n]) / step for n in names]
    free = ~pinned
    n_res, k = len(r0), int(free.sum())
    covs = None
    if own_cov is not None:
        if all(np.all(np.isfinite(c)) for c in own_cov):
            covs = [c[np.ix_(free, free)] for c in own_cov]
    elif n_res > k + 2 and k > 0:
        found = sandwich_covariance(
            jac[:, free], r0, [Series(slice(0, n_res), k, series_time_s(p, p.t0_ns))], memory_s(model)
        )
        covs = list(found) if found is not None else None
    out: dict[str, Interval] = {}
    for i, name in enumerate(names):
        touches = np.abs(grad[i]) > 1e-9 * max(1.0, abs(base_fig[name]))
        considered = touches & pinned
        if model.name != "rc1" and name not in ("r_fast_c_per_w", "tau_fast_s"):
            # a fast stage at zero resistance or at its least τ is a stage the data do not need, not a limit
            # on the slow stage's figures (as :func:`~gpuprobe.model.thermal._at_bound` holds too)
            considered[[2, 3]] = False
        bound = [BOUND_NAMES["rc1" if model.name == "rc1" else "rc2"][c] for c in np.flatnonzero(considered)]
        if bound:
            out[name] = Interval(None, None, at_bound=", ".join(bound))
            continue
        if covs is None:
            out[name] = Interval(None, None, undetermined=True)
            continue
        g = grad[i][free]
        sigma = math.sqrt(max(max(float(g @ c @ g) for c in covs), 0.0))
        low, high = base_fig[name] - Z_90 * sigma, base_fig[name] + Z_90 * sigma
        if name in LOG_FIGURES:
            low, high = math.exp(low), math.exp(high)
        out[name] = Interval(low, high)
    return out


def _fit(
    name: str,
    p: Problem,
    starts: list[StageModel],
    steady_fan: float,
    fixed: Inlet | None = None,
) -> StageModel | None:
    """The best of the least-squares fits from each start (``fixed``: the node's inlet stage, given to an
    inlet model and not fitted)."""
    from scipy.optimize import least_squares

    fixed = fixed if "inlet" in name else None
    lo, hi = _bounds(name)
    best: tuple[float, StageModel] | None = None
    span = hi - lo
    for start in starts:
        if fixed is not None:
            start = StageModel(name, start.t_amb_c, start.stages, fixed, start.fan, start.x0_offset_c, 0)
        x0 = np.clip(_pack(start), lo + 1e-9 * span, hi - 1e-9 * span)
        for dead_zone in (False, True) if p.quantized else (False,):

            def residuals(x: np.ndarray, dz: bool = dead_zone) -> np.ndarray:
                return p.residuals(predict(_unpack(name, x, steady_fan, fixed), p), dz)

            try:
                sol = least_squares(residuals, x0, bounds=(lo, hi), x_scale="jac", max_nfev=200 * len(x0))
            except (ValueError, FloatingPointError, np.linalg.LinAlgError):
                break
            if not np.all(np.isfinite(sol.x)):
                break
            x0 = np.clip(sol.x, lo + 1e-9 * span, hi - 1e-9 * span)
        else:
            model = _unpack(name, x0, steady_fan, fixed)
            cost = float(np.sum(p.residuals(predict(model, p), p.quantized) ** 2))
            if best is None or cost < best[0]:
                best = (cost, model)
    return best[1] if best else None


def _starts(
    name: str,
    base: dict[str, StageModel],
    rc1_guesses: list[StageModel],
    steady_fan: float,
) -> list[StageModel]:
    """Starting points of a GPU's own candidates (``rc1``, ``rc2``, ``rc2+fan``; the inlet ones start from
    :func:`_joint_starts`)."""
    if name == "rc1":
        return rc1_guesses
    if name == "rc2":
        rc1 = base["rc1"]
        st = rc1.stages[0]
        r, tau = st.r_c_per_w, st.tau_s
        out = []
        for share, ratio in ((0.4, 10.0), (0.2, 30.0), (0.6, 5.0)):
            tau_f = max(tau / ratio, 0.1)
            out.append(
                StageModel(
                    "rc2",
                    rc1.t_amb_c,
                    (Stage(share * r, tau_f), Stage((1 - share) * r, max(tau * 1.2, tau_f * 3))),
                    None,
                    None,
                    rc1.x0_offset_c,
                    6,
                )
            )
        return out
    own = base.get("rc2")
    if own is None or name != "rc2+fan":
        return []
    return [
        StageModel(name, own.t_amb_c, own.stages, None, FanLaw(floor, steady_fan), own.x0_offset_c, own.parameters + 1)
        for floor in (0.99, 0.6)
    ]


@dataclass(frozen=True)
class StagedInput:
    """One GPU's samples for :func:`fit_staged_node` (``node_w``: its node's summed power at the same times)."""

    t_ns: np.ndarray
    temp_c: np.ndarray
    power_w: np.ndarray
    node_w: np.ndarray | None = None
    fan_pct: np.ndarray | None = None
    steady_fan_pct: float | None = None
    rc1_guesses: list[tuple[float, float, float]] | None = None
    mem_temp_c: np.ndarray | None = None  # the memory's temperature at the same times (NaN where not read)


@dataclass(eq=False)  # compared by identity
class _Gpu:
    """One GPU's problems and its own (inlet-free) candidates, fitted on the training part."""

    train: Problem
    whole: Problem
    held: np.ndarray  # the whole window's held-out samples
    split_ns: int
    steady_fan: float
    duration_s: float
    notes: list[str]
    fitted: dict[str, StageModel]
    scores: dict[str, float]
    candidates: list[Candidate]
    choice: str = "rc1"
    # the memory's temperature on the whole window's grid and its own first-order fit (the node's joint fit
    # reads the inlet in it too); None where the GPU reports no memory temperature
    mem: Problem | None = None
    mem_fit: StageModel | None = None


def _prepare(m: StagedInput, holdout: float) -> _Gpu | None:
    """The GPU's problems, its own candidates (rc1, rc2, rc2+fan) fitted and scored, its own choice."""
    notes: list[str] = []
    t_ns, temp_c, power_w, node_w, fan_pct = m.t_ns, m.temp_c, m.power_w, m.node_w, m.fan_pct
    mem_c = m.mem_temp_c
    ok = np.isfinite(temp_c) & np.isfinite(power_w)
    if node_w is not None:
        if np.mean(np.isfinite(node_w[ok])) < 0.9:
            node_w = None
        else:
            ok &= np.isfinite(node_w)
    if fan_pct is not None:
        fan_ok = np.isfinite(fan_pct)
        if np.mean(fan_ok[ok]) < 0.9:
            fan_pct = None
        else:
            ok &= fan_ok
    if mem_c is not None and node_w is not None:
        mem_ok = np.isfinite(mem_c)
        if np.mean(mem_ok[ok]) < 0.9:
            mem_c = None
        else:
            ok &= mem_ok
    else:
        mem_c = None  # the memory only serves the node's inlet
    t_ns, temp_c, power_w = t_ns[ok], temp_c[ok], power_w[ok]
    node_w = node_w[ok] if node_w is not None else None
    fan_pct = fan_pct[ok] if fan_pct is not None else None
    mem_c = mem_c[ok] if mem_c is not None else None
    if len(t_ns) < 20 or t_ns[-1] <= t_ns[0]:
        return None
    if fan_pct is not None:
        span = float(np.percentile(fan_pct, 90) - np.percentile(fan_pct, 10))
        if span < MIN_FAN_SPAN_PCT:
            notes.append(f"fan speed nearly constant ({span:.1f} % spread): no fan-dependent model")
            fan_pct = None
    steady_fan = float(m.steady_fan_pct) if m.steady_fan_pct is not None else 100.0
    duration = (t_ns[-1] - t_ns[0]) / 1e9
    h = max(float(np.median(np.diff(t_ns))) / 1e9, duration / MAX_GRID)
    split_ns = int(t_ns[0] + (1 - holdout) * (t_ns[-1] - t_ns[0]))
    train = make_problem(t_ns, temp_c, power_w, node_w, fan_pct, h, split_ns)
    whole = make_problem(t_ns, temp_c, power_w, node_w, fan_pct, h)
    held = t_ns > split_ns
    if len(train.idx) < 10 or held.sum() < 5:
        return None
    lo_p, hi_p = np.percentile(power_w, [10, 90])
    lo_t, hi_t = np.percentile(temp_c, [10, 90])
    r_guess = float((hi_t - lo_t) / (hi_p - lo_p)) if hi_p - lo_p > 1 else 0.1
    r_guess = min(max(r_guess, 1e-3), 5.0)
    guesses = [g for g in (m.rc1_guesses or []) if all(map(math.isfinite, g)) and g[0] > 0 and g[1] > 0]
    guesses.append((r_guess, min(30.0, duration / 5), float(lo_t - r_guess * lo_p)))
    starts1 = [
        StageModel("rc1", t_amb, (Stage(r, min(max(tau, 0.1), 3000.0)),), None, None, 0.0, 4)
        for r, tau, t_amb in guesses
    ]
    gpu = _Gpu(train, whole, held, split_ns, steady_fan, duration, notes, {}, {}, [])
    names = ["rc1", "rc2"] + (["rc2+fan"] if fan_pct is not None else [])
    for name in names:
        model = _fit(name, train, _starts(name, gpu.fitted, starts1, steady_fan), steady_fan)
        if model is None:
            notes.append(f"{name}: the fit failed")
            continue
        gpu.fitted[name] = model
        gpu.scores[name] = _score(model, whole, held)
        gpu.candidates.append(_candidate(name, model, gpu))
    if "rc1" not in gpu.fitted:
        return None
    if mem_c is not None:
        _fit_memory(gpu, make_problem(t_ns, mem_c, power_w, node_w, fan_pct, h), steady_fan)
    for name in names[1:]:
        if name not in gpu.scores or not math.isfinite(gpu.scores[name]):
            continue
        margin = max(PARSIMONY_REL * gpu.scores[gpu.choice], PARSIMONY_ABS_C)
        if gpu.scores[name] < gpu.scores[gpu.choice] - margin:
            gpu.choice = name
    return gpu


def _fit_memory(gpu: _Gpu, mem: Problem, steady_fan: float) -> None:
    """The memory's own first-order response to the GPU's power (without the inlet): the start of its part
    in the node's joint fit. A memory series that does not follow the GPU's power is left out."""
    lo_p, hi_p = np.percentile(mem.u, [10, 90])
    lo_t, hi_t = np.percentile(mem.temp, [10, 90])
    if hi_p - lo_p <= 1 or hi_t - lo_t < 1:
        gpu.notes.append("memory temperature does not follow the power: not used for the node's inlet")
        return
    r = float((hi_t - lo_t) / (hi_p - lo_p))
    taus = [gpu.fitted["rc1"].stages[0].tau_s * k for k in (1.0, 2.0)]
    starts = [StageModel("rc1", float(lo_t - r * lo_p), (Stage(r, tau),), None, None, 0.0, 4) for tau in taus]
    model = _fit("rc1", mem, starts, steady_fan)
    if model is None:
        gpu.notes.append("memory temperature: its fit failed, not used for the node's inlet")
        return
    misfit = rmse(model, mem)
    if misfit > MEM_RMSE_MAX_C:
        # a memory the one-stage model does not describe (heated through the die, say) would bend the inlet
        gpu.notes.append(
            f"memory temperature: one own stage fits it to {misfit:.2f} °C RMS (more than {MEM_RMSE_MAX_C:g} °C):"
            " not used for the node's inlet"
        )
        return
    gpu.mem, gpu.mem_fit = mem, model


def _held_error(model: StageModel, p: Problem, held: np.ndarray) -> np.ndarray:
    """The held-out errors as selection counts them: beyond the ±0.5 °C rounding of whole-degree readings
    (a smooth dead zone, ``e - 0.5·tanh(2e)``), plain otherwise."""
    err = predict(model, p)[held] - p.temp[held]
    result: np.ndarray = err - 0.5 * np.tanh(2 * err) if p.quantized else err
    return result


def _score(model: StageModel, p: Problem, held: np.ndarray) -> float:
    err = _held_error(model, p, held)
    return float(np.sqrt(np.mean(err**2))) if len(err) else math.nan


def _candidate(name: str, model: StageModel, g: _Gpu) -> Candidate:
    return Candidate(
        name,
        rmse(model, g.train),
        rmse(model, g.whole, g.held),
        model.r_total_c_per_w,
        model.tau_slow_s,
        model.t_amb_c,
        g.scores[name],
    )


def _finish(
    g: _Gpu,
    held_model: StageModel,
    final: StageModel,
    holdout: float,
    notes: list[str],
    own_cov: tuple[np.ndarray, np.ndarray] | None = None,
) -> StagedFit:
    fast = final.stages[0] if len(final.stages) == 2 else None
    out_notes = list(g.notes) + notes
    if fast is not None and fast.tau_s < g.whole.h:
        out_notes.append(
            f"fast stage τ {fast.tau_s:.2g} s below the {g.whole.h:.2g} s sampling: it acts as an instant resistance"
        )
    return StagedFit(
        chosen=final,
        held_out=held_model,
        fit_rmse_c=rmse(final, g.whole),
        holdout_rmse_c=rmse(held_model, g.whole, g.held),
        rc1_holdout_rmse_c=rmse(g.fitted["rc1"], g.whole, g.held),
        holdout_fraction=holdout,
        split_ns=g.split_ns,
        candidates=g.candidates,
        grid_s=g.whole.h,
        notes=out_notes,
        intervals=intervals(final, g.whole, g.steady_fan, own_cov),
    )


# --- the node's shared inlet -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Joint:
    inlet: Inlet
    models: list[StageModel]
    cost: float
    mem_models: list[StageModel | None]  # each GPU's memory model (its own stage and the node's inlet)
    # each GPU's own-parameter covariances with the inlet's uncertainty in them (_joint_covariance; whole window)
    own_covs: list[tuple[np.ndarray, np.ndarray]] | None = None


def _joint_covariance(
    x: np.ndarray,
    jac: np.ndarray,
    res: np.ndarray,
    series: list[Series],
    bandwidth_s: float,
    slices: list[slice],
    own_sizes: list[int],
    bounds: tuple[np.ndarray, np.ndarray],
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each GPU's own-parameter covariances (:func:`sandwich_covariance`'s pair) from the node's joint fit,
    the shared inlet's two parameters free: the figures :func:`intervals` gives are then not conditional
    on the inlet as fitted. Held at the inlet, a recording shorter than τ_in splits its rise between the
    inlet and each GPU's slow stage one way with a narrow interval, another recording another way; freed,
    the interval holds what the data cannot split. Matrices of NaN where the fit's information is
    singular (the figures are then undetermined)."""
    lo, hi = bounds
    span = hi - lo
    free = (x > lo + 1e-6 * span) & (x < hi - 1e-6 * span)
    found = sandwich_covariance(jac[:, free], res, series, bandwidth_s)
    out = []
    for full_free in found if found is not None else (None, None):
        cov = np.full((len(x), len(x)), np.nan)
        if full_free is not None:
            cov[np.ix_(free, free)] = full_free
        out.append(cov)
    per_gpu = []
    for s, size in zip(slices, own_sizes, strict=True):
        pair = []
        for cov in out:
            own = cov[s.start : s.start + size, s.start : s.start + size].copy()
            # a parameter at its bound is held there (intervals reports its figures at the bound)
            held = ~free[s.start : s.start + size]
            own[held, :] = 0.0
            own[:, held] = 0.0
            pair.append(own)
        per_gpu.append((pair[0], pair[1]))
    return per_gpu


# one start of the joint fit: the inlet, each GPU's own model and each GPU's memory model (None: no memory)
JointStart = tuple[Inlet, list[StageModel], list[StageModel | None]]


def _mem_model(x: np.ndarray, inlet: Inlet) -> StageModel:
    """The memory's model from its parameters (``rc1``'s) and the node's inlet."""
    t_amb, off, r, ln_tau = (float(v) for v in x)
    return StageModel("rc1", t_amb, (Stage(r, math.exp(ln_tau)),), inlet, None, off, 4)


def _fit_joint(gpus: list[_Gpu], names: list[str], starts: list[JointStart], whole: bool) -> _Joint | None:
    """One least-squares fit of every GPU of the node with the inlet stage (k_in, τ_in) shared.

    The parameter vector is [k_in, ln τ_in] followed by each GPU's own parameters (as ``_pack`` with a
    fixed inlet) and, where the GPU reports its memory's temperature (whole window only), that memory's
    own first-order stage, T_amb and initial offset: the memory breathes the same air, so its series is a
    second reading of the inlet, through a different own stage and with its own rounding. The residuals
    are every GPU's (die, order row, memory), concatenated. The Jacobian is taken by finite differences
    block by block: a GPU's own parameters move only its residuals, so each costs one simulation of that
    GPU, the two shared ones one simulation of the node (the cost grows linearly with the node's size)."""
    from scipy.optimize import least_squares

    problems = [g.whole if whole else g.train for g in gpus]
    mems = [g.mem if whole else None for g in gpus]
    quantized = all(p.quantized for p in problems)
    span_s = INLET_SPAN_MAX * max(p.m * p.h for p in problems)
    h_max = max(p.h for p in problems)
    lo_parts, hi_parts = (
        [np.array([0.0, math.log(max(2 * h_max, TAU_MIN_S))])],
        [np.array([0.5, math.log(max(span_s, 4 * h_max))])],
    )
    sizes = []
    for name, mem in zip(names, mems, strict=True):
        lo, hi = _bounds(name)
        if mem is not None:
            lo_m, hi_m = _bounds("rc1")
            lo, hi = np.concatenate([lo, lo_m]), np.concatenate([hi, hi_m])
        lo_parts.append(lo)
        hi_parts.append(hi)
        sizes.append(len(lo))
    lo_all, hi_all = np.concatenate(lo_parts), np.concatenate(hi_parts)
    span = hi_all - lo_all
    cuts = np.cumsum([2, *sizes])
    slices = [slice(int(a), int(b)) for a, b in itertools.pairwise(cuts)]
    own_sizes = [len(_bounds(n)[0]) for n in names]
    # each GPU's residuals: its die's, its order row, its memory's
    rows = np.cumsum([0, *[len(p.steps) + 1 + (len(q.steps) if q else 0) for p, q in zip(problems, mems, strict=True)]])

    def models_of(x: np.ndarray, i: int) -> tuple[StageModel, StageModel | None]:
        inlet = Inlet(float(x[0]), math.exp(x[1]))
        own = x[slices[i]]
        model = _unpack(names[i], own[: own_sizes[i]], gpus[i].steady_fan, inlet)
        return model, _mem_model(own[own_sizes[i] :], inlet) if mems[i] is not None else None

    def block(i: int, x: np.ndarray, dz: bool) -> np.ndarray:
        model, mem_model = models_of(x, i)
        # τ_in ≥ INLET_RATIO_MIN·τs (effective): a steep penalty row, zero where the order holds, so that the
        # shared stage stays the slow air and does not take over the GPUs' own slow stages
        order = ORDER_WEIGHT * max(0.0, math.log(INLET_RATIO_MIN * model.tau_slow_s / math.exp(x[1])))
        parts = [problems[i].residuals(predict(model, problems[i]), dz), np.array([order])]
        mem = mems[i]
        if mem is not None and mem_model is not None:
            parts.append(mem.residuals(predict(mem_model, mem), dz and mem.quantized))
        return np.concatenate(parts)

    def residuals(x: np.ndarray, dz: bool) -> np.ndarray:
        return np.concatenate([block(i, x, dz) for i in range(len(gpus))])

    def jacobian(x: np.ndarray, dz: bool) -> np.ndarray:
        base = residuals(x, dz)
        jac = np.zeros((len(base), len(x)))
        for c in range(len(x)):
            step = 1.5e-8 * max(1.0, abs(float(x[c])))
            if x[c] + step > hi_all[c]:
                step = -step
            x2 = x.copy()
            x2[c] += step
            if c < 2:
                jac[:, c] = (residuals(x2, dz) - base) / step
            else:
                i = next(k for k, s in enumerate(slices) if s.start <= c < s.stop)
                jac[rows[i] : rows[i + 1], c] = (block(i, x2, dz) - base[rows[i] : rows[i + 1]]) / step
        return jac

    def solve(x0: np.ndarray, dz: bool, nfev: int | None = None) -> np.ndarray | None:
        try:
            sol = least_squares(
                residuals,
                x0,
                jac=jacobian,
                bounds=(lo_all, hi_all),
                x_scale="jac",
                max_nfev=nfev or 60 + 4 * len(x0),
                kwargs={"dz": dz},
            )
        except (ValueError, FloatingPointError, np.linalg.LinAlgError):
            return None
        if not np.all(np.isfinite(sol.x)):
            return None
        return np.asarray(np.clip(sol.x, lo_all + 1e-9 * span, hi_all - 1e-9 * span))

    # every start a few iterations, the best of them to convergence, then the dead-zone refinement
    best: tuple[float, np.ndarray] | None = None
    for inlet, own, mem_starts in starts:
        parts = [np.array([inlet.c_per_w, math.log(inlet.tau_s)])]
        for m, mem_start, mem in zip(own, mem_starts, mems, strict=True):
            parts.append(_pack(m))
            if mem is not None:
                if mem_start is None:
                    return None
                parts.append(_pack(mem_start))
        x0 = np.concatenate(parts)
        x = solve(np.clip(x0, lo_all + 1e-9 * span, hi_all - 1e-9 * span), False, 8 if len(starts) > 1 else None)
        if x is None:
            continue
        cost = float(np.sum(residuals(x, False) ** 2))
        if best is None or cost < best[0]:
            best = (cost, x)
    if best is None:
        return None
    x = best[1]
    if len(starts) > 1:
        full = solve(x, False)
        x = full if full is not None else x
    if quantized:
        refined = solve(x, True)
        x = refined if refined is not None else x
    fitted = [models_of(x, i) for i in range(len(gpus))]
    inlet = Inlet(float(x[0]), math.exp(x[1]))
    cost = float(np.sum(residuals(x, quantized) ** 2))
    own_covs = None
    if whole:
        # the series of each GPU's rows: its die's and its memory's (its order row, a constraint that holds
        # no time, is in none: weight 1, no score)
        t0_ns = min(p.t0_ns for p in problems)
        series = []
        for i, (p, mem) in enumerate(zip(problems, mems, strict=True)):
            start, die = int(rows[i]), len(p.steps)
            series.append(Series(slice(start, start + die), own_sizes[i], series_time_s(p, t0_ns)))
            if mem is not None:
                series.append(Series(slice(start + die + 1, int(rows[i + 1])), 4, series_time_s(mem, t0_ns)))
        bandwidth_s = max(memory_s(m) for m, _ in fitted)
        own_covs = _joint_covariance(
            x, jacobian(x, False), residuals(x, False), series, bandwidth_s, slices, own_sizes, (lo_all, hi_all)
        )
    return _Joint(inlet, [f[0] for f in fitted], cost, [f[1] for f in fitted], own_covs)


def _inlet_name(g: _Gpu) -> str:
    # with the fan wherever the GPU's fan varies: its own choice may have refused the fan only because the
    # node's air, folded into its slow stage, hid the fan's effect
    return "rc2+inlet+fan" if "rc2+fan" in g.fitted else "rc2+inlet"


def _joint_starts(gpus: list[_Gpu], names: list[str]) -> list[JointStart]:
    """Starts of the joint fit: from each GPU's own fit (its slow stage absorbed the node's air), a share
    of the slow stage's rise moved to a shared inlet, at two ratios of τ_in to the GPUs' slow τ."""
    own = [g.fitted["rc2+fan" if n.endswith("fan") else "rc2"] for g, n in zip(gpus, names, strict=True)]
    rises, node_rises = [], []
    for g, m in zip(gpus, own, strict=True):
        p = g.train
        assert p.un is not None
        rises.append(m.effective_stages()[-1].r_c_per_w * max(float(np.mean(p.u)) - p.u_init, 1e-6))
        node_rises.append(max(float(np.mean(p.un)) - p.un_init, 1e-6))
    rise, node_rise = float(np.median(rises)), float(np.median(node_rises))
    tau_slow = float(np.median([m.tau_slow_s for m in own]))
    out = []
    for share, ratio in ((0.15, 3.0), (0.3, 3.0), (0.15, 8.0), (0.5, 4.0)):
        inlet = Inlet(max(share * rise / node_rise, 1e-6), tau_slow * ratio)
        models = []
        for name, m in zip(names, own, strict=True):
            fast, slow = m.stages
            tau_s = max(slow.tau_s * (1 - share), fast.tau_s * 2.5)  # the slow stage had absorbed the air
            stages = (fast, Stage((1 - share) * slow.r_c_per_w, tau_s))
            models.append(StageModel(name, m.t_amb_c, stages, inlet, m.fan, m.x0_offset_c, 0))
        mem_models: list[StageModel | None] = []
        for g in gpus:
            if g.mem_fit is None or g.mem is None:
                mem_models.append(None)
                continue
            # the same share of the air's rise taken out of the memory's own stage
            (st,) = g.mem_fit.stages
            own_rise_w = max(float(np.mean(g.mem.u)) - g.mem.u_init, 1e-6)
            r_m = max(st.r_c_per_w - share * rise / own_rise_w, 0.2 * st.r_c_per_w)
            mem_models.append(
                StageModel("rc1", g.mem_fit.t_amb_c, (Stage(r_m, st.tau_s),), inlet, None, g.mem_fit.x0_offset_c, 4)
            )
        out.append((inlet, models, mem_models))
    return out


def _pooled_score(gpus: list[_Gpu], models: list[StageModel]) -> float:
    """The node's held-out score: :func:`_score` over every GPU's held-out samples together."""
    errs = [_held_error(m, g.whole, g.held) for g, m in zip(gpus, models, strict=True)]
    err = np.concatenate(errs)
    return float(np.sqrt(np.mean(err**2))) if len(err) else math.nan


def fit_staged_node(members: list[StagedInput], *, holdout: float = 0.3) -> list[StagedFit | None]:
    """Every GPU of one node: each GPU's own candidates, then (two GPUs or more with the node's power) the
    inlet candidate fitted jointly, the inlet stage shared by all GPUs; chosen per node by the pooled
    holdout RMS (module docstring). One result per member, None where there was too little to fit.

    The fits run with one BLAS thread: their matrices (a few thousand rows by tens of parameters) gain
    nothing from more, and OpenBLAS's threads, spinning for a core another process holds, made each of
    the solver's SVDs about 20 times slower with the other core busy (105 ms against 5 ms, 3 600 by 42)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        return _fit_staged_node(members, holdout)


def _fit_staged_node(members: list[StagedInput], holdout: float) -> list[StagedFit | None]:
    gpus = [_prepare(m, holdout) for m in members]
    joint_gpus = [g for g in gpus if g is not None and g.whole.un is not None and "rc2" in g.fitted]
    accepted: tuple[list[StageModel], _Joint, str] | None = None
    if len(joint_gpus) >= 2:
        names = [_inlet_name(g) for g in joint_gpus]
        whole = _fit_joint(joint_gpus, names, _joint_starts(joint_gpus, names), whole=True)
        held_models: list[StageModel] = []
        if whole is not None:
            for g, n, m in zip(joint_gpus, names, whole.models, strict=True):
                # the GPU's own stages on its training part, the node's inlet as the joint fit found it
                held = _fit(n, g.train, [m], g.steady_fan, whole.inlet)
                if held is None:
                    break
                held_models.append(held)
                g.scores[n] = _score(held, g.whole, g.held)
                g.candidates.append(_candidate(n, held, g))
        if whole is not None and len(held_models) == len(joint_gpus):
            own_score = _pooled_score(joint_gpus, [g.fitted[g.choice] for g in joint_gpus])
            mems = sum(g.mem is not None for g in joint_gpus)
            with_memory = f", the memory temperature of {mems}" if mems else ""
            inlet_score = _pooled_score(joint_gpus, held_models)
            # the node's power warms the air all its GPUs breathe; a two-stage model without that stage folds it
            # into each GPU's slow stage (τ long, R high), a bias the held-out part cannot show when the GPUs load
            # together (both predict it alike). So where every GPU's data already call for two own stages, the
            # node keeps the inlet unless it predicts the held-out part worse by more than the margin a GPU's own
            # models must clear to replace one another. Otherwise (a GPU whose data are first order) the inlet,
            # two parameters for the node, must beat them by that margin shared by the node's GPUs.
            margin = max(PARSIMONY_REL * own_score, PARSIMONY_ABS_C)
            two_stage = all(g.choice != "rc1" for g in joint_gpus)
            keep = (
                inlet_score <= own_score + margin if two_stage else inlet_score < own_score - margin / len(joint_gpus)
            )
            verdict = (
                f"node inlet k_in {whole.inlet.c_per_w:.3g} °C/W, τ_in {whole.inlet.tau_s:.3g} s (fitted jointly on"
                f" {len(joint_gpus)} GPUs{with_memory}): pooled holdout score {inlet_score:.3f} °C against"
                f" {own_score:.3f} °C without it"
            )
            if keep:
                accepted = (held_models, whole, verdict + ": chosen")
            else:
                for g in joint_gpus:
                    g.notes.append(verdict + ": not chosen")
    out: list[StagedFit | None] = []
    for maybe in gpus:
        if maybe is None:
            out.append(None)
            continue
        gpu = maybe
        if accepted is not None and gpu in joint_gpus:
            k = joint_gpus.index(gpu)
            held_models, joint, verdict = accepted
            own_cov = joint.own_covs[k] if joint.own_covs is not None else None
            out.append(_finish(gpu, held_models[k], joint.models[k], holdout, [verdict], own_cov))
            continue
        held_model = gpu.fitted[gpu.choice]
        final = _fit(gpu.choice, gpu.whole, [held_model], gpu.steady_fan) or held_model
        notes = []
        if gpu.whole.un is None:
            notes.append("no node power (one GPU on the node): no inlet model")
        out.append(_finish(gpu, held_model, final, holdout, notes))
    return out


def fit_staged(
    t_ns: np.ndarray,
    temp_c: np.ndarray,
    power_w: np.ndarray,
    *,
    fan_pct: np.ndarray | None = None,
    steady_fan_pct: float | None = None,
    holdout: float = 0.3,
    rc1_guesses: list[tuple[float, float, float]] | None = None,
) -> StagedFit | None:
    """One GPU alone (no inlet candidate): :func:`fit_staged_node` of a node of one."""
    member = StagedInput(t_ns, temp_c, power_w, None, fan_pct, steady_fan_pct, rc1_guesses)
    return fit_staged_node([member], holdout=holdout)[0]
