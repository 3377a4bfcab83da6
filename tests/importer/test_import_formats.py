"""The formats users have besides nvidia-smi's CSV, written here in the layouts of the real logs (so
a clean clone checks them too): `nvidia-smi dmon` output without its header lines, and `amd-smi metric
--csv` (a row per timestamp, a block of columns per GPU). Imported into a real InfluxDB and read back;
constant readings while the timestamps advance are imported, a stale logger under load is not."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

from import_helpers import Import, influx_args, stored_points, utc_ns

from gpuprobe.devservices import InfluxDBDatabase

START = datetime(2025, 7, 24, 4, 47, 16)
GLITCH = 1047011272  # a real dmon sm% value of the H100 NVL log


def dmon_headerless() -> str:
    """`nvidia-smi dmon -o DT --format csv,noheader` of two GPUs for 200 s, 20 columns as the H100 NVL log
    (date, time, gpu, pwr, gtemp, mtemp, sm, mem, enc, dec, jpg, ofa, mclk, pclk and six more).

    GPU 0 idles: its imported columns never change, a column not imported (a counter) moves until
    second 100, then every cell stays the same for 99 s: a steady GPU, all of it data. At second 50 its
    sm% is garbage. GPU 1 is busy, then from second 120 repeats one row to the end: a stale logger."""
    lines = []
    for s in range(200):
        moment = START + timedelta(seconds=s)
        stamp = f" {moment:%Y%m%d}, {moment:%H:%M:%S}"
        sm0 = GLITCH if s == 50 else 0
        counter0 = s % 7 if s < 100 else 0
        lines.append(f"{stamp}, 0, 60, 34, 41, {sm0}, 0, 0, 0, 0, 0, 2619, 345, {counter0}, 0, -, -, -, -")
        if s < 120:
            lines.append(f"{stamp}, 1, {300 + s % 5}, {60 + s // 20}, 69, 99, 14, 0, 0, 0, 0, 2619, 1785, "
                         f"{20000 + s}, 20816, 17611, 18971, 0, 0")  # fmt: skip
        else:
            lines.append(f"{stamp}, 1, 315, 66, 69, 99, 14, 0, 0, 0, 0, 2619, 1785, 21065, 20816, 17611, 18971, 0, 0")
    return "\n".join(lines) + "\n"


def test_dmon_without_its_header_is_recognised_and_nothing_real_is_dropped(
    influxdb: InfluxDBDatabase, gpuprobe_import: Import, write_file: Callable[[str, str], Path]
) -> None:
    path = write_file("nvdmon.csv", dmon_headerless())
    status, out, err = gpuprobe_import("--host", "nvl", "--timezone", "+02:00", *influx_args(influxdb), path)
    assert status == 0, err
    assert "nvdmon.csv: nvidia-smi dmon without header, 400 rows, 321 points, 0 bad, 79 frozen" in out
    assert "columns from the default of --dmon-columns" in out and "6 more columns without a name after pclk" in out
    assert "GPU rows not imported: 79 of 400 (0 bad, 79 repeats in frozen stretches; below)" in out
    assert "out-of-range value in sm: 1 (lines nvdmon.csv:101)" in out
    assert ": 1, 79 rows not imported" in out  # GPU 1's stale repeats under load
    assert "host nvl gpu 1: 2025-07-24T02:49:16.000Z .. 2025-07-24T02:50:35.000Z (79 s, 79 repeated rows" in out
    assert "steady stretches (identical rows for 60 s or more at idle: readings, imported): 1, 99 rows" in out

    gpu0 = stored_points(influxdb, "WHERE gpu = '0'")
    first = utc_ns("2025-07-24T02:47:16")  # 04:47:16 at +02:00
    assert [p["time"] for p in gpu0] == [first + s * 1_000_000_000 for s in range(200)]
    assert {(p["power_w"], p["temp_c"], p["mem_temp_c"], p["mem_clock_mhz"], p["sm_clock_mhz"]) for p in gpu0} == {
        (60, 34, 41, 2619, 345)
    }
    assert [p["util_pct"] for p in gpu0].count(None) == 1  # the glitch value alone is left out
    assert gpu0[50]["util_pct"] is None and gpu0[50]["power_w"] == 60
    gpu1 = stored_points(influxdb, "WHERE gpu = '1'")
    assert [p["time"] for p in gpu1] == [first + s * 1_000_000_000 for s in range(121)]
    assert gpu1[120]["power_w"] == 315  # the stretch's first row is a real reading

    # --freeze-after 0: every row, the stale ones too
    influxdb.server.execute('DROP SERIES FROM "gpu"', influxdb.name)
    status, out, err = gpuprobe_import("--host", "nvl", "--freeze-after", "0", *influx_args(influxdb), path)
    assert status == 0, err
    assert len(stored_points(influxdb)) == 400


OLD_DRIVER_DMON = """\
 20250601   14:00:00      0     43     48      -      0      0      0      0   2619    345
 20250601   14:00:00      1    312     67     71     98     45      0      0   2619   1980
 20250601   14:00:01      0     44     48      -      1      0      0      0   2619    345
"""


def test_dmon_without_header_in_another_column_order(
    influxdb: InfluxDBDatabase, gpuprobe_import: Import, write_file: Callable[[str, str], Path]
) -> None:
    path = write_file("dmon.log", OLD_DRIVER_DMON)
    # the default order (with jpg and ofa) does not fit 12 columns: said, nothing written
    status, _, err = gpuprobe_import("--host", "n", *influx_args(influxdb), path)
    assert status == 2
    assert "12 columns in its first row, fewer than the 14 of --dmon-columns" in err and "--dmon-columns" in err
    columns = "date,time,gpu,pwr,gtemp,mtemp,sm,mem,enc,dec,mclk,pclk"
    status, out, err = gpuprobe_import("--host", "n", "--dmon-columns", columns, *influx_args(influxdb), path)
    assert status == 0, err
    assert "nvidia-smi dmon without header, 3 rows, 3 points" in out
    assert "columns from --dmon-columns: date time gpu pwr gtemp mtemp sm mem enc dec mclk pclk" in out
    points = stored_points(influxdb)
    assert [(p["gpu"], p["power_w"], p["mem_temp_c"], p["mem_clock_mhz"], p["sm_clock_mhz"]) for p in points] == [
        ("0", 43, None, 2619, 345),
        ("1", 312, 71, 2619, 1980),
        ("0", 44, None, 2619, 345),
    ]


AMD_BLOCK = ["gpu", "socket_power", "gfx_voltage", "throttle_status", "power_management", "gfx_0_clk", "gfx_1_clk",
             "mem_0_clk", "edge", "hotspot", "mem"]  # fmt: skip


def amd_smi_csv() -> str:
    """`amd-smi metric --csv` of two GPUs, as the MI300X log writes it: a Timestamp (unix s), then each
    GPU's block from its `gpu` column, the header ending in a comma that the rows do not have."""
    header = ",".join(["Timestamp", *AMD_BLOCK, *AMD_BLOCK]) + ","
    rows = [
        "1743386238,0,169,N/A,N/A,ENABLED,2103,2109,900,N/A,39,30,1,163,N/A,N/A,ENABLED,2098,2096,900,N/A,35,30",
        "1743386239,0,750,N/A,N/A,ENABLED,1410,1405,1300,N/A,71,52,1,N/A,N/A,N/A,ENABLED,2098,2096,900,N/A,N/A,N/A",
        "1743386241,0,598,N/A,N/A,ENABLED,1800,1795,1300,N/A,74,55,1,560,N/A,N/A,ENABLED,1790,1785,1300,N/A,66,50",
    ]
    return "\n".join([header, *rows]) + "\n"


def test_amd_smi_metric_csv(
    influxdb: InfluxDBDatabase,
    gpuprobe_import_amd: Import,
    gpuprobe_import: Import,
    write_file: Callable[[str, str], Path],
) -> None:
    path = write_file("smi_raw.csv", amd_smi_csv())
    model = ["--gpu-model", "AMD Instinct MI300X"]
    status, out, err = gpuprobe_import_amd("--host", "mi", *model, *influx_args(influxdb), path)
    assert status == 0, err
    assert "smi_raw.csv: amd-smi metric CSV (2 GPU blocks per row), 3 rows, 6 points, 0 bad" in out
    assert "columns not imported (not in the gpu schema): gfx_voltage, throttle_status, power_management, " in out
    points = stored_points(influxdb)
    assert {(p["host"], p["model"], p["vendor"], p["source"]) for p in points} == {
        ("mi", "AMD Instinct MI300X", "amd", "import")
    }
    got = [(p["time"], p["gpu"], p["power_w"], p["temp_c"], p["mem_temp_c"], p["sm_clock_mhz"], p["mem_clock_mhz"])
           for p in points]  # fmt: skip
    s = 1_000_000_000
    assert got == [
        (1743386238 * s, "0", 169, 39, 30, 2103, 900),
        (1743386238 * s, "1", 163, 35, 30, 2098, 900),
        (1743386239 * s, "0", 750, 71, 52, 1410, 1300),
        (1743386239 * s, "1", None, None, None, 2098, 900),  # N/A is absent, not zero
        (1743386241 * s, "0", 598, 74, 55, 1800, 1300),
        (1743386241 * s, "1", 560, 66, 50, 1790, 1300),
    ]

    # each command names the other for the other's files
    status, _, err = gpuprobe_import("--host", "mi", *influx_args(influxdb), path)
    assert status == 2 and "this is amd-smi metric --csv output: import it with `gpuprobe import amd-smi`" in err
    dmon = write_file("nvdmon.csv", dmon_headerless())
    status, _, err = gpuprobe_import_amd("--host", "mi", *influx_args(influxdb), dmon)
    assert status == 2 and "this is nvidia-smi dmon output: import it with `gpuprobe import nvidia-smi`" in err


def test_a_file_in_no_known_format_names_the_formats_expected(
    influxdb: InfluxDBDatabase,
    gpuprobe_import: Import,
    gpuprobe_import_amd: Import,
    write_file: Callable[[str, str], Path],
) -> None:
    other = write_file("log.txt", "uptime 12 days\nload 0.5\n")
    for run in (gpuprobe_import, gpuprobe_import_amd):
        status, out, err = run("--host", "h", *influx_args(influxdb), other)
        assert status == 2 and out == ""
        assert "not a log gpuprobe can read" in err
        for expected in ("nvidia-smi --query-gpu", "`nvidia-smi dmon` output with its", "or without it",
                         "`amd-smi metric --csv`", "--columns time=HEADER"):  # fmt: skip
            assert expected in err, expected
    assert stored_points(influxdb) == []


def test_an_energy_counter_that_stands_still_while_power_is_drawn_is_a_frozen_log(
    gpuprobe_import: Import, write_file: Callable[[str, str], Path]
) -> None:
    """No utilization column: identical rows are stale only when the energy counter stops while the GPU
    draws power; a counter that moves makes every row a new reading, however steady the rest."""
    lines = ["time,power,temp,energy"]
    lines += [f"2025-06-01T12:{s // 60:02d}:{s % 60:02d}Z,120,45,{1000 + 120 * min(s, 10)}" for s in range(100)]
    stale = write_file("stale.csv", "\n".join(lines) + "\n")
    columns = ["--columns", "time=time,power_w=power,temp_c=temp,energy_j=energy"]
    status, out, err = gpuprobe_import("--host", "h", *columns, "--dry-run", stale)
    assert status == 0, err
    assert "stale.csv: CSV mapped by --columns, 100 rows, 11 points, 0 bad, 89 frozen" in out

    lines = ["time,power,temp,energy"]
    lines += [f"2025-06-01T12:{s // 60:02d}:{s % 60:02d}Z,120,45,{1000 + 120 * s}" for s in range(100)]
    live = write_file("live.csv", "\n".join(lines) + "\n")
    status, out, err = gpuprobe_import("--host", "h", *columns, "--dry-run", live)
    assert status == 0, err
    assert "live.csv: CSV mapped by --columns, 100 rows, 100 points, 0 bad, 0 frozen" in out
    assert "steady stretches (identical rows for 60 s or more at idle: readings, imported): 0, 0 rows" in out
