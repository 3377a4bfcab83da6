"""Part: agent. Host sensor: the ``node`` measurement (CPU, memory, load, hwmon temperatures), read once per second.

CPU, memory and load come from psutil. hwmon temperatures are read from sysfs directly, the way
``psutil.sensors_temperatures`` does, but with the list of sensor files discovered once at start (a
node's chips do not change while it runs) so that each read is one small file read per sensor.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

import psutil

from gpuprobe.v1 import telemetry_pb2

log = logging.getLogger(__name__)

HWMON_ROOT = Path("/sys/class/hwmon")


def sensor_name(chip: str, label: str) -> str:
    """``<chip>_<label>`` in lower case with characters outside ``[a-z0-9_]`` replaced by ``_`` (wire contract)."""
    return re.sub(r"[^a-z0-9_]", "_", f"{chip}_{label}".lower())


@dataclass(frozen=True)
class HwmonSensor:
    name: str
    path: Path  # a temp*_input file, millidegrees Celsius


def discover_hwmon(root: Path = HWMON_ROOT) -> list[HwmonSensor]:
    """Every ``temp*_input`` under ``root``/hwmon*, named ``<chip>_<label>`` (``temp<N>`` when unlabelled)."""
    found: list[HwmonSensor] = []
    seen: set[str] = set()
    try:
        chips = sorted(root.iterdir())
    except OSError:
        return found
    for chip_dir in chips:
        try:
            chip = (chip_dir / "name").read_text().strip() or chip_dir.name
        except OSError:
            chip = chip_dir.name
        inputs = sorted(chip_dir.glob("temp*_input"), key=lambda p: int(re.sub(r"\D", "", p.name) or 0))
        for path in inputs:
            stem = path.name[: -len("_input")]
            try:
                label = (chip_dir / f"{stem}_label").read_text().strip() or stem
            except OSError:
                label = stem
            name = sensor_name(chip, label)
            unique, n = name, 2
            while unique in seen:
                unique, n = f"{name}_{n}", n + 1
            seen.add(unique)
            found.append(HwmonSensor(unique, path))
    return found


class HostSensor:
    def __init__(self, hwmon_root: Path = HWMON_ROOT) -> None:
        psutil.cpu_percent(interval=None)  # the first call only starts the interval
        self._hwmon = discover_hwmon(hwmon_root)
        if self._hwmon:
            log.info("hwmon temperatures: %s", ", ".join(s.name for s in self._hwmon))

    @property
    def hwmon_names(self) -> list[str]:
        return [s.name for s in self._hwmon]

    def read(self, t_ns: int) -> telemetry_pb2.NodeSample:
        sample = telemetry_pb2.NodeSample(time_unix_ns=t_ns, cpu_pct=psutil.cpu_percent(interval=None))
        memory = psutil.virtual_memory()
        sample.mem_total_bytes = memory.total
        sample.mem_used_bytes = memory.total - memory.available
        sample.load1 = os.getloadavg()[0]
        temps = sample.hwmon_temp_c
        for sensor in self._hwmon:
            try:
                with open(sensor.path, "rb") as f:
                    temps[sensor.name] = int(f.read()) / 1000.0
            except (OSError, ValueError):
                continue  # a sensor that fails to read is left out (wire contract)
        return sample
