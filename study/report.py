"""Part: study. A study report as JSON, as the terminal's tables, as a self-contained HTML file with plots, and as
``model`` points (kind ``study``) for InfluxDB and the Grafana study dashboard.

Wherever a figure derives from a throughput that the simulator's performance model produced (trainer
tag ``device=sim``), it is labelled *simulated*: the ``data`` column of the tables, the markers and
legends of the plots, ``"simulated": true`` and ``"throughput_source": "simulated"`` in the JSON, and
``simulated=true`` on the ``model`` point.

``model`` points: tags ``probe`` (the study id), ``kind=study`` and the group's keys ``instance_type``,
``gpu_model``, ``virt``, ``region``, ``workload``, ``batch_size``, ``power_limit`` (an empty value —
no instance type, a limit left as is — leaves its tag out, as everywhere in the schema); timestamped
at the study's end, so running the report again overwrites them. Floats unless noted; a value that
was not computed is left out, so field types never change between runs.
"""

from __future__ import annotations

import dataclasses
import html
import math
from collections.abc import Sequence
from typing import Any

from gpuprobe.influx.lineprotocol import encode_line
from gpuprobe.model.html import Section, page, utc_text
from gpuprobe.model.html import img as _img
from gpuprobe.model.html import png as _png
from gpuprobe.model.html import pyplot as _pyplot
from gpuprobe.model.html import table as _table
from gpuprobe.model.output import TERMINAL_COLUMNS, wrapped
from gpuprobe.model.report import legend_beside
from gpuprobe.study.analysis import (
    Group,
    GroupKey,
    StudyReport,
    batch_label,
    limit_label,
)
from gpuprobe.texttable import text_table

MEASUREMENT = "model"
KIND = "study"


def data_label(simulated: bool, has_data: bool = True) -> str:
    if not has_data:
        return "—"
    return "simulated" if simulated else "measured"


# --- JSON ----------------------------------------------------------------------------------------


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        cleaned = {str(k): _clean(v) for k, v in value.items()}
        if isinstance(cleaned.get("simulated"), bool):
            cleaned["throughput_source"] = "simulated" if cleaned["simulated"] else "measured"
        return cleaned
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return _clean(value.item())
    return value


def _key_dict(key: GroupKey) -> dict[str, Any]:
    return {**dataclasses.asdict(key), "label": key.label(), "power_limit_label": limit_label(key.power_limit)}


def to_jsonable(report: StudyReport, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every figure of the report as plain JSON types (NaN and infinities as null); top-level keys:
    ``study``, ``database``, ``start_ns``, ``end_ns``, ``simulated``, ``workloads``, ``points``, ``nodes``,
    ``groups``, ``pareto``, ``scaling``, ``virt_overhead``, ``rankings``, ``refusals``, ``missing``,
    ``measurements``, ``prices``, ``notes``, then ``extra`` (``settings``, ``generated_unix_ns``,
    ``version``)."""
    groups = []
    for g in report.groups:
        entry = dataclasses.asdict(g)
        entry["key"] = _key_dict(g.key)
        groups.append(entry)
    pareto = []
    for f in report.pareto:
        entry = dataclasses.asdict(f)
        entry["energy_optimal"] = _key_dict(f.energy_optimal)
        entry["time_optimal"] = _key_dict(f.time_optimal)
        for p, d in zip(f.points, entry["points"], strict=True):
            d["key"] = _key_dict(p.key)
        pareto.append(entry)
    measurements = []
    for m in report.measurements:
        entry = dataclasses.asdict(m)
        entry["has_data"] = m.has_data
        measurements.append(entry)
    document: dict[str, Any] = {
        "study": report.study,
        "database": report.database,
        "start_ns": report.start_ns,
        "end_ns": report.end_ns,
        "simulated": report.simulated,
        "workloads": report.workloads,
        "points": [dataclasses.asdict(p) for p in report.points],
        "nodes": [dataclasses.asdict(n) for n in report.nodes],
        "groups": groups,
        "pareto": pareto,
        "scaling": [{**dataclasses.asdict(c), "simulated": c.simulated} for c in report.scaling],
        "virt_overhead": [
            {**dataclasses.asdict(o), "key": _key_dict(o.key), "bare_metal": [_key_dict(k) for k in o.bare_metal]}
            for o in report.virt_overhead
        ],
        "rankings": [
            {
                **dataclasses.asdict(r),
                "entries": [{**dataclasses.asdict(e), "best": _key_dict(e.best)} for e in r.entries],
            }
            for r in report.rankings
        ],
        "refusals": [dataclasses.asdict(r) for r in report.refusals],
        "missing": [dataclasses.asdict(m) for m in report.missing],
        "measurements": measurements,
        "prices": report.prices,
        "notes": report.notes,
    }
    cleaned: dict[str, Any] = _clean(document)
    if extra:
        cleaned.update(_clean(extra))
    return cleaned


# --- `model` points ------------------------------------------------------------------------------

Fields = dict[str, float | int | bool | str]


def _put(fields: Fields, name: str, value: float | None) -> None:
    if value is not None and math.isfinite(value):
        fields[name] = float(value)


def group_fields(g: Group) -> Fields:
    fields: Fields = {}
    _put(fields, "samples_per_s", g.samples_per_s)
    _put(fields, "samples_per_j", g.samples_per_j)
    _put(fields, "j_per_sample", g.j_per_sample)
    _put(fields, "mean_power_w", g.mean_power_w)
    _put(fields, "power_limit_w", g.enforced_limit_w)
    _put(fields, "requested_power_limit_w", g.requested_limit_w)
    _put(fields, "peak_temp_c", g.peak_temp_c)
    _put(fields, "headroom_c", g.headroom_c)
    _put(fields, "est_dba", g.est_dba)
    _put(fields, "sm_clock_mhz", g.sm_clock_mhz)
    _put(fields, "price_per_hour_usd", g.price_per_hour_usd)
    _put(fields, "cost_per_million_samples_usd", g.cost_per_million_samples_usd)
    _put(fields, "virt_overhead_pct", g.virt_overhead_pct)
    fields["gpus"] = int(g.gpus)
    fields["nodes"] = int(g.nodes)
    fields["refusals"] = int(g.refusals)
    if len(g.points) == 1:
        fields["point"] = int(g.points[0])
    fields["simulated"] = bool(g.simulated)
    fields["pareto"] = bool(g.pareto)
    fields["energy_optimal"] = bool(g.energy_optimal)
    fields["time_optimal"] = bool(g.time_optimal)
    return fields


def group_tags(study: str, key: GroupKey) -> dict[str, str]:
    return {
        "probe": study,
        "kind": KIND,
        "instance_type": key.instance_type,
        "gpu_model": key.gpu_model,
        "virt": key.virt,
        "region": key.region,
        "workload": key.workload,
        "batch_size": "" if key.batch_size is None else str(key.batch_size),
        "power_limit": key.power_limit,
    }


def model_lines(report: StudyReport) -> list[str]:
    """One ``model`` point per group, each a line ending in ``\\n``, written as the collector writes."""
    return [
        encode_line(MEASUREMENT, group_tags(report.study, g.key), group_fields(g), report.end_ns) for g in report.groups
    ]


# --- terminal ------------------------------------------------------------------------------------


def _num(value: float | None, spec: str) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    return format(value, spec)


GROUP_HEADERS = [
    "GPU model",
    "workload",
    "instance type",
    "virt",
    "region",
    "batch",
    "limit",
    "GPUs",
    "nodes",
    "samples/s/GPU",
    "samples/J",
    "J/sample",
    "mean W",
    "enforced W",
    "peak °C",
    # from here on the terminal's names only (GROUP_HTML_HEADERS has its own): short, for 120 columns
    "headroom °C",
    "proxy dBA",
    "USD/1M",
    "overhead %",
    "refused",
    "data",
]


KEY_COLUMNS = 5  # GPU model, workload, instance type, virt, region: what a configuration is


def _group_row(g: Group) -> list[str]:
    k = g.key
    return [
        k.gpu_model,
        k.workload,
        k.instance_type or "—",
        k.virt or "—",
        k.region or "—",
        batch_label(k.batch_size),
        limit_label(k.power_limit),
        str(g.gpus),
        str(g.nodes),
        _num(g.samples_per_s, ".1f"),
        _num(g.samples_per_j, ".4g"),
        _num(g.j_per_sample, ".4g"),
        _num(g.mean_power_w, ".1f"),
        _num(g.enforced_limit_w, ".0f"),
        _num(g.peak_temp_c, ".1f"),
        _num(g.headroom_c, ".1f"),
        _num(g.est_dba, ".1f"),
        _num(g.cost_per_million_samples_usd, ".4g"),
        _num(g.virt_overhead_pct, "+.1f"),
        str(g.refusals),
        data_label(g.simulated, g.samples_per_s is not None),
    ]


def _sim(simulated: bool) -> str:
    return " (simulated)" if simulated else ""


def _optimal_lines(report: StudyReport) -> list[str]:
    by_key = {g.key: g for g in report.groups}
    lines = []
    for f in report.pareto:
        e, t = by_key[f.energy_optimal], by_key[f.time_optimal]
        lines.append(
            f"{f.gpu_model} / {f.workload}: energy-optimal {e.key.point_label} on {e.key.configuration}: "
            f"{_num(e.samples_per_j, '.4g')} samples/J, {_num(e.samples_per_s, '.1f')} samples/s per GPU"
            f"{_sim(e.simulated)}; time-optimal {t.key.point_label} on {t.key.configuration}: "
            f"{_num(t.samples_per_s, '.1f')} samples/s per GPU, {_num(t.samples_per_j, '.4g')} samples/J"
            f"{_sim(t.simulated)}; Pareto frontier: {len(f.frontier)} of {len(f.points)} groups"
        )
    return lines


#: the group columns the terminal leaves to the HTML and JSON first, while its table is wider than
#: TERMINAL_COLUMNS (after the columns with one value in every row, which it says once above the table)
TERMINAL_DROP_ORDER = ("J/sample", "proxy dBA", "enforced W", "nodes", "peak °C", "refused")


def terminal_columns(
    headers: Sequence[str], rows: Sequence[Sequence[str]], left: int, width: int = TERMINAL_COLUMNS
) -> tuple[list[str], list[list[str]], int, list[str]]:
    """The table the terminal shows: (headers, rows, left-aligned columns, the lines said above it). A
    column with one value in every row becomes a line ``header: value`` above it; then the columns of
    ``TERMINAL_DROP_ORDER`` go, one by one, while the table is wider than ``width`` (a last line names
    them: they stay in the HTML report and the JSON)."""
    keep = list(range(len(headers)))
    above = []
    if len(rows) > 1:
        for i in list(keep):
            values = {r[i] for r in rows}
            if len(values) == 1 and headers[i] != "data":
                above.append(f"{headers[i]}: {values.pop()}")
                keep.remove(i)

    def table_width(columns: list[int]) -> int:
        return sum(max([len(headers[i]), *(len(r[i]) for r in rows)]) for i in columns) + 2 * (len(columns) - 1)

    dropped = []
    for name in TERMINAL_DROP_ORDER:
        if table_width(keep) <= width:
            break
        if name in headers and headers.index(name) in keep:
            keep.remove(headers.index(name))
            dropped.append(name)
    lines = ["every row: " + "; ".join(above)] if above else []
    if dropped:
        lines.append(f"in the HTML report and the JSON only: {', '.join(dropped)}")
    shown_left = sum(1 for i in keep if i < left)
    return [headers[i] for i in keep], [[r[i] for i in keep] for r in rows], shown_left, lines


def summary_table(report: StudyReport) -> str:
    """What the terminal shows: the groups (each configuration a heading over its rows), the optimal points,
    rankings, refusals, gaps and notes, within ``TERMINAL_COLUMNS`` (:func:`terminal_columns`; text wraps)."""
    out = [
        f"study {report.study} (database {report.database}): {len(report.nodes)} nodes, "
        f"{len(report.points)} points, {len(report.measurements)} GPU x point windows",
        *(["SOME FIGURES ARE SIMULATED (data column)"] if report.simulated else []),
        "",
    ]
    # the configuration (GPU model, workload, instance type, virt, region) heads each run of its rows
    # instead of taking 60 columns of every row; the figures' columns line up across the runs
    full = [_group_row(g) for g in report.groups]
    headers, rows, left, said = terminal_columns(
        GROUP_HEADERS[KEY_COLUMNS:], [r[KEY_COLUMNS:] for r in full], left=2, width=TERMINAL_COLUMNS - 2
    )
    lines = text_table(headers, rows, left=left, rule=True)
    table = lines[:2]  # never wrapped: a wrapped row is no row
    for i, (row, line) in enumerate(zip(full, lines[2:], strict=True)):
        if i == 0 or row[:KEY_COLUMNS] != full[i - 1][:KEY_COLUMNS]:
            table.append(" · ".join(cell for cell in row[:KEY_COLUMNS] if cell != "—"))
        table.append(f"  {line}")
    table[:2] = [f"  {table[0]}", f"  {table[1]}"]
    out += said
    before = len(out)  # the title, a blank line and the lines about the table come before it
    if report.pareto:
        out += ["", "optimal points per GPU model and workload (time-energy Pareto frontier):"]
        out += [f"  {line}" for line in _optimal_lines(report)]
    for r in report.rankings:
        what = "GPU models" if r.by == "gpu_model" else "instance types"
        ranked = ", ".join(
            f"{e.rank}. {e.name} {e.samples_per_j:.4g} samples/J ({e.best.point_label}){_sim(e.simulated)}"
            for e in r.entries
        )
        out.append(f"ranking of {what} by samples/J, {r.workload}: {ranked}")
    if report.refusals:
        out += ["", "refused points:"]
        for ref in report.refusals:
            point = "?" if ref.point is None else str(ref.point)
            out.append(
                f"  {ref.host} gpu {ref.gpu or '—'} point {point} ({ref.workload}, "
                f"batch {batch_label(ref.batch_size)}, limit {limit_label(ref.power_limit)}): "
                f"{ref.message or 'no reason given'}"
            )
    if report.missing:
        out += ["", "points without figures:"]
        for m in report.missing:
            out.append(f"  {m.host} gpu {m.gpu or '—'} point {'?' if m.point is None else m.point}: {m.reason}")
    if report.notes:
        out += ["", *(f"note: {n}" for n in report.notes)]
    return "\n".join(wrapped(out[:before]) + table + wrapped(out[before:]))


# --- HTML ----------------------------------------------------------------------------------------

# Key cells stay on one line (a GPU model, a region or "as is" split reads badly); the groups table's
# configurations are lines across it (tr.config), which leaves its figures the page's width.
CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1400px;
padding:0 24px;color:#202124}
h1{font-size:22px;margin:0 0 4px} h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #dadce0}
table{border-collapse:collapse;margin:6px 0 12px;font-size:11px}
th,td{border:1px solid #dadce0;padding:2px 4px;text-align:right} th{background:#f1f3f4}
td.l,th.l{text-align:left} td.l{white-space:nowrap} .wide{overflow-x:auto}
tr.config td{font-weight:600;background:#f8f9fa;text-align:left}
img{max-width:100%;display:block;margin:8px 0}
tr.sim td{background:#fff8e1} .sim{color:#9a5b00;font-weight:600}
.muted{color:#5f6368;font-size:12px} .box{background:#fff8e1;border:1px solid #f0c36d;padding:8px 12px;margin:8px 0}
"""


def _short(key: GroupKey, configurations: int) -> str:
    text = f"b{batch_label(key.batch_size)} {limit_label(key.power_limit)}"
    return f"{text} {key.virt}" if configurations > 1 else text


def pareto_figure(report: StudyReport, gpu_model: str) -> str | None:
    """Time per sample against energy per sample of every group of one GPU model (one panel per
    workload), the frontier as a line, the energy- and time-optimal points marked; hollow markers and
    "(simulated)" where the throughput is the simulator's."""
    fig = pareto_plot(report, gpu_model)
    return None if fig is None else _png(fig)


def pareto_plot(report: StudyReport, gpu_model: str) -> Any:
    """The figure of :func:`pareto_figure` (None without a frontier of that GPU model)."""
    fronts = [f for f in report.pareto if f.gpu_model == gpu_model]
    if not fronts:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(fronts), figsize=(6.2 * len(fronts), 4.2), squeeze=False, layout="constrained")
    for ax, f in zip(axes.flat, fronts, strict=True):
        configurations = len({p.key.configuration for p in f.points})
        for p in f.points:
            colour = "#1a73e8" if p.on_frontier else "#9aa0a6"
            face = "none" if p.simulated else colour
            ax.plot(p.time_per_sample_s * 1e3, p.energy_per_sample_j, "o", ms=7, mec=colour, mfc=face)
            ax.annotate(
                _short(p.key, configurations) + (" (sim)" if p.simulated else ""),
                (p.time_per_sample_s * 1e3, p.energy_per_sample_j),
                fontsize=6,
                xytext=(4, 3),
                textcoords="offset points",
            )
        front = sorted(f.frontier, key=lambda p: p.time_per_sample_s)
        ax.plot(
            [p.time_per_sample_s * 1e3 for p in front],
            [p.energy_per_sample_j for p in front],
            "-",
            color="#1a73e8",
            lw=1.2,
            label="Pareto frontier",
        )
        best = {p.key: p for p in f.points}
        e, t = best[f.energy_optimal], best[f.time_optimal]
        ax.plot(
            e.time_per_sample_s * 1e3,
            e.energy_per_sample_j,
            "*",
            ms=15,
            color="#188038",
            label="energy-optimal (max samples/J)",
        )
        ax.plot(
            t.time_per_sample_s * 1e3,
            t.energy_per_sample_j,
            "^",
            ms=10,
            color="#d93025",
            mfc="none",
            mew=1.5,
            label="time-optimal (max samples/s)",
        )
        ax.plot([], [], "o", mec="#1a73e8", mfc="none", label="hollow: simulated throughput")
        ax.set_xlabel("time per sample per GPU, ms", fontsize=8)
        ax.set_ylabel("energy per sample, J", fontsize=8)
        ax.set_title(f"{f.workload}{_sim(f.simulated)}", fontsize=9)
        ax.tick_params(labelsize=7)
    # the same key for every panel: once, under them (outside every axes)
    fig.legend(*axes.flat[0].get_legend_handles_labels(), loc="outside lower center", ncol=4, fontsize=7)
    fig.suptitle(f"{gpu_model}: time-energy Pareto frontier{_sim(any(f.simulated for f in fronts))}", fontsize=10)
    return fig


def scaling_figure(report: StudyReport) -> str | None:
    """Throughput per GPU against batch size, one panel per GPU model and workload, a line per power
    limit (and configuration); dashed lines and "(simulated)" where simulated."""
    fig = scaling_plot(report)
    return None if fig is None else _png(fig)


def scaling_plot(report: StudyReport) -> Any:
    """The figure of :func:`scaling_figure` (None without scaling curves)."""
    panels = sorted({(c.gpu_model, c.workload) for c in report.scaling})
    if not panels:
        return None
    plt = _pyplot()
    cols = min(2, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.2 * cols, 3.6 * rows), squeeze=False, layout="constrained")
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax, (model, workload) in zip(axes.flat, panels, strict=False):
        curves = [c for c in report.scaling if (c.gpu_model, c.workload) == (model, workload)]
        configurations = len({c.configuration for c in curves})
        for c in curves:
            xs = [p.batch_size or 0 for p in c.points]
            ys = [p.samples_per_s for p in c.points]
            label = f"limit {limit_label(c.power_limit)}"
            if configurations > 1:
                label += f" on {c.configuration}"
            ax.plot(xs, ys, "--" if c.simulated else "-", marker="o", ms=4, label=label + _sim(c.simulated))
        ax.set_xscale("log", base=2)
        batches = sorted({p.batch_size or 0 for c in curves for p in c.points} - {0})
        if batches:
            ax.set_xticks(batches, [str(b) for b in batches])
            ax.minorticks_off()
        ax.set_xlabel("batch size", fontsize=8)
        ax.set_ylabel("samples/s per GPU", fontsize=8)
        ax.set_title(f"{model} / {workload}{_sim(any(c.simulated for c in curves))}", fontsize=9)
        ax.tick_params(labelsize=7)
        legend_beside(ax)
    fig.suptitle("batch-size scaling", fontsize=10)
    return fig


def overhead_figure(report: StudyReport) -> str | None:
    """Virtualization overhead of each virtualized group against bare metal (hatched when simulated)."""
    shown = [o for o in report.virt_overhead if o.overhead_pct is not None]
    if not shown:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(shown) + 2), 3.8), layout="constrained")
    for i, o in enumerate(shown):
        ax.bar(i, o.overhead_pct or 0.0, color="#f29900", hatch="//" if o.simulated else None, edgecolor="#202124")
    labels = [
        f"{o.key.gpu_model}\n{o.key.virt} {o.key.instance_type}\n{o.key.workload} {_short(o.key, 1)}{_sim(o.simulated)}"
        for o in shown
    ]
    if len(shown) <= 6:
        ax.set_xticks(range(len(shown)), labels, fontsize=6)
    else:
        ax.set_xticks(range(len(shown)), labels, rotation=45, ha="right", fontsize=6)
    ax.axhline(0, color="#202124", lw=0.8)
    ax.set_ylabel("throughput overhead vs bare metal, %", fontsize=8)
    ax.set_title("virtualization overhead: (1 - virt/bare metal) x 100 (hatched: simulated)", fontsize=9)
    ax.tick_params(labelsize=7)
    return _png(fig)


def render_html(report: StudyReport, settings: dict[str, Any]) -> str:
    sections = [
        _header(report),
        _groups(report),
        _optimal(report),
        _scaling(report),
        _overhead(report),
        _rankings(report),
        _refusals(report),
        _missing(report),
        _measurements(report),
        _nodes(report),
        _notes(report),
        _settings(report, settings),
    ]
    return page(sections)


def _header(r: StudyReport) -> Section:
    parts = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        f"<title>gpuprobe study report: {html.escape(r.study)}</title><style>{CSS}</style></head><body>",
        f"<h1>gpuprobe study report: {html.escape(r.study)}</h1>",
        f'<p class="muted">{utc_text(r.start_ns)} → {utc_text(r.end_ns)}; database {html.escape(r.database)}; '
        f"{len(r.nodes)} nodes, {len(r.points)} points, workloads {html.escape(', '.join(r.workloads))}. "
        "Acoustic proxy levels are <b>estimates</b>. Definitions: docs/studies.md.</p>",
    ]
    if r.simulated:
        parts.append(
            '<p class="box"><b>Simulated figures.</b> Rows and points marked <span class="sim">simulated</span> '
            "take their throughput from the GPU simulator's performance model (trainer <code>device=sim</code>), "
            "not from a measurement; so do their samples/J, J/sample, cost and overhead.</p>"
        )
    return parts


GROUP_HTML_HEADERS = [
    *GROUP_HEADERS[:15],
    "headroom °C",
    "proxy dBA (estimate)",
    "USD per 1M samples",
    "virt overhead %",
    "refused",
    "data",
    "Pareto",
]


def _groups(r: StudyReport) -> Section:
    # each configuration (GPU model · workload · instance type · virt · region) is a line over its rows, as
    # on the terminal, instead of five columns of every row: the table fits the page without wrapping them
    rows: list[list[Any]] = []
    headings: list[str | None] = []
    last = ""
    for g in r.groups:
        k = g.key
        tag = ", ".join(
            t
            for t, on in (
                ("energy-optimal", g.energy_optimal),
                ("time-optimal", g.time_optimal),
                ("frontier", g.pareto),
            )
            if on
        )
        configuration = " · ".join(c for c in (k.gpu_model, k.workload, k.instance_type, k.virt, k.region) if c)
        headings.append(None if headings and configuration == last else configuration)
        last = configuration
        rows.append(
            [
                batch_label(k.batch_size),
                limit_label(k.power_limit),
                g.gpus,
                g.nodes,
                g.samples_per_s,
                g.samples_per_j,
                g.j_per_sample,
                g.mean_power_w,
                g.enforced_limit_w,
                g.peak_temp_c,
                g.headroom_c,
                g.est_dba,
                g.cost_per_million_samples_usd,
                g.virt_overhead_pct,
                g.refusals,
                data_label(g.simulated, g.samples_per_s is not None),
                tag,
            ]
        )
    return [
        "<h2>Groups</h2>",
        '<p class="muted">One row per instance type x GPU model x virt x region x workload x batch size x power '
        "limit. samples/s per GPU: mean over its GPUs; samples/J: Σ samples/s ÷ Σ mean W; enforced W: the limit the "
        "GPUs reported (what really ran); headroom: the slowdown threshold minus the steady temperature (where "
        "the window's temperature was heading, as gpuprobe model counts it), the smallest of the GPUs'; cost: price "
        "per hour ÷ 3600 ÷ (samples/s per GPU x GPUs of the node in the study) x 1e6.</p>",
        _table(GROUP_HTML_HEADERS[KEY_COLUMNS:], rows, left=2, sim=[g.simulated for g in r.groups], headings=headings),
    ]


def _optimal(r: StudyReport) -> Section:
    by_key = {g.key: g for g in r.groups}
    rows, sim = [], []
    for f in r.pareto:
        for which, key in (
            ("energy-optimal (max samples/J)", f.energy_optimal),
            ("time-optimal (max samples/s)", f.time_optimal),
        ):
            g = by_key[key]
            rows.append(
                [
                    f.gpu_model,
                    f.workload,
                    which,
                    key.point_label,
                    key.configuration,
                    g.samples_per_s,
                    g.samples_per_j,
                    g.j_per_sample,
                    data_label(g.simulated),
                ]
            )
            sim.append(g.simulated)
    parts = [
        "<h2>Optimal points and the time-energy Pareto frontier</h2>",
        '<p class="muted">Per GPU model and workload, every group as time per sample per GPU (1 ÷ samples/s) '
        "against energy per sample (J/sample); the frontier holds the groups no other group beats on both.</p>",
        _table(
            [
                "GPU model",
                "workload",
                "optimal",
                "point",
                "configuration",
                "samples/s per GPU",
                "samples/J",
                "J/sample",
                "data",
            ],
            rows,
            left=5,
            sim=sim,
        ),
    ]
    for model in sorted({f.gpu_model for f in r.pareto}):
        parts.append(_img(pareto_figure(r, model), f"Pareto frontier of {model}"))
    return parts


def _scaling(r: StudyReport) -> Section:
    rows, sim = [], []
    for c in r.scaling:
        for p in c.points:
            rows.append(
                [
                    c.gpu_model,
                    c.workload,
                    c.configuration,
                    limit_label(c.power_limit),
                    batch_label(p.batch_size),
                    p.samples_per_s,
                    p.samples_per_j,
                    data_label(p.simulated),
                ]
            )
            sim.append(p.simulated)
    return [
        "<h2>Batch-size scaling</h2>",
        _img(scaling_figure(r), "batch-size scaling"),
        _table(
            ["GPU model", "workload", "configuration", "limit", "batch", "samples/s per GPU", "samples/J", "data"],
            rows,
            left=5,
            sim=sim,
        ),
    ]


def _overhead(r: StudyReport) -> Section:
    if not r.virt_overhead:
        return ["<h2>Virtualization overhead</h2>", "<p>Every group ran on bare metal.</p>"]
    rows = [
        [
            o.key.gpu_model,
            o.key.workload,
            o.key.instance_type or "—",
            o.key.virt,
            o.key.point_label,
            o.samples_per_s,
            o.bare_metal_samples_per_s,
            o.overhead_pct,
            ", ".join(k.instance_type or "—" for k in o.bare_metal) or "—",
            data_label(o.simulated, o.samples_per_s is not None),
            o.note,
        ]
        for o in r.virt_overhead
    ]
    return [
        "<h2>Virtualization overhead</h2>",
        '<p class="muted">Per group whose virt is not bare_metal: its throughput per GPU against the bare_metal '
        "groups of the same GPU model, workload, batch size and power limit; overhead % = (1 - virt ÷ bare) x 100 "
        "(absent without a bare_metal group).</p>",
        _table(
            [
                "GPU model",
                "workload",
                "instance type",
                "virt",
                "point",
                "samples/s per GPU",
                "bare metal samples/s per GPU",
                "overhead %",
                "bare metal on",
                "data",
                "note",
            ],
            rows,
            left=5,
            sim=[o.simulated for o in r.virt_overhead],
        ),
        _img(overhead_figure(r), "virtualization overhead"),
    ]


def _rankings(r: StudyReport) -> Section:
    parts = [
        "<h2>Rankings by samples per joule</h2>",
        '<p class="muted">Each GPU model or instance type at its best point, per workload.</p>',
    ]
    for ranking in r.rankings:
        what = "GPU model" if ranking.by == "gpu_model" else "instance type"
        parts.append(f"<h3>{html.escape(ranking.workload)}: by {what}</h3>")
        parts.append(
            _table(
                ["rank", what, "samples/J", "samples/s per GPU", "best point", "on", "data"],
                [
                    [
                        e.rank,
                        e.name,
                        e.samples_per_j,
                        e.samples_per_s,
                        e.best.point_label,
                        e.best.configuration,
                        data_label(e.simulated),
                    ]
                    for e in ranking.entries
                ],
                left=2,
                sim=[e.simulated for e in ranking.entries],
            )
        )
    return parts


def _refusals(r: StudyReport) -> Section:
    if not r.refusals:
        return ["<h2>Refused points</h2>", "<p>None.</p>"]
    rows = [
        [
            x.host,
            x.gpu or "—",
            x.gpu_model,
            "—" if x.point is None else x.point,
            x.workload,
            batch_label(x.batch_size),
            limit_label(x.power_limit),
            x.message or "no reason given",
            utc_text(x.t_ns),
        ]
        for x in r.refusals
    ]
    return [
        "<h2>Refused points</h2>",
        '<p class="muted">Points a node could not run, with its reason; its other points are unaffected.</p>',
        _table(["host", "gpu", "GPU model", "point", "workload", "batch", "limit", "reason", "time"], rows, left=8),
    ]


def _missing(r: StudyReport) -> Section:
    if not r.missing:
        return []
    return [
        "<h2>Points without figures</h2>",
        _table(
            ["host", "gpu", "point", "why"],
            [[m.host, m.gpu or "—", "—" if m.point is None else m.point, m.reason] for m in r.missing],
            left=4,
        ),
    ]


def _measurements(r: StudyReport) -> Section:
    # each GPU (host · gpu · GPU model) is a line over its points' rows, not three columns of every row:
    # the table fits the page with no GPU model wrapped
    measurements = sorted(r.measurements, key=lambda m: (m.host, m.gpu or ""))  # stable: points stay in order
    headings = [
        None if i and (m.host, m.gpu) == (measurements[i - 1].host, measurements[i - 1].gpu) else
        " · ".join((m.host, f"gpu {m.gpu or '—'}", m.gpu_model))
        for i, m in enumerate(measurements)
    ]  # fmt: skip
    headers = [
        "point",
        "workload",
        "batch",
        "limit",
        "window s",
        "samples/s",
        "trainer reports",
        "mean W",
        "energy from",
        "samples/J",
        "J/sample",
        "requested W",
        "enforced W",
        "peak °C",
        "slowdown °C",
        "headroom °C",
        "proxy dBA",
        "SM MHz",
        "device",
        "data",
    ]
    rows = [
        [
            m.point,
            m.workload,
            batch_label(m.batch_size),
            limit_label(m.power_limit),
            m.stats.duration_s,
            m.samples_per_s,
            m.trainer_reports,
            m.stats.mean_power_w,
            m.stats.energy_source,
            m.samples_per_j,
            m.j_per_sample,
            m.requested_limit_w,
            m.stats.enforced_limit_w,
            m.stats.peak_temp_c,
            m.slowdown_c,
            m.headroom_c,
            m.est_dba,
            m.stats.sm_clock_mhz,
            ", ".join(m.devices) or "—",
            data_label(m.simulated, m.samples_per_s is not None),
        ]
        for m in measurements
    ]
    return [
        "<h2>Every GPU at every point</h2>",
        '<p class="muted">Over each steady window: samples/s = mean of the trainer\'s steady reports of the point; '
        "mean W = energy counter increase ÷ window (else the mean power reading).</p>",
        _table(headers, rows, left=4, sim=[m.simulated for m in measurements], headings=headings),
    ]


def _nodes(r: StudyReport) -> Section:
    rows = [
        [
            n.host,
            n.instance_type or "—",
            n.virt or "—",
            n.region or "—",
            n.cloud or "—",
            n.cluster or "—",
            n.gpus_in_study,
        ]
        for n in r.nodes
    ]
    return [
        "<h2>Nodes</h2>",
        _table(["host", "instance type", "virt", "region", "cloud", "cluster", "GPUs in the study"], rows, left=6),
    ]


def _notes(r: StudyReport) -> Section:
    if not r.notes:
        return []
    return ["<h2>Notes</h2><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in r.notes) + "</ul>"]


def _settings(r: StudyReport, settings: dict[str, Any]) -> Section:
    prices = (
        _table(["instance type", "USD per hour"], sorted(r.prices.items())) if r.prices else "<p>No prices given.</p>"
    )
    return [
        "<h2>Prices</h2>",
        prices,
        "<h2>Settings</h2>",
        _table(["setting", "value"], [[k, v] for k, v in settings.items()]),
        '<p class="muted">Every number is also in the JSON file (--json).</p></body></html>',
    ]
