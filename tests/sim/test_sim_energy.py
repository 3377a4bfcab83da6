"""The energy counter is the integral of the power the same GPU reports, tick by tick."""

from __future__ import annotations

import itertools

import pytest

from gpuprobe.sim.profiles import PROFILES

H100 = PROFILES["H100-SXM5-80GB"]
PERIOD_S = 0.1

# The child reads the counter (both ways) at the start of a window, polls field 186 (instant power,
# stamped with its tick's start) through the window while, optionally, changing the load, reads the
# counter again, then fetches the driver's power history (GetSamples TOTAL_POWER) for the window.
WINDOW = """
LOADS = {loads!r}
h = H[0]
wait_ticks(h, 3)
read_counter = lambda: (N.nvmlDeviceGetTotalEnergyConsumption(h), fields(h, [83])[83])
ts_a, (e_a, f_a) = same_tick(h, read_counter)
polled = {{}}
t0 = time.time()
pending = sorted(LOADS.items())
while time.time() - t0 < 2.5:
    f = fields(h, [186])
    polled[f["ts"]] = f[186]
    if pending and time.time() - t0 >= pending[0][0]:
        set_load(0, pending.pop(0)[1])
    time.sleep(0.004)
ts_b, (e_b, f_b) = same_tick(h, read_counter)
_, samples = N.nvmlDeviceGetSamples(h, N.NVML_TOTAL_POWER_SAMPLES, 0)
emit({{"ts_a": ts_a, "e_a": e_a, "f_a": f_a, "ts_b": ts_b, "e_b": e_b, "f_b": f_b,
      "polled": sorted(polled.items()),
      "samples": [[s.timeStamp, s.sampleValue.uiVal] for s in samples]}})
"""


@pytest.mark.parametrize(
    "loads",
    [
        pytest.param({}, id="constant-load"),
        pytest.param({0.3: 20, 0.7: 100, 1.1: 0, 1.5: 55, 1.9: 0}, id="changing-load"),
    ],
)
def test_energy_counter_grows_by_integral_of_power(sim, loads):
    machine = sim.machine("H100-SXM5-80GB", period_s=PERIOD_S)
    machine.set_load(0, 70)
    r = sim.run(machine, WINDOW.format(loads=loads))
    period_us = round(PERIOD_S * 1e6)

    # both ways of reading the counter agree
    assert r["e_a"] == r["f_a"]
    assert r["e_b"] == r["f_b"]

    # the driver's history holds every tick of the window, one period apart
    history = {ts: mw for ts, mw in r["samples"]}
    window = sorted(ts for ts in history if r["ts_a"] <= ts < r["ts_b"])
    n_ticks = round((r["ts_b"] - r["ts_a"]) / period_us)
    assert len(window) == n_ticks >= 20
    assert all(b - a in (period_us - 1, period_us, period_us + 1) for a, b in itertools.pairwise(window))
    # what the test itself polled agrees with that history
    assert len(r["polled"]) >= n_ticks // 2
    for ts, mw in r["polled"]:
        if ts in history:
            assert history[ts] == mw

    # E(t_b) - E(t_a) = sum over the ticks in [t_a, t_b) of P_k * period
    integral_mj = sum(history[ts] * PERIOD_S for ts in window)  # mW * s = mJ
    delta_mj = r["e_b"] - r["e_a"]
    assert delta_mj == pytest.approx(integral_mj, rel=0.005)
    powers = [history[ts] for ts in window]
    if loads:
        assert len(set(powers)) >= 4, powers
        # the tolerance is tight enough to tell a counter that lags or leads by one tick
        ticks = sorted(history)
        i, j = ticks.index(window[0]), ticks.index(window[-1])
        for shift in (-1, 1):
            shifted_mj = sum(history[ts] * PERIOD_S for ts in ticks[i + shift : j + 1 + shift])
            assert abs(shifted_mj - delta_mj) > 0.005 * delta_mj
    else:
        assert set(powers) == {round(H100.power_w(70) * 1000)}
        assert delta_mj == pytest.approx(H100.power_w(70) * 1000 * PERIOD_S * n_ticks, rel=0.005)
