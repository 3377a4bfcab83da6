"""The two-stage thermal model with inlet coupling: the C library against its Python mirror (gpuprobe.sim.thermal).

Time constants are shortened through overrides so that each machine settles within seconds.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import sys
import textwrap
from pathlib import Path

import pytest
import support

from gpuprobe.sim import state, thermal
from gpuprobe.sim.profiles import PROFILES, UnknownProfileError, with_overrides

H100 = PROFILES["H100-SXM5-80GB"]
RTX = PROFILES["RTX-4090"]
NEW_KEYS = tuple(state.LEGACY_FIRST_ORDER_THERMAL)

# short time constants (and a larger inlet coefficient, so the inlet shows in whole degrees)
FAST = {"tau_fast_s": "0.2", "tau_s": "1.0", "inlet_tau_s": "0.8", "inlet_c_per_w": "0.003", "mem_tau_s": "0.8"}

# Reads every GPU inside one tick: die temperature of all, memory temperature where supported, fans where fitted.
READ_MACHINE = """
def read_all():
    out = []
    for h in H:
        temp = N.nvmlDeviceGetTemperature(h, 0)
        try:
            mem = fields(h, [82])[82]
        except Exception:
            mem = None
        try:
            fan = N.nvmlDeviceGetFanSpeed(h)
        except N.NVMLError_NotSupported:
            fan = None
        mem = mem if isinstance(mem, int) else None
        out.append([temp, mem, fan])
    return out

def poll(seconds, seen):
    t0 = time.time()
    while time.time() - t0 < seconds:
        ts, v = same_tick(H[0], read_all)
        seen[ts] = v
        time.sleep(0.01)
"""


def tick_index(config: state.SimSettings, ts_us: int) -> int:
    return (ts_us * 1000 - config.start_ns) // config.period_ns


def load_tick(config: state.SimSettings, t_ns: int) -> int:
    """The first tick whose inputs include an event written at t_ns."""
    return (config.next_tick_ns(t_ns) - config.start_ns) // config.period_ns


def replay_steps(
    config: state.SimSettings, steps: dict[int, tuple[int, float]], ticks: int
) -> list[thermal.TickRecord]:
    """The mirror of a machine whose GPU i goes to utilization u at tick k (steps[i] = (k, u))."""
    profiles = [g.profile for g in config.gpus]
    utils = (
        [steps[i][1] if i in steps and k >= steps[i][0] else 0.0 for i in range(len(profiles))] for k in range(ticks)
    )
    return thermal.replay(profiles, config.period_ns, ticks, utils)


def test_c_library_matches_the_mirror_on_a_machine_with_inlet_coupling_slot_offset_and_fans(sim):
    """GPU 0 steps to full load, GPUs 2 and 3 to 60 %; GPU 1 stays idle in a slot 3 °C hotter and warms only through the
    inlet air; the RTX 4090s (GPU 2 with the stock fan floor 0.5, GPU 3 with floor 1) show that the heatsink's
    resistance depends on the fan. Every reading of every tick equals the mirror's, to the degree and percent."""
    profiles = [
        with_overrides(H100, FAST),
        with_overrides(H100, {**FAST, "slot_offset_c": "3"}),
        with_overrides(RTX, FAST),
        with_overrides(RTX, {**FAST, "fan_conductance_floor": "1"}),
    ]
    machine = sim.machine(profiles, period_s=0.05)
    config = machine.config()
    assert [g.profile for g in config.gpus] == profiles  # sim.conf holds every new key
    r = sim.run(
        machine,
        READ_MACHINE
        + textwrap.dedent(
            """
        seen = {}
        poll(0.4, seen)
        steps = {i: [set_load(i, u), u] for i, u in ((0, 100), (2, 60), (3, 60))}
        poll(5.0, seen)
        emit({"steps": steps, "seen": sorted(seen.items())})
        """
        ),
        timeout=90,
    )
    steps = {int(i): (load_tick(config, t_ns), float(u)) for i, (t_ns, u) in r["steps"].items()}
    seen = {tick_index(config, ts): v for ts, v in r["seen"]}
    records = replay_steps(config, steps, max(seen) + 1)
    first_load = min(k for k, _ in steps.values())
    assert sum(1 for k in seen if k < first_load) >= 3 and sum(1 for k in seen if k >= first_load) >= 60
    for k, readings in seen.items():
        rec = records[k]
        for i, (temp, mem, fan) in enumerate(readings):
            assert temp == rec.readings_c[i], (k, i, temp, rec.temps_c[i])
            assert mem == (rec.mem_readings_c[i] if profiles[i].mem_temp_supported else None), (k, i)
            assert fan == rec.fan_pcts[i], (k, i)

    # no slowdown anywhere: the test is about the temperatures
    assert not any(any(rec.slowed) for rec in records)
    before = records[first_load - 1]
    last = records[-1]
    # the idle GPU in the hot slot: 3 °C over its neighbour at the start, then warmed by the others' power
    idle_truth = thermal.ground_truth(profiles, [thermal.idle_power_w(p) for p in profiles])
    assert idle_truth[1].t_amb_c == H100.ambient_c + 3.0
    assert before.temps_c[1] - before.temps_c[0] == pytest.approx(3.0, abs=1e-9)
    assert last.powers_w[1] == H100.idle_w
    load_truth = thermal.ground_truth(profiles, last.powers_w)
    inlet_rise_c = load_truth[1].inlet_c - idle_truth[1].inlet_c
    rtx_w = RTX.power_w(60)
    assert last.powers_w == [700.0, H100.idle_w, rtx_w, rtx_w]
    assert inlet_rise_c == pytest.approx(0.003 * (700 + 2 * rtx_w - 70 - 20 - 20), rel=1e-9)
    assert max(seen[k][1][0] for k in seen) - seen[min(seen)][1][0] >= 4  # whole degrees, read through NVML
    # the fast stage: a quarter second after its step GPU 0 has risen by well over a first-order RC's share
    k0 = steps[0][0]
    rise_c = records[k0 + 5].temps_c[0] - records[k0].temps_c[0]
    rc_only_c = H100.r_th_c_per_w * (700 - 70) * (1 - math.exp(-0.25 / 1.0))
    assert rise_c > rc_only_c + 0.5 * H100.r_fast_c_per_w * (700 - 70) * (1 - math.exp(-0.25 / 0.2))
    # the fan: under load the 4090 with floor 0.5 runs hotter than the one whose fan does not matter (its
    # fan, in mid-curve, leaves the heatsink part of its resistance), and its resistance is lower under load
    # (fan faster) than at idle (fan at its minimum)
    hot, cool = load_truth[2], load_truth[3]
    assert cool.r_th_c_per_w == pytest.approx(RTX.r_th_c_per_w) and cool.conductance == 1.0
    assert hot.fan_pct is not None and 50 < hot.fan_pct < 90
    assert hot.r_th_c_per_w < idle_truth[2].r_th_c_per_w
    assert hot.r_th_c_per_w > RTX.r_th_c_per_w
    assert hot.tau_s == pytest.approx(1.0 / hot.conductance)
    assert hot.steady_temp_c - cool.steady_temp_c == pytest.approx((hot.r_th_c_per_w - RTX.r_th_c_per_w) * rtx_w)
    assert hot.steady_temp_c - cool.steady_temp_c > 2.5
    assert last.temps_c[2] - last.temps_c[3] > 2.5
    assert seen[max(seen)][2][0] > seen[max(seen)][3][0]
    assert seen[max(seen)][2][2] > RTX.fan_min_pct + 20  # the fan went up with the heat


def test_a_process_that_reads_only_an_idle_gpu_sees_its_neighbours_heat(sim):
    """Lockstep: a process that never asks about GPU 0 still computes it, because GPU 1's inlet air depends on it."""
    machine = sim.machine("H100-SXM5-80GB", gpus=2, period_s=0.05, **FAST)
    config = machine.config()
    t_step = machine.set_load(0, 100)
    # GPU 0 heats for 2 s of the machine's clock (the physics, not a wait for something): nobody reads
    # the machine meanwhile, so the fresh process below computes GPU 0's ticks itself
    support.pass_time(2.0)
    r = sim.run(
        machine,
        """
        h = N.nvmlDeviceGetHandleByIndex(1)  # only GPU 1, in a fresh process
        emit(same_tick(h, lambda: [N.nvmlDeviceGetTemperature(h, 0), fields(h, [82])[82]]))
        """,
    )
    ts_us, (temp, mem) = r
    k = tick_index(config, ts_us)
    records = replay_steps(config, {0: (load_tick(config, t_step), 100.0)}, k + 1)
    assert [temp, mem] == [records[k].readings_c[1], records[k].mem_readings_c[1]]
    assert temp >= records[0].readings_c[1] + 1  # 0.003 °C/W x 630 W more on the node


def test_a_machine_from_before_the_two_stage_model_keeps_its_first_order_rc(sim):
    """A sim.conf written by an older gpuprobe has none of the newer thermal keys: the C library runs the old
    first-order RC (no fast stage, no inlet coupling, no fan effect) and state.load says the same."""
    machine = sim.machine([H100, H100, RTX], period_s=0.05, tau_s="1.0", mem_tau_s="0.8")
    conf = machine.state_dir / "sim.conf"
    lines = conf.read_text().splitlines(True)
    conf.write_text("".join(line for line in lines if not any(f".{key} " in line for key in NEW_KEYS)))
    config = machine.config()
    for gpu in config.gpus:
        for key, value in state.LEGACY_FIRST_ORDER_THERMAL.items():
            assert getattr(gpu.profile, key) == value, key
    r = sim.run(
        machine,
        READ_MACHINE
        + textwrap.dedent(
            """
        seen = {}
        poll(0.3, seen)
        steps = {i: set_load(i, 100) for i in (0, 2)}
        poll(3.0, seen)
        emit({"steps": steps, "seen": sorted(seen.items())})
        """
        ),
        timeout=90,
    )
    steps = {int(i): load_tick(config, t_ns) for i, t_ns in r["steps"].items()}
    seen = {tick_index(config, ts): v for ts, v in r["seen"]}
    # the old model, written out as it was: T_k+1 = T_ss + (T_k - T_ss) exp(-dt/tau), T_ss = T_amb + R P_k
    dt = config.period_ns / 1e9
    profiles = [g.profile for g in config.gpus]
    temps = [p.ambient_c + p.r_th_c_per_w * p.idle_w for p in profiles]
    mems = [p.ambient_c + p.mem_r_th_c_per_w * p.idle_w for p in profiles]
    for k in range(max(seen) + 1):
        if k in seen:
            for i, (temp, mem, fan) in enumerate(seen[k]):
                assert temp == thermal.reading_c(temps[i]), (k, i)
                if profiles[i].mem_temp_supported:
                    assert mem == thermal.reading_c(mems[i]), (k, i)
                if profiles[i].fan_count:
                    assert fan == thermal.fan_pct(profiles[i], temps[i])
        for i, p in enumerate(profiles):
            power = p.power_w(100) if i in steps and k >= steps[i] else p.idle_w
            t_ss = p.ambient_c + p.r_th_c_per_w * power
            temps[i] = t_ss + (temps[i] - t_ss) * math.exp(-dt / p.tau_s)
            m_ss = p.ambient_c + p.mem_r_th_c_per_w * power
            mems[i] = m_ss + (mems[i] - m_ss) * math.exp(-dt / p.mem_tau_s)
    # the idle GPU never moves: no inlet coupling
    assert {v[1][0] for v in seen.values()} == {thermal.reading_c(H100.ambient_c + H100.r_th_c_per_w * H100.idle_w)}
    # and the mirror, given the loaded profiles, is that same model bit for bit
    records = replay_steps(config, {i: (k, 100.0) for i, k in steps.items()}, max(seen) + 1)
    for k, readings in seen.items():
        assert [v[0] for v in readings] == records[k].readings_c


def test_sim_run_set_takes_the_new_thermal_keys(cli, sim):
    code = sim.script(
        """
        emit([N.nvmlDeviceGetTemperature(h, 0) for h in H])
        """
    )
    proc = cli(
        "sim", "run", "--gpus", "2", "--set", "1.slot_offset_c=10", "--set", "1.r_fast_c_per_w=0.02",
        "--set", "0.inlet_c_per_w=0", "--set", "1.inlet_tau_s=60", "--set", "1.tau_fast_s=2.5",
        "--set", "0.fan_conductance_floor=0.8", "--", sys.executable, "-c", code,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    temps = json.loads(proc.stdout.splitlines()[-1])
    p0 = with_overrides(H100, {"inlet_c_per_w": "0"})
    p1 = with_overrides(H100, {"slot_offset_c": "10", "r_fast_c_per_w": "0.02"})
    want = thermal.MachineThermal([p0, p1], 100_000_000).readings_c
    assert temps == want and temps[1] - temps[0] >= 10
    for bad, message in (
        ("0.fan_conductance_floor=0", "fan_conductance_floor"),
        ("0.r_fast_c_per_w=0.5", "r_fast_c_per_w"),
        ("0.inlet_tau_s=-1", "inlet_tau_s"),
        ("0.slot_offset_c=warm", "bad value 'warm' for slot_offset_c"),
    ):
        proc = cli("sim", "run", "--gpus", "1", "--set", bad, "--", "true")
        assert proc.returncode == 2 and message in proc.stderr, (bad, proc.stderr)


# ------------------------------------------------------------------------------ the mirror alone


@pytest.mark.parametrize("name", list(PROFILES))
def test_ground_truth_of_every_profile(name):
    p = PROFILES[name]
    full = p.power_w(100)
    truth = thermal.truth_at(p, full, full)
    assert truth.t_amb_c == p.ambient_c + p.slot_offset_c
    assert truth.r_fast_c_per_w == p.r_fast_c_per_w
    # the fast stage is about 45 % of the total, settling in 1-3 s
    assert 0.4 <= p.r_fast_c_per_w / p.r_th_c_per_w <= 0.5 and 1.0 <= p.tau_fast_s <= 3.0
    if p.passive:
        assert p.fan_conductance_floor == 1.0 and truth.fan_pct is None
        assert truth.r_th_c_per_w == pytest.approx(p.r_th_c_per_w) and truth.tau_s == p.tau_s
    else:
        g = p.fan_conductance_floor + (1 - p.fan_conductance_floor) * truth.fan_pct / 100
        assert truth.conductance == pytest.approx(g)
        assert truth.r_th_c_per_w == pytest.approx(p.r_fast_c_per_w + (p.r_th_c_per_w - p.r_fast_c_per_w) / g)
        assert truth.tau_s == pytest.approx(p.tau_s / g)
    # the steady temperature is the sum of its parts, and what the profile's steady_temp_c says
    want = truth.t_amb_c + truth.inlet_c + truth.r_th_c_per_w * full
    assert truth.steady_temp_c == pytest.approx(want, abs=1e-6)
    assert thermal.steady_temp_c(p, full) == truth.steady_temp_c
    assert truth.inlet_c == pytest.approx(p.inlet_c_per_w * full)
    # the fan curve agrees with the temperature it settles at
    if truth.fan_pct is not None:
        assert truth.fan_pct == pytest.approx(thermal.fan_curve_pct(p, truth.steady_temp_c), abs=1e-6)


@pytest.mark.parametrize("name", list(PROFILES))
def test_equilibrium_is_a_fixed_point_and_a_load_settles_there(name):
    p = with_overrides(PROFILES[name], {"inlet_tau_s": "10", "tau_s": "5", "mem_tau_s": "5", "slot_offset_c": "1.5"})
    others_w = 1234.0
    idle = thermal.equilibrium(p, p.idle_w, p.idle_w + others_w)
    stepped = thermal.advance(p, idle, p.idle_w, p.idle_w + others_w, 0.1)
    assert stepped.temp_c == pytest.approx(idle.temp_c, abs=1e-9)
    s = idle
    full = p.power_w(100)
    for _ in range(3000):  # 300 s: 30 of the slowest time constants
        s = thermal.advance(p, s, full, full + others_w, 0.1)
    settled = thermal.equilibrium(p, full, full + others_w)
    assert s.temp_c == pytest.approx(settled.temp_c, abs=1e-6)
    assert s.mem_temp_c == pytest.approx(settled.mem_temp_c, abs=1e-6)


def test_first_order_profiles_are_the_old_rc_bit_for_bit():
    for p in PROFILES.values():
        old = thermal.first_order(p)
        machine = thermal.MachineThermal([old, old], 100_000_000)
        temp = old.ambient_c + old.r_th_c_per_w * old.idle_w
        assert machine.temps_c == [temp, temp]
        for k in range(200):
            power = old.power_w(100) if k >= 10 else old.idle_w
            machine.step([power, old.idle_w])
            t_ss = old.ambient_c + old.r_th_c_per_w * power
            temp = t_ss + (temp - t_ss) * math.exp(-0.1 / old.tau_s)
            assert machine.temps_c[0] == temp  # exactly
        assert machine.temps_c[1] == old.ambient_c + old.r_th_c_per_w * old.idle_w
        assert thermal.steady_temp_c(old, 500.0) == old.ambient_c + old.r_th_c_per_w * 500.0


def test_bad_thermal_overrides_are_refused():
    with pytest.raises(UnknownProfileError, match="r_fast_c_per_w"):
        with_overrides(H100, {"r_fast_c_per_w": "0.08"})
    with pytest.raises(UnknownProfileError, match="fan_conductance_floor"):
        with_overrides(RTX, {"fan_conductance_floor": "1.5"})
    assert with_overrides(RTX, {"fan_conductance_floor": "1"}).fan_conductance_floor == 1.0
    assert dataclasses.replace(RTX).fan_conductance_floor == 0.5


def test_model_code_never_reads_the_simulator():
    """The fits are checked against the simulator's ground truth, so gpuprobe.model must not import any of it
    (gpuprobe.sim.thermal, .perf, .profiles): a fit that read the constants would be checked against itself."""
    model_dir = Path(__file__).resolve().parents[2] / "model"
    offenders = []
    for path in sorted(model_dir.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                # a relative import from the package root (from ..sim import thermal) counts as well
                names = [f"gpuprobe.{node.module}" if node.level > 1 else node.module]
            offenders += [f"{path.name}: {n}" for n in names if n == "gpuprobe.sim" or n.startswith("gpuprobe.sim.")]
    assert not offenders
