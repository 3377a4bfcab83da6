"""Part: model. What a model run reads from InfluxDB: the window (a probe and its phases, or a time range) and the
series of the ``gpu``, ``acoustic`` and ``trainer`` measurements in it (storage schema: docs/schema.md),
and the GPUs' own slowdown thresholds: the latest ``gpu_info`` point of each GPU at or before the
window's end.

A probe's window and phases come from the ``probe`` measurement (one point per phase change and
host: fields ``phase``, ``kind``, ``status``, ``workload``), or, where there are none, from the
``phase`` string of the ``trainer`` measurement. Several trainers on one node report the same phase
change at slightly different times; the earliest counts.

The ``probe``, ``trainer`` and ``gpu_info`` points are read from the ``events`` retention policy as
well as the default one where the database has it (:mod:`gpuprobe.influx.eventreads`), so a probe
stays findable for as long as ``events`` keeps it (400 days by default), not only the raw policy's
7 days.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from gpuprobe.config import format_time_ns
from gpuprobe.errors import DataError
from gpuprobe.influx.client import InfluxClient
from gpuprobe.influx.eventreads import EventSources, event_sources, query_events
from gpuprobe.influx.influxql import Series, quote_identifier, quote_string
from gpuprobe.wire.vocabulary import marks_a_phase

GPU_FIELDS = (
    "temp_c",
    "power_w",
    "power_instant_w",
    "energy_j",
    "clock_event_reasons",
    "power_limit_w",
    "util_pct",
    "fan_pct",
    "mem_temp_c",
)


class NoDataError(DataError, LookupError):
    """The probe or time range has no data (the message says what was looked for)."""


@dataclass(frozen=True)
class Phase:
    name: str
    start_ns: int
    end_ns: int


@dataclass
class Window:
    """What is analysed: a probe (with per-host phases) or a plain time range."""

    label: str  # the probe id, or range-<start>-<end> (the `probe` tag of written `model` points)
    probe: str | None
    start_ns: int
    end_ns: int
    hosts: list[str]
    phases: dict[str, list[Phase]] = field(default_factory=dict)
    workload: str | None = None
    status: str | None = None
    # (host, gpu) -> that GPU's trainer's own phases (its events: each trainer stamps its own, a few ms
    # apart from the others'), and the samples its steady phases processed (their ending events' count)
    gpu_phases: dict[tuple[str, str], list[Phase]] = field(default_factory=dict)
    steady_samples: dict[tuple[str, str], int] = field(default_factory=dict)

    def intervals(self, host: str, name: str) -> list[tuple[int, int]]:
        return [(p.start_ns, p.end_ns) for p in self.phases.get(host, []) if p.name == name]

    def gpu_intervals(self, host: str, gpu: str, name: str) -> list[tuple[int, int]]:
        """The GPU's own phase ``name`` where its trainer's events say, else the host's."""
        own = self.gpu_phases.get((host, gpu))
        if not own:
            return self.intervals(host, name)
        return [(p.start_ns, p.end_ns) for p in own if p.name == name]

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    def describe(self) -> str:
        """The window as a message names it: the probe, or the range in ISO times (never the label's raw seconds)."""
        if self.probe is not None:
            return f"probe {self.probe!r}"
        return f"{format_time_ns(self.start_ns)} to {format_time_ns(self.end_ns)}"


@dataclass
class GpuSeries:
    host: str
    gpu: str
    model: str
    uuid: str
    t_ns: np.ndarray
    values: dict[str, np.ndarray]  # GPU_FIELDS as float arrays, NaN where absent

    def field(self, name: str) -> np.ndarray:
        return self.values[name]

    def inside(self, start_ns: int, end_ns: int) -> GpuSeries:
        """The samples within [start, end]."""
        keep = (self.t_ns >= start_ns) & (self.t_ns <= end_ns)
        return GpuSeries(
            self.host, self.gpu, self.model, self.uuid, self.t_ns[keep], {k: v[keep] for k, v in self.values.items()}
        )

    def has(self, name: str, fraction: float = 0.5) -> bool:
        v = self.values[name]
        return len(v) > 0 and float(np.mean(np.isfinite(v))) >= fraction

    def power(self) -> tuple[np.ndarray, bool]:
        """The power to model with, and whether it is NVML's 1 s average (``power_w``).

        ``power_instant_w`` (field 186) where the agent stored it: the RC model and the energy
        integral want the instantaneous power. Otherwise ``power_w``, which is a 1 s average on
        Ampere (not GA100) and newer, so fits skip its first second after a step.
        """
        if self.has("power_instant_w"):
            return self.values["power_instant_w"], False
        return self.values["power_w"], True


@dataclass
class AcousticSeries:
    host: str
    gpu: str  # "" for the node level
    source: str  # "proxy" or "mic"
    t_ns: np.ndarray
    est_dba: np.ndarray
    laeq_db: np.ndarray


@dataclass
class TrainerSeries:
    host: str
    gpu: str
    workload: str
    t_ns: np.ndarray
    samples_per_s: np.ndarray
    phase: list[str]
    device: str = ""  # the `device` tag: cuda, cpu, sim (simulated throughput), or "" (an older trainer)


@dataclass(frozen=True)
class GpuInfoPoint:
    """The latest slowdown threshold a GPU reported (``gpu_info``) at or before the window's end."""

    host: str
    gpu: str
    uuid: str
    time_ns: int
    temp_slowdown_c: float


@dataclass
class Dataset:
    window: Window
    gpus: list[GpuSeries]
    acoustic: list[AcousticSeries]
    trainer: list[TrainerSeries]
    gpu_info: list[GpuInfoPoint] = field(default_factory=list)

    def reported_slowdown_c(self, host: str, gpu: str, uuid: str) -> float | None:
        """The slowdown threshold the GPU itself reported, or None: its latest ``gpu_info`` point by
        uuid, else (no point of that uuid on the host, or no uuid) by host and index."""
        mine = [p for p in self.gpu_info if p.host == host]
        matches = [p for p in mine if uuid and p.uuid == uuid] or [p for p in mine if p.gpu == gpu]
        if not matches:
            return None
        return max(matches, key=lambda p: p.time_ns).temp_slowdown_c

    def node_power(self, host: str, t_ns: np.ndarray, advance_s: float = 0.0) -> tuple[np.ndarray | None, int]:
        """The summed power of the host's GPUs at the times ``t_ns`` and how many GPUs it sums.

        Each GPU's power (:meth:`GpuSeries.power`; its 1 s average read ``advance_s`` later, as the
        thermal fit reads it) is interpolated linearly at ``t_ns`` over its finite samples and held
        beyond its first and last; a GPU without power is left out. None when the host has no power.
        """
        total = np.zeros(len(t_ns))
        count = 0
        for g in self.gpus:
            if g.host != host:
                continue
            power, is_average = g.power()
            ok = np.isfinite(power)
            if ok.sum() < 2:
                continue
            t = g.t_ns[ok].astype(np.float64) - (advance_s * 1e9 if is_average else 0.0)
            total += np.interp(t_ns.astype(np.float64), t, power[ok])
            count += 1
        return (total if count else None), count


def hosts_note(hosts: Sequence[str], source: str = "--hosts") -> str:
    """What a no-data message adds when the search was limited to some hosts: which, and by what."""
    return f" on hosts {', '.join(hosts)} ({source})" if hosts else ""


def _host_filter(hosts: Sequence[str]) -> str:
    if not hosts:
        return ""
    return " AND (" + " OR ".join(f'"host" = {quote_string(h)}' for h in hosts) + ")"


def _time_filter(start_ns: int, end_ns: int) -> str:
    return f"time >= {int(start_ns)} AND time <= {int(end_ns)}"


def _floats(series: Series, name: str) -> np.ndarray:
    return np.array([math.nan if v is None or isinstance(v, str | bool) else float(v) for v in series.column(name)])


def _phases_from_points(points: list[tuple[int, str]], end_ns: int) -> list[Phase]:
    points.sort()
    collapsed: list[tuple[int, str]] = []
    for t, name in points:
        if collapsed and collapsed[-1][1] == name:
            continue
        collapsed.append((t, name))
    phases = []
    for i, (t, name) in enumerate(collapsed):
        if name in ("done", "pending", ""):
            continue
        stop = collapsed[i + 1][0] if i + 1 < len(collapsed) else end_ns
        phases.append(Phase(name, t, stop))
    return phases


def find_probe(
    client: InfluxClient, probe: str, hosts: Sequence[str] = (), sources: EventSources | None = None
) -> Window:
    """The probe's window and per-host phases (``probe`` points, else ``trainer`` phases), from the
    ``events`` policy and the default one (``sources``; None: asked)."""
    sources = event_sources(client) if sources is None else sources
    where = f'"probe" = {quote_string(probe)}' + _host_filter(hosts)
    answer = query_events(
        client,
        '"phase", "kind", "status", "workload", "gpu", "steady_samples"',
        "probe",
        f'WHERE {where} GROUP BY "host"',
        sources,
    )
    per_host: dict[str, list[tuple[int, str]]] = {}
    per_gpu: dict[tuple[str, str], list[tuple[int, str]]] = {}
    counts: dict[tuple[str, str], list[int]] = {}
    workload = status = None
    times: list[int] = []
    for s in answer:
        host = s.tags.get("host", "")
        for t, phase, kind, st, wl, gpu, count in zip(
            s.column("time"),
            s.column("phase"),
            s.column("kind"),
            s.column("status"),
            s.column("workload"),
            s.column("gpu"),
            s.column("steady_samples"),
            strict=True,
        ):
            times.append(int(t))
            if not marks_a_phase(kind):
                continue  # stamped with the phase the trainer was in, after it ended: no phase of its own
            per_host.setdefault(host, []).append((int(t), str(phase or "")))
            if gpu is not None and gpu != "":
                key = (host, str(gpu))
                per_gpu.setdefault(key, []).append((int(t), str(phase or "")))
                if isinstance(count, int | float) and not isinstance(count, bool):
                    counts.setdefault(key, []).append(int(count))
            workload = workload or wl
            status = st or status
    source = "probe"
    if not per_host:
        answer = query_events(
            client, '"phase", "samples_per_s"', "trainer", f'WHERE {where} GROUP BY "host", "workload"', sources
        )
        for s in answer:
            host = s.tags.get("host", "")
            workload = workload or s.tags.get("workload")
            for t, phase in zip(s.column("time"), s.column("phase"), strict=True):
                times.append(int(t))
                per_host.setdefault(host, []).append((int(t), str(phase or "")))
        source = "trainer"
    if not per_host:
        database = client.settings.database
        raise NoDataError(
            f"no probe {probe!r}{hosts_note(hosts)} in database {database!r} (no `probe` or `trainer` points "
            f"in {sources.describe()})"
        )
    start, end = min(times), max(times)
    trainer_end = query_events(client, 'last("step")', "trainer", f"WHERE {where}", sources)
    for s in trainer_end:
        end = max([end, *(int(t) for t in s.column("time"))])
    gpu_phases = {key: _phases_from_points(points, end) for key, points in per_gpu.items()}
    # a GPU's count only where every steady phase of it has one (an older trainer sends none, a failed
    # run's last steady phase ends without an event): a partial sum would divide all the energy by part
    steady_samples = {
        key: sum(found)
        for key, found in counts.items()
        if len(found) == sum(p.name == "steady" for p in gpu_phases.get(key, []))
    }
    phases: dict[str, list[Phase]] = {}
    for host, points in per_host.items():
        if source == "trainer":
            # trainer points are progress reports: a phase starts at its first report
            points = sorted(points)
        phases[host] = _phases_from_points(points, end)
    return Window(
        label=probe,
        probe=probe,
        start_ns=start,
        end_ns=end,
        hosts=sorted(per_host),
        phases=phases,
        workload=str(workload) if workload else None,
        status=str(status) if status else None,
        gpu_phases=gpu_phases,
        steady_samples=steady_samples,
    )


def range_window(
    client: InfluxClient, start_ns: int, end_ns: int, hosts: Sequence[str] = (), hosts_source: str = "--hosts"
) -> Window:
    """A plain time range: hosts are those with ``gpu`` points in it (or ``hosts``, which a no-data
    message attributes to ``hosts_source``)."""
    if end_ns <= start_ns:
        raise NoDataError(f"--to ({format_time_ns(end_ns)}) must be after --from ({format_time_ns(start_ns)})")
    answer = client.query(
        f'SELECT count("temp_c") FROM "gpu" WHERE {_time_filter(start_ns, end_ns)}{_host_filter(hosts)} GROUP BY "host"'
    )
    found = sorted({s.tags.get("host", "") for s in answer if s.values})
    if not found:
        database = client.settings.database
        raise NoDataError(
            f"no `gpu` points between {format_time_ns(start_ns)} and {format_time_ns(end_ns)}"
            f"{hosts_note(hosts, hosts_source)} in database {database!r}"
        )
    label = f"range-{start_ns // 10**9}-{end_ns // 10**9}"
    return Window(label=label, probe=None, start_ns=start_ns, end_ns=end_ns, hosts=found)


EDGE_MARGIN_NS = 10 * 10**9


def load(client: InfluxClient, window: Window, sources: EventSources | None = None) -> Dataset:
    """Every series the models need, for the window's hosts (``trainer`` and ``gpu_info`` from the
    ``events`` policy and the default one: ``sources``; None: asked).

    GPU series reach ``EDGE_MARGIN_NS`` beyond the window on both sides, so the energy counter can be
    interpolated exactly at the window's edges; :meth:`GpuSeries.inside` cuts them to the window.
    """
    sources = event_sources(client) if sources is None else sources
    where = _time_filter(window.start_ns, window.end_ns) + _host_filter(window.hosts)
    wide = _time_filter(window.start_ns - EDGE_MARGIN_NS, window.end_ns + EDGE_MARGIN_NS) + _host_filter(window.hosts)
    fields = ", ".join(quote_identifier(f) for f in GPU_FIELDS)
    gpus = []
    for s in client.query(f'SELECT {fields} FROM "gpu" WHERE {wide} GROUP BY "host", "gpu", "model", "uuid"'):
        t = np.array(s.column("time"), dtype=np.int64)
        order = np.argsort(t, kind="stable")
        values = {f: _floats(s, f)[order] for f in GPU_FIELDS}
        gpus.append(
            GpuSeries(
                host=s.tags.get("host", ""),
                gpu=s.tags.get("gpu", ""),
                model=s.tags.get("model", ""),
                uuid=s.tags.get("uuid", ""),
                t_ns=t[order],
                values=values,
            )
        )
    if not gpus:
        raise NoDataError(
            f"no `gpu` points for {window.describe()} on hosts {', '.join(window.hosts) or 'any'} in database "
            f"{client.settings.database!r}"
        )
    gpus.sort(key=lambda g: (g.host, _index_key(g.gpu)))
    acoustic = []
    for s in client.query(
        f'SELECT "est_dba", "laeq_db" FROM "acoustic" WHERE {where} GROUP BY "host", "gpu", "source"'
    ):
        t = np.array(s.column("time"), dtype=np.int64)
        acoustic.append(
            AcousticSeries(
                host=s.tags.get("host", ""),
                gpu=s.tags.get("gpu", ""),
                source=s.tags.get("source", ""),
                t_ns=t,
                est_dba=_floats(s, "est_dba"),
                laeq_db=_floats(s, "laeq_db"),
            )
        )
    trainer = []
    probe_filter = "" if window.probe is None else f'"probe" = {quote_string(window.probe)} AND '
    trainer_where = probe_filter + where
    for s in query_events(
        client,
        '"samples_per_s", "phase"',
        "trainer",
        f'WHERE {trainer_where} GROUP BY "host", "gpu", "workload", "device"',
        sources,
    ):
        trainer.append(
            TrainerSeries(
                host=s.tags.get("host", ""),
                gpu=s.tags.get("gpu", ""),
                workload=s.tags.get("workload", ""),
                t_ns=np.array(s.column("time"), dtype=np.int64),
                samples_per_s=_floats(s, "samples_per_s"),
                phase=[str(p or "") for p in s.column("phase")],
                device=s.tags.get("device", ""),
            )
        )
    gpu_info = load_gpu_info(client, window, sources)
    return Dataset(window=window, gpus=gpus, acoustic=acoustic, trainer=trainer, gpu_info=gpu_info)


def load_gpu_info(client: InfluxClient, window: Window, sources: EventSources | None = None) -> list[GpuInfoPoint]:
    """Each GPU's latest reported slowdown threshold (``gpu_info``) in or before the window (a point
    per policy that has one: :meth:`Dataset.reported_slowdown_c` takes the latest)."""
    where = f"time <= {int(window.end_ns)}" + _host_filter(window.hosts)
    out = []
    answer = query_events(
        client,
        'last("temp_slowdown_c") AS "temp_slowdown_c"',
        "gpu_info",
        f'WHERE {where} GROUP BY "host", "gpu", "uuid"',
        sources,
    )
    for s in answer:
        for t, value in zip(s.column("time"), _floats(s, "temp_slowdown_c"), strict=True):
            if math.isfinite(value):
                out.append(
                    GpuInfoPoint(
                        host=s.tags.get("host", ""),
                        gpu=s.tags.get("gpu", ""),
                        uuid=s.tags.get("uuid", ""),
                        time_ns=int(t),
                        temp_slowdown_c=float(value),
                    )
                )
    return out


def _index_key(gpu: str) -> tuple[int, str]:
    return (int(gpu), "") if gpu.isdigit() else (1 << 30, gpu)
