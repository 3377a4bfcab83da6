"""Part: study. The maths of a study report: pure functions over plain data (no InfluxDB here; :mod:`.data` reads it).

A *study* is one fleet probe whose steady phases run a matrix of points (workload x batch size x power
limit) on many nodes at once (docs/studies.md). From the ``probe`` events the steady window of each
(host, GPU, point) is found (:func:`steady_windows`); each window's GPU samples are reduced to power,
energy, temperatures and clocks (:func:`window_stats`); with the trainer's throughput each window becomes
a :class:`Measurement`. :func:`analyze` then groups the measurements (instance type, GPU model, virt,
region, workload, batch size, power limit), and finds per GPU model and workload the time-energy Pareto
frontier, the batch-size scaling curves, the virtualization overhead against bare metal, and the
rankings by samples per joule::

    samples/J        = samples/s ÷ mean W            J/sample = 1 ÷ samples/J
    mean W           = (E(end) - E(start)) ÷ window  (NVML energy counter, interpolated at both ends)
    headroom °C      = slowdown threshold - steady temperature (gpuprobe.model.thermal.headroom_c)
    steady °C        = where the window's temperature was heading (window_steady_c: its step fit)
    cost per 1e6     = price per hour ÷ 3600 ÷ (samples/s per GPU x GPUs of the node in the study) x 1e6
    virt overhead %  = (1 - samples/s per GPU ÷ bare-metal samples/s per GPU) x 100

Figures whose throughput comes from the simulator's performance model (trainer tag ``device=sim``) are
marked ``simulated`` everywhere they are carried.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpuprobe.energy import window_energy
from gpuprobe.model.thermal import headroom_c, window_steady_c
from gpuprobe.wire.vocabulary import marks_a_phase

BARE_METAL = "bare_metal"


# --- events and steady windows -------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """One ``probe`` point of a study (docs/schema.md, ``probe``); study fields None/"" when absent."""

    t_ns: int
    host: str
    kind: str
    phase: str = ""
    status: str = ""
    workload: str = ""
    message: str = ""
    gpu: str = ""
    point: int | None = None
    batch_size: int | None = None
    power_limit: str = ""  # the requested limit's label ("60%", "250W"); "" = left as is
    power_limit_w: float | None = None  # the limit the agent set
    temp_slowdown_c: float | None = None
    steady_samples: int | None = None  # on the event that ends a steady phase: the samples it processed


@dataclass(frozen=True)
class Window:
    """The steady phase of one (host, GPU, point): from its ``steady`` event to the next event of that
    host and GPU; ``closed`` is False when no later event came (the end is then the last trainer report)."""

    host: str
    gpu: str
    point: int
    start_ns: int
    end_ns: int
    closed: bool
    event: Event
    samples: int | None = None  # the trainer's count of the window (its ending event's steady_samples)

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def _ends_window(e: Event, gpu: str) -> bool:
    """Whether event ``e`` ends a steady window of ``gpu``: the next event of the same GPU (not a
    refusal, which is no phase of the GPU), or a node-wide ``end`` (one without a GPU)."""
    return marks_a_phase(e.kind) and (e.gpu == gpu or (e.gpu == "" and e.kind == "end"))


def steady_windows(
    events: Iterable[Event], open_ends: Mapping[tuple[str, str, int], int] | None = None
) -> list[Window]:
    """Every steady window of the events (any hosts, any order). A window that no later event ends is
    closed at ``open_ends[(host, gpu, point)]`` (its last trainer report) when that is after its start,
    and left out otherwise."""
    by_host: dict[str, list[Event]] = {}
    for e in events:
        by_host.setdefault(e.host, []).append(e)
    windows = []
    for host, host_events in sorted(by_host.items()):
        ordered = sorted(host_events, key=lambda e: e.t_ns)
        for i, e in enumerate(ordered):
            if e.kind != "phase_change" or e.phase != "steady" or e.point is None:
                continue
            nxt = next((n for n in ordered[i + 1 :] if n.t_ns >= e.t_ns and _ends_window(n, e.gpu)), None)
            if nxt is not None:
                # the count is the GPU's own trainer's (a node-wide end carries none)
                samples = nxt.steady_samples if nxt.gpu == e.gpu else None
                windows.append(Window(host, e.gpu, e.point, e.t_ns, nxt.t_ns, True, e, samples))
                continue
            end = (open_ends or {}).get((host, e.gpu, e.point))
            if end is not None and end > e.t_ns:
                windows.append(Window(host, e.gpu, e.point, e.t_ns, end, False, e))
    return windows


# --- one window's GPU samples --------------------------------------------------------------------


@dataclass
class WindowStats:
    """One GPU's samples over one window, reduced."""

    duration_s: float
    gpu_samples: int  # samples inside the window
    mean_power_w: float | None
    energy_j: float | None
    energy_source: str  # "counter" (NVML energy counter), "power_w" (mean of the power readings), "none"
    counter_resets: int
    mean_power_reading_w: float | None  # mean of power_w inside (a cross-check of the counter)
    enforced_limit_w: float | None
    peak_temp_c: float | None
    sm_clock_mhz: float | None
    steady_temp_c: float | None = None  # where the temperature was heading (window_steady_c)
    steady_fitted: bool = False  # False: the last quarter's median, a lower bound while it still warmed up


def _mean(values: np.ndarray) -> float | None:
    finite = values[np.isfinite(values)]
    return float(np.mean(finite)) if len(finite) else None


def _max(values: np.ndarray) -> float | None:
    finite = values[np.isfinite(values)]
    return float(np.max(finite)) if len(finite) else None


def window_stats(
    t_ns: np.ndarray,
    start_ns: int,
    end_ns: int,
    *,
    power_w: np.ndarray,
    energy_j: np.ndarray,
    temp_c: np.ndarray,
    power_limit_w: np.ndarray,
    sm_clock_mhz: np.ndarray,
) -> WindowStats:
    """Power, energy, limit, temperature and clock of one GPU over [start, end).

    The arrays are that GPU's samples in time order; they may reach beyond the window (so the energy
    counter can be interpolated exactly at its ends). Mean power is the counter's increase over the
    window ÷ its length (:func:`gpuprobe.energy.window_energy`, the formula ``probe results`` and
    ``gpuprobe model`` use too: a counter reset is bridged with ``power · Δt``); without counter
    readings at both ends it is the mean of the ``power_w`` readings inside the window.
    """
    inside = (t_ns >= start_ns) & (t_ns < end_ns)  # the sample at the end belongs to the next phase
    energy = window_energy(t_ns, energy_j, power_w, start_ns, end_ns)
    steady_c, fitted = window_steady_c(t_ns[inside], temp_c[inside], power_w[inside])
    return WindowStats(
        duration_s=(end_ns - start_ns) / 1e9,
        gpu_samples=int(np.sum(inside)),
        mean_power_w=energy.mean_power_w,
        energy_j=energy.energy_j,
        energy_source=energy.source,
        counter_resets=energy.counter_resets,
        mean_power_reading_w=energy.mean_power_reading_w,
        enforced_limit_w=_mean(power_limit_w[inside]),
        peak_temp_c=_max(temp_c[inside]),
        sm_clock_mhz=_mean(sm_clock_mhz[inside]),
        steady_temp_c=steady_c,
        steady_fitted=fitted,
    )


def mean_inside(t_ns: np.ndarray, values: np.ndarray, start_ns: int, end_ns: int) -> float | None:
    """The mean of the finite values taken within [start, end)."""
    return _mean(values[(t_ns >= start_ns) & (t_ns < end_ns)])


EMPTY_STATS = WindowStats(0.0, 0, None, None, "none", 0, None, None, None, None)


# --- nodes, measurements, refusals ---------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    """A node of the study: its identity tags and how many of its GPUs took part."""

    host: str
    instance_type: str = ""
    region: str = ""
    virt: str = ""
    cloud: str = ""
    cluster: str = ""
    gpus_in_study: int = 0


@dataclass(frozen=True)
class PointSpec:
    """One point of the study matrix (``point`` is its index, 0..N-1)."""

    point: int
    workload: str
    batch_size: int | None
    power_limit: str  # label; "" = left as is


@dataclass
class Measurement:
    """What one GPU achieved at one point, over its steady window (docs/studies.md, "Metrics")."""

    host: str
    gpu: str
    gpu_model: str
    point: int
    workload: str
    batch_size: int | None
    power_limit: str
    instance_type: str
    virt: str
    region: str
    start_ns: int
    end_ns: int
    window_closed: bool
    samples_per_s: float | None  # mean of the trainer's steady reports of this point
    trainer_reports: int
    devices: list[str]  # the trainer's `device` tags: cuda, cpu, sim
    requested_limit_w: float | None  # the limit the agent set (probe event)
    slowdown_c: float | None  # the GPU's slowdown threshold (probe event), None when unknown
    est_dba: float | None  # mean proxy level of the GPU over the window (an estimate)
    stats: WindowStats
    steady_samples: int | None = None  # the trainer's count of the window (None: an older trainer's data)
    simulated: bool = field(init=False)
    samples_per_j: float | None = field(init=False)
    j_per_sample: float | None = field(init=False)
    headroom_c: float | None = field(init=False)
    problems: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.simulated = "sim" in self.devices
        power, energy = self.stats.mean_power_w, self.stats.energy_j
        self.samples_per_j = self.j_per_sample = None
        if self.steady_samples and energy and energy > 0:
            # the window's energy over the trainer's count (as probe results divides them)
            self.samples_per_j = self.steady_samples / energy
            self.j_per_sample = energy / self.steady_samples
        elif self.samples_per_s and power and power > 0:
            self.samples_per_j = self.samples_per_s / power
            self.j_per_sample = power / self.samples_per_s
        self.headroom_c = headroom_c(self.slowdown_c, self.stats.steady_temp_c)
        self.problems = []
        if self.samples_per_s is None:
            self.problems.append("no steady trainer reports of this point")
        if self.stats.gpu_samples == 0:
            self.problems.append("no `gpu` samples in the steady window")
        elif self.stats.mean_power_w is None:
            self.problems.append("no power readings in the steady window")
        if not self.window_closed:
            self.problems.append("no event after the steady phase: the window ends at the last trainer report")

    @property
    def has_data(self) -> bool:
        return self.samples_per_j is not None

    @property
    def key(self) -> GroupKey:
        return GroupKey(
            self.instance_type, self.gpu_model, self.virt, self.region, self.workload, self.batch_size, self.power_limit
        )


@dataclass(frozen=True)
class Refusal:
    """A point a node could not run, with the reason it gave."""

    t_ns: int
    host: str
    gpu: str
    gpu_model: str
    point: int | None
    workload: str
    batch_size: int | None
    power_limit: str
    message: str
    instance_type: str = ""
    virt: str = ""
    region: str = ""

    @property
    def key(self) -> GroupKey:
        return GroupKey(
            self.instance_type, self.gpu_model, self.virt, self.region, self.workload, self.batch_size, self.power_limit
        )


@dataclass(frozen=True)
class Missing:
    """A (host, GPU, point) that gives no figures, and why."""

    host: str
    gpu: str
    point: int | None
    reason: str


# --- groups --------------------------------------------------------------------------------------


def limit_label(power_limit: str) -> str:
    return power_limit or "as is"


def batch_label(batch_size: int | None) -> str:
    return "—" if batch_size is None else str(batch_size)


@dataclass(frozen=True)
class GroupKey:
    """What a group shares: the node's kind, the GPU model and the study point's settings."""

    instance_type: str
    gpu_model: str
    virt: str
    region: str
    workload: str
    batch_size: int | None
    power_limit: str  # label; "" = left as is

    def sort_key(self) -> tuple[Any, ...]:
        return (
            self.gpu_model,
            self.workload,
            self.instance_type,
            self.virt,
            self.region,
            _power_limit_order(self.power_limit),
            -1 if self.batch_size is None else self.batch_size,
        )

    @property
    def configuration(self) -> str:
        """Where it ran: instance type, virtualization, region."""
        return " ".join(p for p in (self.instance_type or "(no instance type)", self.virt, self.region) if p)

    @property
    def point_label(self) -> str:
        return f"batch {batch_label(self.batch_size)}, limit {limit_label(self.power_limit)}"

    def label(self) -> str:
        return f"{self.gpu_model} {self.workload} {self.point_label} on {self.configuration}"

    def matches(self, criteria: Mapping[str, Any]) -> bool:
        return all(getattr(self, name) == value for name, value in criteria.items())


def _power_limit_order(label: str) -> tuple[int, float, str]:
    """As-is first, then percentages and watts by their number (descending: the least limited first)."""
    if not label:
        return (0, 0.0, "")
    text = label.strip().lower()
    for suffix, rank in (("%", 1), ("w", 2)):
        if text.endswith(suffix):
            try:
                return (rank, -float(text[: -len(suffix)]), label)
            except ValueError:
                break
    return (3, 0.0, label)


@dataclass
class Group:
    """The measurements that share a :class:`GroupKey`, summarised (docs/studies.md, "Groups")."""

    key: GroupKey
    points: list[int]
    hosts: list[str]
    gpus: int  # measurements (GPU x point) in the group
    nodes: int
    gpus_with_data: int
    samples_per_s: float | None  # throughput per GPU: mean over the GPUs with throughput
    mean_power_w: float | None  # per GPU: mean over the GPUs with power
    samples_per_j: float | None  # Σ samples/s ÷ Σ mean W over the GPUs with both
    j_per_sample: float | None
    requested_limit_w: float | None
    enforced_limit_w: float | None  # mean of the enforced limit the GPUs reported: what really ran
    peak_temp_c: float | None  # the hottest GPU's peak
    headroom_c: float | None  # the smallest headroom of its GPUs
    est_dba: float | None  # mean of the GPUs' proxy levels (an estimate)
    max_est_dba: float | None
    sm_clock_mhz: float | None
    gpus_per_node: float | None  # mean of its nodes' GPUs in the study
    price_per_hour_usd: float | None
    cost_per_million_samples_usd: float | None
    refusals: int
    simulated: bool  # some throughput of the group is the simulator's performance model
    devices: list[str]
    virt_overhead_pct: float | None = None
    pareto: bool = False  # on its GPU model's and workload's time-energy frontier
    energy_optimal: bool = False
    time_optimal: bool = False


def _fmean(values: Iterable[float | None]) -> float | None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return float(statistics.fmean(finite)) if finite else None


def cost_per_million_samples(
    price_per_hour: float | None, samples_per_s_per_gpu: float | None, gpus_per_node: float | None
) -> float | None:
    """USD per 1e6 samples when a node costs ``price_per_hour`` and runs ``gpus_per_node`` GPUs at
    ``samples_per_s_per_gpu`` each; None when any of them is unknown or the throughput is zero."""
    if price_per_hour is None or not samples_per_s_per_gpu or not gpus_per_node:
        return None
    return price_per_hour / 3600.0 / (samples_per_s_per_gpu * gpus_per_node) * 1e6


def make_groups(
    measurements: Sequence[Measurement],
    refusals: Sequence[Refusal],
    nodes: Mapping[str, Node],
    prices: Mapping[str, float] | None = None,
) -> list[Group]:
    """One :class:`Group` per key, sorted by GPU model, workload, configuration, limit and batch size."""
    members: dict[GroupKey, list[Measurement]] = {}
    for m in measurements:
        members.setdefault(m.key, []).append(m)
    refused: dict[GroupKey, int] = {}
    for r in refusals:
        refused[r.key] = refused.get(r.key, 0) + 1
        members.setdefault(r.key, [])
    groups = []
    for key in sorted(members, key=GroupKey.sort_key):
        ms = members[key]
        hosts = sorted({m.host for m in ms} | {r.host for r in refusals if r.key == key})
        with_rate = [m for m in ms if m.samples_per_s is not None]
        with_power = [m for m in ms if m.stats.mean_power_w is not None]
        both = [m for m in ms if m.samples_per_j is not None]
        spj = None
        if both:
            total_w = sum(m.stats.mean_power_w or 0.0 for m in both)
            spj = sum(m.samples_per_s or 0.0 for m in both) / total_w if total_w > 0 else None
        rate = _fmean(m.samples_per_s for m in with_rate)
        data_hosts = sorted({m.host for m in ms})
        gpus_per_node = _fmean(float(nodes[h].gpus_in_study) for h in data_hosts if h in nodes)
        price = (prices or {}).get(key.instance_type) if key.instance_type else None
        headrooms = [m.headroom_c for m in ms if m.headroom_c is not None]
        peaks = [m.stats.peak_temp_c for m in ms if m.stats.peak_temp_c is not None]
        levels = [m.est_dba for m in ms if m.est_dba is not None]
        groups.append(
            Group(
                key=key,
                points=sorted({m.point for m in ms}),
                hosts=hosts,
                gpus=len(ms),
                nodes=len(data_hosts),
                gpus_with_data=len(both),
                samples_per_s=rate,
                mean_power_w=_fmean(m.stats.mean_power_w for m in with_power),
                samples_per_j=spj,
                j_per_sample=1 / spj if spj else None,
                requested_limit_w=_fmean(m.requested_limit_w for m in ms),
                enforced_limit_w=_fmean(m.stats.enforced_limit_w for m in ms),
                peak_temp_c=max(peaks) if peaks else None,
                headroom_c=min(headrooms) if headrooms else None,
                est_dba=_fmean(levels),
                max_est_dba=max(levels) if levels else None,
                sm_clock_mhz=_fmean(m.stats.sm_clock_mhz for m in ms),
                gpus_per_node=gpus_per_node,
                price_per_hour_usd=price,
                cost_per_million_samples_usd=cost_per_million_samples(price, rate, gpus_per_node),
                refusals=refused.get(key, 0),
                simulated=any(m.simulated for m in with_rate),
                devices=sorted({d for m in ms for d in m.devices}),
            )
        )
    return groups


# --- Pareto frontier, scaling, overhead, rankings --------------------------------------------------


def pareto_front(costs: Sequence[tuple[float, float]]) -> list[int]:
    """The indexes of the points that no other point dominates, both coordinates minimised (a point
    dominates another when it is no worse in both and better in one); equal points are all kept."""
    front = []
    for i, (x, y) in enumerate(costs):
        dominated = any((xo <= x and yo <= y) and (xo < x or yo < y) for j, (xo, yo) in enumerate(costs) if j != i)
        if not dominated:
            front.append(i)
    return front


@dataclass
class FrontierPoint:
    key: GroupKey
    time_per_sample_s: float  # 1 ÷ samples/s per GPU
    energy_per_sample_j: float  # J/sample
    samples_per_s: float
    samples_per_j: float
    on_frontier: bool
    simulated: bool


@dataclass
class Frontier:
    """The time-energy trade-off of one GPU model and workload over all its groups (points)."""

    gpu_model: str
    workload: str
    points: list[FrontierPoint]  # every group with both figures, fastest first
    energy_optimal: GroupKey  # max samples/J
    time_optimal: GroupKey  # max samples/s per GPU
    simulated: bool

    @property
    def frontier(self) -> list[FrontierPoint]:
        return [p for p in self.points if p.on_frontier]


def frontiers(groups: Sequence[Group]) -> list[Frontier]:
    by_model: dict[tuple[str, str], list[Group]] = {}
    for g in groups:
        if g.samples_per_s and g.samples_per_j:
            by_model.setdefault((g.key.gpu_model, g.key.workload), []).append(g)
    out = []
    for (model, workload), gs in sorted(by_model.items()):
        costs = [(1 / (g.samples_per_s or math.inf), 1 / (g.samples_per_j or math.inf)) for g in gs]
        front = set(pareto_front(costs))
        points = [
            FrontierPoint(g.key, c[0], c[1], g.samples_per_s or 0.0, g.samples_per_j or 0.0, i in front, g.simulated)
            for i, (g, c) in enumerate(zip(gs, costs, strict=True))
        ]
        points.sort(key=lambda p: (p.time_per_sample_s, p.energy_per_sample_j))
        energy_best = max(gs, key=lambda g: (g.samples_per_j or 0.0, g.samples_per_s or 0.0))
        time_best = max(gs, key=lambda g: (g.samples_per_s or 0.0, g.samples_per_j or 0.0))
        out.append(Frontier(model, workload, points, energy_best.key, time_best.key, any(p.simulated for p in points)))
    return out


@dataclass
class ScalingPoint:
    batch_size: int | None
    samples_per_s: float
    samples_per_j: float | None
    simulated: bool


@dataclass
class ScalingCurve:
    """Throughput per GPU against batch size, at one power limit, for one GPU model, workload and
    configuration (instance type, virt, region)."""

    gpu_model: str
    workload: str
    power_limit: str
    configuration: str
    points: list[ScalingPoint]  # by batch size

    @property
    def simulated(self) -> bool:
        return any(p.simulated for p in self.points)


def scaling_curves(groups: Sequence[Group]) -> list[ScalingCurve]:
    curves: dict[tuple[str, str, str, str], list[ScalingPoint]] = {}
    order: dict[tuple[str, str, str, str], tuple[Any, ...]] = {}
    for g in groups:
        if g.samples_per_s is None:
            continue
        k = (g.key.gpu_model, g.key.workload, g.key.power_limit, g.key.configuration)
        order.setdefault(
            k, (g.key.gpu_model, g.key.workload, g.key.configuration, _power_limit_order(g.key.power_limit))
        )
        curves.setdefault(k, []).append(ScalingPoint(g.key.batch_size, g.samples_per_s, g.samples_per_j, g.simulated))
    return [
        ScalingCurve(*k, sorted(curves[k], key=lambda p: -1 if p.batch_size is None else p.batch_size))
        for k in sorted(curves, key=lambda k: order[k])
    ]


@dataclass
class Overhead:
    """A virtualized group's throughput against bare metal at the same GPU model, workload and point."""

    key: GroupKey
    samples_per_s: float | None
    bare_metal: list[GroupKey]
    bare_metal_samples_per_s: float | None  # per GPU, over all the bare-metal groups' GPUs
    overhead_pct: float | None  # (1 - virt ÷ bare) x 100; None without a bare-metal group
    simulated: bool
    note: str = ""


def virt_overheads(groups: Sequence[Group]) -> list[Overhead]:
    """One entry per group whose virt is not ``bare_metal`` (sets the groups' ``virt_overhead_pct``)."""
    out = []
    for g in groups:
        if g.key.virt == BARE_METAL:
            continue
        same = (g.key.gpu_model, g.key.workload, g.key.batch_size, g.key.power_limit)
        bare = [
            b
            for b in groups
            if b.key.virt == BARE_METAL
            and (b.key.gpu_model, b.key.workload, b.key.batch_size, b.key.power_limit) == same
            and b.samples_per_s is not None
        ]
        weight = sum(b.gpus for b in bare)
        bare_rate = sum((b.samples_per_s or 0.0) * b.gpus for b in bare) / weight if bare and weight else None
        pct = None
        note = ""
        if not bare:
            note = "no bare_metal group of this GPU model, workload, batch size and power limit"
        elif g.samples_per_s is None:
            note = "no throughput in this group"
        elif bare_rate:
            pct = (1 - g.samples_per_s / bare_rate) * 100
        g.virt_overhead_pct = pct
        out.append(
            Overhead(
                key=g.key,
                samples_per_s=g.samples_per_s,
                bare_metal=[b.key for b in bare],
                bare_metal_samples_per_s=bare_rate,
                overhead_pct=pct,
                simulated=g.simulated or any(b.simulated for b in bare),
                note=note,
            )
        )
    return out


@dataclass
class RankEntry:
    rank: int
    name: str  # the GPU model or the instance type
    samples_per_j: float
    samples_per_s: float | None
    best: GroupKey  # the group (point) where it reached its best samples/J
    simulated: bool


@dataclass
class Ranking:
    """GPU models or instance types of one workload by their best samples/J (best first)."""

    workload: str
    by: str  # "gpu_model" or "instance_type"
    entries: list[RankEntry]


def rankings(groups: Sequence[Group]) -> list[Ranking]:
    out = []
    for workload in sorted({g.key.workload for g in groups}):
        for by in ("gpu_model", "instance_type"):
            best: dict[str, Group] = {}
            for g in groups:
                if g.key.workload != workload or g.samples_per_j is None:
                    continue
                name = getattr(g.key, by) or "(none)"
                if name not in best or (g.samples_per_j, g.samples_per_s or 0) > (
                    best[name].samples_per_j or 0,
                    best[name].samples_per_s or 0,
                ):
                    best[name] = g
            ordered = sorted(best.items(), key=lambda item: (-(item[1].samples_per_j or 0.0), item[0]))
            entries = [
                RankEntry(i + 1, name, g.samples_per_j or 0.0, g.samples_per_s, g.key, g.simulated)
                for i, (name, g) in enumerate(ordered)
            ]
            if entries:
                out.append(Ranking(workload, by, entries))
    return out


# --- the whole report ----------------------------------------------------------------------------


@dataclass
class StudyReport:
    """Every figure of a study report (docs/studies.md); the JSON file is this, as plain JSON."""

    study: str
    database: str
    start_ns: int
    end_ns: int
    points: list[PointSpec]
    nodes: list[Node]
    measurements: list[Measurement]
    groups: list[Group]
    pareto: list[Frontier]
    scaling: list[ScalingCurve]
    virt_overhead: list[Overhead]
    rankings: list[Ranking]
    refusals: list[Refusal]
    missing: list[Missing]
    prices: dict[str, float]
    notes: list[str] = field(default_factory=list)

    @property
    def simulated(self) -> bool:
        """Whether any figure of the report comes from the simulator's performance model."""
        return any(m.simulated for m in self.measurements)

    @property
    def workloads(self) -> list[str]:
        return sorted({p.workload for p in self.points})

    def groups_where(self, **criteria: Any) -> list[Group]:
        """The groups whose key has these values: ``groups_where(gpu_model="…", virt="vgpu")``."""
        return [g for g in self.groups if g.key.matches(criteria)]

    def group(self, **criteria: Any) -> Group:
        """The one group whose key has these values (KeyError when none or several match)."""
        found = self.groups_where(**criteria)
        if len(found) != 1:
            raise KeyError(f"{len(found)} groups match {criteria}")
        return found[0]

    def frontier(self, gpu_model: str, workload: str | None = None) -> Frontier:
        found = [f for f in self.pareto if f.gpu_model == gpu_model and workload in (None, f.workload)]
        if len(found) != 1:
            raise KeyError(f"{len(found)} Pareto frontiers for {gpu_model!r} {workload or ''}")
        return found[0]


def analyze(
    *,
    study: str,
    database: str,
    start_ns: int,
    end_ns: int,
    points: Sequence[PointSpec],
    nodes: Sequence[Node],
    measurements: Sequence[Measurement],
    refusals: Sequence[Refusal],
    missing: Sequence[Missing] = (),
    prices: Mapping[str, float] | None = None,
) -> StudyReport:
    """Groups, frontiers, scaling curves, overheads and rankings from the measurements."""
    node_map = {n.host: n for n in nodes}
    groups = make_groups(measurements, refusals, node_map, prices)
    pareto = frontiers(groups)
    for f in pareto:
        on_front = {p.key for p in f.points if p.on_frontier}
        for g in groups:
            if g.key in on_front:
                g.pareto = True
            if g.key == f.energy_optimal:
                g.energy_optimal = True
            if g.key == f.time_optimal:
                g.time_optimal = True
    overheads = virt_overheads(groups)
    notes = []
    used_types = {g.key.instance_type for g in groups}
    if prices:
        unpriced = sorted(t or "(none)" for t in used_types if t not in prices)
        if unpriced:
            notes.append(f"no price for instance types {', '.join(unpriced)}: their cost is not computed")
        unused = sorted(set(prices) - used_types)
        if unused:
            notes.append(f"prices of instance types not in this study were not used: {', '.join(unused)}")
    if any(m.simulated for m in measurements):
        notes.append(
            "figures marked simulated come from the GPU simulator's performance model (trainer device=sim), "
            "not from a measurement"
        )
    return StudyReport(
        study=study,
        database=database,
        start_ns=start_ns,
        end_ns=end_ns,
        points=sorted(points, key=lambda p: p.point),
        nodes=sorted(nodes, key=lambda n: n.host),
        measurements=sorted(measurements, key=lambda m: (m.host, gpu_order(m.gpu), m.point)),
        groups=groups,
        pareto=pareto,
        scaling=scaling_curves(groups),
        virt_overhead=overheads,
        rankings=rankings(groups),
        refusals=sorted(refusals, key=lambda r: (r.host, gpu_order(r.gpu), -1 if r.point is None else r.point)),
        missing=list(missing),
        prices=dict(prices or {}),
        notes=notes,
    )


def gpu_order(gpu: str) -> tuple[int, str]:
    """GPU indexes in numeric order ("2" before "10"), others after them."""
    return (int(gpu), "") if gpu.isdigit() else (1 << 30, gpu)
