"""Part: agent. The acoustic proxy: an *estimate* of each GPU's A-weighted noise from what NVML reports.

Every value is stored with ``source=proxy`` so nobody mistakes it for a measurement.

Fan-cooled GPUs (NVML reports a fan duty) use the fan law (``gpuprobe.fanlaw``), sound power grows with
the fifth power of fan speed (cpemma fan laws; Levitronix: +10 % speed ≈ +2 dB)::

    L_fan = L_rated + 50·log10(fan_pct / 100)          L_rated: dBA of the GPU's fans at 100 %

Passively cooled GPUs (no fans of their own, the chassis fans move the air) go through the heat the
chassis must carry away::

    airflow_m3_per_s = P / (rho · c_p · ΔT)             rho = 1.2 kg/m³, c_p = 1005 J/(kg·K),
                                                        ΔT = allowed air temperature rise (K)
    speed_pct        = clamp(100 · airflow / airflow_rated, min_pct, 100)   airflow ∝ fan speed
    L_chassis        = L_chassis_rated + 50·log10(speed_pct / 100)

where ``airflow_rated`` is the chassis airflow available to one GPU at full fan speed and
``L_chassis_rated`` the level of that share of the chassis fans at full speed. Each GPU's estimate
is its source level summed with the room's floor, ``est = 10·log10(10^(L/10) + 10^(L_floor/10))``
(which also keeps a 0 % fan finite); the node level sums every GPU's source once plus the floor
once: ``10·log10(Σ 10^(L_i/10) + 10^(L_floor/10))``.

``tdp_flag`` is the categorical "fan-driven acoustics" flag of Lulla et al. (2025): power above a
configurable fraction ``k`` of the TDP (the GPU's default power limit). The node's flag is true when
any GPU's is.

The default constants are representative, not measured for a particular chassis: calibrate them
against a microphone where one exists (``docs/agent.md``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuprobe.fanlaw import fan_law_dba
from gpuprobe.v1 import common_pb2, telemetry_pb2

AIR_DENSITY_KG_PER_M3 = 1.2
AIR_HEAT_CAPACITY_J_PER_KG_K = 1005.0


@dataclass(frozen=True)
class ProxyParams:
    fan_rated_dba: float = 50.0
    floor_dba: float = 35.0
    tdp_fraction: float = 0.8
    air_rise_c: float = 15.0
    chassis_airflow_m3_per_s: float = 0.05
    chassis_rated_dba: float = 75.0
    chassis_min_pct: float = 30.0


def sum_db(levels: Sequence[float]) -> float:
    """Incoherent sum of sound levels: 10·log10 Σ 10^(L/10); -inf for no sources."""
    total = sum(10 ** (level / 10) for level in levels if level != -math.inf)
    return 10 * math.log10(total) if total > 0 else -math.inf


def chassis_speed_pct(power_w: float, p: ProxyParams) -> float:
    """Chassis fan speed (%) needed to carry ``power_w`` away with an air temperature rise of ``air_rise_c``."""
    airflow = max(power_w, 0.0) / (AIR_DENSITY_KG_PER_M3 * AIR_HEAT_CAPACITY_J_PER_KG_K * p.air_rise_c)
    return min(100.0, max(p.chassis_min_pct, 100.0 * airflow / p.chassis_airflow_m3_per_s))


def passive_dba(power_w: float, p: ProxyParams) -> float:
    return fan_law_dba(chassis_speed_pct(power_w, p), p.chassis_rated_dba)


class AcousticProxy:
    def __init__(self, params: ProxyParams, infos: Sequence[common_pb2.GpuInfo]) -> None:
        self.params = params
        self._tdp_w = {i.index: i.power_limit_default_w for i in infos if i.HasField("power_limit_default_w")}

    def source_dba(self, sample: Mapping[str, Any]) -> float | None:
        """The GPU's own source level, or None when neither fan duty nor power is known."""
        fan = sample.get("fan_pct")
        if fan is not None:
            return fan_law_dba(float(fan), self.params.fan_rated_dba)
        power = sample.get("power_w", sample.get("power_instant_w"))
        if power is not None:
            return passive_dba(float(power), self.params)
        return None

    def tdp_flag(self, sample: Mapping[str, Any]) -> bool | None:
        tdp = self._tdp_w.get(sample["gpu_index"])
        power = sample.get("power_w", sample.get("power_instant_w"))
        if tdp is None or power is None:
            return None
        return bool(power > self.params.tdp_fraction * tdp)

    def estimate(self, gpu_samples: Sequence[Mapping[str, Any]], t_ns: int) -> list[telemetry_pb2.AcousticSample]:
        """One estimate per GPU (at its sample's time) and one for the node (at ``t_ns``)."""
        out: list[telemetry_pb2.AcousticSample] = []
        sources: list[float] = []
        flags: list[bool] = []
        floor = self.params.floor_dba
        for s in gpu_samples:
            level = self.source_dba(s)
            flag = self.tdp_flag(s)
            est = telemetry_pb2.AcousticSample(
                time_unix_ns=s["time_unix_ns"], source=telemetry_pb2.ACOUSTIC_SOURCE_PROXY, gpu_index=s["gpu_index"]
            )
            if level is not None:
                sources.append(level)
                est.est_dba = sum_db([level, floor])
            if flag is not None:
                flags.append(flag)
                est.tdp_flag = flag
            if est.HasField("est_dba") or est.HasField("tdp_flag"):
                out.append(est)
        node = telemetry_pb2.AcousticSample(time_unix_ns=t_ns, source=telemetry_pb2.ACOUSTIC_SOURCE_PROXY)
        node.est_dba = sum_db([*sources, floor])
        if flags:
            node.tdp_flag = any(flags)
        out.append(node)
        return out
