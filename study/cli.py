"""Part: study. ``gpuprobe study …``: the study commands. ``study report`` is the analysis (:func:`gpuprobe.study.run`).

Each subcommand is one :class:`~gpuprobe.config.Command` named ``study.<name>`` in :data:`COMMANDS`
(``app/cli.py`` registers the list); add a subcommand by appending to it. The ``--influx-*``
options are ``gpuprobe model``'s own declarations (:data:`INFLUX_OPTIONS`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gpuprobe.config import Command, Option
from gpuprobe.model import cli as model_cli

INFLUX_OPTIONS = [option for option in model_cli.OPTIONS if option.name.startswith("influx_")]


def _study_id_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study_id", metavar="STUDY_ID", help="the study id (the `probe` tag of its events)")


REPORT_OPTIONS = [
    Option(
        "prices",
        'TOML file of node prices: "INSTANCE TYPE" = USD per hour, e.g. "p5.48xlarge" = 98.32 (omit: no cost)',
        Path,
        metavar="FILE",
        doc="node prices per instance type ([below](#prices)); without it no cost is computed",
    ),
    Option(
        "html",
        "write the report with its plots to this HTML file (self-contained, nothing loaded from the network)",
        Path,
        metavar="FILE",
    ),
    Option("json", "write every figure to this JSON file", Path, metavar="FILE"),
    Option(
        "hosts",
        "only these hosts (repeat or comma-separate; default all of the study)",
        multiple=True,
        default=[],
        metavar="HOST",
        default_text="all",
    ),
    Option(
        "write",
        "write one `model` point (kind=study) per group back to InfluxDB (--no-write: do not)",
        is_flag=True,
        default=True,
    ),
    *INFLUX_OPTIONS,
]


def _progress(message: str) -> None:
    print(f"gpuprobe study report: {message}", file=sys.stderr, flush=True)


def _report(values: dict[str, Any], args: argparse.Namespace) -> int:
    from gpuprobe.errors import ConfigError
    from gpuprobe.influx.influxql import InfluxError
    from gpuprobe.influx.settings import InfluxSettings
    from gpuprobe.study import NoDataError, ReportSettings, load_prices, run

    if not values["influx_timeout"] > 0:
        print(
            f"gpuprobe study report: --influx-timeout must be positive, not {values['influx_timeout']:g} s",
            file=sys.stderr,
        )
        return 2
    try:
        prices = load_prices(values["prices"]) if values["prices"] is not None else None
    except ConfigError as e:
        print(f"gpuprobe study report: {e}", file=sys.stderr)
        return 2
    settings = ReportSettings(
        study=args.study_id,
        influx=InfluxSettings.from_option_values(values),
        hosts=tuple(h for item in values["hosts"] for h in item.split(",") if h),
        prices=prices,
        prices_file=values["prices"],
        html=values["html"],
        json=values["json"],
        write_model=values["write"],
    )
    try:
        outcome = run(settings, _progress)
    except (NoDataError, InfluxError) as e:
        print(f"gpuprobe study report: {e}", file=sys.stderr)
        return 1
    print(outcome.summary)
    print()
    if outcome.html is not None:
        print(f"report: {outcome.html}")
    if outcome.json is not None:
        print(f"numbers: {outcome.json}")
    if settings.write_model:
        print(f"`model` points written (kind=study): {outcome.model_points_written}")
    return 0


COMMANDS = [
    Command(
        name="study.report",
        help="the report of a study: throughput, samples/J, cost, Pareto frontier, scaling, virtualization overhead",
        description=(
            "Reads a study (a fleet probe whose steady phases ran a matrix of workload x batch size x power limit "
            "points) from InfluxDB with InfluxQL: each GPU's steady window of each point from the `probe` events, "
            "its throughput from the `trainer` reports, its power from the NVML energy counter, its temperature, "
            "enforced limit, SM clock and proxy level from the `gpu` and `acoustic` samples. Groups them by "
            "instance type, GPU model, virt, region, workload, batch size and power limit; finds per GPU model "
            "and workload the time-energy Pareto frontier and its energy- and time-optimal points, the batch-size "
            "scaling and the overhead of virtualized groups against bare metal; ranks GPU models and instance "
            "types by samples/J; lists refused points with their reasons. Prints the tables, writes --html and "
            "--json, and one `model` point (kind=study) per group unless --no-write. Figures whose throughput is "
            "the simulator's performance model (trainer device=sim) are labelled simulated. Exit status 0; 1 when "
            "the study is unknown, has no data or InfluxDB fails (the message says which); 2 for a usage error "
            "(a bad --prices file included). Definitions: docs/studies.md."
        ),
        run=_report,
        options=REPORT_OPTIONS,
        extra_arguments=_study_id_arg,
    )
]


# --- study start ------------------------------------------------------------------------------------


def _start_options() -> list[Option]:
    from gpuprobe.control import cli as control_cli
    from gpuprobe.control.mqtt import MQTT_OPTIONS
    from gpuprobe.study.start import STUDY_OPTIONS

    gpus = next(o for o in control_cli.START_OPTIONS if o.name == "gpus")
    as_json = Option("json", "print the replies as JSON", is_flag=True, default=False)
    return [
        *MQTT_OPTIONS,
        control_cli.KEY,
        *STUDY_OPTIONS,
        gpus,
        control_cli.LIFETIME,
        control_cli.WAIT,
        control_cli.ISSUER,
        as_json,
    ]


def _start(values: dict[str, Any], args: argparse.Namespace) -> int:
    import time

    from gpuprobe.config import ConfigError
    from gpuprobe.control import cli as control_cli
    from gpuprobe.control import signing
    from gpuprobe.study import start as study_start

    name = "study start"
    now = time.time_ns()
    try:
        key = control_cli._load_key(name, values)
        command = signing.new_command(
            issuer=values["issuer"] or control_cli._issuer(), lifetime_s=values["lifetime"], now_ns=now
        )
        found, study_id = study_start.build(values, command, now)
        if values["lifetime"] <= values["start_in"]:
            raise ConfigError(
                f"--lifetime ({values['lifetime']:.0f} s) must be longer than --start-in ({values['start_in']:.0f} s)"
            )
    except (ConfigError, ValueError) as e:
        return control_cli._error(name, str(e))
    command.probe_start.gpu_indices.extend(values["gpus"] or [])
    points = [
        {"index": i, "workload": w, "power_limit": limit, "batch_size": b}
        for i, (w, limit, b) in enumerate(found.points())
    ]
    return control_cli.send_start(
        name,
        values,
        command,
        key,
        headline=f"study {study_id}: {study_start.describe(found, values)}",
        json_head={"study": study_id},
        json_extra={"points": points},
        next_steps=f"watch it:  gpuprobe study status {study_id}\nreport:    gpuprobe study report {study_id}",
    )


# --- study status -----------------------------------------------------------------------------------


def _status_options() -> list[Option]:
    from gpuprobe.control import cli as control_cli

    return [
        *control_cli.STATUS_OPTIONS,
        Option(
            "json",
            "print every point's result reported so far as JSON, at once (no live view)",
            is_flag=True,
            default=False,
        ),
    ]


def _points_table(rows: list[dict[str, Any]]) -> str:
    from gpuprobe.control import render

    def fmt(value: Any, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    body = [
        [
            r["host"], str(r["point"]), r["workload"], str(r["batch_size"]), r["power_limit"],
            fmt(r["samples_per_s"], ".1f"), fmt(r["j_per_sample"], ".4f"), fmt(r["mean_power_w"], ".0f"),
            render.throughput_source(r["device"]), r["refused"] or "",
        ]
        for r in rows
    ]  # fmt: skip
    headers = ["host", "point", "workload", "batch", "limit", "samples/s", "J/sample", "power W", "throughput"]
    headers.append("refused")
    return render.table(headers, body)


def _status(values: dict[str, Any], args: argparse.Namespace) -> int:
    import json

    from gpuprobe.control import cli as control_cli
    from gpuprobe.control import operator_side, render
    from gpuprobe.study.start import point_rows

    study_id: str = args.study_id
    if not values["json"]:
        # the live view of every node (phase, step, samples/s), until every node has its result
        code = control_cli._status(values, argparse.Namespace(probe_id=study_id))
        if code != 0:
            return code

    async def main(broker: Any) -> int:
        async with operator_side.Session(broker) as session:
            view = await operator_side.probe_view(session, study_id)
        rows = [row for host in view.hosts(study_id) if (study_id, host) in view.results
                for row in point_rows(view.results[(study_id, host)])]  # fmt: skip
        if values["json"]:
            print(json.dumps({"study": study_id, "points": rows}, indent=2))
        elif rows:
            simulated = any(r["simulated"] for r in rows)
            note = f"; {render.SIMULATED_NOTE}" if simulated else ""
            print(f"\nstudy {study_id}: every point on every node (node totals over each steady phase{note})")
            print(_points_table(rows))
            print(f"\nthe full comparison: gpuprobe study report {study_id}")
        if not view.hosts(study_id):
            print(f"gpuprobe study status: no study {study_id!r} on the broker", file=sys.stderr)
            return 1
        return 0

    return control_cli._run_async("study status", values, main)


COMMANDS.extend(
    [
        Command(
            name="study.start",
            help="start a study: a signed probe whose points run every workload x power limit x batch size",
            description=(
                "Signs one probe command whose points are every combination of --workloads, --power-limits and "
                "--batch-sizes (in that nesting), and sends it to the agents --nodes selects. Every node runs the "
                "same point at the same time: one idle baseline, then per point a warm-up and a --duration steady "
                "phase, then one cool-down. Power limits are a percent of each GPU's maximum limit (60%) or watts "
                "(250W); an agent sets them only with --allow-power-limits and the privilege, refuses the points "
                "it cannot run (the others still run) and always restores the previous limits. Exit status 0 when "
                "every selected agent accepted, 3 when some refused, 1 when none did, 2 for a usage error. See "
                "docs/studies.md."
            ),
            run=_start,
            options=_start_options(),
        ),
        Command(
            name="study.status",
            help="a study's live progress on every node, then every point's result",
            description=(
                "Shows each node's phase, step and samples/s until every node has its result (like `gpuprobe probe "
                "status`), then one row per node and point: samples/s, J/sample and mean power over the point's "
                "steady phase, or why the node did not run it. --once prints the current state and exits."
            ),
            run=_status,
            options=_status_options(),
            extra_arguments=_study_id_arg,
        ),
    ]
)
