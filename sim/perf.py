"""Part: sim. The simulator's performance model: the ground truth for training throughput on a simulated GPU.

Throughput produced by the simulator is *simulated*, never a measurement. It follows from three
things (docs/simulator.md, "Performance model", has the equations and the calibration table):

- what one training sample costs: tensor FLOPs (forward + backward), counted once from the real
  models of ``gpuprobe.trainer.models`` with ``torch.utils.flop_counter.FlopCounterMode`` (by
  ``gpuprobe.trainer.costs``: the simulator sits below the trainer and never imports it), and the
  bytes it moves (activations written in the forward pass and read back in the backward pass,
  plus the parameter traffic of one optimizer step), cached in ``workload_costs.json``
  (``python -m gpuprobe.trainer.costs`` recomputes it);
- what the GPU reaches: the profile's datasheet peak fp16 tensor throughput and memory bandwidth
  times achievable efficiencies, which are *chosen* (calibrated against published training
  throughput, ``tests/data/published-throughput/``); the compute-bound part of a sample's time
  scales with the SM clock, the memory-bound part does not;
- how full the GPU is kept: a batch-size efficiency curve (small batches leave it under-used), the
  utilization a workload holds at a batch size, and what virtualization costs.

It also mirrors, operation for operation, the C library's power and clock physics
(``sim/native/nvml_sim.c``): :func:`tick` is what the library computes for one update period and
:func:`steady_state` what it reports once the load and the limit have settled.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuprobe.sim.profiles import PROFILES, GpuProfile
from gpuprobe.sim.profiles import virt_overhead_pct as _profile_virt_overhead_pct
from gpuprobe.workloads import SIZES, WORKLOADS

COSTS_PATH = Path(__file__).resolve().parent / "workload_costs.json"
REGENERATE_COMMAND = "python -m gpuprobe.trainer.costs"  # the trainer counts its own models' costs

# ------------------------------------------------------------------------------------------------
# Power and clocks: the C library's physics, mirrored exactly (same operations, same order, so the
# same doubles and the same rounding).

CLOCK_BISECTIONS = 60  # as in nvml_sim.c


def _voltage(p: GpuProfile, x: float) -> float:
    """v(x): the voltage at SM clock fraction x, relative to the one at the maximum clock."""
    if x <= p.voltage_knee:
        return p.voltage_floor
    t = (x - p.voltage_knee) / (1.0 - p.voltage_knee)
    return p.voltage_floor + (1.0 - p.voltage_floor) * math.pow(t, p.voltage_exponent)


def active_power_fraction(p: GpuProfile, x: float) -> float:
    """a(x) = s + (1 - s) x v(x)^2: the active power at clock fraction x over the one at the maximum clock."""
    v = _voltage(p, x)
    return p.uncore_power_share + (1.0 - p.uncore_power_share) * x * v * v


def sm_clock_fraction(p: GpuProfile, target: float) -> float:
    """The clock fraction at which a(x) = target, never below the idle clock (bisection, as in C)."""
    lo = float(p.sm_clock_idle_mhz) / float(p.sm_clock_max_mhz)
    hi = 1.0
    if active_power_fraction(p, lo) >= target:
        return lo
    if target >= 1.0:
        return 1.0
    for _ in range(CLOCK_BISECTIONS):
        mid = 0.5 * (lo + hi)
        if active_power_fraction(p, mid) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _sm_clock_mhz(p: GpuProfile, fraction: float) -> int:
    mhz = p.sm_clock_max_mhz * fraction
    # C: mhz < idle ? idle : (unsigned)(mhz + 0.5)
    return p.sm_clock_idle_mhz if mhz < p.sm_clock_idle_mhz else int(mhz + 0.5)


@dataclass(frozen=True)
class SteadyState:
    """What the C library reports for one update period with these inputs (or once they have settled)."""

    util_pct: int  # the whole percent the simulator works with
    limit_w: float
    power_w: float  # P: exactly the power the library draws (reported in mW, rounded)
    sm_clock_mhz: int  # exactly what nvmlDeviceGetClockInfo(SM) reports
    clock_fraction: float  # x = the unrounded SM clock over the maximum
    power_capped: bool  # SW_POWER_CAP: the limit is what holds the power down
    slowed: bool  # thermal slowdown in force

    @property
    def power_mw(self) -> int:
        return int(self.power_w * 1000.0 + 0.5)


def tick(p: GpuProfile, util_pct: float, limit_w: float | None = None, slowed: bool = False) -> SteadyState:
    """Power and SM clock of one update period, as ``begin_tick`` in nvml_sim.c computes them.

    ``util_pct`` is rounded to a whole percent and clamped to 0-100 as the simulator takes it
    (``gpuprobe sim load``); ``limit_w`` defaults to the profile's default limit and is otherwise
    taken in whole mW, as ``nvmlDeviceSetPowerManagementLimit`` takes it."""
    util = max(0, min(100, round(util_pct)))
    limit = p.limit_default_w if limit_w is None else int(limit_w * 1000.0 + 0.5) / 1000.0
    demand = p.idle_w + (p.peak_demand_w - p.idle_w) * util / 100.0
    thermal = p.throttle_clock_factor if slowed else 1.0
    wanted = p.idle_w + (demand - p.idle_w) * thermal
    # power_of(): the same demand, scaled while slowed, capped by the limit
    slowed_demand = p.idle_w + (demand - p.idle_w) * p.throttle_clock_factor if slowed else demand
    power = slowed_demand if slowed_demand < limit else limit
    fraction = 1.0
    if util == 0:
        return SteadyState(util, limit, power, p.sm_clock_idle_mhz, fraction, False, slowed)
    capped = wanted > limit + 1e-9
    if capped or slowed:
        fraction = sm_clock_fraction(p, (power - p.idle_w) / (demand - p.idle_w))
    return SteadyState(util, limit, power, _sm_clock_mhz(p, fraction), fraction, capped, slowed)


def steady_state(profile: GpuProfile, util_pct: float, limit_w: float | None = None) -> SteadyState:
    """Power and SM clock the C library reports in steady state at a load and a limit (no thermal slowdown)."""
    return tick(profile, util_pct, limit_w, slowed=False)


# ------------------------------------------------------------------------------------------------
# What a training sample costs (workload_costs.json)


@dataclass(frozen=True)
class WorkloadCost:
    """One training sample of one model, as the cache holds it."""

    key: str  # "resnet50/full", or a calibration configuration's name
    description: str
    flops_per_sample: float  # tensor FLOPs of forward + backward (FlopCounterMode)
    activation_bytes_per_sample: float  # saved activations: written in forward, read in backward (16-bit)
    param_bytes_per_step: float  # weights, gradients and optimizer state touched once per step
    kernels_per_step: int  # ATen operations of one step that launch a kernel (forward, backward, optimizer)
    params: int
    optimizer: str


# Bytes each parameter moves per optimizer step under mixed precision: the 16-bit copy of the weight
# read in the forward and in the backward pass (2 + 2), the fp32 gradient written (4), then the
# optimizer's fp32 reads and writes: SGD with momentum reads weight, gradient and momentum and
# writes weight and momentum (5 x 4); AdamW reads weight, gradient and two moments and writes
# weight and two moments (7 x 4).
PARAM_BYTES_PER_STEP: dict[str, int] = {"sgd": 2 + 2 + 4 + 5 * 4, "adamw": 2 + 2 + 4 + 7 * 4}
FLOAT_BYTES = 2  # activations are stored in 16 bits under mixed precision (AMP, bf16 autocast)


@functools.cache
def _cache() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(COSTS_PATH.read_text())
    return data


def _cost_from_json(key: str, entry: dict[str, Any]) -> WorkloadCost:
    return WorkloadCost(
        key=key,
        description=str(entry["description"]),
        flops_per_sample=float(entry["flops_per_sample"]),
        activation_bytes_per_sample=float(entry["activation_bytes_per_sample"]),
        param_bytes_per_step=float(entry["param_bytes_per_step"]),
        kernels_per_step=int(entry["kernels_per_step"]),
        params=int(entry["params"]),
        optimizer=str(entry["optimizer"]),
    )


def workload_cost(workload: str, size: str) -> WorkloadCost:
    """The cached cost of one sample of a catalog workload (``idle`` has none)."""
    _check(workload, size)
    key = f"{workload}/{size}"
    entries: dict[str, Any] = _cache()["workloads"]
    if key not in entries:
        raise KeyError(f"{key} is not in {COSTS_PATH.name}: run `{REGENERATE_COMMAND}`")
    return _cost_from_json(key, entries[key])


def calibration_cost(name: str) -> WorkloadCost:
    entries: dict[str, Any] = _cache()["calibration"]
    return _cost_from_json(name, entries[name])


def _check(workload: str, size: str) -> None:
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; known: {', '.join(WORKLOADS)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; known: {', '.join(SIZES)}")


# ------------------------------------------------------------------------------------------------
# The throughput model


@dataclass(frozen=True)
class WorkloadModel:
    """What the model assumes of a workload beyond its FLOPs and bytes."""

    compute_factor: float  # tensor-core efficiency relative to transformer training on the same GPU


# ResNet-50's convolutions (many with few channels) and its batch norms keep its tensor cores far
# less busy per FLOP than the large GEMMs of a transformer; matmul-burn is nothing but large square
# GEMMs, which reach the cap below on every profile.
WORKLOAD_MODELS: dict[str, WorkloadModel] = {
    "resnet50": WorkloadModel(compute_factor=0.41),
    "bert-base": WorkloadModel(compute_factor=1.0),
    "gpt": WorkloadModel(compute_factor=1.0),
    "matmul-burn": WorkloadModel(compute_factor=4.0),
}
MAX_COMPUTE_EFFICIENCY = 0.75  # no training reaches more of the datasheet peak (large cuBLAS GEMMs do ~70-80 %)

# Batch-size efficiency: the fraction of its saturated throughput a GPU reaches at a batch size, from
# the Zeus traces of ResNet-50 on a V100 (batch -> fraction of the throughput at batch >= 192).
ZEUS_BATCH_EFFICIENCY: tuple[tuple[int, float], ...] = (
    (8, 0.60),
    (16, 0.76),
    (32, 0.87),
    (64, 0.94),
    (128, 0.98),
    (192, 1.0),
)
# The reference those batches ran at: one V100 training ResNet-50 saturated (Lambda's V100 16GB fp16
# figure, the same table as the calibration), in images/s. What leaves a GPU under-used is time a
# step loses outside its work (kernel launches, the Python loop, kernels too small to fill the GPU),
# which grows with the kernels the step launches; so what matters is how long a step keeps the GPU
# busy per kernel: a batch whose work takes a GPU as long, per kernel, as b ResNet-50 images take a
# V100 is as efficient as batch b was in the trace.
REFERENCE_SAMPLES_PER_S = 833.0
REFERENCE_WORKLOAD = ("resnet50", "full")  # whose kernels per step the trace's steps launched
# Below the trace's smallest batch, a step is the fixed overhead plus work: e = b / (b + b0), with b0
# chosen so that it meets the trace at batch 8 (0.60).
SMALL_BATCH_B0 = ZEUS_BATCH_EFFICIENCY[0][0] * (1.0 - ZEUS_BATCH_EFFICIENCY[0][1]) / ZEUS_BATCH_EFFICIENCY[0][1]
# About half of the small-batch loss is idle time between kernels (launches, the optimizer's small
# kernels, the Python loop: CPU time, which neither a faster SM clock shortens nor NVML counts as
# busy), half under-filled kernels (GPU time: it scales with the clock and NVML counts it as busy).
IDLE_SHARE_OF_BATCH_LOSS = 0.5


def batch_efficiency_at_reference(equivalent_batch: float) -> float:
    """The Zeus curve: efficiency at an equivalent V100 ResNet-50 batch (log-linear between its points)."""
    points = ZEUS_BATCH_EFFICIENCY
    if equivalent_batch <= 0:
        return 0.0
    if equivalent_batch < points[0][0]:
        return equivalent_batch / (equivalent_batch + SMALL_BATCH_B0)
    if equivalent_batch >= points[-1][0]:
        return points[-1][1]
    for (b0, e0), (b1, e1) in itertools.pairwise(points):
        if equivalent_batch < b1:
            t = math.log2(equivalent_batch / b0) / math.log2(b1 / b0)
            return e0 + (e1 - e0) * t
    raise AssertionError("unreachable")


def compute_efficiency(profile: GpuProfile, workload: str) -> float:
    """The fraction of the datasheet peak a workload's tensor work reaches at the maximum clock."""
    return min(MAX_COMPUTE_EFFICIENCY, profile.compute_efficiency * WORKLOAD_MODELS[workload].compute_factor)


@dataclass(frozen=True)
class _SampleTimes:
    """The parts of one sample's time at the maximum clock."""

    compute_s: float  # tensor work at the compute efficiency; scales with 1/x
    memory_s: float  # activation and parameter traffic; does not scale with the SM clock
    underfill_s: float  # small-batch loss inside under-filled kernels; scales with 1/x
    gap_s: float  # small-batch loss between kernels (launches, the Python loop); does not scale
    efficiency: float  # batch efficiency at the maximum clock

    def at(self, x: float) -> float:
        """The time per sample at SM clock fraction x."""
        return (self.compute_s + self.underfill_s) / x + self.memory_s + self.gap_s


def _sample_times(profile: GpuProfile, cost: WorkloadCost, workload: str, batch_size: int) -> _SampleTimes:
    if batch_size <= 0:
        raise ValueError(f"batch size must be positive, not {batch_size}")
    flops_per_s = profile.peak_fp16_tflops * 1e12 * compute_efficiency(profile, workload)
    bytes_per_s = profile.mem_bandwidth_gb_s * 1e9 * profile.memory_efficiency
    compute_s = cost.flops_per_sample / flops_per_s
    memory_s = (cost.activation_bytes_per_sample + cost.param_bytes_per_step / batch_size) / bytes_per_s
    busy_s = compute_s + memory_s
    kernels = workload_cost(*REFERENCE_WORKLOAD).kernels_per_step / cost.kernels_per_step
    efficiency = batch_efficiency_at_reference(batch_size * busy_s * REFERENCE_SAMPLES_PER_S * kernels)
    lost_s = busy_s * (1.0 / efficiency - 1.0)
    gap_s = IDLE_SHARE_OF_BATCH_LOSS * lost_s
    return _SampleTimes(compute_s, memory_s, lost_s - gap_s, gap_s, efficiency)


def batch_efficiency(profile: GpuProfile, workload: str, size: str, batch_size: int) -> float:
    """The fraction of its saturated throughput (at the maximum clock) the GPU reaches at this batch."""
    _check(workload, size)
    if not WORKLOADS[workload].needs_torch:
        return 0.0
    return _sample_times(profile, workload_cost(workload, size), workload, batch_size).efficiency


def _utilization(workload: str, efficiency: float) -> float:
    saturated = WORKLOADS[workload].steady_util_pct
    return float(round(saturated * (1.0 - IDLE_SHARE_OF_BATCH_LOSS * (1.0 - efficiency))))


def utilization_pct(profile: GpuProfile, workload: str, size: str, batch_size: int) -> float:
    """The GPU utilization (whole percent, as NVML reports and the simulator takes it) a workload holds at a batch.

    The catalog's ``steady_util_pct`` at large batches; smaller batches lose part of it to idle gaps."""
    _check(workload, size)
    if not WORKLOADS[workload].needs_torch:
        return 0.0
    return _utilization(workload, batch_efficiency(profile, workload, size, batch_size))


def _samples_per_s(
    profile: GpuProfile, cost: WorkloadCost, workload: str, batch_size: int, sm_clock_mhz: float, virt_pct: float
) -> float:
    x = sm_clock_mhz / profile.sm_clock_max_mhz
    if x <= 0:
        return 0.0
    return (1.0 - virt_pct / 100.0) / _sample_times(profile, cost, workload, batch_size).at(x)


def samples_per_s(
    profile: GpuProfile,
    workload: str,
    size: str,
    batch_size: int,
    sm_clock_mhz: float,
    virt_overhead_pct: float = 0.0,
) -> float:
    """Training samples/s at a batch size while the SM clock is ``sm_clock_mhz`` (as NVML reports it).

    The compute-bound part of a sample's time scales with the clock, the memory-bound part and the
    per-step overhead do not; ``virt_overhead_pct`` of the result is lost to virtualization.
    ``idle`` trains nothing: 0."""
    _check(workload, size)
    if not WORKLOADS[workload].needs_torch:
        return 0.0
    return _samples_per_s(profile, workload_cost(workload, size), workload, batch_size, sm_clock_mhz, virt_overhead_pct)


def virt_overhead_pct(profile: GpuProfile) -> float:
    """The effective virtualization overhead of a (possibly overridden) profile, in % of throughput."""
    return _profile_virt_overhead_pct(profile)


@dataclass(frozen=True)
class GroundTruth:
    """What a workload does on a simulated GPU in steady state (no thermal slowdown): simulated, not measured."""

    workload: str
    size: str
    batch_size: int
    util_pct: float
    limit_w: float
    power_w: float
    sm_clock_mhz: int
    virt_overhead_pct: float
    samples_per_s: float
    j_per_sample: float  # inf when nothing is trained (idle)
    samples_per_j: float
    step_time_s: float  # inf when nothing is trained (idle)


def _truth(
    profile: GpuProfile,
    cost: WorkloadCost | None,
    workload: str,
    size: str,
    batch_size: int,
    limit_w: float | None,
    virt_pct: float | None,
) -> GroundTruth:
    virt = virt_overhead_pct(profile) if virt_pct is None else virt_pct
    if cost is None:
        util = 0.0
        state = steady_state(profile, util, limit_w)
        rate = 0.0
    else:
        util = _utilization(workload, _sample_times(profile, cost, workload, batch_size).efficiency)
        state = steady_state(profile, util, limit_w)
        # the clock as NVML reports it: what a reader of the simulator would compute with
        rate = _samples_per_s(profile, cost, workload, batch_size, state.sm_clock_mhz, virt)
    return GroundTruth(
        workload=workload,
        size=size,
        batch_size=batch_size,
        util_pct=util,
        limit_w=state.limit_w,
        power_w=state.power_w,
        sm_clock_mhz=state.sm_clock_mhz,
        virt_overhead_pct=virt,
        samples_per_s=rate,
        j_per_sample=state.power_w / rate if rate > 0 else math.inf,
        samples_per_j=rate / state.power_w if rate > 0 else 0.0,
        step_time_s=batch_size / rate if rate > 0 else math.inf,
    )


def ground_truth(
    profile: GpuProfile,
    workload: str,
    size: str,
    batch_size: int,
    limit_w: float | None = None,
    virt_overhead_pct: float | None = None,
) -> GroundTruth:
    """Steady utilization, power, SM clock and throughput of a workload at a batch size and a power limit.

    ``limit_w`` defaults to the profile's default limit; ``virt_overhead_pct`` to the profile's own
    (``virt_overhead_pct(profile)``)."""
    _check(workload, size)
    cost = workload_cost(workload, size) if WORKLOADS[workload].needs_torch else None
    return _truth(profile, cost, workload, size, batch_size, limit_w, virt_overhead_pct)


# ------------------------------------------------------------------------------------------------
# Calibration: the published configurations, evaluated like the trainer's workloads


@dataclass(frozen=True)
class CalibrationConfig:
    name: str  # the calibration entry of workload_costs.json
    workload: str  # the catalog workload whose model (utilization, compute factor) it runs under
    description: str


CALIBRATION_CONFIGS: dict[str, CalibrationConfig] = {
    c.name: c
    for c in (
        CalibrationConfig("resnet50-imagenet-224", "resnet50", "ResNet-50 v1.5, 224x224 ImageNet training, fp16/AMP"),
        CalibrationConfig(
            "bert-base-squad-384",
            "bert-base",
            "BERT-base SQuAD fine-tuning (question answering head), sequence 384, fp16/AMP",
        ),
    )
}


def calibration_ground_truth(
    profile: GpuProfile, config: str, batch_size: int, limit_w: float | None = None
) -> GroundTruth:
    """A published configuration on a simulated GPU (bare metal, the default limit unless given)."""
    c = CALIBRATION_CONFIGS[config]
    return _truth(profile, calibration_cost(config), c.workload, config, batch_size, limit_w, 0.0)


@dataclass(frozen=True)
class PublishedFigure:
    """One row of tests/data/published-throughput/published.csv."""

    profile: str
    config: str
    batch_size: int
    samples_per_s: float
    source: str


PUBLISHED_CSV = Path(__file__).resolve().parents[1] / "tests" / "data" / "published-throughput" / "published.csv"


def published_figures(path: Path = PUBLISHED_CSV) -> list[PublishedFigure]:
    import csv

    with path.open(newline="") as f:
        return [
            PublishedFigure(
                profile=row["profile"],
                config=row["config"],
                batch_size=int(row["batch_size"]),
                samples_per_s=float(row["samples_per_s"]),
                source=row["source"],
            )
            for row in csv.DictReader(f)
        ]


# ------------------------------------------------------------------------------------------------
# Power-limit sweeps


@dataclass(frozen=True)
class SweepPoint:
    limit_w: float
    limit_pct_of_max: float
    truth: GroundTruth
    rel_samples_per_s: float  # relative to the maximum limit
    rel_j_per_sample: float


def power_limit_sweep(
    profile: GpuProfile, workload: str, size: str, batch_size: int, limits_w: Sequence[float] | None = None
) -> list[SweepPoint]:
    """Ground truth at each power limit, relative to the maximum limit's (default limits: the minimum,
    then 5 % steps of the maximum)."""
    if limits_w is None:
        lo, hi = profile.limit_min_w, profile.limit_max_w
        steps = [hi * pct / 100.0 for pct in range(5, 101, 5) if lo <= hi * pct / 100.0 <= hi]
        limits_w = sorted({lo, *steps, hi})
    top = ground_truth(profile, workload, size, batch_size, profile.limit_max_w)
    return [
        SweepPoint(
            limit_w=limit,
            limit_pct_of_max=100.0 * limit / profile.limit_max_w,
            truth=(truth := ground_truth(profile, workload, size, batch_size, limit)),
            rel_samples_per_s=truth.samples_per_s / top.samples_per_s,
            rel_j_per_sample=truth.j_per_sample / top.j_per_sample,
        )
        for limit in limits_w
    ]


# ------------------------------------------------------------------------------------------------
# The tables of docs/simulator.md


def calibration_rows() -> Iterator[tuple[PublishedFigure, GroundTruth, float]]:
    """(published figure, the model at that configuration, error in %) for every published row."""
    for fig in published_figures():
        truth = calibration_ground_truth(PROFILES[fig.profile], fig.config, fig.batch_size)
        yield fig, truth, 100.0 * (truth.samples_per_s / fig.samples_per_s - 1.0)


def markdown_tables() -> str:
    """The performance tables of docs/simulator.md, as this code computes them."""
    out = ["<!-- performance parameters: parsed by tests/sim/test_sim_perf.py -->"]
    out.append(
        "| workload | compute factor | GFLOP/sample (full) | activation MB/sample (full) | param MB/step (full)"
        " | kernels/step (full) |"
    )
    out.append("|---|---|---|---|---|---|")
    for name, model in WORKLOAD_MODELS.items():
        c = workload_cost(name, "full")
        out.append(
            f"| {name} | {model.compute_factor:g} | {c.flops_per_sample / 1e9:.2f} |"
            f" {c.activation_bytes_per_sample / 1e6:.1f} | {c.param_bytes_per_step / 1e6:.1f} | {c.kernels_per_step} |"
        )
    out += ["", "<!-- calibration table: parsed by tests/sim/test_sim_perf.py -->"]
    out.append("| profile | configuration | batch | published (samples/s) | model (samples/s) | error | source |")
    out.append("|---|---|---|---|---|---|---|")
    for fig, truth, err in calibration_rows():
        out.append(
            f"| {fig.profile} | {fig.config} | {fig.batch_size} | {fig.samples_per_s:g} | {truth.samples_per_s:.0f} |"
            f" {err:+.1f} % | {fig.source} |"
        )
    out += ["", "<!-- sweep table: parsed by tests/sim/test_sim_perf.py -->"]
    h100 = PROFILES["H100-SXM5-80GB"]
    batch = WORKLOADS["resnet50"].sweep["full"][-1]
    out.append("| limit (W) | % of max | SM clock (MHz) | images/s | rel. throughput | J/image | rel. J/image |")
    out.append("|---|---|---|---|---|---|---|")
    for point in power_limit_sweep(h100, "resnet50", "full", batch):
        t = point.truth
        out.append(
            f"| {point.limit_w:.0f} | {point.limit_pct_of_max:.0f} | {t.sm_clock_mhz} | {t.samples_per_s:.0f} |"
            f" {point.rel_samples_per_s:.3f} | {t.j_per_sample:.3f} | {point.rel_j_per_sample:.3f} |"
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m gpuprobe.sim.perf", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--tables", action="store_true", help="print the performance tables of docs/simulator.md")
    args = parser.parse_args(argv)
    if not args.tables:
        parser.print_help()
        return 2
    if not PUBLISHED_CSV.exists():  # the published figures live in the source tree's tests, not the wheel
        print(f"error: --tables needs {PUBLISHED_CSV} (a source checkout of gpuprobe)", file=sys.stderr)
        return 1
    sys.stdout.write(markdown_tables())
    return 0


if __name__ == "__main__":
    sys.exit(main())
