"""The output-error stage models (model/thermal_stages.py) on synthetic nodes whose answers are known.

The data come from a small exact simulation written here (not gpuprobe's simulator): per GPU a fast and a
slow first-order stage of its own power, the slow stage's conductance growing with the fan speed, an
inlet stage driven by the node's summed power, every stage advanced per 100 ms tick by its exact
discrete solution, the temperature read as whole degrees at 10 Hz. The load has several levels (a
warm-up below the steady load, then a cool-down), as the trainer runs it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from gpuprobe.model.analysis import ModelSettings
from gpuprobe.model.cli import OPTIONS
from gpuprobe.model.output import _clean
from gpuprobe.model.thermal import ThermalFit, ThermalInput, fit_thermal, fit_thermal_node

pytestmark = pytest.mark.slow  # a few seconds per GPU

DT_S = 0.1
T0_NS = 1_700_000_000 * 10**9
PHASES_S = (60.0, 90.0, 270.0, 180.0)  # idle, warm-up, steady, cool-down


@dataclasses.dataclass(frozen=True)
class Truth:
    t_amb_c: float = 28.0
    r_fast: float = 0.03
    tau_fast_s: float = 2.0
    r_slow: float = 0.03  # at full fan
    tau_slow_s: float = 25.0  # at full fan
    k_in: float = 0.001  # °C per W of node power
    tau_in_s: float = 120.0
    floor: float = 1.0  # slow-stage conductance at zero fan relative to full fan (1: the fan does not matter)
    r_mem: float = 0.05  # the memory: one stage of the GPU's own power, plus the same inlet air
    tau_mem_s: float = 30.0

    def g(self, fan_pct: float) -> float:
        return self.floor + (1 - self.floor) * fan_pct / 100

    def r_total(self, fan_pct: float) -> float:
        return self.r_fast + self.r_slow / self.g(fan_pct)

    def tau_slow(self, fan_pct: float) -> float:
        return self.tau_slow_s / self.g(fan_pct)


def fan_curve(temp_c: float) -> float:
    return min(100.0, max(30.0, 30.0 + 2.0 * (temp_c - 40.0)))


def simulate_node(
    truth: Truth | list[Truth],
    gpus: int = 4,
    seed: int = 0,
    phases_s: tuple[float, float, float, float] = PHASES_S,
    levels_w: list[tuple[float, float, float]] | None = None,
) -> list[dict[str, np.ndarray]]:
    """Each GPU's samples: t_ns, temp (whole degrees), power, node power, fan %, steady (mask), mem (the
    memory's temperature, whole degrees).

    ``truth``: one for every GPU, or one per GPU (their inlet stages must agree: it is the node's air);
    ``levels_w``: per GPU its idle, warm-up and steady power (default: 70, 300, 650 W scaled 0.9 to 1.1)."""
    rng = np.random.default_rng(seed)
    truths = truth if isinstance(truth, list) else [truth] * gpus
    n = int(sum(phases_s) / DT_S)
    t = np.arange(n) * DT_S
    ends = np.cumsum(phases_s)
    if levels_w is None:
        levels_w = [(70.0, 70.0 + 230.0 * sc, 70.0 + 580.0 * sc) for sc in np.linspace(0.9, 1.1, len(truths))]
    powers = []
    for idle, warm, load in levels_w:
        level = np.where(t < ends[0], idle, np.where(t < ends[1], warm, np.where(t < ends[2], load, idle)))
        powers.append(level + rng.normal(0, 0.01 * load, n))
    node = np.sum(powers, axis=0)
    steady = (t >= ends[1]) & (t < ends[2])
    out = []
    idle_node = sum(w[0] for w in levels_w)
    for truth, p, (idle, _, _) in zip(truths, powers, levels_w, strict=True):
        fast = truth.r_fast * idle
        inlet = truth.k_in * idle_node
        slow = truth.r_slow * idle
        mem = truth.r_mem * idle
        for _ in range(50):  # the idle equilibrium (at the idle level, without its noise), fan included
            g = truth.g(fan_curve(truth.t_amb_c + fast + slow + inlet))
            slow = truth.r_slow / g * idle
        temp = np.empty(n)
        fan = np.empty(n)
        mem_c = np.empty(n)
        for k in range(n):
            temp[k] = truth.t_amb_c + fast + slow + inlet
            mem_c[k] = truth.t_amb_c + mem + inlet
            fan[k] = round(fan_curve(temp[k]))
            g = truth.g(fan_curve(temp[k]))
            r_s, tau_s = truth.r_slow / g, truth.tau_slow_s / g
            fast = truth.r_fast * p[k] + (fast - truth.r_fast * p[k]) * math.exp(-DT_S / truth.tau_fast_s)
            slow = r_s * p[k] + (slow - r_s * p[k]) * math.exp(-DT_S / tau_s)
            inlet = truth.k_in * node[k] + (inlet - truth.k_in * node[k]) * math.exp(-DT_S / truth.tau_in_s)
            mem = truth.r_mem * p[k] + (mem - truth.r_mem * p[k]) * math.exp(-DT_S / truth.tau_mem_s)
        t_ns = (T0_NS + t * 1e9).astype(np.int64)
        out.append(
            {
                "t_ns": t_ns,
                "temp": np.floor(temp + 0.5),
                "power": p,
                "node": node,
                "fan": fan,
                "steady": steady,
                "mem": np.floor(mem_c + 0.5),
            }
        )
    return out


def fit_node(
    samples: list[dict[str, np.ndarray]], *, with_fan: bool = True, with_memory: bool = False
) -> list[ThermalFit]:
    """As analysis.py does it: the node's GPUs fitted together (the inlet stage shared); ``with_memory``:
    each GPU's memory temperature too (a second reading of the node's air)."""
    return fit_thermal_node(
        [
            ThermalInput(
                s["t_ns"],
                s["temp"],
                s["power"],
                None,
                False,
                node_w=s["node"] if len(samples) > 1 else None,
                fan_pct=s["fan"] if with_fan else None,
                steady_mask=s["steady"],
                mem_temp_c=s["mem"] if with_memory else None,
            )
            for s in samples
        ]
    )


def steady_fan_of(s: dict[str, np.ndarray]) -> float:
    """The fan speed the model evaluates R and τ at: the median over the later half of the steady load."""
    fans = s["fan"][s["steady"]]
    return float(np.median(fans[len(fans) // 2 :]))


def check_recovered(fit: ThermalFit, truth: Truth, steady_fan_pct: float) -> None:
    assert fit.chosen == "output-error" and fit.model.startswith("rc2"), (fit.model, fit.candidates)
    assert fit.r_th_c_per_w == pytest.approx(truth.r_total(steady_fan_pct), rel=0.05), fit.candidates
    assert fit.tau_s == pytest.approx(truth.tau_slow(steady_fan_pct), rel=0.05), fit.candidates
    assert fit.t_amb_c == pytest.approx(truth.t_amb_c, abs=1.0)
    assert fit.holdout_rmse_c is not None and fit.rc1_holdout_rmse_c is not None
    assert fit.holdout_rmse_c < 0.5 * fit.rc1_holdout_rmse_c
    assert fit.fit_rmse_c is not None and fit.fit_rmse_c < 0.5
    # each reported figure's 90 % interval (from the fit's Jacobian) holds the simulated truth
    for figure, true in (
        ("r_th_c_per_w", truth.r_total(steady_fan_pct)),
        ("tau_s", truth.tau_slow(steady_fan_pct)),
        ("t_amb_c", truth.t_amb_c),
    ):
        interval = fit.intervals[figure]
        assert interval.contains(true), (figure, true, interval, fit.model)


def test_two_stage_node_with_inlet_recovers_total_r_and_slow_tau() -> None:
    """With the memory temperature too (as the agent stores it): a second reading of the node's air."""
    truth = Truth()
    samples = simulate_node(truth)
    fits = fit_node(samples, with_fan=False, with_memory=True)
    for fit in fits:
        assert any("the memory temperature of 4" in n for n in fit.notes), fit.notes
        check_recovered(fit, truth, 100.0)
        assert fit.model == "rc2+inlet" and fit.inlet is not None and fit.inlet_source == "node"
        assert fit.inlet == fits[0].inlet  # one stage, shared by the node's GPUs
        assert fit.inlet.c_per_w == pytest.approx(truth.k_in, rel=0.3)
        assert fit.inlet.tau_s == pytest.approx(truth.tau_in_s, rel=0.3)


def test_two_stage_node_with_fan_and_inlet_recovers_r_at_the_steady_fan_speed() -> None:
    truth = Truth(floor=0.5)
    samples = simulate_node(truth, gpus=8, seed=2)  # an 8-GPU node: the inlet stage is larger than on 4
    fits = fit_node(samples, with_fan=True)
    for s, fit in zip(samples, fits, strict=True):
        steady_fan = steady_fan_of(s)
        assert fit.steady_fan_pct == pytest.approx(steady_fan)
        check_recovered(fit, truth, steady_fan)


def test_two_stage_gpu_alone_is_two_stage_and_beats_first_order() -> None:
    truth = Truth(k_in=0.0)
    s = simulate_node(truth, gpus=1)[0]
    fit = fit_thermal(s["t_ns"], s["temp"], s["power"], None, power_is_average=False)
    check_recovered(fit, truth, 100.0)
    assert fit.model == "rc2" and fit.inlet is None and len(fit.stages) == 2
    assert fit.stages[0].tau_s == pytest.approx(truth.tau_fast_s, rel=0.25)


def test_first_order_data_choose_the_first_order_model() -> None:
    truth = Truth(r_fast=0.0, r_slow=0.06, k_in=0.0)
    s = simulate_node(truth, gpus=1)[0]
    fit = fit_thermal(s["t_ns"], s["temp"], s["power"], None, power_is_average=False)
    assert fit.model == "rc1" and len(fit.stages) == 1, fit.candidates
    assert fit.r_th_c_per_w == pytest.approx(0.06, rel=0.05)
    assert fit.tau_s == pytest.approx(25.0, rel=0.05)
    assert fit.t_amb_c == pytest.approx(28.0, abs=1.0)
    assert fit.holdout_rmse_c == fit.rc1_holdout_rmse_c


def test_thermal_json_has_the_reported_fields() -> None:
    s = simulate_node(Truth(k_in=0.0), gpus=1)[0]
    fit = fit_thermal(s["t_ns"], s["temp"], s["power"], None, power_is_average=False, holdout=0.4)
    document = json.loads(json.dumps(_clean(dataclasses.asdict(fit))))
    for key in ("r_th_c_per_w", "tau_s", "t_amb_c", "fit_rmse_c", "holdout_rmse_c", "rc1_holdout_rmse_c"):
        assert isinstance(document[key], float), key
    assert document["method"] == "output-error" and document["model"] == "rc2"
    assert document["holdout_fraction"] == 0.4
    assert [set(st) for st in document["stages"]] == [{"r_c_per_w", "tau_s"}] * 2
    assert document["inlet"] is None
    assert {c["model"] for c in document["candidates"]} == {"rc1", "rc2"}


def test_holdout_option_is_validated() -> None:
    option = next(o for o in OPTIONS if o.name == "holdout")
    assert option.default == ModelSettings().holdout == 0.3
    assert option.type("0.4") == 0.4
    for bad in ("0", "0.9", "1.5", "-0.1"):
        with pytest.raises(ValueError, match=r"between 0 and 0\.9"):
            option.type(bad)
    run = subprocess.run(
        [sys.executable, "-m", "gpuprobe.app", "model", "--probe", "p", "--holdout", "0.95"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and "--holdout" in run.stderr and "0.9" in run.stderr


# The end-to-end scenario (tests/e2e/test_thermal_pipeline_e2e.py) in miniature: short time constants,
# GPUs of different sizes (one with a fan, one slot hotter), a two-minute probe, the inlet about 1 °C.
SHORT_PHASES_S = (15.0, 10.0, 45.0, 50.0)
SHORT = Truth(t_amb_c=30.0, tau_fast_s=0.8, tau_slow_s=8.0, tau_in_s=25.0, tau_mem_s=10.0)
SHORT_NODE = [
    (dataclasses.replace(SHORT, r_fast=0.05, r_slow=0.06, r_mem=0.09), (55.0, 195.0, 240.0)),
    (dataclasses.replace(SHORT, r_fast=0.032, r_slow=0.038, r_mem=0.06), (70.0, 320.0, 400.0)),
    (dataclasses.replace(SHORT, r_fast=0.31, r_slow=0.39, r_mem=0.6, t_amb_c=36.0), (16.0, 42.0, 50.0)),
    (dataclasses.replace(SHORT, r_fast=0.05, r_slow=0.06, r_mem=0.1, floor=0.5, t_amb_c=25.0), (20.0, 195.0, 250.0)),
]


def test_short_node_separates_the_shared_inlet_from_each_gpus_slow_stage() -> None:
    """One GPU alone cannot tell a 25 s inlet from its own 8 s heatsink when all GPUs load together (its
    slow τ comes out 10 % long); fitted jointly, the inlet shared, with every GPU's memory temperature (as the
    pipeline has it), every GPU's R, τ and T_amb are recovered."""
    truths = [t for t, _ in SHORT_NODE]
    samples = simulate_node(truths, phases_s=SHORT_PHASES_S, levels_w=[w for _, w in SHORT_NODE], seed=3)
    fits = fit_node(samples, with_memory=True)
    for truth, s, fit in zip(truths, samples, fits, strict=True):
        r, tau = truth.r_total(steady_fan_of(s)), truth.tau_slow(steady_fan_of(s))
        line = f"{fit.model}: R {fit.r_th_c_per_w / r - 1:+.1%} τ {fit.tau_s / tau - 1:+.1%}"
        line += f" T_amb {fit.t_amb_c - truth.t_amb_c:+.2f}"
        assert fit.model.startswith("rc2+inlet") and fit.inlet_source == "node", (line, fit.notes)
        assert fit.inlet == fits[0].inlet, line
        assert fit.r_th_c_per_w == pytest.approx(r, rel=0.04), line
        assert fit.tau_s == pytest.approx(tau, rel=0.05), line
        assert fit.t_amb_c == pytest.approx(truth.t_amb_c, abs=0.6), line
    assert fits[0].inlet is not None and fits[0].inlet.c_per_w == pytest.approx(SHORT.k_in, rel=0.5)


def test_one_gpu_node_has_no_inlet_candidate() -> None:
    """A node of one GPU: its node power is its own, so there is no inlet candidate (and no failure)."""
    s = simulate_node(Truth(), gpus=1)[0]
    (fit,) = fit_thermal_node([ThermalInput(s["t_ns"], s["temp"], s["power"], None, False, node_w=s["node"])])
    assert fit.model == "rc2" and fit.inlet is None, fit.candidates
    assert {c.model for c in fit.candidates} == {"rc1", "rc2"}
    assert fit.r_th_c_per_w == pytest.approx(Truth().r_total(100.0), rel=0.1)


def test_a_memory_that_one_stage_does_not_describe_is_left_out() -> None:
    """A memory heated through the die (here: reading exactly the die's two-stage temperature) is not one own
    stage plus the air: it would bend the node's inlet, so it is left out with a note and the fit is the dies'."""
    truth = Truth()
    samples = [dict(s, mem=s["temp"] + 3.0) for s in simulate_node(truth)]
    fits = fit_node(samples, with_fan=False, with_memory=True)
    for fit in fits:
        assert any("not used for the node's inlet" in n for n in fit.notes), fit.notes
        assert not any("the memory temperature of" in n for n in fit.notes), fit.notes
        check_recovered(fit, truth, 100.0)
        assert fit.model == "rc2+inlet"


def test_the_sandwich_bins_the_node_s_gpus_by_their_own_step_however_their_instants_are_offset() -> None:
    """GPUs of one node are read microseconds apart within a tick: binned by the step between all their
    times together, the scores got a bin per microsecond (22 GB for five GPUs over three minutes, the
    OOM killer ended `gpuprobe model` in CI). Offset or not, the same bins and the same covariance."""
    from gpuprobe.model.thermal_stages import Series, sandwich_covariance

    rng = np.random.default_rng(7)
    n, h = 1800, 0.1  # two GPUs, 180 s at 10 Hz
    t = (np.arange(n) + 0.5) * h
    jac = rng.normal(size=(2 * n, 3))
    res = np.repeat(rng.normal(size=(2 * n) // 20), 20) + rng.normal(scale=0.1, size=2 * n)

    def covariance(offset_s: float) -> tuple[np.ndarray, np.ndarray]:
        series = [Series(slice(0, n), 3, t), Series(slice(n, 2 * n), 3, t + offset_s)]
        result = sandwich_covariance(jac, res, series, bandwidth_s=8.0)
        assert result is not None
        return result

    aligned, offset = covariance(0.0), covariance(37e-6)
    for a, b in zip(aligned, offset, strict=True):
        assert np.allclose(a, b, rtol=1e-9, atol=0.0)
