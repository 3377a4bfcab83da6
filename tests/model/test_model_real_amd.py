"""The real eight-MI300X and eight-MI325X amd-smi logs of the shared realdata folder (skipped where absent),
read by ``gpuprobe import amd-smi``'s reader and fitted as ``gpuprobe model --holdout 0.4`` fits them
(the same figures: docs/models.md, "Real hardware", gives both commands).

The issue's goal is a median held-out RMS of 2.5 °C or less. The MI325X meets it; the MI300X, every GPU
fitted, does not (3.66 °C): at the same power its junction temperature moves by degrees, which no model
driven by the power alone can follow (the chassis fans are not in the logs).
"""

from __future__ import annotations

import statistics

import numpy as np
import pytest
from test_model_identifiable import fit_real_node, real_gpus, realdata  # realdata: the importer tests' lookup

pytestmark = pytest.mark.slow  # a few seconds per node

GPUS = tuple(str(i) for i in range(8))
MI300X_LOG = "mi300x_x8_750W_hibagus_sc25_llm_3200-1600-256_smi_raw.csv"
MI325X_LOG = "mi325x_x8_1000W_hibagus_sc25_llm_3200-1600-256_smi_raw.csv"


def median_held_out_c(name: str) -> tuple[float, list[str | None]]:
    fits = fit_real_node(realdata(name), GPUS, expect="amd")
    assert len(fits) == 8
    held = [f.holdout_rmse_c for f in fits]
    assert all(h is not None for h in held), [f.notes for f in fits]
    return statistics.median(h for h in held if h is not None), [f.cannot_tell for f in fits]


def test_real_mi300x_every_gpu_fitted_and_its_held_out_error_as_documented() -> None:
    median, cannot_tell = median_held_out_c(MI300X_LOG)
    assert cannot_tell == [None] * 8  # every GPU gets its R_th, τ and T_amb
    assert 3.5 < median < 3.8, median  # docs: 3.66 °C, above the 2.5 °C goal
    print(f"MI300X: median held-out {median:.2f} °C")


def test_real_mi325x_meets_the_held_out_goal_and_says_which_gpus_it_cannot_pin() -> None:
    median, cannot_tell = median_held_out_c(MI325X_LOG)
    assert median <= 2.5, median  # docs: 2.44 °C
    # every GPU's model predicts its held-out part; seven of eight cannot separate R_th from T_amb
    assert cannot_tell.count("R_th and T_amb not separable") == 7 and cannot_tell[1] is None
    print(f"MI325X: median held-out {median:.2f} °C")


def test_real_mi300x_temperature_moves_at_the_same_power() -> None:
    """Why the MI300X misses 2.5 °C: two 30 s stretches of its load at the same mean power (within
    10 W) differ in mean junction temperature by a median of 1.0-2.5 °C per GPU, up to 5-11 °C: the
    unlogged chassis fans (and the inlet air they move) at work, not the GPU's power."""
    for t_ns, temp, power in real_gpus(realdata(MI300X_LOG), GPUS, expect="amd"):
        k = 30  # readings at about 1 s
        m = len(t_ns) // k * k
        p_mean, t_mean = power[:m].reshape(-1, k).mean(1), temp[:m].reshape(-1, k).mean(1)
        loaded = np.flatnonzero(p_mean > 400)
        gaps = [abs(t_mean[i] - t_mean[j]) for i in loaded for j in loaded if i < j and abs(p_mean[i] - p_mean[j]) < 10]
        assert len(gaps) > 50 and float(np.median(gaps)) >= 1.0 and max(gaps) >= 5.0
