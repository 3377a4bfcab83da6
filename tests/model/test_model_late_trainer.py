"""A probe whose trainers were late: the window the probe's events give starts at the load step.

A trainer slow to get ready (importing torch on a busy machine) shortens its idle baseline to nothing
when it is later than the baseline (trainer/run.py): the probe's first event is then the load step. A
thermal fit of that window alone starts every stage "in equilibrium" at the loaded power; the model
reads the margin before the probe, where the GPU was at rest. The GPUs are the demo's node (four H100s,
the demo's shortened time constants, the inlet warmed by the machine), simulated by the simulator's own
physics (``gpuprobe.sim.thermal``, the ground truth; model code never reads it), read as NVML reports
them (whole degrees, 10 Hz).
"""

from __future__ import annotations

import numpy as np
import pytest

from gpuprobe.model.analysis import ModelSettings, analyze
from gpuprobe.model.data import GPU_FIELDS, Dataset, GpuSeries, Phase, Window
from gpuprobe.sim.profiles import PROFILES, with_overrides
from gpuprobe.sim.thermal import MachineThermal

pytestmark = pytest.mark.slow  # seconds per GPU

DEMO_THERMAL = {"tau_fast_s": "0.8", "tau_s": "8", "inlet_tau_s": "30", "mem_tau_s": "10"}
T0_NS = 1_800_000_000 * 10**9
TICK_NS = 100_000_000
IDLE_W, WARMUP_W, STEADY_W = 70.0, 497.8, 642.7  # the demo's H100 under its ResNet-50


def late_probe() -> tuple[Dataset, float]:
    """60 s at rest, then the trainers (late: no idle baseline) warm up 10 s, run 30 s and cool down 20 s."""
    profile = with_overrides(PROFILES["H100-SXM5-80GB"], DEMO_THERMAL)
    machine = MachineThermal([profile] * 4, TICK_NS)
    plan = [(600, IDLE_W), (100, WARMUP_W), (300, STEADY_W), (200, IDLE_W)]
    times, powers, temps, mems = [], [], [], []
    for ticks, power_w in plan:
        for _ in range(ticks):
            times.append(T0_NS + len(times) * TICK_NS)
            powers.append(power_w)
            temps.append(machine.readings_c)
            mems.append(machine.mem_readings_c)
            machine.step([power_w] * 4)
    t_ns = np.array(times, dtype=np.int64)
    gpus = []
    for i in range(4):
        values = {f: np.full(len(t_ns), np.nan) for f in GPU_FIELDS}
        values["power_instant_w"] = values["power_w"] = np.array(powers)
        values["temp_c"] = np.array([t[i] for t in temps], dtype=float)
        values["mem_temp_c"] = np.array([m[i] for m in mems], dtype=float)
        gpus.append(GpuSeries("node-a", str(i), "NVIDIA H100 80GB HBM3", f"GPU-{i}", t_ns, values))
    step_ns = T0_NS + 60 * 10**9
    s = 10**9
    phases = [
        Phase("warmup", step_ns, step_ns + 10 * s),
        Phase("steady", step_ns + 10 * s, step_ns + 40 * s),
        Phase("cooldown", step_ns + 40 * s, step_ns + 60 * s),
    ]
    window = Window("late", "late", step_ns, step_ns + 60 * s, ["node-a"], {"node-a": phases})
    return Dataset(window=window, gpus=gpus, acoustic=[], trainer=[]), profile.r_th_c_per_w


def test_a_probe_whose_window_starts_at_the_load_step_still_recovers_r_th() -> None:
    dataset, r_th = late_probe()
    results = analyze(dataset, ModelSettings(write_model=False))
    for g in results.gpus:
        rc = g.thermal.rc
        assert rc is not None, g.thermal.notes
        # from the window alone: held-out RMS 10 °C, the fit starting at the loaded equilibrium
        assert g.thermal.holdout_rmse_c is not None and g.thermal.holdout_rmse_c < 0.5, g.thermal.holdout_rmse_c
        assert rc.r_th_c_per_w == pytest.approx(r_th, rel=0.05), (g.gpu, rc.r_th_c_per_w)
