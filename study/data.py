"""Part: study. What a study report reads from InfluxDB, with InfluxQL (storage schema: docs/schema.md).

1. The study's ``probe`` events (``"probe" = <study id>``): the nodes' identity tags, the points of the
   matrix, each (host, GPU, point)'s steady window (:func:`gpuprobe.study.analysis.steady_windows`) and
   the refusals (``kind = point_refused``).
2. The trainers' throughput: the ``trainer`` reports of the study in phase ``steady``, by host, GPU,
   ``point`` field and ``device`` tag (``sim``: the simulator's performance model).
3. Per host, the raw ``gpu`` samples (power, energy counter, temperature, enforced limit, SM clock;
   not the agent's aggregates, whose counters are their interval's last reading stamped at its start) and the
   proxy level (``acoustic``, ``source=proxy``) of each span of overlapping steady windows, with
   ``EDGE_MARGIN_NS`` on both sides so the energy counter can be interpolated at the windows' ends;
   each window is reduced at once (:func:`gpuprobe.study.analysis.window_stats`), so memory stays
   bounded by one span of one host.

The ``probe`` and ``trainer`` points are read from the ``events`` retention policy as well as the
default one where the database has it (:mod:`gpuprobe.influx.eventreads`), so a study stays findable
for as long as ``events`` keeps it (400 days by default), not only the raw policy's 7 days; the
``gpu`` and ``acoustic`` samples are read from the default (raw) policy only.

Nothing here knows whether a GPU is simulated: simulated GPUs are read exactly like real ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuprobe.influx.client import InfluxClient
from gpuprobe.influx.eventreads import EventSources, event_sources, query_events
from gpuprobe.influx.influxql import Series, quote_identifier, quote_string
from gpuprobe.influx.retention import RAW_ONLY
from gpuprobe.model.data import NoDataError, hosts_note
from gpuprobe.study.analysis import (
    EMPTY_STATS,
    Event,
    Measurement,
    Missing,
    Node,
    PointSpec,
    Refusal,
    Window,
    WindowStats,
    gpu_order,
    mean_inside,
    steady_windows,
    window_stats,
)
from gpuprobe.wire.vocabulary import POINT_REFUSED, marks_a_phase

__all__ = ["NoDataError", "StudyData", "load_study"]

EDGE_MARGIN_NS = 5 * 10**9
EVENT_FIELDS = (
    "kind",
    "phase",
    "status",
    "workload",
    "message",
    "gpu",
    "point",
    "batch_size",
    "power_limit",
    "power_limit_w",
    "temp_slowdown_c",
    "steady_samples",
)
NODE_TAGS = ("instance_type", "region", "virt", "cloud", "cluster")
GPU_FIELDS = ("power_w", "energy_j", "temp_c", "power_limit_w", "sm_clock_mhz")

Progress = Callable[[str], None]


def _quiet(_message: str) -> None:
    pass


@dataclass
class StudyData:
    """A study as read: what :func:`gpuprobe.study.analysis.analyze` needs."""

    study: str
    database: str
    start_ns: int
    end_ns: int
    events: list[Event]
    points: list[PointSpec]
    nodes: list[Node]
    gpu_models: dict[tuple[str, str], str]
    measurements: list[Measurement]
    refusals: list[Refusal]
    missing: list[Missing]


def _host_filter(hosts: Sequence[str]) -> str:
    if not hosts:
        return ""
    return " AND (" + " OR ".join(f'"host" = {quote_string(h)}' for h in hosts) + ")"


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _int(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _float(value: Any) -> float | None:
    if value is None or isinstance(value, bool | str):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _floats(series: Series, name: str) -> np.ndarray:
    return np.array(
        [math.nan if v is None or isinstance(v, str | bool) else float(v) for v in series.column(name)], dtype=float
    )


def read_events(
    client: InfluxClient, study: str, hosts: Sequence[str] = (), sources: EventSources | None = None
) -> tuple[list[Event], dict[str, Node]]:
    """The study's ``probe`` events (from the ``sources``; None: asked) and its nodes' identity tags;
    :class:`NoDataError` naming the database when there are none."""
    sources = event_sources(client) if sources is None else sources
    fields = ", ".join(quote_identifier(f) for f in EVENT_FIELDS)
    answer = query_events(
        client, fields, "probe", f'WHERE "probe" = {quote_string(study)}{_host_filter(hosts)} GROUP BY *', sources
    )
    events: list[Event] = []
    tags: dict[str, dict[str, str]] = {}
    for s in answer:
        host = s.tags.get("host", "")
        known = tags.setdefault(host, {})
        for name in NODE_TAGS:
            if s.tags.get(name) and not known.get(name):
                known[name] = s.tags[name]
        for row in s.rows():
            events.append(
                Event(
                    t_ns=int(row["time"]),
                    host=host,
                    kind=_text(row.get("kind")),
                    phase=_text(row.get("phase")),
                    status=_text(row.get("status")),
                    workload=_text(row.get("workload")),
                    message=_text(row.get("message")),
                    gpu=_text(row.get("gpu")),
                    point=_int(row.get("point")),
                    batch_size=_int(row.get("batch_size")),
                    power_limit=_text(row.get("power_limit")),
                    power_limit_w=_float(row.get("power_limit_w")),
                    temp_slowdown_c=_float(row.get("temp_slowdown_c")),
                    steady_samples=_int(row.get("steady_samples")),
                )
            )
    if not events:
        raise NoDataError(
            f"no study {study!r} in database {client.settings.database!r}: no `probe` events with "
            f"probe = {study!r}{hosts_note(hosts)} in {sources.describe()}"
        )
    events.sort(key=lambda e: (e.t_ns, e.host, gpu_order(e.gpu)))
    nodes = {}
    for host, known in tags.items():
        gpus = {e.gpu for e in events if e.host == host and (e.gpu or e.point is not None)}
        nodes[host] = Node(host=host, gpus_in_study=len(gpus), **{name: known.get(name, "") for name in NODE_TAGS})
    return events, nodes


def point_specs(events: Sequence[Event]) -> list[PointSpec]:
    """Each point of the matrix as its events describe it (the first event that names its batch size)."""
    specs: dict[int, PointSpec] = {}
    for e in sorted(events, key=lambda e: (e.batch_size is None, e.t_ns)):
        if e.point is not None and e.point not in specs:
            specs[e.point] = PointSpec(e.point, e.workload, e.batch_size, e.power_limit)
    return [specs[p] for p in sorted(specs)]


@dataclass
class Throughput:
    """The steady trainer reports of one (host, GPU, point)."""

    samples_per_s: float | None
    reports: int
    devices: list[str]
    workload: str
    last_ns: int


def read_throughput(
    client: InfluxClient, study: str, host: str, since_ns: int = 0, sources: EventSources | None = None
) -> dict[tuple[str, str, int], Throughput]:
    """Mean ``samples_per_s`` of the steady reports per (host, GPU, point), with the ``device`` tags
    (reports from ``since_ns`` on: the study's first event; from the ``sources``, None: asked)."""
    answer = query_events(
        client,
        '"samples_per_s", "point"',
        "trainer",
        f'WHERE "probe" = {quote_string(study)} AND "phase" = \'steady\' AND "host" = {quote_string(host)} '
        f'AND time >= {int(since_ns)} GROUP BY "gpu", "device", "workload"',
        sources,
    )
    rates: dict[tuple[str, str, int], list[float]] = {}
    devices: dict[tuple[str, str, int], set[str]] = {}
    workloads: dict[tuple[str, str, int], str] = {}
    last: dict[tuple[str, str, int], int] = {}
    for s in answer:
        gpu, device = s.tags.get("gpu", ""), s.tags.get("device", "")
        for t, rate, point in zip(s.column("time"), s.column("samples_per_s"), s.column("point"), strict=True):
            p = _int(point)
            value = _float(rate)
            if p is None or value is None:
                continue
            key = (host, gpu, p)
            rates.setdefault(key, []).append(value)
            if device:
                devices.setdefault(key, set()).add(device)
            workloads.setdefault(key, s.tags.get("workload", ""))
            last[key] = max(last.get(key, 0), int(t))
    return {
        key: Throughput(
            samples_per_s=float(np.mean(values)) if values else None,
            reports=len(values),
            devices=sorted(devices.get(key, set())),
            workload=workloads.get(key, ""),
            last_ns=last[key],
        )
        for key, values in rates.items()
    }


def read_gpu_models(
    client: InfluxClient, hosts: Sequence[str], start_ns: int, end_ns: int
) -> dict[tuple[str, str], str]:
    """The ``model`` tag of each (host, GPU) that reported in the study's time range."""
    answer = client.query(
        f'SELECT last("temp_c") FROM "gpu" WHERE time >= {start_ns - EDGE_MARGIN_NS} AND '
        f'time <= {end_ns + EDGE_MARGIN_NS}{_host_filter(hosts)} GROUP BY "host", "gpu", "model"'
    )
    models: dict[tuple[str, str], str] = {}
    for s in answer:
        models.setdefault((s.tags.get("host", ""), s.tags.get("gpu", "")), s.tags.get("model", ""))
    if not models:  # GPUs that report no temperature still have a power reading
        answer = client.query(
            f'SELECT last("power_w") FROM "gpu" WHERE time >= {start_ns - EDGE_MARGIN_NS} AND '
            f'time <= {end_ns + EDGE_MARGIN_NS}{_host_filter(hosts)} GROUP BY "host", "gpu", "model"'
        )
        for s in answer:
            models.setdefault((s.tags.get("host", ""), s.tags.get("gpu", "")), s.tags.get("model", ""))
    return models


def spans(windows: Sequence[Window], margin_ns: int = EDGE_MARGIN_NS) -> list[tuple[int, int, list[Window]]]:
    """The windows of one host merged into spans of overlapping [start - margin, end + margin]."""
    out: list[tuple[int, int, list[Window]]] = []
    for w in sorted(windows, key=lambda w: w.start_ns):
        lo, hi = w.start_ns - margin_ns, w.end_ns + margin_ns
        if out and lo <= out[-1][1]:
            start, end, members = out[-1]
            out[-1] = (start, max(end, hi), [*members, w])
        else:
            out.append((lo, hi, [w]))
    return out


def reduce_host_windows(
    client: InfluxClient, host: str, windows: Sequence[Window]
) -> dict[tuple[str, int], tuple[WindowStats, float | None]]:
    """(GPU, point) -> the window's GPU statistics and mean proxy level, one span query at a time."""
    out: dict[tuple[str, int], tuple[WindowStats, float | None]] = {}
    fields = ", ".join(quote_identifier(f) for f in GPU_FIELDS)
    for lo, hi, members in spans(windows):
        where = f'"host" = {quote_string(host)} AND time >= {lo} AND time <= {hi}'
        samples: dict[str, tuple[np.ndarray, dict[str, np.ndarray]]] = {}
        # the agent's readings only: an aggregate point (``res`` tag) holds its interval's last energy
        # reading at the interval's start, up to a second early, and inside a probe the agent ships raw
        gpu_where = f"{where} AND {RAW_ONLY}"
        for s in client.query(f'SELECT {fields} FROM "gpu" WHERE {gpu_where} GROUP BY "gpu"'):
            t = np.array(s.column("time"), dtype=np.int64)
            order = np.argsort(t, kind="stable")
            samples[s.tags.get("gpu", "")] = (t[order], {f: _floats(s, f)[order] for f in GPU_FIELDS})
        levels: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for s in client.query(
            f'SELECT "est_dba" FROM "acoustic" WHERE "source" = \'proxy\' AND "gpu" != \'\' AND {where} GROUP BY "gpu"'
        ):
            levels[s.tags.get("gpu", "")] = (np.array(s.column("time"), dtype=np.int64), _floats(s, "est_dba"))
        for w in members:
            stats = EMPTY_STATS
            if w.gpu in samples:
                t, v = samples[w.gpu]
                stats = window_stats(
                    t,
                    w.start_ns,
                    w.end_ns,
                    power_w=v["power_w"],
                    energy_j=v["energy_j"],
                    temp_c=v["temp_c"],
                    power_limit_w=v["power_limit_w"],
                    sm_clock_mhz=v["sm_clock_mhz"],
                )
            level = None
            if w.gpu in levels:
                level = mean_inside(*levels[w.gpu], w.start_ns, w.end_ns)
            out[(w.gpu, w.point)] = (stats, level)
    return out


def _model_of(gpu_models: dict[tuple[str, str], str], host: str, gpu: str) -> str:
    if not gpu:
        return "cpu"
    return gpu_models.get((host, gpu)) or "unknown"


def load_study(
    client: InfluxClient, study: str, hosts: Sequence[str] = (), progress: Progress | None = None
) -> StudyData:
    """Everything a report needs, read and reduced; :class:`NoDataError` for an unknown study."""
    say = progress or _quiet
    database = client.settings.database
    sources = event_sources(client)
    say(f"reading the events of study {study!r} (database {database!r}, {sources.describe()})")
    events, nodes = read_events(client, study, hosts, sources)
    start_ns, end_ns = events[0].t_ns, events[-1].t_ns
    host_names = sorted(nodes)
    throughput: dict[tuple[str, str, int], Throughput] = {}
    for i, host in enumerate(host_names, 1):
        say(f"reading throughput (trainer): {host} ({i}/{len(host_names)})")
        throughput.update(read_throughput(client, study, host, start_ns - EDGE_MARGIN_NS, sources))
    if throughput:
        end_ns = max(end_ns, *(t.last_ns for t in throughput.values()))
    windows = steady_windows(events, {key: t.last_ns for key, t in throughput.items()})
    gpu_models = read_gpu_models(client, host_names, start_ns, end_ns)
    reduced: dict[tuple[str, str, int], tuple[WindowStats, float | None]] = {}
    windowed_hosts = sorted({w.host for w in windows})
    for i, host in enumerate(windowed_hosts, 1):
        mine = [w for w in windows if w.host == host]
        say(f"reading GPU samples of {len(mine)} steady windows: {host} ({i}/{len(windowed_hosts)})")
        for (gpu, point), value in reduce_host_windows(client, host, mine).items():
            reduced[(host, gpu, point)] = value
    specs = point_specs(events)
    spec_of = {p.point: p for p in specs}
    slowdowns: dict[tuple[str, str], float] = {}
    for ev in events:  # a GPU's threshold from any of its events, when the steady one lacks it
        if ev.temp_slowdown_c is not None:
            slowdowns.setdefault((ev.host, ev.gpu), ev.temp_slowdown_c)
    measurements = []
    for w in windows:
        spec = spec_of.get(w.point)
        node = nodes[w.host]
        rate = throughput.get((w.host, w.gpu, w.point))
        stats, level = reduced.get((w.host, w.gpu, w.point), (EMPTY_STATS, None))
        e = w.event
        measurements.append(
            Measurement(
                host=w.host,
                gpu=w.gpu,
                gpu_model=_model_of(gpu_models, w.host, w.gpu),
                point=w.point,
                workload=e.workload or (spec.workload if spec else "") or (rate.workload if rate else ""),
                batch_size=e.batch_size if e.batch_size is not None else (spec.batch_size if spec else None),
                power_limit=e.power_limit or (spec.power_limit if spec else ""),
                instance_type=node.instance_type,
                virt=node.virt,
                region=node.region,
                start_ns=w.start_ns,
                end_ns=w.end_ns,
                window_closed=w.closed,
                samples_per_s=rate.samples_per_s if rate else None,
                steady_samples=w.samples,
                trainer_reports=rate.reports if rate else 0,
                devices=rate.devices if rate else [],
                requested_limit_w=e.power_limit_w,
                slowdown_c=e.temp_slowdown_c if e.temp_slowdown_c is not None else slowdowns.get((w.host, w.gpu)),
                est_dba=level,
                stats=stats,
            )
        )
    refusals = [
        Refusal(
            t_ns=e.t_ns,
            host=e.host,
            gpu=e.gpu,
            gpu_model=_model_of(gpu_models, e.host, e.gpu),
            point=e.point,
            workload=e.workload or (spec_of[e.point].workload if e.point in spec_of else ""),
            batch_size=e.batch_size,
            power_limit=e.power_limit,
            message=e.message,
            instance_type=nodes[e.host].instance_type,
            virt=nodes[e.host].virt,
            region=nodes[e.host].region,
        )
        for e in events
        if e.kind == POINT_REFUSED
    ]
    # a point refused on a GPU after it started (its power limit could not be set when its warm-up
    # began) has a steady window at another limit: it is not a measurement of that point
    refused_keys = {(r.host, r.gpu, r.point) for r in refusals}
    measurements = [m for m in measurements if (m.host, m.gpu, m.point) not in refused_keys]
    missing = _missing(events, measurements, refusals)
    return StudyData(
        study=study,
        database=database,
        start_ns=start_ns,
        end_ns=end_ns,
        events=events,
        points=specs,
        nodes=[nodes[h] for h in host_names],
        gpu_models=gpu_models,
        measurements=measurements,
        refusals=refusals,
        missing=missing,
    )


def _missing(
    events: Sequence[Event], measurements: Sequence[Measurement], refusals: Sequence[Refusal]
) -> list[Missing]:
    """Measurements without figures, and points a GPU started but never ran steady (not refused)."""
    out = [Missing(m.host, m.gpu, m.point, "; ".join(m.problems)) for m in measurements if not m.has_data]
    measured = {(m.host, m.gpu, m.point) for m in measurements}
    refused = {(r.host, r.gpu, r.point) for r in refusals}
    seen: dict[tuple[str, str, int], Event] = {}
    for e in events:
        if e.point is not None and marks_a_phase(e.kind):
            seen[(e.host, e.gpu, e.point)] = e  # the last phase event
    for key in sorted(seen, key=lambda k: (k[0], gpu_order(k[1]), k[2])):
        if key in measured or key in refused:
            continue
        last = seen[key]
        ended = next(
            (
                e
                for e in events
                if e.host == key[0] and e.gpu == key[1] and e.t_ns >= last.t_ns and e.status in ("failed", "cancelled")
            ),
            last,
        )
        detail = " ".join(p for p in ("last event:", ended.kind, ended.phase, ended.status) if p)
        if ended.message:
            detail += f" ({ended.message})"
        out.append(Missing(key[0], key[1], key[2], f"never reached its steady phase; {detail}"))
    return out
