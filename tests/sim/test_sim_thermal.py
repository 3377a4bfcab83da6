"""Temperature, thermal slowdown and cooling, against the documented thermal model and fan curve.

(tests/sim/test_sim_thermal_machine.py holds the C library against the Python mirror on whole machines.)"""

from __future__ import annotations

import json
import math
import re
import sys

import pytest

from gpuprobe.sim import perf, thermal
from gpuprobe.sim.profiles import PROFILES

H100 = PROFILES["H100-SXM5-80GB"]
RTX = PROFILES["RTX-4090"]

SLOWDOWN = 0x8 | 0x40  # HW_SLOWDOWN | HW_THERMAL
SW_POWER_CAP = 0x4


def tick_start_ns(config, ts_us):
    """The exact tick start (ns) behind a FieldValue timestamp (which is that start in whole us)."""
    return config.tick_start_ns(ts_us * 1000 + 999)


def test_temperature_follows_the_staged_step_response(sim, gpuprobe_cmd):
    """A GPU alone in its machine: after a load step every stage (die, heatsink, inlet air; memory) relaxes
    exponentially to its new level, so the temperature is a sum of three exponentials in closed form."""
    tau_s, mem_tau_s, tau_fast_s, inlet_tau_s = 2.0, 1.5, 0.4, 1.2
    machine = sim.machine(
        "H100-SXM5-80GB",
        period_s=0.1,
        tau_s=tau_s,
        mem_tau_s=mem_tau_s,
        tau_fast_s=tau_fast_s,
        inlet_tau_s=inlet_tau_s,
        inlet_c_per_w=0.004,  # large enough to matter in whole degrees
    )
    p = machine.config().gpus[0].profile
    config = machine.config()
    r = sim.run(
        machine,
        f"""
        h = H[0]
        read = lambda: (N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU), fields(h, [82])[82])
        readings = []
        def poll(seconds):
            t0 = time.time()
            while time.time() - t0 < seconds:
                ts, (t, m) = same_tick(h, read)
                readings.append([ts, t, m])
                time.sleep(0.01)
        poll(0.3)
        out = subprocess.run({gpuprobe_cmd!r} + ["sim", "load", "--gpu", "0", "--util", "100"],
                             capture_output=True, text=True, check=True).stdout
        poll(4.0)
        emit({{"out": out, "readings": readings}})
        """,
    )
    match = re.search(r"from (\d+) \(unix ns\)", r["out"])
    assert match, r["out"]
    t_step = int(match.group(1))
    assert config.next_tick_ns(t_step) == t_step  # the load starts on a tick boundary

    p_idle, p_load = p.power_w(0), p.power_w(100)
    assert p_load == p.limit_default_w  # full load is power-capped
    r_slow = p.r_th_c_per_w - p.r_fast_c_per_w
    # (idle level, loaded level, time constant) of each stage: one GPU, so the node's power is its own
    die_stages = [
        (p.r_fast_c_per_w * p_idle, p.r_fast_c_per_w * p_load, tau_fast_s),
        (r_slow * p_idle, r_slow * p_load, tau_s),
        (p.inlet_c_per_w * p_idle, p.inlet_c_per_w * p_load, inlet_tau_s),
    ]
    mem_stages = [(p.mem_r_th_c_per_w * p_idle, p.mem_r_th_c_per_w * p_load, mem_tau_s), die_stages[2]]

    def response(stages, dt):
        return p.ambient_c + sum(hi + (lo - hi) * math.exp(-dt / tau) for lo, hi, tau in stages)

    t0, m0 = response(die_stages, 0.0), response(mem_stages, 0.0)
    assert t0 == pytest.approx(thermal.steady_temp_c(p, p_idle))

    before = after = 0
    ticks = set()
    for ts_us, temp, mem_temp in r["readings"]:
        t = tick_start_ns(config, ts_us)
        ticks.add(t)
        if t < t_step:
            before += 1
            want, want_mem = t0, m0
        else:
            after += 1
            dt = (t - t_step) / 1e9
            want, want_mem = response(die_stages, dt), response(mem_stages, dt)
        # readings are whole degrees rounded from the model's value at the tick start
        assert abs(temp - want) <= 0.5 + 1e-9, (dt if t >= t_step else None, temp, want)
        assert abs(mem_temp - want_mem) <= 0.5 + 1e-9, (mem_temp, want_mem)
    assert before >= 3 and after >= 100
    assert len(ticks) >= 35
    assert max(ticks) - t_step >= 3.5e9  # most of two time constants of the response were checked


def test_power_cap_then_thermal_slowdown(cli, sim):
    """A GPU whose cooling cannot hold full power slows down at its slowdown threshold."""
    code = """
        h = H[0]
        set_load(0, 100)
        seen = {}
        t0 = time.time()
        while time.time() - t0 < 2.0:
            ts, s = snapshot(h)
            seen[ts] = s
            time.sleep(0.005)
        emit(sorted(seen.items()))
    """
    proc = cli(
        "sim",
        "run",
        "--gpus",
        "1",
        "--period",
        "50ms",
        "--set",
        "0.r_th_c_per_w=0.2",
        "--set",
        "0.tau_s=0.5",
        "--",
        sys.executable,
        "-c",
        sim.script(code),
    )
    assert proc.returncode == 0, proc.stderr
    ticks = json.loads(proc.stdout.splitlines()[-1])
    loaded = [s for _, s in ticks if s["util"] == 100]
    assert loaded
    capped = [s for s in loaded if not s["reasons"] & SLOWDOWN]
    slowed = [s for s in loaded if s["reasons"] & SLOWDOWN]
    assert capped and slowed, [s["temp_c"] for s in loaded]
    # the clocks come from the DVFS curve (gpuprobe.sim.perf mirrors the C physics exactly)
    cap_mhz = perf.tick(H100, 100).sm_clock_mhz
    slowed_state = perf.tick(H100, 100, slowed=True)
    for s in capped:
        # demand (760 W) above the 700 W limit: power at the limit, clocks down to where it draws that
        assert s["temp_c"] <= H100.slowdown_c
        assert s["reasons"] == SW_POWER_CAP
        assert s["power_instant_mw"] == 700_000
        assert s["sm_mhz"] == cap_mhz
    # slowdown starts when the temperature reaches the threshold, and stays (R=0.2 keeps it hot)
    first = loaded.index(slowed[0])
    assert loaded[first]["temp_c"] >= H100.slowdown_c
    assert all(s["reasons"] & SLOWDOWN == SLOWDOWN for s in loaded[first:])
    slowed_w = H100.idle_w + (H100.peak_demand_w - H100.idle_w) * H100.throttle_clock_factor
    assert slowed_state.power_w == slowed_w
    for s in slowed:
        assert s["temp_c"] >= H100.slowdown_c
        # the active power cut to throttle_clock_factor, at the clock where the DVFS curve draws that
        assert s["sm_mhz"] == slowed_state.sm_clock_mhz < cap_mhz
        assert s["power_instant_mw"] == round(slowed_w * 1000)
        # below the power limit now, so the power cap is not what holds the clocks down
        assert s["power_instant_mw"] < s["limit_mw"]
        assert not s["reasons"] & SW_POWER_CAP


def test_slowdown_hysteresis(sim):
    """Slowdown switches on at the threshold and off only 3 C below it. (A quick fast stage and no inlet
    coupling, so the temperature follows the power's switching within a few ticks.)"""
    # R chosen so that full power heats past the threshold but slowed power cools below threshold-3
    r_th = 0.095
    p_full = H100.limit_default_w
    p_slow = H100.idle_w + (H100.peak_demand_w - H100.idle_w) * H100.throttle_clock_factor
    assert H100.ambient_c + r_th * p_full > H100.slowdown_c + 5
    assert H100.ambient_c + r_th * p_slow < H100.slowdown_c - 3 - 2
    machine = sim.machine(
        "H100-SXM5-80GB", period_s=0.05, r_th_c_per_w=r_th, tau_s=0.5, tau_fast_s=0.1, inlet_c_per_w=0.0
    )
    machine.set_load(0, 100)
    ticks = sim.run(
        machine,
        """
        seen = {}
        t0 = time.time()
        while time.time() - t0 < 3.5:
            ts, s = snapshot(H[0])
            seen[ts] = [s["temp_c"], s["reasons"], s["sm_mhz"], s["power_instant_mw"]]
            time.sleep(0.004)
        emit(sorted(seen.items()))
        """,
    )
    states = [(temp, bool(reasons & SLOWDOWN), mhz, mw) for _, (temp, reasons, mhz, mw) in ticks]
    stamps = [ts for ts, _ in ticks]
    # transitions between ticks observed back to back (a stalled poller may skip one)
    pairs = [i for i in range(1, len(states)) if stamps[i] - stamps[i - 1] == 50_000]
    on = [i for i in pairs if states[i][1] and not states[i - 1][1]]
    off = [i for i in pairs if not states[i][1] and states[i - 1][1]]
    assert len(on) >= 2 and len(off) >= 2, [s[:2] for s in states]
    slow = H100.slowdown_c
    for temp, slowed, mhz, mw in states:
        if slowed:
            assert temp >= slow - 3  # stays slowed until below slowdown - 3
            assert mw == round(p_slow * 1000)
            assert mhz == perf.tick(H100, 100, slowed=True).sm_clock_mhz
        else:
            assert temp <= slow  # a tick that starts at the threshold is slowed
    for i in on:
        assert states[i][0] >= slow
    for i in off:
        assert states[i][0] <= slow - 3
    # it cycles between the two thresholds rather than at a single one
    assert any(slow - 3 < s[0] < slow for s in states if s[1])


def fan_curve_pct(p, temp_c):
    if temp_c <= p.fan_t_low_c:
        return p.fan_min_pct
    if temp_c >= p.fan_t_high_c:
        return 100
    return p.fan_min_pct + (temp_c - p.fan_t_low_c) * (100 - p.fan_min_pct) / (p.fan_t_high_c - p.fan_t_low_c)


def test_fans_follow_temperature_on_rtx_4090(sim):
    # short time constants, so the fan settles within the test
    machine = sim.machine("RTX-4090", period_s=0.05, tau_s=0.4, tau_fast_s=0.1, inlet_tau_s=0.1)
    r = sim.run(
        machine,
        """
        h = H[0]
        out = {"num_fans": N.nvmlDeviceGetNumFans(h)}
        try:
            N.nvmlDeviceGetFanSpeed_v2(h, 2)
        except N.NVMLError_InvalidArgument:
            out["fan2"] = "InvalidArgument"
        out["fields"] = fields(h, [82, 195, 186])
        read = lambda: [N.nvmlDeviceGetTemperature(h, 0), N.nvmlDeviceGetFanSpeed(h),
                        N.nvmlDeviceGetFanSpeed_v2(h, 0), N.nvmlDeviceGetFanSpeed_v2(h, 1)]
        out["idle"] = same_tick(h, read)[1]
        set_load(0, 100)
        seen = {}
        t0 = time.time()
        while time.time() - t0 < 3.0:
            ts, v = same_tick(h, read)
            seen[ts] = v
            time.sleep(0.005)
        out["ticks"] = sorted(seen.items())
        emit(out)
        """,
    )
    assert r["num_fans"] == 2
    assert r["fan2"] == "InvalidArgument"
    # GeForce boards do not expose the memory temperature; power works
    assert r["fields"]["82"] == "err3" and r["fields"]["195"] == "err3"
    assert r["fields"]["186"] == round(RTX.idle_w * 1000)
    assert r["idle"][1:] == [RTX.fan_min_pct] * 3
    values = [v for _, v in r["ticks"]]
    for temp, fan, fan0, fan1 in values:
        assert fan == fan0 == fan1
        # the reading is whole degrees, so the curve is known to within half a degree of slope
        slope = (100 - RTX.fan_min_pct) / (RTX.fan_t_high_c - RTX.fan_t_low_c)
        assert abs(fan - fan_curve_pct(RTX, temp)) <= 0.5 * slope + 0.5 + 1e-9
    fans = [v[1] for v in values]
    assert fans == sorted(fans)  # heating: the fan only speeds up
    t_ss = thermal.steady_temp_c(RTX, RTX.power_w(100))  # the fan's own settling point (thermal.equilibrium)
    assert fans[-1] >= round(fan_curve_pct(RTX, t_ss)) - 2 > RTX.fan_min_pct + 40


@pytest.mark.parametrize("name", ["A100-SXM4-80GB", "H100-SXM5-80GB", "H200-SXM-141GB", "L4"])
def test_passive_parts_have_no_fans(sim, name):
    machine = sim.machine(name)
    r = sim.run(
        machine,
        """
        h = H[0]
        out = {}
        for call, fn in [("num", lambda: N.nvmlDeviceGetNumFans(h)), ("speed", lambda: N.nvmlDeviceGetFanSpeed(h)),
                         ("speed_v2", lambda: N.nvmlDeviceGetFanSpeed_v2(h, 0))]:
            try:
                out[call] = fn()
            except N.NVMLError_NotSupported:
                out[call] = "NotSupported"
        out["fields"] = fields(h, [82, 185, 186])
        emit(out)
        """,
    )
    p = PROFILES[name]
    assert r["num"] == r["speed"] == r["speed_v2"] == "NotSupported"
    f = r["fields"]
    # datacenter parts expose it: idle equilibrium, the inlet air warmed by the GPU's own idle power
    assert f["82"] == thermal.MachineThermal([p], 100_000_000).mem_readings_c[0]
    assert f["82"] == round(p.ambient_c + p.mem_r_th_c_per_w * p.idle_w + p.inlet_c_per_w * p.idle_w)
    assert f["186"] == round(p.idle_w * 1000)
    if p.power_usage_is_average:
        assert f["185"] == round(p.idle_w * 1000)
    else:  # GA100: no power average
        assert f["185"] == "err3"
