"""Part: importer. The import: rows of the files → ``gpu`` points → InfluxDB in batches, and the summary.

Each point carries the tags of docs/schema.md's ``gpu`` measurement (``host``, ``gpu``, ``uuid`` when
known, ``model``, ``cluster`` when given) plus ``source=import``, so imported data can always be told
from what agents sent (``WHERE "source" = 'import'``). Lines are written with
:func:`gpuprobe.influx.lineprotocol.encode_line` and sent through :class:`gpuprobe.influx.client.InfluxClient`
(v1 ``/write``, ns precision) in batches of ``batch_lines``.

**Frozen logs.** When the driver hangs, nvidia-smi keeps printing the last readings with new
timestamps. But constant readings while the timestamps advance are usually data: a quiet idle GPU
logged in whole watts and degrees reads the same for minutes. So per GPU, a stretch of consecutive
rows whose every cell but the time (the imported columns and the others, counters included) is
identical to the row that began it, lasting at least ``freeze_after_s``, is

- a **frozen stretch** only when the rows show that the logger is stale: the GPU is busy
  (``util_pct`` above 0: under load the readings move from second to second), or an energy counter
  (``energy_j``) stands still while the GPU draws power. It is reported with its time range, its first
  row imported (it was a real reading) and the repeats not;
- otherwise a **steady stretch**: imported whole, and counted in the summary.

A shorter stretch is imported as it is.

**Bad rows** (a wrong number of columns, a timestamp or value that cannot be read, a row without any
value, a second row of one GPU with the timestamp of its previous row) are counted by reason with the
first line numbers and skipped; they never stop the import.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from gpuprobe.importer.formats import Bad, FieldValue, ReadOptions, Row, Source, open_source
from gpuprobe.importer.progress import Progress
from gpuprobe.influx.lineprotocol import field_text, series_prefix
from gpuprobe.influx.settings import InfluxSettings

MEASUREMENT = "gpu"
SOURCE_TAG = ("source", "import")
FIRST_LINES_SHOWN = 5
IGNORED_SHOWN = 12  # amd-smi has 90 other columns per GPU


@dataclass(frozen=True)
class ImportSettings:
    """One import: the files, what they do not say themselves, and where the points go."""

    files: tuple[Path, ...]
    read: ReadOptions
    cluster: str = ""
    freeze_after_s: float = 60.0  # 0: no freeze detection
    dry_run: bool = False
    influx: InfluxSettings = field(default_factory=InfluxSettings)
    batch_lines: int = 5000


@dataclass
class ReasonCount:
    count: int = 0
    where: list[str] = field(default_factory=list)  # the first few "file:line"


@dataclass
class FrozenStretch:
    path: Path
    host: str
    gpu: str
    first_line: int
    last_line: int
    start_ns: int
    end_ns: int
    repeated_rows: int  # not imported (frozen) or imported (steady)


@dataclass
class SeriesStats:
    host: str
    gpu: str
    uuid: str
    model: str
    first_ns: int
    last_ns: int
    points: int = 0


@dataclass
class FileReport:
    path: Path
    kind: str
    rows: int = 0
    points: int = 0
    bad: int = 0
    frozen_rows: int = 0
    ignored: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class ImportReport:
    """What an import read, wrote and skipped; :meth:`render` is the summary the command prints."""

    dry_run: bool
    destination: str
    files: list[FileReport] = field(default_factory=list)
    bad: dict[str, ReasonCount] = field(default_factory=dict)
    frozen: list[FrozenStretch] = field(default_factory=list)
    steady: list[FrozenStretch] = field(default_factory=list)  # identical rows at idle: data, imported
    bad_values: dict[str, ReasonCount] = field(default_factory=dict)  # values left out of imported rows
    series: dict[tuple[str, str], SeriesStats] = field(default_factory=dict)
    freeze_after_s: float = 60.0
    lines_sent: int = 0  # line-protocol lines InfluxDB accepted (0 in a dry run)

    @property
    def rows_read(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def points(self) -> int:
        return sum(f.points for f in self.files)

    @property
    def bad_rows(self) -> int:
        return sum(r.count for r in self.bad.values())

    @property
    def frozen_rows(self) -> int:
        return sum(s.repeated_rows for s in self.frozen)

    @property
    def steady_rows(self) -> int:
        return sum(s.repeated_rows for s in self.steady)

    @property
    def bad_value_count(self) -> int:
        return sum(r.count for r in self.bad_values.values())

    def render(self) -> str:
        verb = "would be written (dry run: nothing written)" if self.dry_run else f"written to {self.destination}"
        # GPU rows: a file row of amd-smi holds one per GPU
        rows = self.points + self.bad_rows + self.frozen_rows
        out = [
            f"rows read: {self.rows_read} in {len(self.files)} file(s); points {verb}: {self.points}",
            f"GPU rows not imported: {self.bad_rows + self.frozen_rows} of {rows} ({self.bad_rows} bad, "
            f"{self.frozen_rows} repeats in frozen stretches; below)",
        ]
        for report in self.files:
            out.append(
                f"  {report.path}: {report.kind}, {report.rows} rows, {report.points} points, "
                f"{report.bad} bad, {report.frozen_rows} frozen"
            )
            for note in report.notes:
                out.append(f"    {note}")
            if report.ignored:
                names = ", ".join(report.ignored[:IGNORED_SHOWN])
                more = f", ... ({len(report.ignored)} in all)" if len(report.ignored) > IGNORED_SHOWN else ""
                out.append(f"    columns not imported (not in the gpu schema): {names}{more}")
        out.append(f"bad rows (skipped): {self.bad_rows}")
        for reason, count in sorted(self.bad.items(), key=lambda item: (-item[1].count, item[0])):
            more = ", ..." if count.count > len(count.where) else ""
            out.append(f"  {reason}: {count.count} (lines {', '.join(count.where)}{more})")
        out.append(f"bad values (left out, the rest of the row imported): {self.bad_value_count}")
        for reason, count in sorted(self.bad_values.items(), key=lambda item: (-item[1].count, item[0])):
            more = ", ..." if count.count > len(count.where) else ""
            out.append(f"  {reason}: {count.count} (lines {', '.join(count.where)}{more})")
        rule = (
            "off"
            if self.freeze_after_s <= 0
            else f"identical rows for {self.freeze_after_s:g} s or more under load or with a standing energy "
            "counter; first row imported, repeats not"
        )
        out.append(f"frozen stretches ({rule}): {len(self.frozen)}, {self.frozen_rows} rows not imported")
        out += [_stretch_line(stretch) for stretch in self.frozen]
        if self.freeze_after_s > 0:
            out.append(
                f"steady stretches (identical rows for {self.freeze_after_s:g} s or more at idle: readings, "
                f"imported): {len(self.steady)}, {self.steady_rows} rows"
            )
            shown = sorted(self.steady, key=lambda s: s.start_ns - s.end_ns)[:FIRST_LINES_SHOWN]
            out += [_stretch_line(stretch) for stretch in shown]
            if len(self.steady) > len(shown):
                out.append(f"  ... and {len(self.steady) - len(shown)} shorter")
        out.append(f"GPUs: {len(self.series)}")
        for stats in sorted(self.series.values(), key=lambda s: (s.host, int(s.gpu))):
            labels = " ".join(
                part for part in (f"uuid {stats.uuid}" if stats.uuid else "", stats.model and repr(stats.model)) if part
            )
            out.append(
                f"  host {stats.host} gpu {stats.gpu}{' ' + labels if labels else ''}: {stats.points} points, "
                f"{format_ns(stats.first_ns)} .. {format_ns(stats.last_ns)}"
            )
        return "\n".join(out)


def _stretch_line(stretch: FrozenStretch) -> str:
    return (
        f"  host {stretch.host} gpu {stretch.gpu}: {format_ns(stretch.start_ns)} .. "
        f"{format_ns(stretch.end_ns)} ({(stretch.end_ns - stretch.start_ns) / 1e9:g} s, "
        f"{stretch.repeated_rows} repeated rows, {stretch.path.name} lines "
        f"{stretch.first_line}-{stretch.last_line})"
    )


def stale(row: Row) -> bool:
    """Whether identical rows of this reading mean a stale logger rather than a steady GPU: a busy GPU's
    readings move from second to second, and an energy counter advances whenever power is drawn."""
    fields = row.fields
    return fields.get("util_pct", 0) > 0 or ("energy_j" in fields and fields.get("power_w", 0) > 0)


def format_ns(ns: int) -> str:
    """UTC, to the ms: ``2025-06-01T12:00:00.123Z``."""
    moment = datetime.fromtimestamp(ns // 1_000_000_000, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + f".{ns % 1_000_000_000 // 1_000_000:03d}Z"


@dataclass
class _Run:
    """Consecutive identical readings of one GPU: the row that began them and the repeats since."""

    first: Row
    signature: tuple[object, ...]
    repeats: list[tuple[int, int]] = field(default_factory=list)  # (line, time_ns)

    @property
    def last_ns(self) -> int:
        return self.repeats[-1][1] if self.repeats else self.first.time_ns


Sender = Callable[[list[str]], int]


class Importer:
    """Feeds the rows of each file through duplicate and freeze detection into batches of lines."""

    def __init__(self, settings: ImportSettings, send: Sender | None, progress: Progress | None = None) -> None:
        self.settings = settings
        self.send = send
        self.progress = progress
        self.report = ImportReport(
            dry_run=send is None,
            destination=f"{settings.influx.database}@{settings.influx.base_url}",
            freeze_after_s=settings.freeze_after_s,
        )
        self._freeze_ns = int(settings.freeze_after_s * 1e9) if settings.freeze_after_s > 0 else 0
        self._batch: list[str] = []
        self._prefixes: dict[tuple[str, str, str, str, str], str] = {}
        self._file: FileReport | None = None
        self._path = Path()

    def run(self, sources: list[Source]) -> ImportReport:
        for source in sources:
            self.feed(source)
        self.flush()
        return self.report

    def feed(self, source: Source) -> None:
        report = FileReport(source.path, source.kind, ignored=list(source.ignored), notes=list(source.notes))
        self.report.files.append(report)
        self._file, self._path = report, source.path
        progress = self.progress
        if progress is not None:
            progress.start(str(source.path), source.count_lines())
        runs: dict[tuple[str, str], _Run] = {}
        tick = 0
        last_line = -1
        for item in source.rows():
            if item.line != last_line:  # an amd-smi line holds a row of each GPU
                report.rows += 1
                last_line = item.line
            tick += 1
            if tick == 512 and progress is not None:
                progress.advance(tick)
                tick = 0
            if isinstance(item, Bad):
                self._bad(item.line, item.reason)
                continue
            for reason in item.bad_values:
                self._count(self.report.bad_values, item.line, reason)
            key = (item.host, item.gpu)
            run = runs.get(key)
            if run is not None and item.time_ns == run.last_ns:
                self._bad(item.line, "duplicate timestamp for the same GPU (the first row is kept)")
                continue
            # every cell but the time: a counter or a column not imported that moves makes it a new reading
            cells: tuple[object, ...] = item.cells or tuple(sorted(item.fields.items()))
            signature = (cells, item.uuid, item.model)
            if run is not None and self._freeze_ns and signature == run.signature and item.time_ns > run.last_ns:
                run.repeats.append((item.line, item.time_ns))
                continue
            if run is not None:
                self._close(run)
            self._emit(item, item.time_ns)
            runs[key] = _Run(item, signature)
        for run in runs.values():
            self._close(run)
        if progress is not None:
            progress.advance(tick)
            progress.finish()

    def _bad(self, line: int, reason: str) -> None:
        self._count(self.report.bad, line, reason)
        assert self._file is not None
        self._file.bad += 1

    def _count(self, counts: dict[str, ReasonCount], line: int, reason: str) -> None:
        count = counts.setdefault(reason, ReasonCount())
        count.count += 1
        if len(count.where) < FIRST_LINES_SHOWN:
            count.where.append(f"{self._path.name}:{line}")

    def _close(self, run: _Run) -> None:
        if not run.repeats:
            return
        first = run.first
        if self._freeze_ns and run.last_ns - first.time_ns >= self._freeze_ns:
            stretch = FrozenStretch(
                self._path, first.host, first.gpu, first.line, run.repeats[-1][0], first.time_ns, run.last_ns,
                len(run.repeats),
            )  # fmt: skip
            if stale(first):
                self.report.frozen.append(stretch)
                assert self._file is not None
                self._file.frozen_rows += len(run.repeats)
                return
            self.report.steady.append(stretch)
        for _, time_ns in run.repeats:
            self._emit(first, time_ns)

    def _emit(self, row: Row, time_ns: int) -> None:
        tags = (row.host, row.gpu, row.uuid, row.model, row.vendor)
        prefix = self._prefixes.get(tags)
        if prefix is None:
            prefix = self._prefixes[tags] = series_prefix(
                MEASUREMENT,
                {
                    "host": row.host,
                    "gpu": row.gpu,
                    "uuid": row.uuid,
                    "model": row.model,
                    "vendor": row.vendor,
                    "cluster": self.settings.cluster,
                    SOURCE_TAG[0]: SOURCE_TAG[1],
                },
            )
        self._batch.append(f"{prefix}{_fields_text(row.fields)} {time_ns}")
        assert self._file is not None
        self._file.points += 1
        stats = self.report.series.get((row.host, row.gpu))
        if stats is None:
            stats = self.report.series[(row.host, row.gpu)] = SeriesStats(
                row.host, row.gpu, row.uuid, row.model, time_ns, time_ns
            )
        stats.points += 1
        stats.first_ns = min(stats.first_ns, time_ns)
        stats.last_ns = max(stats.last_ns, time_ns)
        stats.uuid = stats.uuid or row.uuid
        stats.model = stats.model or row.model
        if len(self._batch) >= self.settings.batch_lines:
            self.flush()

    def flush(self) -> None:
        """Sends the open batch (a dry run only drops it)."""
        if self._batch and self.send is not None:
            self.report.lines_sent += self.send(self._batch)
        self._batch = []


def _fields_text(fields: dict[str, FieldValue]) -> str:
    # field names are plain [a-z_] (docs/schema.md): nothing to escape
    return ",".join(f"{name}={field_text(value)}" for name, value in fields.items())


def open_sources(settings: ImportSettings) -> list[Source]:
    """Every file's format and columns, checked before anything is written (FormatError otherwise)."""
    return [open_source(path, settings.read) for path in settings.files]
