"""Part: importer. The formats ``gpuprobe import nvidia-smi`` reads, and how each value becomes a ``gpu`` field.

Five kinds of file, told apart by their first line (:func:`open_source`):

- the CSV of ``nvidia-smi --query-gpu=timestamp,index,… --format=csv[,nounits]``: a header such as
  ``timestamp, index, name, uuid, power.draw [W], temperature.gpu, …`` (with ``nounits`` the headers
  and the values carry no units), values such as ``250.12 W``, ``45 %``, ``1980 MHz``, ``[N/A]``;
- the output of ``nvidia-smi dmon`` (``# gpu pwr gtemp mtemp sm mem enc dec mclk pclk``, a units line,
  optional ``Date``/``Time`` columns from ``-o DT`` or ``-o T``; columns apart by spaces or commas);
- ``nvidia-smi dmon`` output WITHOUT its header lines (``--format csv,noheader`` or a logger that cut
  them): a first line such as ``20250724, 04:47:16, 0, 63, 36, 42, …`` (``-o DT``) or
  ``04:47:16 0 63 …`` (``-o T``); the columns are ``--dmon-columns`` (by default the order of
  ``nvidia-smi dmon -o DT -s pucm`` on current drivers, :data:`DMON_DEFAULT_COLUMNS`);
- ``amd-smi metric --csv`` (one row per timestamp, a block of columns per GPU, each block starting at
  its ``gpu`` column: ``Timestamp,gpu,socket_power,…,hotspot,mem,gpu,socket_power,…``);
- any other CSV, with ``--columns KEY=HEADER[:UNIT],…`` naming the column of each schema field.

Every value is converted to the unit of its field exactly: a number in the field's unit is read as
written (the nearest double, which line protocol writes back as the same text), any other unit by an
exact decimal product (MiB → bytes: times 1 048 576, mW → W: times 0.001, GHz → MHz: times 1000). Integer fields
(bytes, MHz, the clock-event bitmask) must come out whole; a byte count with a fraction is rounded to
the nearest byte. ``[N/A]``, ``[Not Supported]``, ``N/A``, ``-`` and empty cells leave the field out of
the point (the schema: a field the GPU does not report is absent, never zero). A value that no GPU can
report (a percentage outside 0-100, such as a dmon ``sm`` of 1047011272; a temperature or a power
beyond any sensor's range) is a bad value: that field is left out of the point, the rest of the row is
imported, and the summary counts it.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta, tzinfo
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TextIO

from gpuprobe.errors import DataError
from gpuprobe.fields import GPU_FIELDS, GpuField
from gpuprobe.importer.timeparse import NS_PER_S, TimeReader, parse_datetime_ns, wall_time_ns
from gpuprobe.influx.storable import INT64_MAX, tag_value_problem

FieldValue = float | int


#: The ``gpu`` fields read at every tick (the field catalogue's), the ones nvidia-smi's logs hold, with
#: their InfluxDB types: an integer written where the agents write a float would make InfluxDB refuse
#: the points of one of them (field type conflict).
FIELDS: dict[str, GpuField] = {f.name: f for f in GPU_FIELDS if not f.health}

#: ``--columns`` keys that are not fields: the point's time and its tags.
TAG_KEYS = ("time", "gpu", "uuid", "model", "host")


@dataclass(frozen=True)
class Unit:
    name: str
    dimension: str  # the unit of the fields it measures, as the field catalogue writes it
    factor: Decimal  # value in the dimension's base unit = number · factor


def _units() -> dict[str, Unit]:
    table: list[tuple[str, str, str]] = [
        ("%", "%", "1"),
        ("W", "W", "1"),
        ("mW", "W", "0.001"),
        ("kW", "W", "1000"),
        ("J", "J", "1"),
        ("mJ", "J", "0.001"),
        ("kJ", "J", "1000"),
        ("Wh", "J", "3600"),
        ("kWh", "J", "3600000"),
        ("C", "°C", "1"),
        ("°C", "°C", "1"),
        ("degC", "°C", "1"),
        ("Hz", "MHz", "0.000001"),
        ("kHz", "MHz", "0.001"),
        ("MHz", "MHz", "1"),
        ("GHz", "MHz", "1000"),
        ("B", "bytes", "1"),
        ("KiB", "bytes", "1024"),
        ("MiB", "bytes", "1048576"),
        ("GiB", "bytes", "1073741824"),
        ("TiB", "bytes", "1099511627776"),
        ("kB", "bytes", "1000"),
        ("MB", "bytes", "1000000"),
        ("GB", "bytes", "1000000000"),
        ("TB", "bytes", "1000000000000"),
        ("B/s", "bytes/s", "1"),
        ("KiB/s", "bytes/s", "1024"),
        ("MiB/s", "bytes/s", "1048576"),
        ("GiB/s", "bytes/s", "1073741824"),
        ("kB/s", "bytes/s", "1000"),
        ("MB/s", "bytes/s", "1000000"),
        ("GB/s", "bytes/s", "1000000000"),
    ]
    return {name: Unit(name, dimension, Decimal(factor)) for name, dimension, factor in table}


UNITS = _units()
_UNITS_FOLDED = {name.casefold(): unit for name, unit in UNITS.items()}
#: The unit a number without one is in, for each unit of the catalogue (gpuprobe/fields.py)
BASE_UNITS = {"%": UNITS["%"], "bytes": UNITS["B"], "W": UNITS["W"], "J": UNITS["J"], "°C": UNITS["C"],
              "MHz": UNITS["MHz"], "bytes/s": UNITS["B/s"], "bitmask": Unit("mask", "bitmask", Decimal(1))}  # fmt: skip


def find_unit(text: str) -> Unit | None:
    """The unit named ``text`` (``MiB``, ``W``, ``%``…; case is ignored where it is not ambiguous)."""
    name = text.strip()
    return UNITS.get(name) or _UNITS_FOLDED.get(name.casefold())


class BadRow(DataError):
    """A row that cannot be imported; ``reason`` is what the summary counts it under."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class FormatError(DataError, ValueError):
    """A file that is neither format, or a column mapping that does not fit it (nothing is imported)."""


_NOT_AVAILABLE = {"", "-", "n/a", "na", "not supported", "unknown", "unknown error", "none"}
_NUMBER_AND_UNIT = re.compile(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*(\S.*)?$")
_HEX = re.compile(r"^0[xX][0-9a-fA-F]+$")


def is_not_available(text: str) -> bool:
    """``[N/A]``, ``[Not Supported]``, ``[Unknown Error]``, ``N/A``, ``-``, empty: no reading."""
    value = text.strip()
    return (value.startswith("[") and value.endswith("]")) or value.casefold() in _NOT_AVAILABLE


def convert(text: str, spec: GpuField, unit: Unit) -> FieldValue | None:
    """One cell as the value of ``spec`` (None when not available); BadRow when it is not a value.

    A unit written after the number (``250 W``) must be one of the field's dimension and wins over the
    column's ``unit``."""
    value = text.strip()
    if is_not_available(value):
        return None
    if spec.unit == "bitmask" and _HEX.match(value):
        number = int(value, 16)
        if number > INT64_MAX:
            raise BadRow(f"{value} is beyond int64")
        return number
    match = _NUMBER_AND_UNIT.match(value)
    if not match:
        raise BadRow(f"not a number: {value[:40]!r}")
    digits, unit_text = match.group(1), match.group(2)
    if unit_text is not None:
        written = find_unit(unit_text)
        if written is None or written.dimension != spec.unit:
            raise BadRow(f"unit {unit_text[:20]!r} is not one of {spec.name}")
        unit = written
    if not spec.integer:
        number_f = float(digits) if unit.factor == 1 else float(Decimal(digits) * unit.factor)
        if number_f - number_f != 0.0:
            raise BadRow(f"{value[:40]!r} is not finite")
        return number_f
    exact = Decimal(digits) * unit.factor
    try:
        whole = exact.to_integral_value()
    except InvalidOperation:
        raise BadRow(f"{value[:40]!r} is not finite") from None
    if whole != exact and spec.unit != "bytes":
        raise BadRow(f"{value[:40]!r} is not a whole number of {spec.unit}")
    number = int(whole)
    if not -INT64_MAX - 1 <= number <= INT64_MAX:
        raise BadRow(f"{value[:40]!r} is beyond int64")
    return number


@dataclass(slots=True)
class Row:
    """One reading of one GPU, ready to become a point."""

    line: int
    time_ns: int
    gpu: str
    uuid: str
    model: str
    host: str
    fields: dict[str, FieldValue]
    # every cell of the row but its time, as written (the imported ones and the others, counters
    # included): rows are stale repeats only when all of it is the same (run.py, frozen logs)
    cells: tuple[str, ...] = ()
    vendor: str = ""
    bad_values: list[str] = field(default_factory=list)  # reasons of the values left out


#: Ranges outside which a value is garbage, not a reading (by the dimension of the field's unit).
PLAUSIBLE: dict[str, tuple[float, float]] = {"%": (0.0, 100.0), "°C": (-273.15, 1000.0), "W": (0.0, 1e6)}


def plausible(spec: GpuField, value: FieldValue) -> bool:
    bounds = PLAUSIBLE.get(spec.unit)
    return bounds is None or bounds[0] <= value <= bounds[1]


@dataclass(slots=True)
class Bad:
    line: int
    reason: str


@dataclass(frozen=True)
class ReadOptions:
    """What the files do not say themselves (from the command's options)."""

    zone: tzinfo
    time_format: str = "auto"
    columns: tuple[tuple[str, str, Unit | None], ...] = ()
    host: str = ""
    gpu_model: str = ""
    dmon_date: tuple[int, int, int] | None = None
    dmon_start_ns: int | None = None
    dmon_interval_ns: int = NS_PER_S
    dmon_columns: tuple[str, ...] = ()  # the columns of dmon output without a header (empty: the default)
    expect: str = "nvidia"  # the command: "nvidia" (import nvidia-smi) or "amd" (import amd-smi)


@dataclass(frozen=True)
class _Cell:
    """Where one field comes from: the column position, the field and the column's unit."""

    index: int
    header: str
    spec: GpuField
    unit: Unit


def _row_values(cells: Sequence[str], columns: Iterable[_Cell]) -> tuple[dict[str, FieldValue], list[str]]:
    """A row's values (its not-available cells left out) and why its out-of-range ones were skipped;
    :class:`BadRow` when a cell cannot be read at all."""
    values: dict[str, FieldValue] = {}
    bad_values: list[str] = []
    for cell in columns:
        try:
            value = convert(cells[cell.index], cell.spec, cell.unit)
        except BadRow:
            raise BadRow(f"bad value in {cell.header}") from None
        if value is None:
            continue
        if plausible(cell.spec, value):
            values[cell.spec.name] = value
        else:
            bad_values.append(f"out-of-range value in {cell.header}")
    return values, bad_values


def _no_values(bad_values: list[str]) -> str:
    """Why a row without a single value is refused."""
    return bad_values[0] if bad_values else "no values (all not available)"


@dataclass
class Plan:
    """How the cells of one row become a :class:`Row`."""

    width: int
    time: int | None
    time_reader: Callable[[str], int] | None
    gpu: int | None
    uuid: int | None
    model: int | None
    host: int | None
    cells: list[_Cell]
    ignored: list[str] = field(default_factory=list)


def parse_columns(items: Sequence[str]) -> tuple[tuple[str, str, Unit | None], ...]:
    """``--columns`` (``KEY=HEADER[:UNIT]``, repeated or comma-separated) as (key, header, unit)."""
    mapping: list[tuple[str, str, Unit | None]] = []
    seen: set[str] = set()
    for item in (part for entry in items for part in entry.split(",")):
        if not item.strip():
            continue
        key, sep, header = item.partition("=")
        key, header = key.strip(), header.strip()
        if not sep or not key or not header:
            raise ValueError(f"--columns: {item.strip()!r} is not KEY=HEADER")
        if key not in TAG_KEYS and key not in FIELDS:
            known = ", ".join([*TAG_KEYS, *FIELDS])
            raise ValueError(f"--columns: unknown key {key!r} (keys: {known})")
        if key in seen:
            raise ValueError(f"--columns: {key} is mapped twice")
        seen.add(key)
        unit: Unit | None = None
        base, colon, unit_text = header.rpartition(":")
        if colon and base.strip() and find_unit(unit_text) is not None:
            header, unit = base.strip(), find_unit(unit_text)
        if unit is not None:
            if key not in FIELDS:
                raise ValueError(f"--columns: {key} takes no unit")
            if unit.dimension != FIELDS[key].unit:
                raise ValueError(f"--columns: {unit.name} is not a unit of {key}")
        mapping.append((key, header, unit))
    if mapping and "time" not in seen:
        raise ValueError("--columns needs the time column: time=HEADER")
    if mapping and not seen & FIELDS.keys():
        raise ValueError("--columns maps no gpu field (temp_c=HEADER, power_w=HEADER, ...; docs/schema.md)")
    return tuple(mapping)


# nvidia-smi --query-gpu properties (nvidia-smi --help-query-gpu) and the field each one is; the first
# property of a group present in the file is taken (power.draw before its alias power.draw.average, the
# enforced power limit before the software one), and the unit is nvidia-smi's when the header has none.
_NVSMI: tuple[tuple[tuple[str, ...], str, str | None], ...] = (
    (("timestamp",), "time", None),
    (("index",), "gpu", None),
    (("uuid", "gpu_uuid"), "uuid", None),
    (("name", "gpu_name"), "model", None),
    (("utilization.gpu",), "util_pct", "%"),
    (("utilization.memory",), "mem_util_pct", "%"),
    (("memory.used",), "mem_used_bytes", "MiB"),
    (("memory.total",), "mem_total_bytes", "MiB"),
    (("power.draw", "power.draw.average"), "power_w", "W"),
    (("power.draw.instant",), "power_instant_w", "W"),
    (("temperature.gpu",), "temp_c", "C"),
    (("temperature.memory",), "mem_temp_c", "C"),
    (("fan.speed",), "fan_pct", "%"),
    (("clocks.sm", "clocks.current.sm"), "sm_clock_mhz", "MHz"),
    (("clocks.mem", "clocks.current.memory"), "mem_clock_mhz", "MHz"),
    (("enforced.power.limit", "power.limit"), "power_limit_w", "W"),
    (("clocks_event_reasons.active", "clocks_throttle_reasons.active"), "clock_event_reasons", "mask"),
)

# nvidia-smi dmon columns (-s pucm; the others, enc/dec/jpg/ofa, violations, ECC, PCIe, are not in the
# schema). pclk is the graphics clock, which NVML reports equal to the SM clock; fb is in MiB (dmon
# labels it MB).
_DMON: dict[str, tuple[str, str]] = {
    "pwr": ("power_w", "W"),
    "gtemp": ("temp_c", "C"),
    "mtemp": ("mem_temp_c", "C"),
    "sm": ("util_pct", "%"),
    "mem": ("mem_util_pct", "%"),
    "mclk": ("mem_clock_mhz", "MHz"),
    "pclk": ("sm_clock_mhz", "MHz"),
    "fb": ("mem_used_bytes", "MiB"),
}

#: The columns of ``nvidia-smi dmon -o DT`` (default ``-s pucm``) on current drivers (with ``jpg`` and
#: ``ofa``), the default of ``--dmon-columns`` for dmon output without a header; further columns of
#: such a file (``-s`` options beyond pucm) are unnamed and not imported. An older driver writes no
#: ``jpg``/``ofa``: give its order with ``--dmon-columns``.
DMON_DEFAULT_COLUMNS = ("date", "time", "gpu", "pwr", "gtemp", "mtemp", "sm", "mem", "enc", "dec", "jpg", "ofa",
                        "mclk", "pclk")  # fmt: skip
_DMON_SPLIT = re.compile(r"[,\s]+")
_DMON_DATE = re.compile(r"\d{8}")
_DMON_CLOCK = re.compile(r"\d{1,2}:\d{2}:\d{2}")

# amd-smi metric --csv: the columns of one GPU's block (the block starts at its `gpu` column) and the
# field each is; the first name of a group present in the block is taken (amd-smi's names changed
# between ROCm releases: `socket_power` or `power_socket_power`...). `hotspot` is the junction
# temperature, what the model fits (MI300 boards report no `edge`); gfx_0/mem_0 are the first XCD's
# graphics and the first memory clock. `throttle_status` is not imported: it is not NVML's
# clock-event bitmask (docs/schema.md), and these logs write N/A.
_AMD: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("socket_power", "power_socket_power", "current_socket_power"), "power_w", "W"),
    (("hotspot", "temperature_hotspot", "edge", "temperature_edge"), "temp_c", "C"),
    (("mem", "temperature_mem"), "mem_temp_c", "C"),
    (("gfx_activity", "usage_gfx_activity"), "util_pct", "%"),
    (("umc_activity", "usage_umc_activity"), "mem_util_pct", "%"),
    (("gfx_0_clk", "clock_gfx_0_clk"), "sm_clock_mhz", "MHz"),
    (("mem_0_clk", "clock_mem_0_clk"), "mem_clock_mhz", "MHz"),
)
_AMD_NAMES = {name for aliases, _, _ in _AMD for name in aliases}
_AMD_TIME = ("timestamp", "time", "date")


@dataclass(frozen=True)
class _AmdBlock:
    """The columns of one GPU in an amd-smi row: where its gpu index is, its fields, its whole span."""

    gpu: int
    start: int
    end: int  # one past its last column
    cells: list[_Cell]


_HEADER_UNIT = re.compile(r"^(.*?)\s*\[([^\]]*)\]\s*$")


def _split_header(cell: str) -> tuple[str, str | None]:
    """``power.draw [W]`` → (``power.draw``, ``W``); ``temperature.gpu`` → (``temperature.gpu``, None)."""
    match = _HEADER_UNIT.match(cell.strip())
    if match:
        return match.group(1).strip(), match.group(2).strip()
    return cell.strip(), None


class Source:
    """One file: its format (read from the header when opened) and its rows."""

    def __init__(self, path: Path, options: ReadOptions) -> None:
        self.path = path
        self.options = options
        self.kind = ""
        self.ignored: list[str] = []
        self.notes: list[str] = []
        self._plan: Plan | None = None
        self._dmon: list[str] = []
        self._amd: list[_AmdBlock] = []
        self._amd_time: int | None = None
        self._width = 0
        self._header_line = 0
        self._header_cells: list[str] = []
        self._delimiter = ","
        self._open()

    # --- the header ----------------------------------------------------------------------------

    def _first_line(self) -> tuple[int, str]:
        with self.path.open(encoding="utf-8", errors="replace", newline="") as f:
            for number, line in enumerate(f, 1):
                if line.strip():
                    return number, line.lstrip("\ufeff").rstrip("\r\n")
        raise FormatError(f"{self.path}: the file is empty")

    def _open(self) -> None:
        number, line = self._first_line()
        self._header_line = number
        stripped = line.strip()
        if stripped.startswith("#") and "gpu" in _DMON_SPLIT.split(stripped.lstrip("#").lower()):
            if self.options.columns:
                raise FormatError(f"{self.path}: --columns maps CSV columns, but this is nvidia-smi dmon output")
            self._expect("nvidia", "nvidia-smi dmon output")
            self._open_dmon(stripped)
            return
        tokens = _DMON_SPLIT.split(stripped)
        if self.options.dmon_columns or _headerless_dmon(tokens):
            if self.options.columns:
                raise FormatError(f"{self.path}: --columns maps CSV columns, but this is nvidia-smi dmon output")
            self._expect("nvidia", "nvidia-smi dmon output")
            self._header_line = number - 1  # the first line is a row
            self._open_dmon_headerless(tokens)
            return
        self._delimiter = "\t" if "\t" in line and "," not in line else ";" if ";" in line and "," not in line else ","
        cells = next(csv.reader([line], delimiter=self._delimiter, skipinitialspace=True), [])
        self._header_cells = [cell.strip() for cell in cells]
        if not self.options.columns and self._is_amd(self._header_cells):
            self._expect("amd", "amd-smi metric --csv output")
            self._open_amd(self._header_cells)
            return
        if self.options.expect == "amd" and not self.options.columns:
            raise self._unknown_format(line, "no amd-smi header: a 'gpu' column followed by socket_power, hotspot, ...")
        if self.options.columns:
            self._plan = self._mapped_plan(self._header_cells)
            self.kind = "CSV mapped by --columns"
        else:
            self._plan = self._nvsmi_plan(self._header_cells, line)
        self.ignored = list(self._plan.ignored)
        self._check_host()

    def _check_host(self) -> None:
        assert self._plan is not None
        if self._plan.host is None and not self.options.host:
            raise FormatError(f"{self.path}: no host: give --host NAME (or map a host column: --columns host=HEADER)")

    def _unknown_format(self, line: str, why: str) -> FormatError:
        return FormatError(
            f"{self.path}: not a log gpuprobe can read ({why}). It should be one of: the CSV of "
            "`nvidia-smi --query-gpu=timestamp,index,... --format=csv[,nounits]` (a header such as "
            "'timestamp, index, name, power.draw [W], temperature.gpu'); `nvidia-smi dmon` output with its "
            "'# gpu pwr gtemp ...' header, or without it from its first row ('20250724, 04:47:16, 0, 63, ...' "
            "for -o DT; other columns: --dmon-columns); `amd-smi metric --csv` output (a header "
            "'Timestamp,gpu,socket_power,...,hotspot,mem,gpu,...', read by `gpuprobe import amd-smi`); or map "
            f"the columns of any other CSV with --columns time=HEADER,temp_c=HEADER,... First line: {line[:120]!r}"
        )

    def _expect(self, vendor: str, what: str) -> None:
        """The file is ``what``: fine for its own command, a clear error for the other one."""
        if self.options.expect == vendor:
            return
        command = "gpuprobe import amd-smi" if vendor == "amd" else "gpuprobe import nvidia-smi"
        raise FormatError(f"{self.path}: this is {what}: import it with `{command}`")

    @staticmethod
    def _is_amd(cells: list[str]) -> bool:
        names = [cell.strip().lower() for cell in cells]
        if "gpu" not in names:
            return False
        after = names[names.index("gpu") + 1 :]
        return any(name in _AMD_NAMES for name in after) and not any(
            _split_header(cell)[0].lower() in ("power.draw", "temperature.gpu", "index") for cell in cells
        )

    def _open_amd(self, cells: list[str]) -> None:
        names = [cell.strip().lower() for cell in cells]
        while names and not names[-1]:
            names.pop()  # amd-smi ends its header with a comma: an empty column its rows do not have
        starts = [i for i, name in enumerate(names) if name == "gpu"]
        before = names[: starts[0]]
        self._amd_time = next((i for i, name in enumerate(before) if name in _AMD_TIME), None)
        if self._amd_time is None:
            raise FormatError(
                f"{self.path}: amd-smi output without a Timestamp column before the first gpu column: log with "
                "a timestamp per row (the columns found: " + ", ".join(before[:5] or ["none"]) + ")"
            )
        ignored: list[str] = [cells[i].strip() for i in range(starts[0]) if i != self._amd_time]
        for n, start in enumerate(starts):
            end = starts[n + 1] if n + 1 < len(starts) else len(names)
            position = {names[i]: i for i in reversed(range(start + 1, end))}
            block_cells: list[_Cell] = []
            used: set[int] = set()
            for aliases, key, unit_name in _AMD:
                index = next((position[a] for a in aliases if a in position), None)
                if index is None:
                    continue
                used.add(index)
                block_cells.append(_Cell(index, names[index], FIELDS[key], UNITS[unit_name]))
                if n == 0 and names[index] in ("edge", "temperature_edge"):
                    self.notes.append("no hotspot (junction) column: temp_c is the edge temperature")
            if not block_cells:
                raise self._unknown_format(",".join(cells), f"the gpu column at {start + 1} has no column it knows")
            self._amd.append(_AmdBlock(start, start, end, block_cells))
            if n == 0:
                ignored += [names[i] for i in range(start + 1, end) if i not in used]
        self._width = len(names)
        self.ignored = ignored
        self.kind = f"amd-smi metric CSV ({len(starts)} GPU block{'s' if len(starts) != 1 else ''} per row)"
        if not self.options.host:
            raise FormatError(f"{self.path}: no host: give --host NAME")
        if self.options.gpu_model:
            self.notes.append(f"amd-smi writes no names here: model tag {self.options.gpu_model!r} (--gpu-model)")
        else:
            self.notes.append("amd-smi writes no names here and no --gpu-model: no model tag")

    def _nvsmi_plan(self, cells: list[str], line: str) -> Plan:
        names = [_split_header(cell) for cell in cells]
        position = {name.lower(): i for i, (name, _) in reversed(list(enumerate(names)))}
        plan = Plan(len(cells), None, None, None, None, None, None, [])
        used: set[int] = set()
        for aliases, key, default_unit in _NVSMI:
            index = next((position[a] for a in aliases if a in position), None)
            if index is None:
                continue
            used.add(index)
            if key in FIELDS:
                spec = FIELDS[key]
                written = names[index][1]
                unit = find_unit(written) if written else None
                if unit is None or unit.dimension != spec.unit:
                    unit = UNITS.get(default_unit or "") or BASE_UNITS[spec.unit]
                plan.cells.append(_Cell(index, cells[index], spec, unit))
            else:
                setattr(plan, key, index)
        if not plan.cells:
            raise self._unknown_format(line, "no column it knows, such as power.draw or temperature.gpu")
        if plan.time is None:
            raise FormatError(
                f"{self.path}: nvidia-smi CSV without a timestamp column: log with "
                "--query-gpu=timestamp,index,..., or map a time column with --columns time=HEADER,..."
            )
        plan.time_reader = TimeReader("auto", self.options.zone)
        plan.ignored = [cells[i] for i in range(len(cells)) if i not in used]
        self.kind = "nvidia-smi CSV"
        self._note_gpu_tags(plan)
        return plan

    def _mapped_plan(self, cells: list[str]) -> Plan:
        exact = {cell: i for i, cell in reversed(list(enumerate(cells)))}
        folded = {cell.casefold(): i for i, cell in reversed(list(enumerate(cells)))}
        plan = Plan(len(cells), None, None, None, None, None, None, [])
        used: set[int] = set()
        for key, header, unit in self.options.columns:
            index = exact.get(header, folded.get(header.casefold()))
            if index is None:
                raise FormatError(
                    f"{self.path}: --columns maps {key} to {header!r}, which is not a column of the file "
                    f"(columns: {', '.join(repr(c) for c in cells)})"
                )
            used.add(index)
            if key in FIELDS:
                spec = FIELDS[key]
                if unit is None:
                    written = _split_header(cells[index])[1]
                    unit = find_unit(written) if written else None
                    if unit is None or unit.dimension != spec.unit:
                        unit = BASE_UNITS[spec.unit]
                plan.cells.append(_Cell(index, cells[index], spec, unit))
            else:
                setattr(plan, key, index)
        plan.time_reader = TimeReader(self.options.time_format, self.options.zone)
        plan.ignored = [cells[i] for i in range(len(cells)) if i not in used]
        self._note_gpu_tags(plan)
        return plan

    def _note_gpu_tags(self, plan: Plan) -> None:
        if plan.gpu is None:
            self.notes.append(
                "no GPU index column: the rows are GPU 0"
                + (", or one index per uuid in order of appearance" if plan.uuid is not None else "")
            )
        if plan.model is None:
            self.notes.append(
                f"no name column: model tag {self.options.gpu_model!r} (--gpu-model)"
                if self.options.gpu_model
                else "no name column and no --gpu-model: no model tag"
            )

    def _open_dmon_headerless(self, tokens: list[str]) -> None:
        given = [name.strip().lower() for entry in self.options.dmon_columns for name in _DMON_SPLIT.split(entry)]
        given = [name for name in given if name]
        names = given or list(DMON_DEFAULT_COLUMNS)
        if not given and _DMON_CLOCK.fullmatch(tokens[0]):
            names = names[1:]  # -o T: a time, no date
        if len(tokens) < len(names):
            raise FormatError(
                f"{self.path}: nvidia-smi dmon output without a header, {len(tokens)} columns in its first row, "
                f"fewer than the {len(names)} of --dmon-columns ({' '.join(names)}): give its columns in order "
                "with --dmon-columns date,time,gpu,pwr,..."
            )
        extra = len(tokens) - len(names)
        names += [f"column {len(names) + i + 1}" for i in range(extra)]
        self._open_dmon("# " + " ".join(names), names)
        self.kind = "nvidia-smi dmon without header"
        source = "--dmon-columns" if given else "the default of --dmon-columns (nvidia-smi dmon -o DT -s pucm)"
        self.ignored = [name for name in self.ignored if not name.startswith("column ")]
        self.notes.append(f"columns from {source}: {' '.join(names[: len(names) - extra])}")
        if extra:
            self.notes.append(
                f"{extra} more columns without a name after {names[len(names) - extra - 1]}: not imported"
            )

    def _open_dmon(self, header: str, names: list[str] | None = None) -> None:
        self._dmon = names or [t.lower() for t in _DMON_SPLIT.split(header.lstrip("#").strip()) if t]
        if "gpu" not in self._dmon:
            raise self._unknown_format(header, "a '#' header without a gpu column")
        names = self._dmon
        has_date, has_time = "date" in names, "time" in names
        if has_date and not has_time:
            raise FormatError(f"{self.path}: dmon output with a Date but no Time column")
        if has_time and not has_date and self.options.dmon_date is None:
            raise FormatError(
                f"{self.path}: `nvidia-smi dmon -o T` output has times but no dates: give the day of its "
                "first row with --dmon-date YYYY-MM-DD"
            )
        if not has_time and self.options.dmon_start_ns is None:
            raise FormatError(
                f"{self.path}: nvidia-smi dmon output without time columns: give the time of its first row "
                "with --dmon-start TIME (and --dmon-interval S, dmon's -d), or log with `nvidia-smi dmon -o DT`"
            )
        if not any(name in _DMON for name in names):
            raise self._unknown_format(header, "dmon columns without any of pwr, gtemp, mtemp, sm, mem, mclk, pclk, fb")
        if not self.options.host:
            raise FormatError(f"{self.path}: no host: give --host NAME")
        self.kind = "nvidia-smi dmon"
        self.ignored = [name for name in names if name not in _DMON and name not in ("gpu", "date", "time")]
        if self.options.gpu_model:
            self.notes.append(f"dmon has no names: model tag {self.options.gpu_model!r} (--gpu-model)")
        else:
            self.notes.append("dmon has no names and no --gpu-model: no model tag")

    # --- the rows --------------------------------------------------------------------------------

    def count_lines(self) -> int:
        """Lines after the header (for the progress display; cheap: bytes are counted, not parsed)."""
        total = 0
        last = b"\n"
        with self.path.open("rb") as f:
            while chunk := f.read(1 << 20):
                total += chunk.count(b"\n")
                last = chunk[-1:]
        return max(0, total + (last != b"\n") - self._header_line)

    def rows(self) -> Iterator[Row | Bad]:
        """Every data line after the header, as a Row or a Bad (header lines repeated in the file, for
        example by a logger that ran nvidia-smi once per sample, and blank lines are skipped)."""
        with self.path.open(encoding="utf-8", errors="replace", newline="") as f:
            for _ in range(self._header_line):
                f.readline()
            if self._dmon:
                yield from self._dmon_rows(f)
            elif self._amd:
                yield from self._amd_rows(f)
            else:
                yield from self._csv_rows(f)

    def _csv_rows(self, f: TextIO) -> Iterator[Row | Bad]:
        plan = self._plan
        assert plan is not None and plan.time_reader is not None
        options = self.options
        header = self._header_cells
        read_time = plan.time_reader
        uuid_order: dict[str, str] = {}
        reader = csv.reader(f, delimiter=self._delimiter, skipinitialspace=True)
        offset = self._header_line
        while True:
            try:
                cells = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                yield Bad(offset + reader.line_num, f"unreadable CSV ({e})")
                continue
            line = offset + reader.line_num
            if not cells or (len(cells) == 1 and not cells[0].strip()):
                continue
            if len(cells) != plan.width:
                yield Bad(line, "wrong number of columns")
                continue
            if cells[0].strip() == header[0] and [c.strip() for c in cells] == header:
                continue  # the header again (a logger that ran nvidia-smi once per sample)
            try:
                try:
                    time_ns = _storable_time(read_time(cells[plan.time]) if plan.time is not None else 0)
                except (ValueError, OverflowError):
                    raise BadRow("bad timestamp") from None
                uuid = self._tag(cells, plan.uuid, "uuid")
                if plan.gpu is not None:
                    gpu = _gpu_index(cells[plan.gpu])
                elif uuid:
                    gpu = uuid_order.setdefault(uuid, str(len(uuid_order)))
                else:
                    gpu = "0"
                model = self._tag(cells, plan.model, "model") or options.gpu_model
                host = self._tag(cells, plan.host, "host") or options.host
                if not host:
                    raise BadRow("no host")
                values, bad_values = _row_values(cells, plan.cells)
            except BadRow as bad:
                yield Bad(line, bad.reason)
                continue
            if not values:
                yield Bad(line, _no_values(bad_values))
                continue
            key = tuple(cell.strip() for i, cell in enumerate(cells) if i != plan.time)
            yield Row(line, time_ns, gpu, uuid, model, host, values, key, bad_values=bad_values)

    @staticmethod
    def _tag(cells: list[str], index: int | None, name: str) -> str:
        if index is None:
            return ""
        value = cells[index].strip()
        if is_not_available(value):
            return ""
        problem = tag_value_problem(value, max_bytes=256)
        if problem is not None:
            raise BadRow(f"{name} cannot be stored as a tag ({problem.split(' (')[0]})")
        return value

    def _dmon_rows(self, f: TextIO) -> Iterator[Row | Bad]:
        names = self._dmon
        options = self.options
        width = len(names)
        gpu_at = names.index("gpu")
        date_at = names.index("date") if "date" in names else None
        time_at = names.index("time") if "time" in names else None
        columns = [_Cell(i, n, FIELDS[_DMON[n][0]], UNITS[_DMON[n][1]]) for i, n in enumerate(names) if n in _DMON]
        day = options.dmon_date
        last_seconds: int | None = None
        round_index = 0
        seen_in_round: set[str] = set()
        for number, raw in enumerate(f, self._header_line + 1):
            text = raw.strip()
            if not text or text.startswith("#"):
                continue
            tokens = [token for token in _DMON_SPLIT.split(text) if token]
            if len(tokens) != width:
                yield Bad(number, "wrong number of columns")
                continue
            try:
                gpu = _gpu_index(tokens[gpu_at])
                if time_at is not None:
                    time_ns, day, last_seconds = self._dmon_time(tokens, date_at, time_at, day, last_seconds)
                else:
                    if gpu in seen_in_round:
                        round_index, seen_in_round = round_index + 1, set()
                    seen_in_round.add(gpu)
                    assert options.dmon_start_ns is not None
                    time_ns = options.dmon_start_ns + round_index * options.dmon_interval_ns
                values, bad_values = _row_values(tokens, columns)
            except BadRow as bad:
                yield Bad(number, bad.reason)
                continue
            if not values:
                yield Bad(number, _no_values(bad_values))
                continue
            key = tuple(token for i, token in enumerate(tokens) if i != date_at and i != time_at)
            yield Row(number, time_ns, gpu, "", options.gpu_model, options.host, values, key, bad_values=bad_values)

    def _amd_rows(self, f: TextIO) -> Iterator[Row | Bad]:
        """One row per timestamp: a Row (or a Bad) for each GPU block."""
        options = self.options
        assert self._amd_time is not None
        read_time = TimeReader(options.time_format, options.zone)
        reader = csv.reader(f, skipinitialspace=True)
        offset = self._header_line
        header = [c.strip().lower() for c in self._header_cells]
        while True:
            try:
                cells = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                yield Bad(offset + reader.line_num, f"unreadable CSV ({e})")
                continue
            line = offset + reader.line_num
            if not cells or (len(cells) == 1 and not cells[0].strip()):
                continue
            if len(cells) == self._width + 1 and not cells[-1].strip():
                cells.pop()  # a trailing comma, as the header has
            if [c.strip().lower() for c in cells] == header[: len(cells)]:
                continue  # the header again
            if len(cells) != self._width:
                yield Bad(line, "wrong number of columns")
                continue
            try:
                time_ns = _storable_time(read_time(cells[self._amd_time]))
            except (ValueError, OverflowError):
                yield Bad(line, "bad timestamp")
                continue
            for block in self._amd:
                try:
                    gpu = _gpu_index(cells[block.gpu])
                    values, bad_values = _row_values(cells, block.cells)
                except BadRow as bad:
                    yield Bad(line, bad.reason)
                    continue
                if not values:
                    yield Bad(line, _no_values(bad_values))
                    continue
                key = tuple(cell.strip() for cell in cells[block.start : block.end])
                yield Row(line, time_ns, gpu, "", options.gpu_model, options.host, values, key, "amd", bad_values)

    def _dmon_time(
        self,
        tokens: list[str],
        date_at: int | None,
        time_at: int,
        day: tuple[int, int, int] | None,
        last_seconds: int | None,
    ) -> tuple[int, tuple[int, int, int] | None, int | None]:
        match = re.fullmatch(r"(\d{1,2}):(\d{2}):(\d{2})", tokens[time_at])
        if not match:
            raise BadRow("bad timestamp")
        hour, minute, second = (int(match.group(i)) for i in (1, 2, 3))
        seconds = hour * 3600 + minute * 60 + second
        if date_at is not None:
            stamp = tokens[date_at]
            if not re.fullmatch(r"\d{8}", stamp):
                raise BadRow("bad timestamp")
            day = (int(stamp[:4]), int(stamp[4:6]), int(stamp[6:]))
        else:
            assert day is not None
            if last_seconds is not None and seconds < last_seconds - 12 * 3600:
                day = _next_day(day)  # the time went back: midnight passed
            last_seconds = seconds
        try:
            return _storable_time(wall_time_ns(self.options.zone, *day, hour, minute, second)), day, last_seconds
        except (ValueError, OverflowError):
            raise BadRow("bad timestamp") from None


# InfluxDB stores int64 ns, 1677-09-21 to 2262-04-11, less one ns at each end
_TIME_MIN_NS, _TIME_MAX_NS = -INT64_MAX + 1, INT64_MAX - 1


def _storable_time(time_ns: int) -> int:
    if not _TIME_MIN_NS <= time_ns <= _TIME_MAX_NS:
        raise ValueError(f"{time_ns} ns is outside what InfluxDB stores (1677 to 2262)")
    return time_ns


def _next_day(day: tuple[int, int, int]) -> tuple[int, int, int]:
    following = date(*day) + timedelta(days=1)
    return following.year, following.month, following.day


def _headerless_dmon(tokens: list[str]) -> bool:
    """The first row of dmon output without its header: ``20250724 04:47:16 0 63 …`` (-o DT) or
    ``04:47:16 0 63 …`` (-o T), in spaces or commas."""
    if len(tokens) >= 4 and _DMON_DATE.fullmatch(tokens[0]) and _DMON_CLOCK.fullmatch(tokens[1]):
        return tokens[2].isdigit()
    return len(tokens) >= 3 and bool(_DMON_CLOCK.fullmatch(tokens[0])) and tokens[1].isdigit()


def _gpu_index(text: str) -> str:
    value = text.strip()
    if not value.isdigit():
        raise BadRow("bad GPU index")
    return str(int(value))


def parse_day(text: str) -> tuple[int, int, int]:
    """``--dmon-date``: ``YYYY-MM-DD`` (or ``YYYY/MM/DD``, ``YYYYMMDD``)."""
    match = re.fullmatch(r"(\d{4})[-/]?(\d{2})[-/]?(\d{2})", text.strip())
    if not match:
        raise ValueError(f"not a date: {text!r} (use YYYY-MM-DD)")
    day = date(int(match.group(1)), int(match.group(2)), int(match.group(3)))
    return day.year, day.month, day.day


def parse_start(text: str, zone: tzinfo) -> int:
    """``--dmon-start``: a date and time (nvidia-smi's format or ISO 8601; without a zone in ``zone``)."""
    return parse_datetime_ns(text, zone)


def open_source(path: Path, options: ReadOptions) -> Source:
    """The file's format, read from its first line; FormatError when it is neither, or does not fit."""
    try:
        return Source(path, options)
    except OSError as e:
        raise FormatError(f"{path}: cannot read: {e.strerror or e}") from None
    except UnicodeError as e:  # pragma: no cover - errors="replace"
        raise FormatError(f"{path}: cannot read: {e}") from None
