"""`gpuprobe import nvidia-smi` into a real InfluxDB: every value, timestamp (ns) and tag read back is
exactly what the log said, in the schema's units; bad rows and frozen stretches are reported and
skipped; a dry run writes nothing; files that cannot be read stop the command before anything is
written."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from import_helpers import Import, field_types, influx_args, measurements, stored_points, utc_ns

from gpuprobe.devservices import InfluxDBDatabase
from gpuprobe.importer.formats import ReadOptions
from gpuprobe.importer.run import Importer, ImportSettings, open_sources
from gpuprobe.importer.timeparse import parse_timezone
from gpuprobe.influx.settings import InfluxSettings

MIB = 1048576
H100 = "NVIDIA H100 80GB HBM3"
UUID0 = "GPU-5d5f3a4e-1c2b-4e8f-9a7d-0b6c5e4f3a21"
UUID1 = "GPU-0b6c5e4f-3a21-4e8f-9a7d-5d5f3a4e1c2b"

# properties in the order of the query; unit of each as nvidia-smi writes it with --format=csv
COLUMNS = [
    ("timestamp", None),
    ("index", None),
    ("name", None),
    ("uuid", None),
    ("pci.bus_id", None),
    ("pstate", None),
    ("utilization.gpu", "%"),
    ("utilization.memory", "%"),
    ("memory.used", "MiB"),
    ("memory.total", "MiB"),
    ("power.draw", "W"),
    ("power.draw.instant", "W"),
    ("temperature.gpu", None),
    ("temperature.memory", None),
    ("fan.speed", "%"),
    ("clocks.sm", "MHz"),
    ("clocks.mem", "MHz"),
    ("enforced.power.limit", "W"),
    ("clocks_event_reasons.active", None),
]
# local time (Europe/Berlin, CEST = UTC+2), then the other properties
ROWS = [
    ["2025/06/01 14:00:00.123", "0", H100, UUID0, "00000000:18:00.0", "P0", "97", "48", "63488", "81559",
     "652.11", "688.20", "71", "78", "[N/A]", "1980", "2619", "700.00", "0x0000000000000000"],
    ["2025/06/01 14:00:00.125", "1", H100, UUID1, "00000000:2A:00.0", "P8", "0", "0", "0", "81559",
     "69.87", "[N/A]", "31", "[N/A]", "[Not Supported]", "345", "2619", "700.00", "0x0000000000000001"],
    ["2025/06/01 14:00:01.123", "0", H100, UUID0, "00000000:18:00.0", "P0", "100", "52", "63490", "81559",
     "700.13", "731.50", "74", "80", "[N/A]", "1755", "2619", "700.00", "0x0000000000000004"],
    ["2025/06/01 14:00:01.126", "1", H100, UUID1, "00000000:2A:00.0", "P8", "3", "1", "512", "81559",
     "70.02", "[N/A]", "31", "[N/A]", "[Not Supported]", "345", "2619", "700.00", "0x0000000000000001"],
    ["2025/06/01 14:00:02.999", "0", H100, UUID0, "00000000:18:00.0", "P0", "99", "50", "63488", "81559",
     "650.5", "0.1", "89", "91", "[N/A]", "1410", "2619", "700.00", "0x0000000000000060"],
]  # fmt: skip
# the same rows as stored: UTC ns and the schema's fields (absent ones None)
EXPECTED = [
    (utc_ns("2025-06-01T12:00:00", 123_000_000), "0", UUID0,
     dict(util_pct=97, mem_util_pct=48, mem_used_bytes=63488 * MIB, mem_total_bytes=81559 * MIB, power_w=652.11,
          power_instant_w=688.2, temp_c=71, mem_temp_c=78, fan_pct=None, sm_clock_mhz=1980, mem_clock_mhz=2619,
          power_limit_w=700, clock_event_reasons=0)),
    (utc_ns("2025-06-01T12:00:00", 125_000_000), "1", UUID1,
     dict(util_pct=0, mem_util_pct=0, mem_used_bytes=0, mem_total_bytes=81559 * MIB, power_w=69.87,
          power_instant_w=None, temp_c=31, mem_temp_c=None, fan_pct=None, sm_clock_mhz=345, mem_clock_mhz=2619,
          power_limit_w=700, clock_event_reasons=1)),
    (utc_ns("2025-06-01T12:00:01", 123_000_000), "0", UUID0,
     dict(util_pct=100, mem_util_pct=52, mem_used_bytes=63490 * MIB, mem_total_bytes=81559 * MIB, power_w=700.13,
          power_instant_w=731.5, temp_c=74, mem_temp_c=80, fan_pct=None, sm_clock_mhz=1755, mem_clock_mhz=2619,
          power_limit_w=700, clock_event_reasons=4)),
    (utc_ns("2025-06-01T12:00:01", 126_000_000), "1", UUID1,
     dict(util_pct=3, mem_util_pct=1, mem_used_bytes=512 * MIB, mem_total_bytes=81559 * MIB, power_w=70.02,
          power_instant_w=None, temp_c=31, mem_temp_c=None, fan_pct=None, sm_clock_mhz=345, mem_clock_mhz=2619,
          power_limit_w=700, clock_event_reasons=1)),
    (utc_ns("2025-06-01T12:00:02", 999_000_000), "0", UUID0,
     dict(util_pct=99, mem_util_pct=50, mem_used_bytes=63488 * MIB, mem_total_bytes=81559 * MIB, power_w=650.5,
          power_instant_w=0.1, temp_c=89, mem_temp_c=91, fan_pct=None, sm_clock_mhz=1410, mem_clock_mhz=2619,
          power_limit_w=700, clock_event_reasons=0x60)),
]  # fmt: skip
TYPES = {
    "util_pct": "float",
    "mem_util_pct": "float",
    "mem_used_bytes": "integer",
    "mem_total_bytes": "integer",
    "power_w": "float",
    "power_instant_w": "float",
    "temp_c": "float",
    "mem_temp_c": "float",
    "sm_clock_mhz": "integer",
    "mem_clock_mhz": "integer",
    "power_limit_w": "float",
    "clock_event_reasons": "integer",
}


def nvidia_smi_csv(header_units: bool, value_units: bool) -> str:
    """The log as nvidia-smi writes it: --format=csv (units in header and values), csv,nounits (units in
    the header only), and headers without units too."""
    header = ", ".join(f"{name} [{unit}]" if unit and header_units else name for name, unit in COLUMNS)
    lines = [header]
    for row in ROWS:
        cells = [
            f"{value} {unit}" if unit and value_units and not value.startswith("[") else value
            for value, (_, unit) in zip(row, COLUMNS, strict=True)
        ]
        lines.append(", ".join(cells))
    return "\n".join(lines) + "\n"


def assert_stored(
    points: list[dict[str, Any]], expected: list[tuple[int, str, str | None, dict[str, Any]]], **tags: str
) -> None:
    assert len(points) == len(expected)
    for point, (time_ns, gpu, uuid, fields) in zip(points, expected, strict=True):
        assert point["time"] == time_ns
        assert (point["gpu"], point.get("uuid")) == (gpu, uuid)
        for name, value in tags.items():
            assert point[name] == value, name
        for name, value in fields.items():
            assert point.get(name) == value, f"{name} at {time_ns}: {point.get(name)!r} != {value!r}"


@pytest.mark.parametrize(
    ("header_units", "value_units"),
    [(True, True), (True, False), (False, False)],
    ids=["csv", "csv-nounits", "bare-headers"],
)
def test_standard_csv_round_trips_exactly(
    header_units: bool,
    value_units: bool,
    influxdb: InfluxDBDatabase,
    gpuprobe_import: Import,
    write_file: Callable[[str, str], Path],
) -> None:
    path = write_file("gpu.csv", nvidia_smi_csv(header_units, value_units))
    status, out, err = gpuprobe_import(
        "--host", "gpu-node-17", "--cluster", "lab", "--timezone", "Europe/Berlin", *influx_args(influxdb), path
    )
    assert status == 0, err
    assert "rows read: 5 in 1 file(s); points written to" in out
    assert "columns not imported (not in the gpu schema): pci.bus_id, pstate" in out
    assert "bad rows (skipped): 0" in out
    assert "host gpu-node-17 gpu 0 uuid GPU-5d5f3a4e" in out
    assert "3 points, 2025-06-01T12:00:00.123Z .. 2025-06-01T12:00:02.999Z" in out

    points = stored_points(influxdb)
    assert_stored(points, EXPECTED, host="gpu-node-17", model=H100, source="import", cluster="lab")
    assert all(point.get("virt") is None for point in points)
    assert field_types(influxdb) == TYPES
    # imported points are told from live ones by their tag
    assert len(stored_points(influxdb, "WHERE \"source\" = 'import'")) == 5
    assert stored_points(influxdb, "WHERE \"source\" = ''") == []


def test_importing_again_overwrites_and_batches_hold_5000_lines(
    influxdb: InfluxDBDatabase, write_file: Callable[[str, str], Path]
) -> None:
    lines = ["timestamp, index, power.draw [W], temperature.gpu"]
    for second in range(6000):
        stamp = f"2025/06/01 {second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}"
        for gpu in (0, 1):
            lines.append(f"{stamp}.{gpu:03d}, {gpu}, {100 + second % 7}.5 W, 40")
    path = write_file("long.csv", "\n".join(lines) + "\n")
    settings = ImportSettings(
        files=(path,),
        read=ReadOptions(zone=parse_timezone("UTC"), host="h"),
        influx=InfluxSettings(url=influxdb.server.url, database=influxdb.name),
    )
    batches: list[int] = []

    def send(batch: list[str]) -> int:
        batches.append(len(batch))
        influxdb.write_lines(batch)
        return len(batch)

    for _ in range(2):
        report = Importer(settings, send).run(open_sources(settings))
        assert report.points == report.lines_sent == 12000
    assert batches == [5000, 5000, 2000] * 2
    (series,) = influxdb.query('SELECT count("power_w") FROM "gpu"')
    assert series.values[0][1] == 12000


DMON_DT = """\
#Date       Time        gpu    pwr  gtemp  mtemp     sm    mem    enc    dec    jpg    ofa   mclk   pclk
#YYYYMMDD   HH:MM:SS    Idx      W      C      C      %      %      %      %      %      %    MHz    MHz
 20250601   14:00:00      0     43     48      -      0      0      0      0      0      0   2619    345
 20250601   14:00:00      1    312     67     71     98     45      0      0      0      0   2619   1980
 20250601   14:00:01      0     44     48      -      1      0      0      0      0      0   2619    345
 20250601   14:00:01      1    315     68     72     99     47      0      0      0      0   2619   1980
#Date       Time        gpu    pwr  gtemp  mtemp     sm    mem    enc    dec    jpg    ofa   mclk   pclk
#YYYYMMDD   HH:MM:SS    Idx      W      C      C      %      %      %      %      %      %    MHz    MHz
 20250601   14:00:02      0     44     49      -      0      0      0      0      0      0   2619    345
 20250601   14:00:02      1    31x     68     72     99     47      0      0      0      0   2619   1980
"""


def test_dmon_with_dates_and_times(
    influxdb: InfluxDBDatabase, gpuprobe_import: Import, write_file: Callable[[str, str], Path]
) -> None:
    path = write_file("dmon.log", DMON_DT)
    status, out, err = gpuprobe_import(
        "--host", "n1", "--gpu-model", "NVIDIA A100-SXM4-80GB", "--timezone", "+02:00", *influx_args(influxdb), path
    )
    assert status == 0, err
    assert "nvidia-smi dmon, 6 rows, 5 points, 1 bad" in out
    assert "bad value in pwr: 1 (lines dmon.log:10)" in out
    assert "columns not imported (not in the gpu schema): enc, dec, jpg, ofa" in out
    points = stored_points(influxdb)
    expected = [
        (utc_ns("2025-06-01T12:00:00"), "0", None, dict(power_w=43, temp_c=48, mem_temp_c=None, util_pct=0,
         mem_util_pct=0, mem_clock_mhz=2619, sm_clock_mhz=345)),
        (utc_ns("2025-06-01T12:00:00"), "1", None, dict(power_w=312, temp_c=67, mem_temp_c=71, util_pct=98,
         mem_util_pct=45, mem_clock_mhz=2619, sm_clock_mhz=1980)),
        (utc_ns("2025-06-01T12:00:01"), "0", None, dict(power_w=44, temp_c=48, util_pct=1)),
        (utc_ns("2025-06-01T12:00:01"), "1", None, dict(power_w=315, temp_c=68, mem_temp_c=72, util_pct=99)),
        (utc_ns("2025-06-01T12:00:02"), "0", None, dict(power_w=44, temp_c=49, util_pct=0)),
    ]  # fmt: skip
    assert_stored(points, expected, host="n1", model="NVIDIA A100-SXM4-80GB", source="import")
    assert field_types(influxdb)["power_w"] == "float" and field_types(influxdb)["sm_clock_mhz"] == "integer"


def test_dmon_with_times_only_or_no_times(
    influxdb: InfluxDBDatabase, gpuprobe_import: Import, write_file: Callable[[str, str], Path]
) -> None:
    times_only = write_file(
        "dmon-t.log",
        "#Time        gpu    pwr  gtemp\n#HH:MM:SS    Idx      W      C\n"
        " 23:59:59      0     43     48\n 00:00:00      0     44     49\n 00:00:01      0     45     50\n",
    )
    status, _, err = gpuprobe_import("--host", "a", "--dmon-date", "2025-12-31", *influx_args(influxdb), times_only)
    assert status == 0, err
    assert [p["time"] for p in stored_points(influxdb, "WHERE host = 'a'")] == [
        utc_ns("2025-12-31T23:59:59"),
        utc_ns("2026-01-01T00:00:00"),
        utc_ns("2026-01-01T00:00:01"),
    ]
    no_times = write_file(
        "dmon.log",
        "# gpu    pwr  gtemp     sm\n# Idx      W      C      %\n"
        "    0     43     48      0\n    1     80     50      9\n"
        "    0     44     48      1\n    1     81     51      9\n",
    )
    status, _, err = gpuprobe_import(
        "--host", "b", "--dmon-start", "2025-06-01 14:00:00", "--dmon-interval", "0.5", *influx_args(influxdb), no_times
    )
    assert status == 0, err
    points = stored_points(influxdb, "WHERE host = 'b'")
    start = utc_ns("2025-06-01T14:00:00")
    assert [(p["time"], p["gpu"], p["power_w"]) for p in points] == [
        (start, "0", 43),
        (start, "1", 80),
        (start + 500_000_000, "0", 44),
        (start + 500_000_000, "1", 81),
    ]


def test_any_csv_with_a_column_mapping(
    influxdb: InfluxDBDatabase, gpuprobe_import: Import, write_file: Callable[[str, str], Path]
) -> None:
    path = write_file(
        "gpu_metrics.csv",
        "timestamp,gpu_index,temperature_C,utilization_gpu_percent,power_W,vram_used_GiB,host_name\n"
        "2025-09-24T03:48:33.493Z,0, 38, 100, 387.26, 1.5,node-a\n"
        "2025-09-24T03:48:33.493Z,1, 60, 100, 422.55, 0.25,node-a\n"
        "2025-09-24T03:48:33.788Z,0, 38, 100, 387.36, 1.5,node-b\n",
    )
    status, out, err = gpuprobe_import(
        "--columns",
        "time=timestamp,gpu=gpu_index,temp_c=temperature_C,util_pct=utilization_gpu_percent,power_w=power_W",
        "--columns",
        "mem_used_bytes=vram_used_GiB:GiB,host=host_name",
        *influx_args(influxdb),
        path,
    )
    assert status == 0, err
    assert "CSV mapped by --columns, 3 rows, 3 points" in out
    points = stored_points(influxdb)
    columns = ("time", "host", "gpu", "temp_c", "util_pct", "power_w", "mem_used_bytes")
    assert [tuple(p[c] for c in columns) for p in points] == [
        (utc_ns("2025-09-24T03:48:33", 493_000_000), "node-a", "0", 38, 100, 387.26, 1610612736),
        (utc_ns("2025-09-24T03:48:33", 493_000_000), "node-a", "1", 60, 100, 422.55, 268435456),
        (utc_ns("2025-09-24T03:48:33", 788_000_000), "node-b", "0", 38, 100, 387.36, 1610612736),
    ]  # fmt: skip
    assert field_types(influxdb)["temp_c"] == "float" and field_types(influxdb)["mem_used_bytes"] == "integer"

    unix = write_file("unix.csv", "ts;dev;milliwatts\n1763736779573;0;250120\n1763736779673;0;9\n")
    status, out, err = gpuprobe_import(
        "--host", "c", "--time-format", "unix_ms", "--columns", "time=ts,gpu=dev,power_w=milliwatts:mW",
        *influx_args(influxdb), unix,
    )  # fmt: skip
    assert status == 0, err
    assert [(p["time"], p["power_w"]) for p in stored_points(influxdb, "WHERE host = 'c'")] == [
        (1763736779_573000000, 250.12),
        (1763736779_673000000, 0.009),
    ]


BAD = """\
timestamp, index, power.draw [W], temperature.gpu, memory.used [MiB]
2025/06/01 12:00:00.000, 0, 100.00 W, 40, 10 MiB
2025/06/01 12:00:01.000, 0, 101.00 W, 40
2025/06/01 25:00:02.000, 0, 102.00 W, 40, 10 MiB
2025/06/01 12:00:03.000, 0, abc W, 40, 10 MiB
2025/06/01 12:00:04.000, 0, 12 MiB, 40, 10 MiB
2025/06/01 12:00:05.000, x, 105.00 W, 40, 10 MiB
2025/06/01 12:00:06.000, 0, [N/A], [N/A], [N/A]
2025/06/01 12:00:07.000, 0, 107.00 W, 41, 10 MiB
2025/06/01 12:00:07.000, 0, 107.50 W, 41, 10 MiB
timestamp, index, power.draw [W], temperature.gpu, memory.used [MiB]

2025/06/01 12:00:08.000, 0, 108.00 W, 42, 10 MiB
2025/06/01 12:00:09.000, 0, 109.00 W, 42, 10 W
"""


def test_bad_rows_are_counted_with_their_lines_and_skipped(
    influxdb: InfluxDBDatabase, gpuprobe_import: Import, write_file: Callable[[str, str], Path]
) -> None:
    path = write_file("bad.csv", BAD)
    status, out, err = gpuprobe_import("--host", "h", *influx_args(influxdb), path)
    assert status == 0, err
    # the header repeated and the blank line are no rows; a value without its unit (nounits) is fine
    assert "bad.csv: nvidia-smi CSV, 11 rows, 3 points, 8 bad, 0 frozen" in out
    for reason in (
        "wrong number of columns: 1 (lines bad.csv:3)",
        "bad timestamp: 1 (lines bad.csv:4)",
        "bad value in power.draw [W]: 2 (lines bad.csv:5, bad.csv:6)",
        "bad GPU index: 1 (lines bad.csv:7)",
        "no values (all not available): 1 (lines bad.csv:8)",
        "duplicate timestamp for the same GPU (the first row is kept): 1 (lines bad.csv:10)",
        "bad value in memory.used [MiB]: 1 (lines bad.csv:14)",
    ):
        assert f"  {reason}" in out
    assert "bad rows (skipped): 8" in out
    points = stored_points(influxdb)
    assert [(p["time"], p["power_w"]) for p in points] == [
        (utc_ns("2025-06-01T12:00:00"), 100),
        (utc_ns("2025-06-01T12:00:07"), 107),
        (utc_ns("2025-06-01T12:00:08"), 108),
    ]


def frozen_log() -> str:
    """GPU 0: changing readings for 10 s, then the same row for 90 s (a hung driver), then changing again;
    GPU 1: the same idle readings for 90 s (a quiet GPU, not a frozen log), then changing."""
    lines = ["timestamp, index, power.draw [W], temperature.gpu, utilization.gpu [%]"]
    for second in range(106):
        stamp = f"2025/06/01 12:{second // 60:02d}:{second % 60:02d}.000"
        if second <= 10:
            lines.append(f"{stamp}, 0, {300 + second}.25 W, {60 + second}, 99 %")
        elif second <= 100:
            lines.append(f"{stamp}, 0, 310.25 W, 70, 99 %")
        else:
            lines.append(f"{stamp}, 0, {200 + second}.75 W, 65, 50 %")
        if second <= 90:
            lines.append(f"{stamp}, 1, 61.00 W, 30, 0 %")
        else:
            lines.append(f"{stamp}, 1, {61 + second}.00 W, 31, 5 %")
    return "\n".join(lines) + "\n"


def test_a_frozen_stretch_is_reported_and_its_repeats_not_imported(
    influxdb: InfluxDBDatabase, gpuprobe_import: Import, write_file: Callable[[str, str], Path]
) -> None:
    path = write_file("frozen.csv", frozen_log())
    status, out, err = gpuprobe_import("--host", "h", *influx_args(influxdb), path)
    assert status == 0, err
    assert "frozen.csv: nvidia-smi CSV, 212 rows, 122 points, 0 bad, 90 frozen" in out
    assert "GPU rows not imported: 90 of 212 (0 bad, 90 repeats in frozen stretches; below)" in out
    assert "under load or with a standing energy counter; first row imported, repeats not): 1, 90 rows" in out
    # the stretch: from the row that began it (line 22: second 10 of GPU 0) to the last repeat (second 100)
    assert (
        "  host h gpu 0: 2025-06-01T12:00:10.000Z .. 2025-06-01T12:01:40.000Z (90 s, 90 repeated rows, "
        "frozen.csv lines 22-202)" in out
    )
    gpu0 = [p["time"] for p in stored_points(influxdb, "WHERE gpu = '0'")]
    start = utc_ns("2025-06-01T12:00:00")
    assert gpu0 == [start + s * 1_000_000_000 for s in [*range(11), *range(101, 106)]]
    # 90 s of identical idle rows: readings of a quiet GPU, imported and said
    assert len(stored_points(influxdb, "WHERE gpu = '1'")) == 106
    assert "steady stretches (identical rows for 60 s or more at idle: readings, imported): 1, 90 rows" in out
    assert "  host h gpu 1: 2025-06-01T12:00:00.000Z .. 2025-06-01T12:01:30.000Z (90 s, 90 repeated rows" in out

    influxdb.server.execute('DROP SERIES FROM "gpu"', influxdb.name)
    status, out, err = gpuprobe_import("--host", "h", "--freeze-after", "0", *influx_args(influxdb), path)
    assert status == 0, err
    assert "frozen stretches (off): 0, 0 rows not imported" in out
    assert len(stored_points(influxdb)) == 212


def test_dry_run_reads_and_reports_but_writes_nothing(
    influxdb: InfluxDBDatabase, gpuprobe_import: Import, write_file: Callable[[str, str], Path]
) -> None:
    path = write_file("frozen.csv", frozen_log())
    status, out, err = gpuprobe_import(
        "--host", "h", "--dry-run", "--influx-url", "http://127.0.0.1:9", "--influx-db", influxdb.name, path
    )
    assert status == 0, err
    assert "points would be written (dry run: nothing written): 122" in out
    assert "90 rows not imported" in out
    assert measurements(influxdb) == []


NOT_A_LOG = """\
{"gpu": 0, "power": 250.1}
{"gpu": 1, "power": 80.2}
"""


def test_clear_errors_and_nothing_written(
    influxdb: InfluxDBDatabase, gpuprobe_import: Import, write_file: Callable[[str, str], Path]
) -> None:
    good = write_file("good.csv", nvidia_smi_csv(True, True))
    neither = write_file("readings.jsonl", NOT_A_LOG)
    other = write_file("other.csv", "time,temperature_C\n2025-06-01T12:00:00Z,40\n")
    no_time = write_file("notime.csv", "index, power.draw [W]\n0, 100 W\n")
    args = ["--host", "h", *influx_args(influxdb)]

    status, out, err = gpuprobe_import(*args, good, neither)
    assert status == 2 and out == ""
    assert f"{neither}: not a log gpuprobe can read" in err and "--columns time=HEADER" in err
    assert 'First line: \'{"gpu": 0, "power": 250.1}\'' in err

    status, _, err = gpuprobe_import(*args, other)  # a CSV that is not nvidia-smi's: map it
    assert status == 2 and "not a log gpuprobe can read" in err

    status, _, err = gpuprobe_import(*args, no_time)
    assert status == 2 and "without a timestamp column" in err

    status, _, err = gpuprobe_import(*args, "--columns", "time=time,temp_c=temperature", other)
    assert status == 2
    assert "--columns maps temp_c to 'temperature', which is not a column of the file" in err
    assert "(columns: 'time', 'temperature_C')" in err

    status, _, err = gpuprobe_import(*args, "--columns", "temp_c=temperature_C", other)
    assert status == 2 and "--columns needs the time column" in err

    status, _, err = gpuprobe_import(*args, "--timezone", "Mars/Olympus_Mons", good)
    assert status == 2
    assert "--timezone" in err and "not a time zone: 'Mars/Olympus_Mons'" in err and "Europe/Berlin" in err

    status, _, err = gpuprobe_import(*influx_args(influxdb), good)
    assert status == 2 and "no host: give --host NAME" in err

    status, _, err = gpuprobe_import(*args, write_file("dmon.log", DMON_DT.replace("Date       Time", "Xate       X")))
    assert status == 2 and "--dmon-start" in err

    status, _, err = gpuprobe_import(*args, Path(good).with_name("missing.csv"))
    assert status == 2 and "missing.csv: cannot read" in err

    assert measurements(influxdb) == []  # the good file was not imported either


def test_an_unreachable_influxdb_is_exit_status_1(
    gpuprobe_import: Import, write_file: Callable[[str, str], Path]
) -> None:
    path = write_file("gpu.csv", nvidia_smi_csv(True, True))
    status, _, err = gpuprobe_import("--host", "h", "--influx-url", "http://127.0.0.1:9", path)
    assert status == 1
    assert "cannot reach InfluxDB at http://127.0.0.1:9" in err
    assert "0 points were written before the error; importing again is safe" in err
