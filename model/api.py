"""The one-call API of ``gpuprobe.model`` (re-exported lazily by the package)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpuprobe import __version__
from gpuprobe.influx.client import InfluxClient
from gpuprobe.influx.eventreads import event_sources
from gpuprobe.influx.retention import write_with_events
from gpuprobe.model.analysis import ModelSettings, Progress, Results, analyze
from gpuprobe.model.data import Dataset, find_probe, load, range_window


@dataclass(frozen=True)
class ReportPaths:
    """What a run produced: the report, the JSON, the terminal summary, and the results themselves."""

    html: Path
    json: Path
    summary: str
    results: Results
    model_points_written: int


def _settings_for_report(s: ModelSettings) -> dict[str, Any]:
    shown = asdict(s)
    influx = shown.pop("influx")
    shown["influx_url"] = influx["url"]
    shown["influx_db"] = influx["database"]
    shown["influx_rp"] = influx["retention_policy"]
    shown["out_dir"] = str(s.out_dir)
    shown["hosts"] = ",".join(s.hosts)
    return shown


def fit(settings: ModelSettings, progress: Progress | None = None) -> tuple[Dataset, Results]:
    """Read and fit, without writing anything; ``progress`` hears each stage as it starts."""
    say = progress or (lambda _message: None)
    if not settings.probe and (settings.start_ns is None or settings.end_ns is None):
        raise ValueError("give a probe id, or both the start and the end of a time range")
    with InfluxClient(settings.influx, user_agent="gpuprobe-model") as client:
        sources = event_sources(client)  # asked once: where the probe, trainer and gpu_info points are
        if settings.probe:
            window = find_probe(client, settings.probe, settings.hosts, sources)
        else:
            assert settings.start_ns is not None and settings.end_ns is not None
            window = range_window(client, settings.start_ns, settings.end_ns, settings.hosts)
        say(f"reading the samples of {window.describe()} on {len(window.hosts)} host(s)")
        dataset = load(client, window, sources)
    return dataset, analyze(dataset, settings, progress)


def _file_stem(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in label) or "report"


def run(settings: ModelSettings, progress: Progress | None = None) -> ReportPaths:
    """Fit, write ``<out_dir>/<label>.html`` and ``.json``, and (unless disabled) the ``model`` points;
    ``progress`` hears each stage as it starts."""
    from gpuprobe.model.output import model_lines, summary_table, to_jsonable
    from gpuprobe.model.report import render_html

    dataset, results = fit(settings, progress)
    if progress is not None:
        progress(f"drawing the plots and writing the report in {settings.out_dir}")
    out_dir = settings.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = _file_stem(results.label)
    shown = _settings_for_report(settings)
    html_path = out_dir / f"{stem}.html"
    json_path = out_dir / f"{stem}.json"
    html_path.write_text(render_html(dataset, results, shown), encoding="utf-8")
    document = to_jsonable(results, {"settings": shown, "generated_unix_ns": time.time_ns(), "version": __version__})
    json_path.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    written = 0
    if settings.write_model:
        with InfluxClient(settings.influx, user_agent="gpuprobe-model") as client:
            written = write_with_events(client, "".join(model_lines(results)))
    return ReportPaths(html_path, json_path, summary_table(results), results, written)
