"""How much the thermal fit moves when the simulated machine's ambient moves by tenths of a degree.

The end-to-end thermal test (tests/e2e/test_thermal_pipeline_e2e.py) runs one scenario: five simulated
GPUs (A100, H100, H200, L4 with a 6 degC hotter slot, RTX 4090) at the utilization the tiny ResNet-50
holds on each (the performance model's, about 48 %), a warm-up at 70/93 of it, every GPU stepping at the
same moment, time constants shortened as in that test. Its result is one draw: the readings are whole
degrees, so where the temperature crosses each degree boundary, and with it the fit, depends on the
sub-degree ambient. This replays the same scenario offline (``gpuprobe.sim.thermal.replay``: the
simulator's own tick physics, the die and memory readings rounded as NVML reports them, no memory reading
on the RTX 4090 as on the GeForce part), shifts every GPU's ambient by each of ``--shifts``, fits the node
with ``fit_thermal_node`` as ``gpuprobe model`` does (steady mask, second opinions as starting points,
memory temperatures unless ``--without-memory``), and prints each GPU's error against the simulator's
ground truth. SIMULATED data, not a measurement of hardware.

    python bench/thermal_sensitivity.py --shifts 0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9 [--without-memory]

About 18 s per shift on the development VM (10 s without the memory temperatures).
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from gpuprobe.model.thermal import ThermalInput, fit_thermal_node
from gpuprobe.sim import perf, thermal
from gpuprobe.sim.profiles import PROFILES, with_overrides

NAMES = ["A100-SXM4-80GB", "H100-SXM5-80GB", "H200-SXM-141GB", "L4", "RTX-4090"]
SHORT_TAUS = {"tau_fast_s": "1", "tau_s": "12", "inlet_tau_s": "48", "mem_tau_s": "15"}
HOT_SLOT, HOT_SLOT_OFFSET = 3, "6"
PERIOD_NS = 100_000_000
# (phase, seconds, share of the steady utilization): the e2e test's 30 s start delay is idle too
PHASES = [("idle", 45.0, 0.0), ("warmup", 12.0, 70 / 93), ("steady", 60.0, 1.0), ("cooldown", 75.0, 0.0)]


def fit_at(shift_c: float, use_memory: bool = True) -> list[dict[str, object]]:
    profiles = []
    for i, name in enumerate(NAMES):
        o = dict(SHORT_TAUS, ambient_c=f"{PROFILES[name].ambient_c + shift_c:g}")
        if i == HOT_SLOT:
            o["slot_offset_c"] = HOT_SLOT_OFFSET
        profiles.append(with_overrides(PROFILES[name], o))
    steady_pct = [perf.utilization_pct(p, "resnet50", "tiny", 8) for p in profiles]
    utils: list[list[float]] = []
    for _, seconds, share in PHASES:
        utils += [[float(round(u * share)) for u in steady_pct]] * int(seconds * 1e9 / PERIOD_NS)
    ticks = thermal.replay(profiles, PERIOD_NS, len(utils), iter(utils))
    t_ns = np.array([r.k * PERIOD_NS for r in ticks], dtype=np.int64)
    power_w = np.array([r.powers_w for r in ticks])
    temp_c = np.array([r.readings_c for r in ticks], dtype=float)
    # field 82 where the profile reports it (NOT_SUPPORTED on GeForce)
    mem_c = np.array([r.mem_readings_c for r in ticks], dtype=float)
    mem_c[:, [not p.mem_temp_supported for p in profiles]] = np.nan
    node_w = power_w.sum(axis=1)
    steady_from = int(sum(s for _, s, _ in PHASES[:2]) * 1e9 / PERIOD_NS)
    steady_to = steady_from + int(PHASES[2][1] * 1e9 / PERIOD_NS)
    steady_mask = np.zeros(len(ticks), dtype=bool)
    steady_mask[steady_from:steady_to] = True
    inputs = []
    for i in range(len(profiles)):
        fans = [r.fan_pcts[i] for r in ticks]
        fan = None if fans[0] is None else np.array(fans, dtype=float)
        reasons = np.zeros(len(ticks), dtype=np.int64)
        inputs.append(
            ThermalInput(
                t_ns,
                temp_c[:, i],
                power_w[:, i],
                reasons,
                False,
                node_w=node_w,
                fan_pct=fan,
                steady_mask=steady_mask,
                mem_temp_c=mem_c[:, i] if use_memory and profiles[i].mem_temp_supported else None,
            )
        )
    fits = fit_thermal_node(inputs, holdout=0.3)
    steady_w = power_w[(steady_from + steady_to) // 2 : steady_to].mean(axis=0)
    truths = thermal.ground_truth(profiles, [float(w) for w in steady_w])
    out: list[dict[str, object]] = []
    for name, fit, truth in zip(NAMES, fits, truths, strict=True):
        if fit.r_th_c_per_w is None or fit.tau_s is None or fit.t_amb_c is None:
            out.append({"gpu": name, "model": None})
            continue
        out.append(
            {
                "gpu": name,
                "model": fit.model,
                "r_err": fit.r_th_c_per_w / truth.r_th_c_per_w - 1,
                "tau_err": fit.tau_s / truth.tau_s - 1,
                "t_amb_err_c": fit.t_amb_c - truth.t_amb_c,
                "tau_in_s": fit.inlet.tau_s if fit.inlet else None,
                "k_in_c_per_w": fit.inlet.c_per_w if fit.inlet else None,
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--shifts", default="0,0.2,0.4,0.6,0.8", help="ambient shifts in degC, comma-separated")
    parser.add_argument("--json", help="write the results here too")
    parser.add_argument(
        "--without-memory",
        action="store_true",
        help="do not give the fit the memory temperature (field 82): the node's inlet from the dies alone",
    )
    args = parser.parse_args()
    results = {}
    print("SIMULATED: fits of the replayed scenario; truth inlet tau 48 s, k_in 0.001 degC/W")
    for shift in (float(s) for s in args.shifts.split(",")):
        rows = fit_at(shift, use_memory=not args.without_memory)
        results[f"{shift:g}"] = rows
        inlet = next((r for r in rows if r.get("tau_in_s")), None)
        head = f"ambient {shift:+.1f} C"
        if inlet:
            head += f" (inlet tau {inlet['tau_in_s']:.0f} s, k_in {inlet['k_in_c_per_w']:.4f})"
        cells = [
            f"{r['gpu'][:5]} R {r['r_err']:+.1%} tau {r['tau_err']:+.1%} T_amb {r['t_amb_err_c']:+.2f}"
            if r["model"]
            else f"{r['gpu'][:5]} no fit"
            for r in rows
        ]
        print(head + ": " + ", ".join(cells), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
