"""``gpuprobe import nvidia-smi FILE…``: the command around :class:`gpuprobe.importer.run.Importer`.

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
        "a GPU whose measured values all stay identical this long is a frozen log (nvidia-smi repeats its "
        "last row when the driver hangs): the stretch is reported, its first row imported and the repeats "
        "not; 0 turns it off",
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


def settings_from(values: dict[str, Any], files: list[Path]) -> Any:
    """The import's settings from the options; ValueError with the option's name for a bad value."""
    from gpuprobe.importer.formats import ReadOptions, parse_columns, parse_day, parse_start
    from gpuprobe.importer.run import ImportSettings
    from gpuprobe.importer.timeparse import NS_PER_S, parse_timezone
    from gpuprobe.influx.settings import InfluxSettings
    from gpuprobe.influx.storable import tag_value_problem

    zone = parse_timezone(values["timezone"])
    if not values["influx_timeout"] > 0:
        raise ValueError(f"--influx-timeout must be positive, not {values['influx_timeout']:g} s")
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
    from gpuprobe.importer.progress import Progress
    from gpuprobe.importer.run import Importer, open_sources
    from gpuprobe.influx.client import InfluxClient
    from gpuprobe.influx.influxql import InfluxError

    try:
        settings = settings_from(values, list(args.files))
        sources = open_sources(settings)
    except ValueError as e:  # FormatError too: nothing has been written
        print(f"gpuprobe import nvidia-smi: {e}", file=sys.stderr)
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
                print(f"gpuprobe import nvidia-smi: {e}", file=sys.stderr)
                print(
                    f"gpuprobe import nvidia-smi: {importer.report.lines_sent} points were written before "
                    "the error; importing again is safe (a point written twice overwrites itself)",
                    file=sys.stderr,
                )
                return 1
    print(report.render())
    if report.points == 0:
        print("gpuprobe import nvidia-smi: nothing to import", file=sys.stderr)
        return 1
    return 0


COMMANDS = [
    Command(
        name="import.nvidia-smi",
        help="import existing nvidia-smi logs (--query-gpu CSV, dmon) as `gpu` points tagged source=import",
        description=(
            "Reads the CSV of `nvidia-smi --query-gpu=timestamp,index,name,uuid,... --format=csv[,nounits]`, "
            "`nvidia-smi dmon` output (-o DT, -o T with --dmon-date, or none with --dmon-start) or, with "
            "--columns, any other CSV; converts every value to the unit of its `gpu` field (docs/schema.md) "
            "exactly and writes the points to InfluxDB in batches of 5000 lines (v1 /write), tagged host, gpu, "
            "uuid, model, cluster and source=import. TIMESTAMPS: nvidia-smi writes the logging machine's local "
            "time WITHOUT a zone; they are read in --timezone, which is UTC unless you say otherwise. FROZEN "
            "LOGS: rows of one GPU whose measured values all stay identical for --freeze-after (60 s) or more "
            "are reported as a frozen stretch; its first row is imported and the repeats are not. Bad rows are "
            "counted by reason with their line numbers and skipped. Prints a summary: rows read, points "
            "written, bad rows, frozen stretches, each GPU's time range. Exit status 0; 1 when nothing was "
            "imported or InfluxDB failed; 2 for a usage error or a file that is neither format (nothing is "
            "written then). Details: docs/models.md, 'Importing existing nvidia-smi logs'."
        ),
        run=_run,
        options=OPTIONS,
        extra_arguments=_files,
    )
]
