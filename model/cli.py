"""Part: model. ``gpuprobe model``: the command around :func:`gpuprobe.model.run`."""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gpuprobe.config import Command, Option, parse_duration
from gpuprobe.influx.options import connection_options


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
    # whole microseconds, not timestamp() * 1e9: a float's 53 bits lose the last ns digits (…045000192)
    return (parsed - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1) * 1000


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
        "start of a time range to model instead of a probe: ISO 8601 (UTC without a zone), unix seconds, now,"
        " now-30m or -2h (a duration with its unit)",
        parse_time,
        metavar="TIME",
    ),
    Option("to", "end of the time range, in the same forms (default now)", parse_time, metavar="TIME"),
    Option(
        "hosts",
        "only these hosts (repeat or comma-separate; default all in the probe or range)",
        multiple=True,
        default=[],
        metavar="HOST",
        default_text="all",
    ),
    *connection_options(timeout_s=60.0),
    Option(
        "out",
        "folder for the report (<probe>.html) and every number (<probe>.json)",
        Path,
        default=Path("gpuprobe-report"),
        metavar="DIR",
    ),
    Option(
        "pue",
        "power usage effectiveness of the site (facility energy / IT energy); 1.0 counts the GPUs only",
        _positive,
        default=1.0,
        metavar="X",
    ),
    Option(
        "grid_kg_per_kwh",
        "carbon intensity of the electricity, kg CO2e per kWh: the default is a placeholder, not any real"
        " grid's figure; set yours",
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
    Option("arx_resample", "bin width of the ARX fit's block means", parse_duration, default=1.0),
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
        default_text="the GPU's own",
    ),
    Option("mic_window", "averaging window of the microphone's LAeq", parse_duration, default=1.0),
    Option("write_model", "write the fitted parameters back as the `model` measurement", is_flag=True, default=True),
    # `gpuprobe model predict FITTED.json ...` only
    Option(
        "power_w",
        "predict: each GPU's steady temperature, time to reach it and headroom at this power",
        _positive,
        metavar="W",
        flag_only=True,
    ),
    Option(
        "inlet_c",
        "predict --power-w: the inlet air's temperature (default the fitted T_amb and the node's inlet stage)",
        float,
        metavar="C",
        flag_only=True,
    ),
    Option("json", "predict: also write the figures to this JSON file", Path, metavar="FILE", flag_only=True),
]

PREDICT_ONLY = ("power_w", "inlet_c", "json")


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


def _action_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        nargs="*",
        metavar="predict FITTED.json",
        help="apply the models of a fitted JSON (what `gpuprobe model` writes) to another window (--from/--to) "
        "or ask for the steady temperature at a power (--power-w)",
    )


def _predict(values: dict[str, Any], fitted_path: Path) -> int:
    import json

    from gpuprobe.influx.influxql import InfluxError
    from gpuprobe.model import InfluxSettings, NoDataError
    from gpuprobe.model import predict as pr

    hosts = tuple(h for item in values["hosts"] for h in item.split(",") if h)
    try:
        document = json.loads(fitted_path.read_text(encoding="utf-8"))
        fitted, skipped = pr.load_fitted(document, hosts)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"gpuprobe model predict: {fitted_path}: {e}", file=sys.stderr)
        return 2
    out: dict[str, Any]
    if values["power_w"] is not None:
        if values["from"] is not None:
            print("gpuprobe model predict: give either --power-w or --from/--to, not both", file=sys.stderr)
            return 2
        per_host = {g.host: sum(1 for d in document["gpus"] if d["host"] == g.host) for g in fitted}
        answers = [pr.steady_answer(g, values["power_w"], per_host[g.host], inlet_c=values["inlet_c"]) for g in fitted]
        print(pr.steady_table(answers, skipped))
        out = pr.steady_json(answers, skipped, values["inlet_c"])
    else:
        if values["from"] is None:
            print("gpuprobe model predict: give --from TIME [--to TIME] or --power-w W", file=sys.stderr)
            return 2
        start, end = values["from"], values["to"] or time.time_ns()
        try:
            errors, skipped_window = pr.predict_range(
                InfluxSettings.from_option_values(values), fitted, start, end, hosts
            )
        except (NoDataError, InfluxError) as e:
            print(f"gpuprobe model predict: {e}", file=sys.stderr)
            return 1
        skipped = skipped + skipped_window
        print(pr.window_table(errors, skipped))
        out = pr.window_json(errors, skipped, start, end)
        span = f"{start // 10**9}-{end // 10**9}"
        html_path = values["out"] / f"predict-{span}.html"
        pr.write_text(html_path, pr.window_html(errors, f"{fitted_path.name} predicting {span}"))
        print(f"report: {html_path}")
    if values["json"] is not None:
        pr.write_text(values["json"], json.dumps(out, indent=1, ensure_ascii=False) + "\n")
        print(f"numbers: {values['json']}")
    return 0


def _run(values: dict[str, Any], args: argparse.Namespace) -> int:
    from gpuprobe.influx.influxql import InfluxError
    from gpuprobe.model import NoDataError, run

    action = list(getattr(args, "action", []) or [])
    if action:
        if action[0] != "predict" or len(action) != 2:
            print("gpuprobe model: the only action is `predict FITTED.json`", file=sys.stderr)
            return 2
        return _predict(values, Path(action[1]))
    given = [name for name in PREDICT_ONLY if values[name] is not None]
    if given:
        print(f"gpuprobe model: --{given[0].replace('_', '-')} is for `gpuprobe model predict`", file=sys.stderr)
        return 2

    try:
        settings = settings_from(values)
    except ValueError as e:
        print(f"gpuprobe model: {e}", file=sys.stderr)
        return 2
    from gpuprobe.model.api import QuietProgress

    progress = QuietProgress("gpuprobe model")
    try:
        paths = run(settings, progress)
    except (NoDataError, InfluxError) as e:
        print(f"gpuprobe model: {e}", file=sys.stderr)
        return 1
    finally:
        progress.close()
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
            "a summary table. `gpuprobe model predict FITTED.json` applies the models of such a JSON to another "
            "window (--from/--to: RMS, bias and largest error against the measured temperature) or answers for "
            "a power (--power-w [--inlet-c]: steady temperature, time to reach it, headroom). Methods and "
            "sources: docs/models.md."
        ),
        run=_run,
        options=OPTIONS,
        extra_arguments=_action_argument,
    )
]
