"""The driver's sample ring (nvmlDeviceGetSamples) and the PCIe counters."""

from __future__ import annotations

import itertools
import time

from gpuprobe.sim.profiles import PROFILES

A100 = PROFILES["A100-SXM4-80GB"]


def test_get_samples_ring_of_128_ticks(sim):
    period_s = 0.05
    machine = sim.machine("A100-SXM4-80GB", period_s=period_s, start_ns=time.time_ns() - 20 * 10**9)
    machine.set_load(0, 50)
    r = sim.run(
        machine,
        """
        h = H[0]
        wait_ticks(h, 1)
        def take():
            _, power = N.nvmlDeviceGetSamples(h, N.NVML_TOTAL_POWER_SAMPLES, 0)
            _, util = N.nvmlDeviceGetSamples(h, N.NVML_GPU_UTILIZATION_SAMPLES, 0)
            _, sm = N.nvmlDeviceGetSamples(h, N.NVML_PROCESSOR_CLK_SAMPLES, 0)
            return [[[s.timeStamp, s.sampleValue.uiVal] for s in x] for x in (power, util, sm)]
        now, (power, util, sm) = same_tick(h, take)
        def newer(since):
            try:
                return [s.timeStamp for s in N.nvmlDeviceGetSamples(h, N.NVML_TOTAL_POWER_SAMPLES, since)[1]]
            except N.NVMLError_NotFound:
                return "NotFound"
        def since_fifth():
            return newer(power[-5][0])
        out = {"now": now, "power": power, "util": util, "sm": sm}
        out["now2"], out["newer"] = same_tick(h, since_fifth)
        out["none_newer"] = same_tick(h, lambda: newer(tick_us(h)))[1]
        try:
            N.nvmlDeviceGetSamples(h, 7, 0)  # MODULE_POWER: Grace Hopper only
        except N.NVMLError_NotSupported:
            out["module_power"] = "NotSupported"
        emit(out)
        """,
    )
    power, util, sm = r["power"], r["util"], r["sm"]
    assert len(power) == len(util) == len(sm) == 128  # the ring is full after 400 ticks
    stamps = [ts for ts, _ in power]
    assert stamps[-1] == r["now"]  # oldest first, ending with the current tick
    period_us = round(period_s * 1e6)
    assert all(b - a in (period_us - 1, period_us, period_us + 1) for a, b in itertools.pairwise(stamps))
    assert [ts for ts, _ in util] == stamps == [ts for ts, _ in sm]
    # the load (written before the child started) is in the most recent ticks
    assert power[-1][1] == round(A100.power_w(50) * 1000) and util[-1][1] == 50
    assert sm[-1][1] == A100.sm_clock_max_mhz
    assert power[0][1] == round(A100.idle_w * 1000) and util[0][1] == 0
    if r["now2"] == r["now"]:
        assert r["newer"] == stamps[-4:]
    assert r["none_newer"] == "NotFound"
    assert r["module_power"] == "NotSupported"


def test_pcie_throughput_and_byte_counters(sim):
    period_s = 0.1
    machine = sim.machine("A100-SXM4-80GB", period_s=period_s)
    machine.set_load(0, 50)
    r = sim.run(
        machine,
        """
        h = H[0]
        wait_ticks(h, 1)
        read = lambda: [N.nvmlDeviceGetPcieThroughput(h, N.NVML_PCIE_UTIL_TX_BYTES),
                        N.nvmlDeviceGetPcieThroughput(h, N.NVML_PCIE_UTIL_RX_BYTES), fields(h, [197, 198])]
        a = same_tick(h, read)
        wait_ticks(h, 5)
        b = same_tick(h, read)
        emit([a, b])
        """,
    )
    (ts_a, (tx_kb, rx_kb, fa)), (ts_b, (_, _, fb)) = r
    rx_rate = A100.pcie_bytes_per_s_at_full_util * 0.5
    assert rx_kb == int(rx_rate / 1024)
    assert tx_kb == int(rx_rate / 4 / 1024)
    ticks = round((ts_b - ts_a) / (period_s * 1e6))
    assert ticks >= 5
    assert abs((fb["198"] - fa["198"]) - rx_rate * period_s * ticks) <= 1
    assert abs((fb["197"] - fa["197"]) - rx_rate / 4 * period_s * ticks) <= 1
