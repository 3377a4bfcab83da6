"""The performance model (gpuprobe.sim.perf) against published throughput, its own documented shape,
docs/simulator.md, and the C library it mirrors (through the real pynvml in child processes)."""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuprobe.sim import perf
from gpuprobe.sim.profiles import (
    DEFAULT_VIRT_OVERHEAD_PCT,
    PROFILES,
    VIRT_NAMES,
    UnknownProfileError,
    with_overrides,
)
from gpuprobe.sim.runner import SimMachine, open_machine
from gpuprobe.trainer import costs
from gpuprobe.workloads import WORKLOADS

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "simulator.md"
PUBLISHED_DIR = ROOT / "tests" / "data" / "published-throughput"
H100 = PROFILES["H100-SXM5-80GB"]
NOBODY = 65534


# --- the cached costs are what the real models give ------------------------------------------------


def test_cached_costs_match_the_real_models() -> None:
    """The tiny models and the full ResNet-50 recomputed now, against workload_costs.json (1 %)."""
    pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    pytest.importorskip("transformers")
    keys = [f"{w}/tiny" for w, spec in WORKLOADS.items() if spec.needs_torch] + ["resnet50/full"]
    fresh = costs.compute_costs(only=keys)["workloads"]
    cached = json.loads(perf.COSTS_PATH.read_text())["workloads"]
    assert sorted(fresh) == sorted(keys)
    for key in keys:
        for field in ("flops_per_sample", "activation_bytes_per_sample", "param_bytes_per_step", "kernels_per_step"):
            assert fresh[key][field] == pytest.approx(cached[key][field], rel=0.01), (key, field)
        assert fresh[key]["params"] == cached[key]["params"], key
        assert fresh[key]["optimizer"] == cached[key]["optimizer"], key


def test_the_cache_covers_every_workload_and_calibration() -> None:
    data = json.loads(perf.COSTS_PATH.read_text())
    assert perf.REGENERATE_COMMAND in data["comment"]
    want = {f"{w}/{s}" for w, spec in WORKLOADS.items() if spec.needs_torch for s in ("tiny", "full")}
    assert set(data["workloads"]) == want
    assert set(data["calibration"]) == set(perf.CALIBRATION_CONFIGS)
    # FLOPs per sample are what the architectures are known for (forward + backward = 3 x forward)
    rn50 = perf.workload_cost("resnet50", "full")
    assert rn50.flops_per_sample == pytest.approx(3 * 2 * 4.1e9, rel=0.03)  # 4.1 GMAC forward at 224x224
    assert rn50.params == 25_557_032
    bert = perf.workload_cost("bert-base", "full")
    squad = perf.calibration_cost("bert-base-squad-384")
    # longer sequences cost more than linearly (attention), and pre-training pays for its vocabulary head
    assert squad.flops_per_sample > 2 * bert.flops_per_sample
    assert perf.calibration_cost("resnet50-imagenet-224").flops_per_sample == rn50.flops_per_sample


# --- the published figures ----------------------------------------------------------------------------


def published_rows() -> list[dict[str, str]]:
    with (PUBLISHED_DIR / "published.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def test_published_data_is_documented() -> None:
    rows = published_rows()
    readme = (PUBLISHED_DIR / "README.md").read_text()
    assert {r["profile"] for r in rows} == set(PROFILES), "a published figure for every profile"
    for row in rows:
        assert row["profile"] in PROFILES and row["config"] in perf.CALIBRATION_CONFIGS, row
        assert row["source"] in readme, row["source"]
    for needle in ("lambdal/deeplearning-benchmark", "mlcommons/training_results_v3.1", "BERT-large", "facts"):
        assert needle in readme, needle


@pytest.mark.parametrize("fig", perf.published_figures(), ids=lambda f: f"{f.profile}:{f.config}")
def test_model_within_15_percent_of_published(fig: perf.PublishedFigure) -> None:
    truth = perf.calibration_ground_truth(PROFILES[fig.profile], fig.config, fig.batch_size)
    assert truth.samples_per_s == pytest.approx(fig.samples_per_s, rel=0.15), truth
    # the published runs ran at the default limit, bare metal, under full load
    assert truth.limit_w == PROFILES[fig.profile].limit_default_w
    assert truth.util_pct >= 90


def test_h100_resnet50_at_a_typical_batch_looks_like_an_h100() -> None:
    truth = perf.ground_truth(H100, "resnet50", "full", 256)
    assert truth.samples_per_s == pytest.approx(2600, rel=0.15)
    assert 0.2 <= truth.j_per_sample <= 0.3
    assert truth.samples_per_j == pytest.approx(1 / truth.j_per_sample)
    assert truth.step_time_s == pytest.approx(256 / truth.samples_per_s)


# --- batch size and utilization ---------------------------------------------------------------------


def test_batch_curve_is_the_zeus_trace_at_the_reference() -> None:
    for batch, efficiency in perf.ZEUS_BATCH_EFFICIENCY:
        assert perf.batch_efficiency_at_reference(batch) == pytest.approx(efficiency)
    grid = [0.5 * 1.1**i for i in range(80)]
    values = [perf.batch_efficiency_at_reference(b) for b in grid]
    assert all(a <= b for a, b in itertools.pairwise(values)), "monotone"
    assert all(0 < v <= 1 for v in values)
    assert perf.batch_efficiency_at_reference(192) == perf.batch_efficiency_at_reference(4096) == 1.0
    # continuous where the small-batch law meets the trace
    assert perf.batch_efficiency_at_reference(8 - 1e-9) == pytest.approx(0.60, abs=1e-6)


@pytest.mark.parametrize("profile", PROFILES.values(), ids=lambda p: p.name)
def test_small_batches_underuse_the_gpu(profile) -> None:
    for workload, spec in WORKLOADS.items():
        if not spec.needs_torch:
            assert perf.utilization_pct(profile, workload, "full", 1) == 0.0
            assert perf.ground_truth(profile, workload, "full", 1).samples_per_s == 0.0
            continue
        for size in ("tiny", "full"):
            batches = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384, 1 << 22]
            eff = [perf.batch_efficiency(profile, workload, size, b) for b in batches]
            util = [perf.utilization_pct(profile, workload, size, b) for b in batches]
            rate = [perf.ground_truth(profile, workload, size, b).samples_per_s for b in batches]
            assert all(a <= b for a, b in itertools.pairwise(eff)), (workload, size, eff)
            assert all(a <= b for a, b in itertools.pairwise(util)), (workload, size, util)
            assert all(a < b for a, b in itertools.pairwise(rate)), (workload, size, rate)
            assert all(u == round(u) for u in util), "whole percent, as NVML reports it"
            assert util[-1] <= spec.steady_util_pct
            if size == "full":
                assert util[-1] == spec.steady_util_pct, "saturated: the catalog's steady utilization"
            if workload != "matmul-burn":  # one row of it streams 7.5 GB of weights: busy even at batch 1
                assert util[0] < spec.steady_util_pct
        # the full model at its largest catalog batch keeps the GPU well fed
        assert perf.batch_efficiency(profile, workload, "full", max(spec.sweep["full"])) > 0.8


# --- throughput, clock and virtualization -------------------------------------------------------------


@pytest.mark.parametrize("profile", PROFILES.values(), ids=lambda p: p.name)
def test_throughput_follows_the_sm_clock(profile) -> None:
    for workload in ("resnet50", "bert-base", "gpt", "matmul-burn"):
        batch = WORKLOADS[workload].default_batch["full"]
        top = profile.sm_clock_max_mhz
        rates = [perf.samples_per_s(profile, workload, "full", batch, top * f / 10) for f in range(2, 11)]
        assert all(a < b for a, b in itertools.pairwise(rates)), workload
        # the memory-bound part does not scale with the clock: halving it loses less than half
        half = perf.samples_per_s(profile, workload, "full", batch, top / 2)
        assert 0.5 * rates[-1] < half < rates[-1]
        # virtualization takes its share off the top
        assert perf.samples_per_s(profile, workload, "full", batch, top, 4.5) == pytest.approx(rates[-1] * 0.955)


@pytest.mark.parametrize("profile", PROFILES.values(), ids=lambda p: p.name)
def test_the_reported_clock_gives_the_ground_truth(profile) -> None:
    """What the trainer does: samples_per_s at the integer MHz NVML reports equals the ground truth (0.1 %)."""
    for workload, spec in WORKLOADS.items():
        if not spec.needs_torch:
            continue
        for size in ("tiny", "full"):
            for batch in spec.sweep[size]:
                for limit in (profile.limit_min_w, profile.limit_default_w, profile.limit_max_w):
                    truth = perf.ground_truth(profile, workload, size, batch, limit)
                    state = perf.steady_state(profile, truth.util_pct, limit)
                    assert truth.sm_clock_mhz == state.sm_clock_mhz and truth.power_w == state.power_w
                    reported = perf.samples_per_s(
                        profile, workload, size, batch, float(state.sm_clock_mhz), perf.virt_overhead_pct(profile)
                    )
                    assert reported == pytest.approx(truth.samples_per_s, rel=0.001)
                    assert truth.j_per_sample == pytest.approx(truth.power_w / truth.samples_per_s)


def test_virtualization_modes_and_overheads() -> None:
    assert VIRT_NAMES == {"none": 0, "passthrough": 1, "vgpu": 2}
    assert DEFAULT_VIRT_OVERHEAD_PCT == {0: 0.0, 1: 1.0, 2: 4.5}
    assert H100.virt == 0 and H100.virt_overhead_pct is None and perf.virt_overhead_pct(H100) == 0.0
    for name, mode in VIRT_NAMES.items():
        for spelling in (name, name.upper(), str(mode)):
            p = with_overrides(H100, {"virt": spelling})
            assert p.virt == mode and perf.virt_overhead_pct(p) == DEFAULT_VIRT_OVERHEAD_PCT[mode]
    vgpu = with_overrides(H100, {"virt": "vgpu"})
    own = with_overrides(H100, {"virt": "vgpu", "virt_overhead_pct": "5"})
    assert perf.virt_overhead_pct(own) == 5.0
    assert with_overrides(own, {"virt_overhead_pct": "auto"}).virt_overhead_pct is None
    bare = perf.ground_truth(H100, "resnet50", "full", 256)
    assert perf.ground_truth(vgpu, "resnet50", "full", 256).samples_per_s == pytest.approx(bare.samples_per_s * 0.955)
    assert perf.ground_truth(own, "resnet50", "full", 256).samples_per_s == pytest.approx(bare.samples_per_s * 0.95)
    # an explicit overhead wins over the profile's; power and clock do not depend on it
    explicit = perf.ground_truth(own, "resnet50", "full", 256, virt_overhead_pct=0.0)
    assert explicit.samples_per_s == pytest.approx(bare.samples_per_s)
    assert explicit.power_w == bare.power_w and explicit.sm_clock_mhz == bare.sm_clock_mhz
    for key, bad in (("virt", "sriov"), ("virt", "3"), ("virt_overhead_pct", "-1"), ("virt_overhead_pct", "100")):
        with pytest.raises(UnknownProfileError, match=f"bad value .* for {key}"):
            with_overrides(H100, {key: bad})


# --- power limits -------------------------------------------------------------------------------------


def sweep_cases() -> Iterator[tuple[str, str, int]]:
    """Every profile, ResNet-50 and BERT-base, at the catalog's full-size batches that keep the GPU
    busy (64 and up). Below that the GPU draws so much less that the limit bites only lower down."""
    for name in PROFILES:
        for workload in ("resnet50", "bert-base"):
            for batch in WORKLOADS[workload].sweep["full"]:
                if batch >= 64:
                    yield name, workload, batch


@pytest.mark.parametrize(("name", "workload", "batch"), list(sweep_cases()))
def test_power_limit_sweep_has_the_published_shape(name: str, workload: str, batch: int) -> None:
    """Zeus traces: throughput nearly flat down to ~75 % of the maximum limit, energy per sample least
    around 60-80 % of it, and higher again at the lowest limits."""
    p = PROFILES[name]
    limits = sorted(
        {p.limit_min_w + (p.limit_max_w - p.limit_min_w) * i / 100 for i in range(101)} | {0.75 * p.limit_max_w}
    )
    points = perf.power_limit_sweep(p, workload, "full", batch, limits)
    at_75 = next(q for q in points if q.limit_w == 0.75 * p.limit_max_w)
    best = min(points, key=lambda q: q.rel_j_per_sample)
    assert at_75.rel_samples_per_s >= 0.93
    assert 55 <= best.limit_pct_of_max <= 85, best
    assert points[0].truth.j_per_sample > best.truth.j_per_sample
    assert best.rel_j_per_sample < 0.95  # there is something to save
    # throughput never rises as the limit falls, and power never exceeds the limit
    rates = [q.truth.samples_per_s for q in points]
    assert all(a <= b + 1e-9 for a, b in itertools.pairwise(rates))
    assert all(q.truth.power_w <= q.limit_w + 1e-9 for q in points)


@pytest.mark.parametrize("profile", PROFILES.values(), ids=lambda p: p.name)
def test_every_limit_can_be_held_at_full_load(profile) -> None:
    """P = min(W, L): the DVFS curve reaches the minimum limit at 100 % above the idle clock."""
    floor = profile.sm_clock_idle_mhz / profile.sm_clock_max_mhz
    assert perf.active_power_fraction(profile, floor) * (profile.peak_demand_w - profile.idle_w) + profile.idle_w < (
        profile.limit_min_w
    )
    state = perf.steady_state(profile, 100, profile.limit_min_w)
    assert state.power_w == profile.limit_min_w and state.power_capped
    assert state.sm_clock_mhz > profile.sm_clock_idle_mhz
    # the clock solved for a limit draws that limit
    for limit in (profile.limit_min_w, (profile.limit_min_w + profile.limit_default_w) / 2, profile.limit_default_w):
        s = perf.steady_state(profile, 100, limit)
        drawn = profile.idle_w + (profile.peak_demand_w - profile.idle_w) * perf.active_power_fraction(
            profile, s.clock_fraction
        )
        assert drawn == pytest.approx(limit, abs=1e-6)


def test_dvfs_power_grows_faster_than_the_clock() -> None:
    for p in PROFILES.values():
        xs = [i / 100 for i in range(15, 101)]
        a = [perf.active_power_fraction(p, x) for x in xs]
        assert a[-1] == pytest.approx(1.0)
        assert all(u < v for u, v in itertools.pairwise(a))
        # near the top the voltage rises: power falls faster than the clock when it is lowered
        assert perf.active_power_fraction(p, 0.9) < 0.9
        assert 1 - perf.active_power_fraction(p, 0.97) > 2 * 0.03


# --- docs/simulator.md --------------------------------------------------------------------------------


def test_docs_performance_tables_are_in_step() -> None:
    """The tables of the "Performance model" section are what `python -m gpuprobe.sim.perf --tables` prints."""
    text = DOC.read_text()
    missing = [line for line in perf.markdown_tables().splitlines() if line and line not in text.splitlines()]
    assert not missing, "docs/simulator.md is out of step; paste `python -m gpuprobe.sim.perf --tables`:\n" + "\n".join(
        missing
    )


def test_docs_name_the_model_constants() -> None:
    text = DOC.read_text()
    section = text[text.index("## Performance model") :]
    for constant in (
        f"{perf.REFERENCE_SAMPLES_PER_S:g}",
        f"{perf.MAX_COMPUTE_EFFICIENCY:g}",
        f"{perf.IDLE_SHARE_OF_BATCH_LOSS:g}",
        "simulated",
        "never a measurement",
        perf.REGENERATE_COMMAND,
    ):
        assert constant in section, constant
    for batch, efficiency in perf.ZEUS_BATCH_EFFICIENCY:
        assert re.search(rf"\b{batch}\b[^|\n]*\|[^|\n]*{efficiency:.2f}", section), (batch, efficiency)


# --- the C library: through the real pynvml -----------------------------------------------------------


STEADY_CHILD = """
cases = json.loads(os.environ["CASES"])
out = []
for util, limits in cases:
    for i in range(COUNT):
        set_load(i, util)
    for step in range(len(limits[0])):
        for i, h in enumerate(H):
            N.nvmlDeviceSetPowerManagementLimit(h, limits[i][step])
        wait_ticks(H[0], 2)
        row = []
        for h in H:
            _, v = same_tick(h, lambda: (fields(h, [186])[186], N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_SM),
                                         N.nvmlDeviceGetEnforcedPowerLimit(h), N.nvmlDeviceGetUtilizationRates(h).gpu))
            row.append(v)
        out.append(row)
emit(out)
"""


def test_c_library_steady_state_is_the_python_mirror(sim) -> None:
    """Steady power and SM clock at several loads and limits, every profile: as perf.steady_state says."""
    profiles = list(PROFILES.values())
    machine = sim.machine(profiles, period_s=0.05)
    utils = [20, 55, 80, 93, 100]
    fractions = [0.0, 0.3, 0.6, 0.85, 1.0]  # of the way from the minimum to the maximum limit

    def limit_mw(p, f: float) -> int:
        return round((p.limit_min_w + (p.limit_max_w - p.limit_min_w) * f) * 1000)

    cases = [[u, [[limit_mw(p, f) for f in fractions] for p in profiles]] for u in utils]
    env = machine.environ()
    env["CASES"] = json.dumps(cases)
    rows = sim.run(None, STEADY_CHILD, env=env, timeout=120)
    assert len(rows) == len(utils) * len(fractions)
    capped = 0
    for k, row in enumerate(rows):
        util, f = utils[k // len(fractions)], fractions[k % len(fractions)]
        for p, (power_mw, sm_mhz, enforced_mw, seen_util) in zip(profiles, row, strict=True):
            want = perf.steady_state(p, util, limit_mw(p, f) / 1000)
            assert enforced_mw == limit_mw(p, f) and seen_util == util
            assert abs(sm_mhz - want.sm_clock_mhz) <= 1, (p.name, util, f, sm_mhz, want)
            assert abs(power_mw / 1000 - want.power_w) <= 0.1, (p.name, util, f, power_mw, want)
            capped += want.power_capped
    assert capped >= 10, "the cases include capped ones"


def test_a_machine_from_before_the_dvfs_curve_keeps_its_linear_clock_in_c_and_python(sim) -> None:
    """A sim.conf written by an older gpuprobe has no DVFS parameters: the C library keeps that machine's
    clock linear in the active power, and state.load gives the same law, so its ground truth still holds."""
    machine = sim.machine([H100], period_s=0.05)
    conf = machine.state_dir / "sim.conf"
    dvfs = ("uncore_power_share", "voltage_floor", "voltage_knee", "voltage_exponent")
    conf.write_text("".join(line for line in conf.read_text().splitlines(True) if not any(k in line for k in dvfs)))
    profile = machine.config().gpus[0].profile
    assert (profile.uncore_power_share, profile.voltage_floor, profile.voltage_knee) == (0.0, 1.0, 0.0)
    env = machine.environ()
    env["CASES"] = json.dumps([[90, [[400_000]]]])
    (((power_mw, sm_mhz, _, _),),) = sim.run(None, STEADY_CHILD, env=env, timeout=60)
    want = perf.steady_state(profile, 90, 400.0)
    assert abs(sm_mhz - want.sm_clock_mhz) <= 1 and abs(power_mw / 1000 - 400.0) <= 0.1
    # linear: the clock fraction is the share of the active power the cap leaves (330 W of 621 W)
    assert want.clock_fraction == pytest.approx((400.0 - H100.idle_w) / ((H100.peak_demand_w - H100.idle_w) * 0.9))


def test_virtualization_mode_is_reported(sim) -> None:
    profiles = [with_overrides(H100, {"virt": v}) for v in ("none", "passthrough", "vgpu")]
    profiles.append(with_overrides(PROFILES["L4"], {"virt": "vgpu", "virt_overhead_pct": "3"}))
    machine = sim.machine(profiles)
    modes = sim.run(machine, "emit([N.nvmlDeviceGetVirtualizationMode(h) for h in H])")
    assert modes == [0, 1, 2, 2]
    # the machine's own record keeps the overhead, for the trainer to read back
    gpus = machine.config().gpus
    assert [perf.virt_overhead_pct(g.profile) for g in gpus] == [0.0, 1.0, 4.5, 3.0]


def test_sim_run_set_accepts_virt_names(cli) -> None:
    code = (
        "import pynvml as N; N.nvmlInit(); "
        "print([N.nvmlDeviceGetVirtualizationMode(N.nvmlDeviceGetHandleByIndex(i)) for i in range(3)])"
    )
    proc = cli(
        "sim", "run", "--gpus", "3", "--set", "1.virt=passthrough", "--set", "2.virt=vgpu",
        "--set", "2.virt_overhead_pct=5", "--", sys.executable, "-c", code,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [0, 1, 2]
    bad = cli("sim", "run", "--gpus", "1", "--set", "0.virt=sriov", "--", "true")
    assert bad.returncode == 2
    assert "bad value 'sriov' for virt" in bad.stderr


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder the user nobody may read (pytest's tmp_path is private to its user)."""
    base = Path(tempfile.mkdtemp(prefix="gpuprobe-sim-perf-"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


SET_LIMIT_CHILD = """
import json, os, sys
import pynvml as N
if sys.argv[1] == "nobody":  # drop root's privileges before NVML is loaded
    os.setgroups([]); os.setgid(65534); os.setuid(65534)
N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(0)
out = {"euid": os.geteuid(), "limit": N.nvmlDeviceGetPowerManagementLimit(h)}
for mw in (300000, 100000):
    try:
        N.nvmlDeviceSetPowerManagementLimit(h, mw)
        out[str(mw)] = "ok"
    except N.NVMLError as e:
        out[str(mw)] = e.value
print(json.dumps(out))
"""


def _set_limits(machine: SimMachine, who: str) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", SET_LIMIT_CHILD, who],
        env=machine.environ(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    out: dict[str, object] = json.loads(proc.stdout.splitlines()[-1])
    return out


def test_only_root_may_set_the_power_limit(shared_dir: Path) -> None:
    """NO_PERMISSION to any other effective uid (nobody, when the tests run as root; else the tests'
    own user), whatever the value; root (or a uid the machine grants it to) gets the range check."""
    root = os.geteuid() == 0
    machine = open_machine(shared_dir / "default", [H100])  # as `sim run` makes it: root only
    granted = open_machine(shared_dir / "granted", [H100], admin_uids=(0, os.geteuid()))
    for path in shared_dir.rglob("*"):
        path.chmod(path.stat().st_mode | 0o444 | (0o111 if path.is_dir() else 0))
    assert machine.config().admin_uids == (0,) and granted.config().admin_uids == tuple(sorted({0, os.geteuid()}))

    refused = _set_limits(machine, "nobody" if root else "self")
    assert refused["euid"] == (NOBODY if root else os.geteuid()) and refused["limit"] == 700_000
    assert refused["300000"] == 4 and refused["100000"] == 4  # NVML_ERROR_NO_PERMISSION
    assert (shared_dir / "default" / "gpu0.events").read_text() == "", "nothing reached the GPU"

    allowed = _set_limits(granted, "self")
    assert allowed["300000"] == "ok" and allowed["100000"] == 2  # INVALID_ARGUMENT: below the minimum
    assert (shared_dir / "granted" / "gpu0.events").read_text().count(" L 300000 ") == 1


def test_ground_truth_is_finite_and_consistent() -> None:
    for p in PROFILES.values():
        for workload, spec in WORKLOADS.items():
            truth = perf.ground_truth(p, workload, "full", spec.default_batch["full"])
            if not spec.needs_torch:
                assert truth.util_pct == 0 and truth.samples_per_s == 0 and math.isinf(truth.j_per_sample)
                assert truth.power_w == p.idle_w and truth.sm_clock_mhz == p.sm_clock_idle_mhz
                continue
            assert truth.util_pct == perf.utilization_pct(p, workload, "full", spec.default_batch["full"])
            assert 0 < truth.samples_per_s < math.inf
            assert truth.power_w <= p.limit_default_w
    with pytest.raises(ValueError, match="unknown workload"):
        perf.ground_truth(H100, "vgg", "full", 8)
    with pytest.raises(ValueError, match="batch size"):
        perf.samples_per_s(H100, "resnet50", "full", 0, 1980.0)
    # a profile changed with --set is modelled with its own parameters
    slower = dataclasses.replace(H100, peak_fp16_tflops=H100.peak_fp16_tflops / 2)
    assert (
        perf.ground_truth(slower, "gpt", "full", 32).samples_per_s
        < perf.ground_truth(H100, "gpt", "full", 32).samples_per_s
    )
