"""Part: importer. ``gpuprobe import nvidia-smi FILE…`` and ``gpuprobe import amd-smi FILE…``: the commands around
:class:`gpuprobe.importer.run.Importer`.

The ``--influx-*`` options are ``gpuprobe model``'s own declarations (the operator's machine talks to
the same InfluxDB with the same settings for both).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gpuprobe.config import Command, Option, parse_duration
from gpuprobe.importer.timeparse import check_time_format, check_timezone
from gpuprobe.model import cli as model_cli

INFLUX_OPTIONS = [option for option in model_cli.OPTIONS if option.name.startswith("influx_")]


OPTIONS = [
    Option(
        "host",
        "host tag of every imported point (required unless --columns maps a host column)",
        default="",
        metavar="NAME",
    ),
    Option(
        "gpu_model",
        "model tag when the file has no name column, e.g. 'NVIDIA H100 80GB HBM3' (dmon output has none)",
        default="",
        metavar="NAME",
    ),
    Option("cluster", "cluster tag of every imported point (empty: none)", default="", metavar="NAME"),
    Option(
        "timezone",
        "time zone of timestamps written without one: nvidia-smi writes the machine's LOCAL time without a "
        "zone, so give the zone the logging machine was in (UTC, an IANA name such as Europe/Berlin, or "
        "+HH:MM/-HH:MM)",
        check_timezone,
        default="UTC",
        metavar="TZ",
    ),
    Option(
        "columns",
        "read another CSV: KEY=HEADER[:UNIT],... with KEY time, gpu, uuid, model, host or a gpu field of "
        "docs/schema.md (temp_c, power_w, mem_used_bytes:MiB...); only the mapped columns are imported",
        multiple=True,
        default=[],
        metavar="KEY=HEADER",
    ),
    Option(
        "time_format",
        "the time column of --columns: auto (nvidia-smi's format, ISO 8601 or unix time by magnitude), iso, "
        "unix, unix_ms, unix_us, unix_ns or a strptime format such as '%%d.%%m.%%Y %%H:%%M:%%S'",
        check_time_format,
        default="auto",
        metavar="FORMAT",
    ),
    Option(
        "freeze_after",
        "rows of a GPU whose every cell but the time stays identical this long while it is busy (util > 0) "
        "or its energy counter stands still under power are a frozen log (nvidia-smi repeats its last row "
        "when the driver hangs): reported, its first row imported and the repeats not; identical rows of an "
        "idle GPU are readings and are imported; 0 turns it off",
        parse_duration,
        default=60.0,
        metavar="DURATION",
    ),
    Option("dry_run", "read and report everything, write nothing", is_flag=True, default=False),
    Option(
        "dmon_date",
        "day of the first row of `nvidia-smi dmon -o T` output (times without dates), YYYY-MM-DD",
        default="",
        metavar="DATE",
    ),
    Option(
        "dmon_start",
        "time of the first row of dmon output without -o T/DT (nvidia-smi's format or ISO 8601, in --timezone)",
        default="",
        metavar="TIME",
    ),
    Option(
        "dmon_columns",
        "the columns, in order, of nvidia-smi dmon output WITHOUT its header lines (a first line such as "
        "'20250724, 04:47:16, 0, 63, ...'), e.g. date,time,gpu,pwr,gtemp,mtemp,sm,mem,enc,dec,mclk,pclk for a "
        "driver without jpg/ofa; by default dmon -o DT -s pucm of current drivers: "
        "date,time,gpu,pwr,gtemp,mtemp,sm,mem,enc,dec,jpg,ofa,mclk,pclk (further columns are not imported)",
        multiple=True,
        default=[],
        metavar="NAMES",
    ),
    Option(
        "dmon_interval",
        "time between the rows of one GPU in dmon output without times (dmon -d)",
        parse_duration,
        default=1.0,
        metavar="DURATION",
    ),
    *INFLUX_OPTIONS,
]


def _files(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", type=Path, metavar="FILE", help="nvidia-smi CSV or dmon logs")


def _amd_files(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", type=Path, metavar="FILE", help="amd-smi metric --csv logs")


def settings_from(values: dict[str, Any], files: list[Path], expect: str = "nvidia") -> Any:
    """The import's settings from the options; ValueError with the option's name for a bad value."""
    from gpuprobe.importer.formats import ReadOptions, parse_columns, parse_day, parse_start
    from gpuprobe.importer.run import ImportSettings
    from gpuprobe.importer.timeparse import NS_PER_S, parse_timezone
    from gpuprobe.influx.settings import InfluxSettings
    from gpuprobe.influx.storable import tag_value_problem

    zone = parse_timezone(values["timezone"])
    if not values["influx_timeout"] > 0:
        raise ValueError(f"--influx-timeout must be positive, not {values['influx_timeout']:g} s")
    values = {**{o.name: o.default for o in OPTIONS}, **values}  # import amd-smi has no dmon options
    if not values["dmon_interval"] > 0:
        raise ValueError(f"--dmon-interval must be positive, not {values['dmon_interval']:g} s")
    for name in ("host", "cluster", "gpu_model"):
        problem = tag_value_problem(values[name], max_bytes=256) if values[name] else None
        if problem is not None:
            raise ValueError(f"--{name.replace('_', '-')} {problem}")
    try:
        day = parse_day(values["dmon_date"]) if values["dmon_date"] else None
    except ValueError as e:
        raise ValueError(f"--dmon-date: {e}") from None
    try:
        start = parse_start(values["dmon_start"], zone) if values["dmon_start"] else None
    except ValueError as e:
        raise ValueError(f"--dmon-start: {e}") from None
    read = ReadOptions(
        zone=zone,
        time_format=values["time_format"],
        columns=parse_columns(values["columns"]),
        host=values["host"],
        gpu_model=values["gpu_model"],
        dmon_date=day,
        dmon_start_ns=start,
        dmon_interval_ns=round(values["dmon_interval"] * NS_PER_S),
        dmon_columns=tuple(values["dmon_columns"]),
        expect=expect,
    )
    return ImportSettings(
        files=tuple(files),
        read=read,
        cluster=values["cluster"],
        freeze_after_s=values["freeze_after"],
        dry_run=values["dry_run"],
        influx=InfluxSettings.from_option_values(values),
    )


def _run(values: dict[str, Any], args: argparse.Namespace) -> int:
    return _import(values, args, "nvidia")


def _run_amd(values: dict[str, Any], args: argparse.Namespace) -> int:
    return _import(values, args, "amd")


def _import(values: dict[str, Any], args: argparse.Namespace, expect: str) -> int:
    from gpuprobe.importer.progress import Progress
    from gpuprobe.importer.run import Importer, open_sources
    from gpuprobe.influx.client import InfluxClient
    from gpuprobe.influx.influxql import InfluxError

    name = f"gpuprobe import {'amd-smi' if expect == 'amd' else 'nvidia-smi'}"
    try:
        settings = settings_from(values, list(args.files), expect)
        sources = open_sources(settings)
    except ValueError as e:  # FormatError too: nothing has been written
        print(f"{name}: {e}", file=sys.stderr)
        return 2
    progress = Progress(sys.stderr)
    if settings.dry_run:
        report = Importer(settings, None, progress).run(sources)
    else:
        with InfluxClient(settings.influx, user_agent="gpuprobe-import") as client:
            importer = Importer(settings, lambda lines: client.write(lines), progress)
            try:
                report = importer.run(sources)
            except InfluxError as e:
                progress.finish()
                print(f"{name}: {e}", file=sys.stderr)
                print(
                    f"{name}: {importer.report.lines_sent} points were written before "
                    "the error; importing again is safe (a point written twice overwrites itself)",
                    file=sys.stderr,
                )
                return 1
    print(report.render())
    if report.points == 0:
        print(f"{name}: nothing to import", file=sys.stderr)
        return 1
    return 0


COMMANDS = [
    Command(
        name="import.nvidia-smi",
        help="import existing nvidia-smi logs (--query-gpu CSV, dmon) as `gpu` points tagged source=import",
        description=(
            "Reads the CSV of `nvidia-smi --query-gpu=timestamp,index,name,uuid,... --format=csv[,nounits]`, "
            "`nvidia-smi dmon` output (-o DT, -o T with --dmon-date, or none with --dmon-start; with its header, "
            "or without it, recognised from its first row, columns from --dmon-columns) or, with "
            "--columns, any other CSV; converts every value to the unit of its `gpu` field (docs/schema.md) "
            "exactly and writes the points to InfluxDB in batches of 5000 lines (v1 /write), tagged host, gpu, "
            "uuid, model, cluster and source=import. TIMESTAMPS: nvidia-smi writes the logging machine's local "
            "time WITHOUT a zone; they are read in --timezone, which is UTC unless you say otherwise. FROZEN "
            "LOGS: rows of one GPU whose every cell but the time stays identical for --freeze-after (60 s) or "
            "more while the GPU is busy, or its energy counter stands still under power, are a frozen stretch: "
            "its first row is imported and the repeats are not; identical rows of an idle GPU are readings "
            "(a steady stretch, imported and counted). Bad rows are counted by reason with their line numbers "
            "and skipped; an impossible value (a percentage beyond 0-100...) is left out of its row. Prints a "
            "summary: rows read, points written, rows not imported and why, bad rows and values, frozen and "
            "steady stretches, each GPU's time range. Exit status 0; 1 when nothing was imported or InfluxDB "
            "failed; 2 for a usage error or a file in none of the formats (nothing is written then). "
            "Details: docs/models.md, 'Importing existing GPU logs'."
        ),
        run=_run,
        options=OPTIONS,
        extra_arguments=_files,
    ),
    Command(
        name="import.amd-smi",
        help="import `amd-smi metric --csv` logs (AMD Instinct) as `gpu` points tagged vendor=amd, source=import",
        description=(
            "Reads `amd-smi metric --csv` output: one row per timestamp (a Timestamp column, unix time) and a "
            "block of columns per GPU, each starting at its `gpu` column. Imports socket_power (power_w), "
            "hotspot, the junction temperature (temp_c; edge when there is no hotspot), mem, the HBM "
            "temperature (mem_temp_c), gfx_activity and umc_activity (util_pct, mem_util_pct), gfx_0_clk and "
            "mem_0_clk (sm_clock_mhz, mem_clock_mhz); N/A is absent, not zero; the other columns (voltages, "
            "throttle_status, the other clocks) are listed as not imported. Points are tagged host, gpu, model "
            "(--gpu-model), vendor=amd, cluster and source=import. Bad rows, frozen and steady stretches, the "
            "summary and the exit status as for `gpuprobe import nvidia-smi`. Details: docs/models.md, "
            "'Importing existing GPU logs'."
        ),
        run=_run_amd,
        options=[o for o in OPTIONS if not o.name.startswith("dmon_") and o.name not in ("columns",)],
        extra_arguments=_amd_files,
    ),
]
