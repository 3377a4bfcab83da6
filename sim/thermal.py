"""Part: sim. The simulator's thermal physics in Python, operation for operation as ``sim/native/nvml_sim.c`` computes
it.

Tests use it to know, exactly, what the C library reports and what a model fit should recover
(docs/simulator.md, "Temperature"). It is the simulator's ground truth: model code (``gpuprobe.model``)
must never import it, or a fit would be checked against itself.

Per GPU, per tick of ``period_ns`` (inputs held over the tick, each stage advanced by its exact solution
``x <- x_ss + (x - x_ss) * exp(-dt / tau)``)::

    fast (die)       dT_fast  -> r_fast_c_per_w * P                 tau_fast_s
    slow (heatsink)  dT_slow  -> (r_th_c_per_w - r_fast_c_per_w) / G * P,   tau_s / G
    inlet (air)      dT_inlet -> inlet_c_per_w * P_node              inlet_tau_s
    T = ambient_c + slot_offset_c + dT_inlet + dT_fast + dT_slow

``P_node`` is the power of every GPU of the machine during the tick; ``G`` the heatsink's conductance
relative to full fan, ``floor + (1 - floor) * fan / 100`` on fan-cooled parts with the fan curve read at
the tick's starting die temperature (before rounding), 1 on passive parts. The memory is
``ambient_c + slot_offset_c + dT_inlet`` plus its own first-order stage (``mem_r_th_c_per_w``,
``mem_tau_s``). The machine starts with every stage in equilibrium at idle.

The slow and memory stages are carried with ``ambient_c`` included and the sums are taken in the C
library's order, so that a machine without the newer parameters (``state.LEGACY_FIRST_ORDER_THERMAL``)
gives the old first-order temperatures bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuprobe.sim.profiles import GpuProfile

FAN_BISECTIONS = 60  # as nvml_sim.c: the idle equilibrium of a fan-cooled part is found by bisection
SLOWDOWN_HYSTERESIS_C = 3  # slowdown switches off below slowdown_c - 3 (begin_tick in nvml_sim.c)


@dataclass(frozen=True)
class GpuThermalState:
    """One GPU's thermal state at the start of a tick (the C library's fields of the same names)."""

    slow_abs_c: float  # ambient_c + dT_slow
    fast_c: float  # dT_fast
    inlet_c: float  # dT_inlet
    mem_abs_c: float  # ambient_c + the memory stage
    temp_c: float  # the die temperature NVML reports, rounded to whole degrees
    mem_temp_c: float  # the memory temperature (field 82), rounded likewise


def reading_c(temp_c: float) -> int:
    """A temperature as NVML reports it: whole degrees, half up (``temp_reading`` in nvml_sim.c)."""
    return 0 if temp_c <= 0 else int(temp_c + 0.5)


def fan_curve_pct(p: GpuProfile, temp_c: float) -> float:
    """The fan curve at a die temperature, before NVML's rounding to whole percent."""
    if temp_c <= p.fan_t_low_c:
        return float(p.fan_min_pct)
    if temp_c >= p.fan_t_high_c:
        return 100.0
    return p.fan_min_pct + (temp_c - p.fan_t_low_c) * (100.0 - p.fan_min_pct) / (p.fan_t_high_c - p.fan_t_low_c)


def fan_pct(p: GpuProfile, temp_c: float) -> int:
    """The fan speed NVML reports at a die temperature (fan-cooled parts only)."""
    return int(fan_curve_pct(p, temp_c) + 0.5)


def fan_conductance(p: GpuProfile, temp_c: float) -> float:
    """The heatsink's conductance relative to the one at full fan, at a die temperature (1 on passive parts)."""
    if not p.fan_count or p.fan_conductance_floor >= 1.0:
        return 1.0
    floor = p.fan_conductance_floor
    return floor + (1.0 - floor) * fan_curve_pct(p, temp_c) / 100.0


def _decay(dt_s: float, tau_s: float) -> float:
    return math.exp(-dt_s / tau_s) if tau_s > 0 else 0.0


def _with_sums(p: GpuProfile, slow_abs_c: float, fast_c: float, inlet_c: float, mem_abs_c: float) -> GpuThermalState:
    # die_temp() and mem_temp() in nvml_sim.c, summed in the same order
    temp_c = slow_abs_c + p.slot_offset_c + inlet_c + fast_c
    mem_temp_c = mem_abs_c + p.slot_offset_c + inlet_c
    return GpuThermalState(slow_abs_c, fast_c, inlet_c, mem_abs_c, temp_c, mem_temp_c)


def _equilibrium_conductance(p: GpuProfile, power_w: float, base_c: float) -> float:
    """The conductance at which the fan curve and the heatsink agree: T = base + Rs / G(T) * P."""
    if not p.fan_count or p.fan_conductance_floor >= 1.0:
        return 1.0
    rs = p.r_th_c_per_w - p.r_fast_c_per_w
    lo = base_c + rs * power_w
    hi = base_c + rs / p.fan_conductance_floor * power_w
    for _ in range(FAN_BISECTIONS):
        mid = 0.5 * (lo + hi)
        if base_c + rs / fan_conductance(p, mid) * power_w > mid:
            lo = mid
        else:
            hi = mid
    return fan_conductance(p, 0.5 * (lo + hi))


def equilibrium(p: GpuProfile, power_w: float, node_power_w: float) -> GpuThermalState:
    """Every stage settled at a constant own power and node power (``thermal_equilibrium`` in nvml_sim.c)."""
    rs = p.r_th_c_per_w - p.r_fast_c_per_w
    fast_c = p.r_fast_c_per_w * power_w
    inlet_c = p.inlet_c_per_w * node_power_w
    cond = _equilibrium_conductance(p, power_w, p.ambient_c + p.slot_offset_c + inlet_c + fast_c)
    return _with_sums(p, p.ambient_c + rs / cond * power_w, fast_c, inlet_c, p.ambient_c + p.mem_r_th_c_per_w * power_w)


def advance(p: GpuProfile, s: GpuThermalState, power_w: float, node_power_w: float, dt_s: float) -> GpuThermalState:
    """The state one tick later, from the tick's own power and node power (``end_tick`` in nvml_sim.c)."""
    cond = fan_conductance(p, s.temp_c)  # the fan as the tick starts
    s_ss = p.ambient_c + (p.r_th_c_per_w - p.r_fast_c_per_w) / cond * power_w
    slow_abs_c = s_ss + (s.slow_abs_c - s_ss) * _decay(dt_s, p.tau_s / cond)
    f_ss = p.r_fast_c_per_w * power_w
    fast_c = f_ss + (s.fast_c - f_ss) * _decay(dt_s, p.tau_fast_s)
    i_ss = p.inlet_c_per_w * node_power_w
    inlet_c = i_ss + (s.inlet_c - i_ss) * _decay(dt_s, p.inlet_tau_s)
    m_ss = p.ambient_c + p.mem_r_th_c_per_w * power_w
    mem_abs_c = m_ss + (s.mem_abs_c - m_ss) * math.exp(-dt_s / p.mem_tau_s)
    return _with_sums(p, slow_abs_c, fast_c, inlet_c, mem_abs_c)


def steady_temp_c(p: GpuProfile, power_w: float, node_power_w: float | None = None) -> float:
    """Steady die temperature at a constant own power, with the machine's GPUs drawing ``node_power_w``
    in all (default: this GPU alone, ``power_w``). On a fan-cooled part the fan settles where the curve
    and the heatsink agree, so this is not linear in the power."""
    return equilibrium(p, power_w, power_w if node_power_w is None else node_power_w).temp_c


def node_power_w(powers_w: Iterable[float]) -> float:
    """The machine's power, summed in GPU order as the C library sums it."""
    total = 0.0
    for w in powers_w:
        total += w
    return total


def idle_power_w(p: GpuProfile) -> float:
    """What a GPU draws at the machine's start (``power_of(g, 0, limit_default, 0)`` in nvml_sim.c)."""
    return p.idle_w if p.idle_w < p.limit_default_w else p.limit_default_w


class MachineThermal:
    """The thermal state of every GPU of one machine, advanced in lockstep, tick by tick, as the C library does.

    ``states[i]`` is GPU i's state at the start of the current tick; :meth:`step` takes every GPU's power
    during that tick and moves to the next."""

    def __init__(self, profiles: Sequence[GpuProfile], period_ns: int) -> None:
        self.profiles = list(profiles)
        self.dt_s = period_ns / 1e9  # as nvml_sim.c: g_period_ns / 1e9
        idle = [idle_power_w(p) for p in self.profiles]
        node = node_power_w(idle)
        self.states = [equilibrium(p, w, node) for p, w in zip(self.profiles, idle, strict=True)]

    @property
    def temps_c(self) -> list[float]:
        return [s.temp_c for s in self.states]

    @property
    def readings_c(self) -> list[int]:
        """Die temperatures as nvmlDeviceGetTemperature reports them."""
        return [reading_c(s.temp_c) for s in self.states]

    @property
    def mem_readings_c(self) -> list[int]:
        return [reading_c(s.mem_temp_c) for s in self.states]

    @property
    def fan_pcts(self) -> list[int | None]:
        """Fan speeds as NVML reports them (None: a passive part, NOT_SUPPORTED)."""
        return [fan_pct(p, s.temp_c) if p.fan_count else None for p, s in zip(self.profiles, self.states, strict=True)]

    def step(self, powers_w: Sequence[float]) -> None:
        if len(powers_w) != len(self.profiles):
            raise ValueError(f"one power per GPU: {len(self.profiles)} GPUs, {len(powers_w)} powers")
        node = node_power_w(powers_w)
        self.states = [
            advance(p, s, w, node, self.dt_s) for p, s, w in zip(self.profiles, self.states, powers_w, strict=True)
        ]


@dataclass(frozen=True)
class TickRecord:
    """What the C library reports for one tick of one machine: per GPU, in GPU order."""

    k: int
    utils_pct: list[int]
    powers_w: list[float]
    slowed: list[bool]
    readings_c: list[int]
    mem_readings_c: list[int]
    fan_pcts: list[int | None]
    temps_c: list[float]


def replay(
    profiles: Sequence[GpuProfile],
    period_ns: int,
    ticks: int,
    utils_at: Iterable[Sequence[float]],
    limits_w: Sequence[float | None] | None = None,
) -> list[TickRecord]:
    """Ticks 0 .. ticks-1 of a machine, with the utilization of every GPU per tick (``utils_at`` yields one
    sequence per tick) and thermal slowdown with its hysteresis, as ``begin_tick`` applies it.

    The power of a tick comes from ``gpuprobe.sim.perf.tick`` (the C library's power law)."""
    from gpuprobe.sim import perf

    machine = MachineThermal(profiles, period_ns)
    slowed = [False] * len(machine.profiles)
    limits = list(limits_w) if limits_w is not None else [None] * len(machine.profiles)
    out: list[TickRecord] = []
    for k, utils in zip(range(ticks), utils_at, strict=False):
        powers: list[float] = []
        whole: list[int] = []
        for i, (p, s) in enumerate(zip(machine.profiles, machine.states, strict=True)):
            if s.temp_c >= p.slowdown_c:
                slowed[i] = True
            elif s.temp_c < p.slowdown_c - SLOWDOWN_HYSTERESIS_C:
                slowed[i] = False
            t = perf.tick(p, utils[i], limits[i], slowed[i])
            powers.append(t.power_w)
            whole.append(t.util_pct)
        out.append(
            TickRecord(
                k,
                whole,
                powers,
                list(slowed),
                machine.readings_c,
                machine.mem_readings_c,
                machine.fan_pcts,
                machine.temps_c,
            )
        )
        machine.step(powers)
    return out


@dataclass(frozen=True)
class ThermalTruth:
    """What a model fit should recover for one GPU at a steady load (the spec's ground truth).

    ``r_th_c_per_w`` and ``tau_s`` describe the GPU's response to its *own* power with the fan where that
    load settles it; the inlet's share (the whole machine's power) is not part of them."""

    r_th_c_per_w: float  # r_fast + (r_th - r_fast) / G at the steady-load fan
    tau_s: float  # the slow stage's tau_s / G at the steady-load fan
    t_amb_c: float  # ambient_c + slot_offset_c: the temperature at zero own and zero node power
    tau_fast_s: float
    r_fast_c_per_w: float
    conductance: float  # G at the steady-load fan (1 on passive parts)
    fan_pct: float | None  # the fan curve's value at steady load, before rounding (None: passive)
    inlet_c: float  # inlet_c_per_w * node power: the machine's share of the steady temperature
    steady_temp_c: float  # the steady die temperature: t_amb_c + inlet_c + r_th_c_per_w * P


def truth_at(p: GpuProfile, power_w: float, node_power_w: float) -> ThermalTruth:
    """The ground truth of one GPU at a constant own power and node power."""
    s = equilibrium(p, power_w, node_power_w)
    cond = fan_conductance(p, s.temp_c)
    return ThermalTruth(
        r_th_c_per_w=p.r_fast_c_per_w + (p.r_th_c_per_w - p.r_fast_c_per_w) / cond,
        tau_s=p.tau_s / cond,
        t_amb_c=p.ambient_c + p.slot_offset_c,
        tau_fast_s=p.tau_fast_s,
        r_fast_c_per_w=p.r_fast_c_per_w,
        conductance=cond,
        fan_pct=fan_curve_pct(p, s.temp_c) if p.fan_count else None,
        inlet_c=s.inlet_c,
        steady_temp_c=s.temp_c,
    )


def ground_truth(profiles: Sequence[GpuProfile], powers_w: Sequence[float]) -> list[ThermalTruth]:
    """Every GPU's ground truth when the machine's GPUs draw ``powers_w`` steadily (one per GPU, in order)."""
    node = node_power_w(powers_w)
    return [truth_at(p, w, node) for p, w in zip(profiles, powers_w, strict=True)]


def first_order(p: GpuProfile) -> GpuProfile:
    """The profile with the newer stages switched off: the first-order RC of a machine from before them."""
    from gpuprobe.sim.state import LEGACY_FIRST_ORDER_THERMAL

    return replace(p, **LEGACY_FIRST_ORDER_THERMAL)  # type: ignore[arg-type]
