"""Test scaffolding, not the product: reads one simulated machine through pynvml at 10 Hz and writes
what it reads as InfluxDB line protocol in the storage schema (docs/schema.md; ``gpu``, ``node``,
``acoustic`` with ``source=proxy``, ``agent``), one file per machine.

The real path is agent -> collector -> InfluxDB; this stands in for both so that the model tests
depend on neither. Run inside the simulated machine's environment (``SimMachine.environ()``)::

    python sim_reader.py HOST OUT_FILE READY_FILE

It samples until SIGTERM, then flushes and exits 0. ``READY_FILE`` is created after the first round
of readings, so the caller knows the GPUs are being read before it starts the probe.

Each round is due in the middle of one of the simulator's update periods (its ticks, ``sim.conf``): a
reading is then of the tick its timestamp is in even when the round starts up to half a period late,
as it does on a busy machine. Rounds due near a tick boundary would read the tick before or after at
random under load, a timing error of up to one period that moved the ARX fit's tau by over 5 %
(tests/model/test_model_fits.py failed so beside another pytest worker, never alone).
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from pathlib import Path

import pynvml

from gpuprobe.influx.lineprotocol import escape_tag_value
from gpuprobe.sim import state

INTERVAL_S = 0.1
FIELD_POWER_INSTANT = 186
# the proxy: fan law for GPUs with fans, chassis airflow for passive ones (docs/models.md cites both);
# the constants are this scaffolding's own, any monotonic proxy would do for the tests
FLOOR_DBA = 35.0
FAN_RATED_DBA = 50.0
CHASSIS_RATED_DBA = 75.0
CHASSIS_AIRFLOW_M3_PER_S = 0.05
AIR_RISE_C = 15.0


def source_dba(power_w: float, fan_pct: float | None) -> float:
    if fan_pct is not None:
        return FAN_RATED_DBA + 50 * math.log10(max(fan_pct, 1.0) / 100)
    airflow = power_w / (1.2 * 1005.0 * AIR_RISE_C)
    speed = min(100.0, max(30.0, 100.0 * airflow / CHASSIS_AIRFLOW_M3_PER_S))
    return CHASSIS_RATED_DBA + 50 * math.log10(speed / 100)


def sum_db(levels: list[float]) -> float:
    return 10 * math.log10(sum(10 ** (x / 10) for x in levels))


def main() -> int:
    host, out_path, ready_path = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    stop = False

    def on_term(_signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    prefixes: list[str] = []
    has_fans: list[bool] = []
    for i, h in enumerate(handles):
        name = pynvml.nvmlDeviceGetName(h)
        uuid = pynvml.nvmlDeviceGetUUID(h)
        prefixes.append(f"gpu,cluster=test,gpu={i},host={host},model={escape_tag_value(name)},uuid={uuid} ")
        try:
            pynvml.nvmlDeviceGetFanSpeed(h)
            has_fan = True
        except pynvml.NVMLError:
            has_fan = False
        has_fans.append(has_fan)
    out = out_path.open("w")
    ticks = state.load(Path(os.environ[state.STATE_DIR_ENV]))
    # the first round in the middle of the next tick, then every INTERVAL_S (one tick) from there
    first_ns = ticks.next_tick_ns(time.time_ns()) + ticks.period_ns // 2
    time.sleep(max(0.0, (first_ns - time.time_ns()) / 1e9))
    n = 0
    while not stop:
        lines: list[str] = []
        sources: list[float] = []
        t_node = time.time_ns()
        for i, h in enumerate(handles):
            prefix, has_fan = prefixes[i], has_fans[i]
            t_ns = time.time_ns()
            util = pynvml.nvmlDeviceGetUtilizationRates(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            power_w = pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0
            energy, instant = pynvml.nvmlDeviceGetFieldValues(
                h, [pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, FIELD_POWER_INSTANT]
            )
            temp = pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
            fields = [
                f"util_pct={float(util.gpu)!r}",
                f"mem_util_pct={float(util.memory)!r}",
                f"mem_used_bytes={mem.used}i",
                f"mem_total_bytes={mem.total}i",
                f"power_w={power_w!r}",
                f"power_instant_w={instant.value.uiVal / 1000.0!r}",
                f"energy_j={energy.value.ullVal / 1000.0!r}",
                f"temp_c={float(temp)!r}",
            ]
            try:
                (mem_temp,) = pynvml.nvmlDeviceGetFieldValues(h, [82])
                if mem_temp.nvmlReturn == 0:
                    fields.append(f"mem_temp_c={float(mem_temp.value.uiVal)!r}")
            except pynvml.NVMLError:
                pass
            fan: float | None = None
            if has_fan:
                fan = float(pynvml.nvmlDeviceGetFanSpeed(h))
                fields.append(f"fan_pct={fan!r}")
            fields += [
                f"sm_clock_mhz={pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)}i",
                f"mem_clock_mhz={pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)}i",
                f"power_limit_w={pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0!r}",
                f"clock_event_reasons={pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)}i",
                f"pcie_tx_bytes_per_s={pynvml.nvmlDeviceGetPcieThroughput(h, 0) * 1024.0!r}",
                f"pcie_rx_bytes_per_s={pynvml.nvmlDeviceGetPcieThroughput(h, 1) * 1024.0!r}",
            ]
            lines.append(prefix + ",".join(fields) + f" {t_ns}")
            level = source_dba(power_w, fan)
            sources.append(level)
            flag = "true" if power_w > 0.8 * pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0 else "false"
            lines.append(
                f"acoustic,cluster=test,gpu={i},host={host},source=proxy "
                f"est_dba={sum_db([level, FLOOR_DBA])!r},tdp_flag={flag} {t_ns}"
            )
        lines.append(
            f"acoustic,cluster=test,host={host},source=proxy est_dba={sum_db([*sources, FLOOR_DBA])!r} {t_node}"
        )
        if n % 10 == 0:
            load1 = os.getloadavg()[0]
            lines.append(
                f"node,cluster=test,host={host} cpu_pct={min(100.0, 100.0 * load1 / (os.cpu_count() or 1))!r},"
                f"mem_used_bytes={8 << 30}i,mem_total_bytes={64 << 30}i,load1={load1!r},hwmon_cpu_c=45.0 {t_node}"
            )
            lines.append(
                f"agent,cluster=test,host={host} dropped_samples=0i,dropped_batches=0i,read_errors=0i,"
                f"missed_ticks=0i,spool_bytes={4096 * (n // 10)}i {t_node}"
            )
        out.write("\n".join(lines) + "\n")
        if n == 0:
            out.flush()
            ready_path.touch()
        n += 1
        time.sleep(max(0.0, (first_ns + round(n * INTERVAL_S * 1e9) - time.time_ns()) / 1e9))  # drift-free schedule
    out.close()
    pynvml.nvmlShutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
