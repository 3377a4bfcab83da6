"""Part: model. From a :class:`~gpuprobe.model.data.Dataset` to every fitted and derived number (:class:`Results`).

Per GPU: the thermal fits (:mod:`.thermal`), the predicted steady temperature at the power limit and
the headroom to the slowdown threshold, time throttled, the proxy level (:mod:`.acoustic`) and the
efficiency (:mod:`.efficiency`). Per node: the GPUs' fits summarised, the node's proxy level, the
microphone calibration where there is a microphone, and the node's efficiency. Per fleet: totals,
carbon and cost, and the GPUs that stand out from the others of their model.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gpuprobe.influx.settings import InfluxSettings
from gpuprobe.model.acoustic import Calibration, LevelStats, calibrate, level_stats, pair_levels
from gpuprobe.model.data import EDGE_MARGIN_NS, Dataset, GpuSeries
from gpuprobe.model.efficiency import J_PER_KWH, GpuEfficiency, gpu_efficiency, mask_of
from gpuprobe.model.thermal import (
    AVERAGE_DELAY_S,
    DEFAULT_SLOWDOWN_C,
    POWER_REASONS,
    THERMAL_REASONS,
    ThermalFit,
    ThermalInput,
    detect_steps,
    fit_thermal_node,
    headroom_c,
    slowdown_for,
    throttled_seconds,
)

#: what hears a run's stages as they start (the CLI prints them, see gpuprobe.model.cli)
Progress = Callable[[str], None]

#: the note of a window whose throughput is simulated (the report shows it first, above every figure)
SIMULATED_NOTE = (
    "SIMULATED throughput: samples/s (and so J/sample and samples/J) come from simulated GPUs, the "
    "simulator's performance model (trainer device=sim), not a measurement"
)

MIN_FLEET = 3  # GPUs of one model needed before one of them can stand out


@dataclass(frozen=True)
class ModelSettings:
    """Everything one model run needs; the CLI builds it from its options, the demo directly."""

    influx: InfluxSettings = field(default_factory=InfluxSettings)
    probe: str | None = None
    start_ns: int | None = None
    end_ns: int | None = None
    hosts: tuple[str, ...] = ()
    out_dir: Path = Path("gpuprobe-report")
    pue: float = 1.0
    grid_kg_per_kwh: float = 0.4
    price_per_gpu_hour: float | None = None
    outlier_r_th_pct: float = 15.0
    outlier_dba: float = 3.0
    outlier_samples_per_j_pct: float = 10.0
    arx_resample_s: float = 1.0
    holdout: float = 0.3  # the last fraction of the window the thermal models are scored on
    slowdown_c: float | None = None
    mic_window_s: float = 1.0
    write_model: bool = True


@dataclass
class GpuResult:
    host: str
    gpu: str
    model: str
    uuid: str
    samples: int
    thermal: ThermalFit
    power_limit_w: float | None
    slowdown_c: float
    slowdown_source: str
    t_pred_at_limit_c: float | None  # own R at the limit, plus the inlet's rise with the node at its limits
    headroom_c: float | None
    temp_max_c: float | None
    thermal_throttled_s: float
    power_capped_s: float
    acoustic: LevelStats | None
    efficiency: GpuEfficiency
    flags: list[str] = field(default_factory=list)


@dataclass
class NodeResult:
    host: str
    gpus: int
    r_th_mean_c_per_w: float | None
    tau_mean_s: float | None
    t_amb_mean_c: float | None
    t_pred_at_limit_max_c: float | None
    headroom_min_c: float | None
    thermal_throttled_s: float
    power_capped_s: float
    acoustic: LevelStats | None
    acoustic_source: str
    mic: LevelStats | None
    calibration: Calibration | None
    samples_per_s: float | None
    mean_power_w: float | None
    steady_energy_j: float | None
    samples_per_j: float | None
    j_per_sample: float | None
    idle_power_w: float | None
    probe_energy_j: float


@dataclass
class Outlier:
    host: str
    gpu: str
    model: str
    kind: str  # "hotter", "louder", "less efficient"
    value: float
    fleet_median: float
    threshold: str
    unit: str
    text: str


@dataclass
class FleetTotals:
    gpus: int
    nodes: int
    duration_s: float
    probe_energy_j: float
    pue: float
    kwh: float
    grid_kg_per_kwh: float
    kg_co2e: float
    gpu_hours: float
    price_per_gpu_hour: float | None
    cost: float | None
    samples_per_j: float | None


@dataclass
class Results:
    label: str
    probe: str | None
    workload: str | None
    status: str | None
    start_ns: int
    end_ns: int
    phases: dict[str, list[dict[str, object]]]
    gpus: list[GpuResult]
    nodes: list[NodeResult]
    fleet: FleetTotals
    outliers: list[Outlier]
    thresholds: dict[str, float]
    notes: list[str] = field(default_factory=list)


def _median_finite(values: Sequence[float | None]) -> float | None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return float(statistics.median(finite)) if finite else None


def _mean_finite(values: Sequence[float | None]) -> float | None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return float(statistics.fmean(finite)) if finite else None


def _load_window(g: GpuSeries, power: np.ndarray) -> list[tuple[int, int]]:
    """Without probe phases: the loaded run found in the power series stands in for the steady phase."""
    ok = np.isfinite(power)
    t = g.t_ns[ok]
    if len(t) < 20:
        return []
    heating, _, _, _ = detect_steps((t - t[0]) / 1e9, power[ok])
    if heating is None:
        return []
    return [(int(t[heating[0]]), int(t[heating[1] - 1]))]


def _node_limit_w(ds: Dataset, host: str, fallback_w: float) -> float:
    """The sum of the power limits of the host's GPUs (a GPU without one counts ``fallback_w``)."""
    total = 0.0
    for g in ds.gpus:
        if g.host == host:
            limits = g.field("power_limit_w")
            total += float(np.nanmedian(limits)) if np.any(np.isfinite(limits)) else fallback_w
    return total


def _intervals_where(t_ns: np.ndarray, mask: np.ndarray) -> list[tuple[int, int]]:
    """The runs of samples where ``mask`` holds, each as [first sample, next sample)."""
    out = []
    start = None
    for i, flag in enumerate(mask):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            out.append((int(t_ns[start]), int(t_ns[i])))
            start = None
    if start is not None and len(t_ns) - start >= 2:
        out.append((int(t_ns[start]), int(t_ns[-1])))
    return out


def _thermal_input(ds: Dataset, wide: GpuSeries, s: ModelSettings) -> ThermalInput:
    """One GPU's series over the window for the node's thermal fit (the node's power where it has two GPUs
    or more: the inlet stage they share is fitted jointly, :func:`fit_thermal_node`)."""
    w = ds.window
    # A trainer slow to get ready (importing torch on a busy machine) has a shorter idle baseline, none
    # when it is later than the baseline: then the probe's first event is the load step itself, and a fit
    # of that window starts every stage in equilibrium at the loaded power (held-out error 10 °C on the
    # demo's node). The margin before a probe, read anyway (data.load), holds the GPU as it was before
    # the trainer started, at rest; a time range (--from/--to) is fitted as the user drew it.
    lead_ns = EDGE_MARGIN_NS if w.probe is not None else 0
    g = wide.inside(w.start_ns - lead_ns, w.end_ns)
    if len(g.t_ns) == 0:
        g = wide
    power, is_average = g.power()
    reasons_f = g.field("clock_event_reasons")
    reasons = np.where(np.isfinite(reasons_f), reasons_f, 0).astype(np.int64)
    steady = w.intervals(g.host, "steady") or _load_window(g, power)
    node_w, node_gpus = ds.node_power(g.host, g.t_ns, AVERAGE_DELAY_S)
    return ThermalInput(
        g.t_ns,
        g.field("temp_c"),
        power,
        reasons if g.has("clock_event_reasons") else None,
        is_average,
        resample_s=s.arx_resample_s,
        node_w=node_w if node_gpus >= 2 else None,
        fan_pct=g.field("fan_pct") if g.has("fan_pct") else None,
        steady_mask=mask_of(g.t_ns, steady) if steady else None,
        mem_temp_c=g.field("mem_temp_c") if g.has("mem_temp_c") else None,
    )


def _thermal_fits(ds: Dataset, s: ModelSettings, progress: Progress | None = None) -> list[ThermalFit]:
    """Every GPU's thermal fits, node by node (in the order of ``ds.gpus``); ``progress`` hears each
    node's stages (the fits are what takes long: seconds to minutes per node)."""
    fits: list[ThermalFit | None] = [None] * len(ds.gpus)
    hosts = sorted({g.host for g in ds.gpus})
    for number, host in enumerate(hosts, 1):
        index = [i for i, g in enumerate(ds.gpus) if g.host == host]

        def say(message: str, host: str = host, number: int = number) -> None:
            if progress is not None:
                progress(f"fitting node {number} of {len(hosts)}, {host}: {message}")

        node = fit_thermal_node(
            [_thermal_input(ds, ds.gpus[i], s) for i in index],
            holdout=s.holdout,
            progress=say,
            names=[ds.gpus[i].gpu for i in index],
        )
        for i, fit in zip(index, node, strict=True):
            fits[i] = fit
    return [f if f is not None else ThermalFit() for f in fits]


def _analyze_gpu(ds: Dataset, wide: GpuSeries, s: ModelSettings, fit: ThermalFit) -> GpuResult:
    w = ds.window
    g = wide.inside(w.start_ns, w.end_ns)  # the energy counter also reads the margins (data.load)
    if len(g.t_ns) == 0:
        g = wide
    power, _ = g.power()
    reasons_f = g.field("clock_event_reasons")
    reasons = np.where(np.isfinite(reasons_f), reasons_f, 0).astype(np.int64)
    # the GPU's own trainer's steady phases (as probe results and study report take them)
    steady = w.gpu_intervals(g.host, g.gpu, "steady") or _load_window(g, power)
    idle = w.intervals(g.host, "idle")
    if not idle and g.has("util_pct"):
        idle = _intervals_where(g.t_ns, g.field("util_pct") == 0)
    limits = g.field("power_limit_w")
    limit = float(np.nanmedian(limits)) if np.any(np.isfinite(limits)) else None
    slowdown, source = slowdown_for(s.slowdown_c, ds.reported_slowdown_c(g.host, g.gpu, g.uuid))
    predicted = fit.rc.steady_c(limit) if fit.rc is not None and limit is not None else None
    if predicted is not None and limit is not None and fit.inlet is not None:
        # the node's air at a sustained load with every GPU of the node at its own power limit
        predicted += fit.inlet.c_per_w * _node_limit_w(ds, g.host, limit)
    temps = g.field("temp_c")
    rates = []
    for tr in ds.trainer:
        if tr.host == g.host and tr.gpu == g.gpu:
            inside = mask_of(tr.t_ns, steady) & np.isfinite(tr.samples_per_s)
            rates.extend(tr.samples_per_s[inside].tolist())
    wide_power, _ = wide.power()
    eff = gpu_efficiency(
        wide.t_ns,
        wide_power,
        np.fmax(wide_power, wide.field("power_w")),
        wide.field("energy_j"),
        window=(w.start_ns, w.end_ns),
        steady=steady,
        idle=idle,
        samples_per_s=float(np.mean(rates)) if rates else None,
        steady_samples=w.steady_samples.get((g.host, g.gpu)),
        pue=s.pue,
        grid_kg_per_kwh=s.grid_kg_per_kwh,
        price_per_gpu_hour=s.price_per_gpu_hour,
    )
    proxy = next((a for a in ds.acoustic if a.host == g.host and a.gpu == g.gpu and a.source == "proxy"), None)
    return GpuResult(
        host=g.host,
        gpu=g.gpu,
        model=g.model,
        uuid=g.uuid,
        samples=len(g.t_ns),
        thermal=fit,
        power_limit_w=limit,
        slowdown_c=slowdown,
        slowdown_source=source,
        t_pred_at_limit_c=predicted,
        headroom_c=headroom_c(slowdown, predicted),
        temp_max_c=float(np.nanmax(temps)) if np.any(np.isfinite(temps)) else None,
        thermal_throttled_s=throttled_seconds(g.t_ns, reasons, THERMAL_REASONS),
        power_capped_s=throttled_seconds(g.t_ns, reasons, POWER_REASONS),
        acoustic=level_stats(proxy.t_ns, proxy.est_dba, idle, steady) if proxy is not None else None,
        efficiency=eff,
    )


def _sum(values: Sequence[float | None]) -> float | None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return float(sum(finite)) if finite and len(finite) == len(values) else None


def _analyze_node(ds: Dataset, host: str, gpus: list[GpuResult], s: ModelSettings) -> NodeResult:
    w = ds.window
    steady = w.intervals(host, "steady")
    idle = w.intervals(host, "idle")
    rcs = [g.thermal.rc for g in gpus if g.thermal.rc is not None]
    node_proxy = next((a for a in ds.acoustic if a.host == host and a.gpu == "" and a.source == "proxy"), None)
    acoustic = None
    acoustic_source = "none"
    if node_proxy is not None:
        acoustic = level_stats(node_proxy.t_ns, node_proxy.est_dba, idle, steady)
        acoustic_source = "node proxy series"
    elif any(g.acoustic is not None for g in gpus):
        levels = [g.acoustic.steady_db or g.acoustic.mean_db for g in gpus if g.acoustic is not None]
        finite = [lv for lv in levels if lv is not None]
        total = 10 * math.log10(sum(10 ** (lv / 10) for lv in finite)) if finite else None
        acoustic = LevelStats(mean_db=total, max_db=None, idle_db=None, steady_db=total, samples=0)
        acoustic_source = "energetic sum of the GPUs' proxies"
    mic_series = next((a for a in ds.acoustic if a.host == host and a.gpu == "" and a.source == "mic"), None)
    mic = calibration = None
    if mic_series is not None and np.any(np.isfinite(mic_series.laeq_db)):
        mic = level_stats(mic_series.t_ns, mic_series.laeq_db, idle, steady)
        if node_proxy is not None:
            pairs = pair_levels(
                mic_series.t_ns, mic_series.laeq_db, node_proxy.t_ns, node_proxy.est_dba, s.mic_window_s
            )
            calibration = calibrate(*pairs)
    effs = [g.efficiency for g in gpus]
    rates = [e.samples_per_s for e in effs]
    steady_j = _sum([e.steady_energy_j for e in effs])
    samples_per_s = _sum(rates)
    samples = _sum([e.steady_samples for e in effs])
    samples_per_j = j_per_sample = None
    if samples and steady_j:
        samples_per_j = samples / steady_j
        j_per_sample = 1 / samples_per_j
    headrooms = [g.headroom_c for g in gpus if g.headroom_c is not None]
    predicted = [g.t_pred_at_limit_c for g in gpus if g.t_pred_at_limit_c is not None]
    return NodeResult(
        host=host,
        gpus=len(gpus),
        r_th_mean_c_per_w=_mean_finite([rc.r_th_c_per_w for rc in rcs]),
        tau_mean_s=_mean_finite([rc.tau_s for rc in rcs]),
        t_amb_mean_c=_mean_finite([rc.t_amb_c for rc in rcs]),
        t_pred_at_limit_max_c=max(predicted) if predicted else None,
        headroom_min_c=min(headrooms) if headrooms else None,
        thermal_throttled_s=sum(g.thermal_throttled_s for g in gpus),
        power_capped_s=sum(g.power_capped_s for g in gpus),
        acoustic=acoustic,
        acoustic_source=acoustic_source,
        mic=mic,
        calibration=calibration,
        samples_per_s=samples_per_s,
        mean_power_w=_sum([e.mean_power_w for e in effs]),
        steady_energy_j=steady_j,
        samples_per_j=samples_per_j,
        j_per_sample=j_per_sample,
        idle_power_w=_sum([e.idle_power_w for e in effs]),
        probe_energy_j=float(sum(e.probe_energy_j for e in effs if math.isfinite(e.probe_energy_j))),
    )


def find_outliers(gpus: Sequence[GpuResult], s: ModelSettings) -> list[Outlier]:
    """GPUs beyond a stated threshold from the median of the GPUs of the same model (at least 3)."""
    out: list[Outlier] = []
    by_model: dict[str, list[GpuResult]] = {}
    for g in gpus:
        by_model.setdefault(g.model, []).append(g)
    for model, group in sorted(by_model.items()):
        if len(group) < MIN_FLEET:
            continue
        r_median = _median_finite([g.thermal.rc.r_th_c_per_w if g.thermal.rc else None for g in group])
        dba_median = _median_finite([g.acoustic.steady_db if g.acoustic else None for g in group])
        eff_median = _median_finite([g.efficiency.samples_per_j for g in group])
        for g in group:
            if r_median and g.thermal.rc is not None:
                r = g.thermal.rc.r_th_c_per_w
                if r > r_median * (1 + s.outlier_r_th_pct / 100):
                    excess = 100 * (r / r_median - 1)
                    out.append(
                        Outlier(
                            g.host,
                            g.gpu,
                            model,
                            "hotter",
                            r,
                            r_median,
                            f"> +{s.outlier_r_th_pct:g} %",
                            "°C/W",
                            f"R_th {r:.3f} °C/W is {excess:.0f} % above the {model} median {r_median:.3f}",
                        )
                    )
            if dba_median is not None and g.acoustic is not None and g.acoustic.steady_db is not None:
                level = g.acoustic.steady_db
                if level > dba_median + s.outlier_dba:
                    out.append(
                        Outlier(
                            g.host,
                            g.gpu,
                            model,
                            "louder",
                            level,
                            dba_median,
                            f"> +{s.outlier_dba:g} dB",
                            "dBA",
                            f"proxy {level:.1f} dBA is {level - dba_median:.1f} dB above the {model} median",
                        )
                    )
            if eff_median and g.efficiency.samples_per_j is not None:
                spj = g.efficiency.samples_per_j
                if spj < eff_median * (1 - s.outlier_samples_per_j_pct / 100):
                    short = 100 * (1 - spj / eff_median)
                    out.append(
                        Outlier(
                            g.host,
                            g.gpu,
                            model,
                            "less efficient",
                            spj,
                            eff_median,
                            f"< -{s.outlier_samples_per_j_pct:g} %",
                            "samples/J",
                            f"{spj:.3g} samples/J is {short:.0f} % below the {model} median {eff_median:.3g}",
                        )
                    )
    return out


def analyze(ds: Dataset, s: ModelSettings, progress: Progress | None = None) -> Results:
    """Every figure of the window; ``progress`` hears each stage of the thermal fits as it starts."""
    w = ds.window
    fits = _thermal_fits(ds, s, progress)
    gpus = [_analyze_gpu(ds, g, s, fit) for g, fit in zip(ds.gpus, fits, strict=True)]
    hosts = sorted({g.host for g in gpus})
    nodes = [_analyze_node(ds, h, [g for g in gpus if g.host == h], s) for h in hosts]
    outliers = find_outliers(gpus, s)
    for o in outliers:
        for g in gpus:
            if (g.host, g.gpu) == (o.host, o.gpu):
                g.flags.append(o.kind)
    probe_j = float(sum(n.probe_energy_j for n in nodes))
    kwh = probe_j / J_PER_KWH * s.pue
    gpu_hours = len(gpus) * w.duration_s / 3600
    total_samples = sum(g.efficiency.steady_samples or 0 for g in gpus if g.efficiency.samples_per_j)
    total_steady_j = sum(g.efficiency.steady_energy_j or 0 for g in gpus if g.efficiency.samples_per_j)
    fleet = FleetTotals(
        gpus=len(gpus),
        nodes=len(nodes),
        duration_s=w.duration_s,
        probe_energy_j=probe_j,
        pue=s.pue,
        kwh=kwh,
        grid_kg_per_kwh=s.grid_kg_per_kwh,
        kg_co2e=kwh * s.grid_kg_per_kwh,
        gpu_hours=gpu_hours,
        price_per_gpu_hour=s.price_per_gpu_hour,
        cost=None if s.price_per_gpu_hour is None else gpu_hours * s.price_per_gpu_hour,
        samples_per_j=total_samples / total_steady_j if total_steady_j > 0 and total_samples > 0 else None,
    )
    notes = []
    if w.probe is not None and not any(w.intervals(h, "steady") for h in hosts):
        notes.append("the probe has no steady phase: efficiency uses the loaded part of the power series")
    if w.probe is None:
        notes.append("time range without a probe: the loaded part of each GPU's power series is its steady phase")
    defaulted = [f"{g.host}/{g.gpu}" for g in gpus if g.slowdown_source == "default"]
    if defaulted:
        notes.append(
            f"no slowdown threshold reported (no `gpu_info` point with temp_slowdown_c) for GPU(s)"
            f" {', '.join(defaulted)}: their headroom uses the default {DEFAULT_SLOWDOWN_C:g} °C"
            " (--slowdown-c sets one)"
        )
    if any(t.device == "sim" for t in ds.trainer):
        notes.append(SIMULATED_NOTE)
    return Results(
        label=w.label,
        probe=w.probe,
        workload=w.workload,
        status=w.status,
        start_ns=w.start_ns,
        end_ns=w.end_ns,
        phases={
            h: [{"phase": p.name, "start_ns": p.start_ns, "end_ns": p.end_ns} for p in ps] for h, ps in w.phases.items()
        },
        gpus=gpus,
        nodes=nodes,
        fleet=fleet,
        outliers=outliers,
        thresholds={
            "outlier_r_th_pct": s.outlier_r_th_pct,
            "outlier_dba": s.outlier_dba,
            "outlier_samples_per_j_pct": s.outlier_samples_per_j_pct,
        },
        notes=notes,
    )
