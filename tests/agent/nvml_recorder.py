"""Reference reader for the agent's delivery test: what NVML returned, tick by tick, for every GPU.

Run inside the simulated machine's environment (``SimMachine.environ()``), in its own process::

    python tests/agent/nvml_recorder.py OUT.json

It polls every GPU about every 20 ms through the official pynvml (its ordinary wrappers, not the
agent's code) and keeps, per GPU, one snapshot of every driver update period ("tick") it saw: a
snapshot is kept only when the tick's timestamp (field 186's, the tick start in µs) is the same
before and after the reads, so every value in it belongs to that one tick. Values the GPU does not
support are left out. On SIGTERM it writes ``{gpu index: {tick start µs: {field: value}}}``.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from typing import Any

import pynvml as N


def snapshot(h: Any, fans: int) -> dict[str, Any]:
    def fields(ids: list[int]) -> dict[int, Any]:
        out: dict[int, Any] = {}
        for f in N.nvmlDeviceGetFieldValues(h, ids):
            if f.nvmlReturn == 0:
                out[int(f.fieldId)] = {0: f.value.dVal, 1: f.value.uiVal, 3: f.value.ullVal, 5: f.value.siVal}[
                    f.valueType
                ]
        return out

    f = fields([82, 83, 186, 190])
    u = N.nvmlDeviceGetUtilizationRates(h)
    m = N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)
    s: dict[str, Any] = {
        "util_pct": u.gpu,
        "mem_util_pct": u.memory,
        "mem_used_bytes": m.used,
        "mem_total_bytes": m.total,
        "power_w": N.nvmlDeviceGetPowerUsage(h) / 1000,
        "power_instant_w": f[186] / 1000,
        "energy_j": f[83] / 1000,
        "temp_c": N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU),
        "sm_clock_mhz": N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_SM),
        "mem_clock_mhz": N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_MEM),
        "power_limit_w": f[190] / 1000,
        "clock_event_reasons": N.nvmlDeviceGetCurrentClocksEventReasons(h),
        "pcie_tx_bytes_per_s": N.nvmlDeviceGetPcieThroughput(h, N.NVML_PCIE_UTIL_TX_BYTES) * 1024,
        "pcie_rx_bytes_per_s": N.nvmlDeviceGetPcieThroughput(h, N.NVML_PCIE_UTIL_RX_BYTES) * 1024,
    }
    if 82 in f:
        s["mem_temp_c"] = f[82]
    if fans:
        s["fan_pct"] = sum(N.nvmlDeviceGetFanSpeed_v2(h, i) for i in range(fans)) / fans
    return s


def tick_us(h: Any) -> int:
    return int(N.nvmlDeviceGetFieldValues(h, [186])[0].timestamp)


def main() -> int:
    out_path = sys.argv[1]
    N.nvmlInit()
    handles = [N.nvmlDeviceGetHandleByIndex(i) for i in range(N.nvmlDeviceGetCount())]
    fans = []
    for h in handles:
        try:
            fans.append(N.nvmlDeviceGetNumFans(h))
        except N.NVMLError:
            fans.append(0)
    ticks: dict[int, dict[int, dict[str, Any]]] = {i: {} for i in range(len(handles))}
    stop = False

    def on_term(_sig: int, _frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    print("RECORDING", flush=True)
    while not stop:
        for i, h in enumerate(handles):
            try:
                before = tick_us(h)
                if before in ticks[i]:
                    continue
                snap = snapshot(h, fans[i])
                if tick_us(h) == before:
                    ticks[i][before] = snap
            except N.NVMLError:
                continue
        time.sleep(0.02)
    with open(out_path, "w") as f:
        json.dump({str(i): {str(k): v for k, v in t.items()} for i, t in ticks.items()}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
