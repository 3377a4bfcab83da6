"""The importer's pieces without InfluxDB: the source tag in the schema, time zones and
timestamps to the ns, unit conversions, and the progress display."""

from __future__ import annotations

import io
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from import_helpers import utc_ns

from gpuprobe.importer.formats import FIELDS, UNITS, Bad, BadRow, ReadOptions, Row, convert, open_source, parse_columns
from gpuprobe.importer.progress import Progress
from gpuprobe.importer.timeparse import TimeReader, parse_timezone

SCHEMA = (Path(__file__).resolve().parents[2] / "docs" / "schema.md").read_text()


def gpu_section() -> str:
    match = re.search(r"^## `gpu`.*?(?=^## )", SCHEMA, re.S | re.M)
    assert match
    return match.group(0)


def test_the_source_tag_is_documented_in_the_gpu_section() -> None:
    tags = gpu_section()[: gpu_section().index("| field |")]
    assert re.search(r"^\| `source` \| .*`import`", tags, re.M)


@pytest.mark.parametrize(
    ("zone", "wall", "utc"),
    [
        ("UTC", "2025/06/01 14:00:00.123", "2025-06-01T14:00:00"),
        ("Europe/Berlin", "2025/06/01 14:00:00.123", "2025-06-01T12:00:00"),  # CEST, +2
        ("Europe/Berlin", "2025/01/15 14:00:00.123", "2025-01-15T13:00:00"),  # CET, +1
        ("America/New_York", "2025/03/09 01:59:59.123", "2025-03-09T06:59:59"),  # EST, just before the change
        ("America/New_York", "2025/03/09 03:00:00.123", "2025-03-09T07:00:00"),  # EDT, just after
        ("+05:30", "2025/06/01 14:00:00.123", "2025-06-01T08:30:00"),
        ("-08:00", "2025/06/01 14:00:00.123", "2025-06-01T22:00:00"),
        ("+0200", "2025/06/01 14:00:00.123", "2025-06-01T12:00:00"),
    ],
)
def test_nvidia_smi_local_time_in_a_zone(zone: str, wall: str, utc: str) -> None:
    assert TimeReader("auto", parse_timezone(zone))(wall) == utc_ns(utc, 123_000_000)


def test_times_keep_every_digit_and_their_own_zone() -> None:
    read = TimeReader("auto", parse_timezone("Europe/Berlin"))
    assert read("2025-11-21T14:52:59.573550209Z") == utc_ns("2025-11-21T14:52:59", 573_550_209)
    assert read("2025-09-08T17:26:50+08:00") == utc_ns("2025-09-08T09:26:50")
    assert read("1763736779.573550209") == 1763736779_573550209  # unix seconds, as a decimal
    assert read("1763736779573") == 1763736779_573000000  # ms, by magnitude
    assert TimeReader("unix_ms", UTC)("1763736779573.5") == 1763736779_573500000
    assert TimeReader("unix_ns", UTC)("1763736779573550209") == 1763736779_573550209
    assert TimeReader("%d.%m.%Y %H:%M:%S", parse_timezone("+01:00"))("24.12.2025 18:00:01") == utc_ns(
        "2025-12-24T17:00:01"
    )
    with pytest.raises(ValueError):
        read("2025/13/01 00:00:00")
    with pytest.raises(ValueError):
        read("yesterday")


def test_times_influxdb_cannot_store_are_bad_rows(tmp_path: Path) -> None:
    path = tmp_path / "far.csv"
    path.write_text(
        "timestamp, index, power.draw [W]\n2300/01/01 00:00:00.000, 0, 1 W\n2025/01/01 00:00:00.000, 0, 1 W\n"
    )
    items = list(open_source(path, ReadOptions(zone=UTC, host="h")).rows())
    assert isinstance(items[0], Bad) and (items[0].line, items[0].reason) == (2, "bad timestamp")
    assert isinstance(items[1], Row) and items[1].time_ns == utc_ns("2025-01-01T00:00:00")


@pytest.mark.parametrize("text", ["Mars/Olympus_Mons", "", "+25:00", "../../etc/passwd", "Europe", "UTC+2"])
def test_bad_time_zones_are_refused_with_the_forms_that_work(text: str) -> None:
    with pytest.raises(ValueError, match=r"IANA name|UTC offset"):
        parse_timezone(text)


def test_fixed_offsets() -> None:
    assert parse_timezone("-03:30").utcoffset(None) == -timedelta(hours=3, minutes=30)
    assert datetime(2025, 1, 1, tzinfo=parse_timezone("Asia/Kolkata")).utcoffset() == timedelta(hours=5, minutes=30)


@pytest.mark.parametrize(
    ("text", "field", "unit", "expected"),
    [
        ("250.12 W", "power_w", "W", 250.12),
        ("250.12", "power_w", "W", 250.12),
        ("250120", "power_w", "mW", 250.12),
        ("45 %", "util_pct", "%", 45.0),
        ("1980 MHz", "sm_clock_mhz", "MHz", 1980),
        ("1.98 GHz", "sm_clock_mhz", "MHz", 1980),
        ("63488 MiB", "mem_used_bytes", "MiB", 63488 * 1048576),
        ("63488", "mem_used_bytes", "MiB", 63488 * 1048576),
        ("1.5", "mem_used_bytes", "GiB", 1610612736),
        ("0x0000000000000044", "clock_event_reasons", "bitmask", 0x44),
        ("71", "temp_c", "°C", 71.0),
        ("[N/A]", "fan_pct", "%", None),
        ("[Not Supported]", "fan_pct", "%", None),
        ("N/A", "temp_c", "°C", None),
        ("-", "mem_temp_c", "°C", None),
    ],
)
def test_values_are_converted_exactly(text: str, field: str, unit: str, expected: float | int | None) -> None:
    from gpuprobe.importer.formats import BASE_UNITS

    value = convert(text, FIELDS[field], UNITS.get(unit) or BASE_UNITS[unit])
    assert value == expected
    assert type(value) is (type(expected) if expected is not None else type(None))


def test_exact_conversion_is_a_decimal_product() -> None:
    # 9 mW is 0.009 W: the nearest double of that decimal, not 9.0 * 0.001 in binary (0.009000000000000001)
    assert convert("9", FIELDS["power_w"], UNITS["mW"]) == float(Decimal("0.009")) == 0.009
    assert 9.0 * 0.001 != 0.009


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("12 MiB", "power_w"),  # a unit of another field
        ("abc", "temp_c"),
        ("nan", "temp_c"),
        ("1980.5 MHz", "sm_clock_mhz"),  # an integer field
        ("inf W", "power_w"),
    ],
)
def test_values_that_are_not_values(text: str, field: str) -> None:
    with pytest.raises(BadRow):
        convert(text, FIELDS[field], UNITS["W"] if FIELDS[field].unit == "W" else UNITS["MHz"])


def test_column_mapping() -> None:
    mapping = parse_columns(["time=timestamp,gpu=gpu_index", "mem_used_bytes=vram:GiB", "temp_c=temperature_C"])
    assert [(key, header, unit.name if unit else None) for key, header, unit in mapping] == [
        ("time", "timestamp", None),
        ("gpu", "gpu_index", None),
        ("mem_used_bytes", "vram", "GiB"),
        ("temp_c", "temperature_C", None),
    ]
    for bad, message in [
        (["temp_c=t"], "needs the time column"),
        (["time=t,gpu=g"], "maps no gpu field"),
        (["time=t,temperature=t2"], "unknown key 'temperature'"),
        (["time=t,temp_c=x:MiB"], "not a unit of temp_c"),
        (["time=t,temp_c"], "not KEY=HEADER"),
        (["time=t,temp_c=a,temp_c=b"], "mapped twice"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_columns(bad)


def test_progress_on_a_terminal_and_in_a_log() -> None:
    now = [0.0]
    log = io.StringIO()
    progress = Progress(log, tty=False, clock=lambda: now[0])
    progress.start("gpu.csv", 1000)
    for when, rows in ((0.5, 100), (1.5, 100), (5.0, 100), (11.0, 100), (12.0, 100)):
        now[0] = when
        progress.advance(rows)
    progress.finish()
    lines = log.getvalue().splitlines()
    assert lines == ["gpu.csv: 200/1000 rows (20 %), 133 rows/s", "gpu.csv: 500/1000 rows (50 %), 42 rows/s"]

    now[0] = 0.0
    terminal = io.StringIO()
    progress = Progress(terminal, tty=True, clock=lambda: now[0])
    progress.start("gpu.csv", 1000)
    for when in (0.2, 1.1, 1.2, 1.4):
        now[0] = when
        progress.advance(250)
    progress.finish()
    text = terminal.getvalue()
    assert text.count("\r") == 2 and text.endswith("1000/1000 rows (100 %), 714 rows/s\n")

    quiet = io.StringIO()
    now[0] = 0.0
    progress = Progress(quiet, tty=True, clock=lambda: now[0])
    progress.start("small.csv", 10)
    progress.advance(10)
    progress.finish()
    assert quiet.getvalue() == ""  # an import that ends within its first second shows nothing
