"""Part: model. The one-call API of ``gpuprobe.model`` (re-exported lazily by the package)."""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

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


class QuietProgress:
    """The stages of a run on ``stream`` (stderr), from ``after_s`` into it: a run that ends sooner prints
    nothing (quiet by default), a longer one shows the stage it is in when ``after_s`` passes and each
    later one as it starts, with the seconds so far, so that a minute-long fit is not mistaken for a hang.
    One line per stage (a node's GPUs and its joint fit: a few lines per node), never a ticker."""

    def __init__(self, prefix: str, after_s: float = 3.0, stream: TextIO | None = None) -> None:
        self._prefix = prefix
        self._stream = stream if stream is not None else sys.stderr
        self._started = time.monotonic()
        self._lock = threading.Lock()
        self._current: str | None = None
        self._showing = False
        self._timer = threading.Timer(after_s, self._wake)
        self._timer.daemon = True
        self._timer.start()

    def __call__(self, message: str) -> None:
        with self._lock:
            self._current = message
            if self._showing:
                self._write(message)

    def _wake(self) -> None:
        with self._lock:
            self._showing = True
            if self._current is not None:
                self._write(self._current)

    def _write(self, message: str) -> None:
        elapsed_s = time.monotonic() - self._started
        print(f"{self._prefix}: [{elapsed_s:.0f} s] {message}", file=self._stream, flush=True)

    def close(self) -> None:
        self._timer.cancel()
        with self._lock:
            self._showing = False


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
