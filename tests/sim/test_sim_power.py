"""Power: the limit a user sets, clock-event reasons, and what GetPowerUsage averages."""

from __future__ import annotations

import time

from gpuprobe.sim import perf
from gpuprobe.sim.profiles import PROFILES

H100 = PROFILES["H100-SXM5-80GB"]
A100 = PROFILES["A100-SXM4-80GB"]

GPU_IDLE, SW_POWER_CAP = 0x1, 0x4


def test_lower_power_limit_caps_power_and_clocks(sim):
    machine = sim.machine("H100-SXM5-80GB", gpus=2, period_s=0.1)
    machine.set_load(0, 100)
    r = sim.run(
        machine,
        """
        h = H[0]
        wait_ticks(h, 1)
        out = {"before": snapshot(h)[1], "idle": snapshot(H[1])[1],
               "constraints": list(N.nvmlDeviceGetPowerManagementLimitConstraints(h))}
        N.nvmlDeviceSetPowerManagementLimit(h, 400000)
        wait_ticks(h, 1)
        out["after"] = snapshot(h)[1]
        out["fields"] = fields(h, [187, 188, 189, 190])
        errors = []
        for mw in (100000, 199999, 700001, 800000):
            try:
                N.nvmlDeviceSetPowerManagementLimit(h, mw)
                errors.append("accepted")
            except N.NVMLError_InvalidArgument:
                errors.append("InvalidArgument")
        out["errors"] = errors
        wait_ticks(h, 1)
        out["later"] = snapshot(h)[1]
        emit(out)
        """,
    )
    assert r["constraints"] == [200_000, 700_000]
    before, after, later = r["before"], r["after"], r["later"]
    # full load on an H100 wants 760 W: capped at its 700 W default limit
    assert before["power_instant_mw"] == 700_000 and before["limit_mw"] == 700_000
    assert before["reasons"] == SW_POWER_CAP
    # at 400 W the power sits at the limit and the SM clock drops to where the DVFS curve draws 400 W:
    # less than in proportion to the active power, since the voltage falls with the clock
    assert after["limit_mw"] == 400_000
    assert after["power_instant_mw"] == 400_000
    assert after["reasons"] & SW_POWER_CAP
    want_mhz = perf.steady_state(H100, 100, 400).sm_clock_mhz
    linear_mhz = round(H100.sm_clock_max_mhz * (400 - H100.idle_w) / (H100.peak_demand_w - H100.idle_w))
    assert after["sm_mhz"] == want_mhz < before["sm_mhz"]
    assert want_mhz > linear_mhz
    assert before["sm_mhz"] == perf.steady_state(H100, 100).sm_clock_mhz
    assert after["util"] == 100  # still fully busy, just slower
    assert r["fields"] == {"187": 200_000, "188": 700_000, "189": 700_000, "190": 400_000, "ts": r["fields"]["ts"]}
    # values outside the constraints are refused and change nothing
    assert r["errors"] == ["InvalidArgument"] * 4
    assert later["limit_mw"] == 400_000 and later["power_instant_mw"] == 400_000
    # an idle GPU says so, at its idle clock
    idle = r["idle"]
    assert idle["reasons"] == GPU_IDLE
    assert idle["sm_mhz"] == H100.sm_clock_idle_mhz
    assert idle["power_instant_mw"] == round(H100.idle_w * 1000)
    assert idle["limit_mw"] == 700_000  # the limit is per GPU

    # another process sees the new limit and the capped power
    other = sim.run(
        machine,
        """
        emit({"limit": N.nvmlDeviceGetPowerManagementLimit(H[0]), "enforced": N.nvmlDeviceGetEnforcedPowerLimit(H[0]),
              "power": fields(H[0], [186])[186], "limit1": N.nvmlDeviceGetEnforcedPowerLimit(H[1])})
        """,
    )
    assert other == {"limit": 400_000, "enforced": 400_000, "power": 400_000, "limit1": 700_000}


def test_partial_load_is_not_capped(sim):
    machine = sim.machine("H100-SXM5-80GB", period_s=0.05)
    machine.set_load(0, 50)
    s = sim.run(machine, "wait_ticks(H[0], 1); emit(snapshot(H[0])[1])")
    assert s["reasons"] == 0
    assert s["sm_mhz"] == H100.sm_clock_max_mhz
    assert s["power_instant_mw"] == round(H100.power_w(50) * 1000)
    assert s["util"] == 50 and s["mem_util"] == round(50 * H100.mem_util_per_util)


def test_power_usage_is_1s_average_on_h100_and_instant_on_a100(sim):
    """nvml.h: GetPowerUsage is a 1 s average on Ampere (not GA100) and newer, instantaneous on GA100."""
    period_s = 0.1
    # started 2 s ago, so a full second of history is there to average before the step
    machine = sim.machine([H100, A100], period_s=period_s, start_ns=time.time_ns() - 2_000_000_000)
    r = sim.run(
        machine,
        """
        wait_ticks(H[0], 2)
        read = lambda: [[N.nvmlDeviceGetPowerUsage(h), fields(h, [185, 186])] for h in H]
        seen = {}
        t_event = None
        t0 = time.time()
        while time.time() - t0 < 1.8:
            if t_event is None and time.time() - t0 > 0.3:
                t_event = [set_load(0, 100), set_load(1, 100)]
            ts, v = same_tick(H[0], read)
            seen[ts] = v
            time.sleep(0.005)
        emit({"t_event": t_event, "ticks": sorted(seen.items())})
        """,
    )
    config = machine.config()
    t_step_us = config.next_tick_ns(max(r["t_event"])) // 1000
    per_tick = round(1 / period_s)  # ticks in the 1 s average
    n_after = 0
    for ts, ((h_usage, h_fields), (a_usage, a_fields)) in r["ticks"]:
        j = round((ts - t_step_us) / (period_s * 1e6))  # ticks since the step (negative: before it)
        loaded = min(max(j + 1, 0), per_tick)
        h_inst = H100.power_w(100) if j >= 0 else H100.idle_w
        a_inst = A100.power_w(100) if j >= 0 else A100.idle_w
        assert h_fields["186"] == round(h_inst * 1000)
        assert a_fields["186"] == round(a_inst * 1000)
        # H100: mean of the last second of ticks, so it ramps over 1 s after a step
        want = (loaded * H100.power_w(100) + (per_tick - loaded) * H100.idle_w) / per_tick
        assert abs(h_usage - want * 1000) <= 1, (j, h_usage, want)
        assert h_fields["185"] == h_usage
        # A100: the instantaneous value, and no field 185
        assert a_usage == a_fields["186"]
        assert a_fields["185"] == "err3"
        if 0 <= j < per_tick - 1:
            n_after += 1
            assert h_usage < h_fields["186"]
    assert n_after >= 5  # the ramp was observed
