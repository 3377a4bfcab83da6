"""``gpuprobe model``: the command around :func:`gpuprobe.model.run`."""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuprobe.config import Command, Option, parse_duration


def parse_time(text: str) -> int:
    """A point in time as unix ns: ``now``, ``now-2h`` / ``-2h`` (a duration with its unit, as every
    duration option takes it), unix seconds, or ISO 8601 (``2025-06-01T12:00:00Z``; without a zone it is UTC)."""
    value = text.strip()
    now_ns = time.time_ns()
    if value == "now":
        return now_ns
    relative = value[3:] if value.startswith("now") else value
    # a unit is required here: a bare "-30" is unix time -30 s, as it has always been
    if relative.startswith("-") and relative[-1:].isalpha():
        try:
            return now_ns - int(parse_duration(relative[1:]) * 1e9)
        except ValueError:
            pass
    try:
        return int(float(value) * 1e9)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"not a time: {text!r} (use ISO 8601, unix seconds, now or now-30m)") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1e9)


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError(f"must be positive, not {text}")
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if value < 0:
        raise ValueError(f"must not be negative, not {text}")
    return value


def _holdout_fraction(text: str) -> float:
    value = float(text)
    if not 0 < value < 0.9:
        raise ValueError(f"--holdout must be a fraction between 0 and 0.9 (exclusive), not {text}")
    return value


OPTIONS = [
    Option("probe", "the probe to model (its id, the `probe` tag)", default="", metavar="ID"),
    Option(
        "from",
        "start of a time range to model instead of a probe (ISO 8601, unix s, now-1h)",
        parse_time,
        metavar="TIME",
    ),
    Option("to", "end of the time range (default now)", parse_time, metavar="TIME"),
    Option(
        "hosts",
        "only these hosts (repeat or comma-separate; default all in the probe or range)",
        multiple=True,
        default=[],
        metavar="HOST",
    ),
    Option(
        "influx_url",
        "InfluxDB base URL (v1 /query and /write; 2.x through its v1 API)",
        default="http://127.0.0.1:8086",
        metavar="URL",
    ),
    Option("influx_db", "database (v1; on 2.x the database mapped to the bucket)", default="gpuprobe", metavar="NAME"),
    Option("influx_rp", "retention policy (empty: the database default)", default="", metavar="NAME"),
    Option("influx_username", "user name for basic authentication", default="", metavar="NAME"),
    Option("influx_password", "password for basic authentication", default="", metavar="SECRET"),
    Option("influx_token", "token, sent as 'Authorization: Token ...' (2.x v1 API)", default="", metavar="SECRET"),
    Option("influx_timeout", "timeout of one request", parse_duration, default=60.0),
    Option(
        "out",
        "folder for the report (<probe>.html) and every number (<probe>.json)",
        Path,
        default=Path("gpuprobe-report"),
        metavar="DIR",
    ),
    Option(
        "pue",
        "power usage effectiveness of the site (facility energy / IT energy)",
        _positive,
        default=1.0,
        metavar="X",
    ),
    Option(
        "grid_kg_per_kwh",
        "carbon intensity of the electricity, kg CO2e per kWh (set your grid's)",
        _non_negative,
        default=0.4,
        metavar="KG",
    ),
    Option("price_per_gpu_hour", "price of one GPU-hour, for the cost (omit: no cost)", _non_negative, metavar="PRICE"),
    Option(
        "outlier_r_th_pct",
        "a GPU is 'hotter' when its R_th exceeds its model's median by this many percent",
        _non_negative,
        default=15.0,
        metavar="PCT",
    ),
    Option(
        "outlier_dba",
        "a GPU is 'louder' when its steady proxy level exceeds its model's median by this many dB",
        _non_negative,
        default=3.0,
        metavar="DB",
    ),
    Option(
        "outlier_samples_per_j_pct",
        "a GPU is 'less efficient' when its samples/J is below its model's median by this many percent",
        _non_negative,
        default=10.0,
        metavar="PCT",
    ),
    Option(
        "arx_resample",
        "bin width of the ARX fit's block means",
        parse_duration,
        default=1.0,
    ),
    Option(
        "holdout",
        "thermal models are fitted on the first 1-F of the window and chosen by their error predicting the "
        "last F from the measured power (0 < F < 0.9)",
        _holdout_fraction,
        default=0.3,
        metavar="F",
    ),
    Option(
        "slowdown_c",
        "slowdown threshold for every GPU, °C (default: the GPU's own, docs/models.md)",
        float,
        metavar="C",
    ),
    Option(
        "mic_window",
        "averaging window of the microphone's LAeq",
        parse_duration,
        default=1.0,
    ),
    Option("write_model", "write the fitted parameters back as the `model` measurement", is_flag=True, default=True),
]


def settings_from(values: dict[str, Any]) -> Any:
    from gpuprobe.model import InfluxSettings, ModelSettings

    for name in ("influx_timeout", "arx_resample", "mic_window"):
        if not values[name] > 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, not {values[name]:g} s")
    if not 0 < values["holdout"] < 0.9:
        raise ValueError(f"--holdout must be a fraction between 0 and 0.9 (exclusive), not {values['holdout']:g}")
    probe = values["probe"] or None
    start, end = values["from"], values["to"]
    if probe is None and start is None:
        raise ValueError("give --probe ID, or --from TIME [--to TIME]")
    if probe is not None and start is not None:
        raise ValueError("give either --probe or --from/--to, not both")
    if start is not None and end is None:
        end = time.time_ns()
    return ModelSettings(
        influx=InfluxSettings.from_option_values(values),
        probe=probe,
        start_ns=start,
        end_ns=end,
        hosts=tuple(h for item in values["hosts"] for h in item.split(",") if h),
        out_dir=values["out"],
        pue=values["pue"],
        grid_kg_per_kwh=values["grid_kg_per_kwh"],
        price_per_gpu_hour=values["price_per_gpu_hour"],
        outlier_r_th_pct=values["outlier_r_th_pct"],
        outlier_dba=values["outlier_dba"],
        outlier_samples_per_j_pct=values["outlier_samples_per_j_pct"],
        arx_resample_s=values["arx_resample"],
        holdout=values["holdout"],
        slowdown_c=values["slowdown_c"],
        mic_window_s=values["mic_window"],
        write_model=values["write_model"],
    )


def _run(values: dict[str, Any], _args: argparse.Namespace) -> int:
    from gpuprobe.influx.influxql import InfluxError
    from gpuprobe.model import NoDataError, run

    try:
        settings = settings_from(values)
    except ValueError as e:
        print(f"gpuprobe model: {e}", file=sys.stderr)
        return 2
    try:
        paths = run(settings)
    except (NoDataError, InfluxError) as e:
        print(f"gpuprobe model: {e}", file=sys.stderr)
        return 1
    print(paths.summary)
    print()
    print(f"report: {paths.html}")
    print(f"numbers: {paths.json}")
    if settings.write_model:
        print(f"`model` points written: {paths.model_points_written}")
    return 0


COMMANDS = [
    Command(
        name="model",
        help="fit thermal, acoustic and efficiency models for a probe or a time range; write the report",
        description=(
            "Reads a probe (or a time range) from InfluxDB with InfluxQL, fits per GPU and node a thermal "
            "model (first-order or two-stage RC, optionally with the node's inlet air and the fan; chosen by its "
            "error on the held-out end of the window, --holdout) giving R_th, tau, T_amb, the acoustic proxy "
            "levels and their calibration against a microphone, and the efficiency (samples/J, energy, carbon, "
            "cost); writes a self-contained HTML "
            "report and a JSON file, writes the fitted parameters back as the `model` measurement, and prints "
            "a summary table. Methods and sources: docs/models.md."
        ),
        run=_run,
        options=OPTIONS,
    )
]
