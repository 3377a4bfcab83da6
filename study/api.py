"""Part: study. The one-call API of ``gpuprobe study report`` (re-exported lazily by :mod:`gpuprobe.study`).

::

    from gpuprobe.influx.client import InfluxClient
    from gpuprobe.study import build_report

    with InfluxClient(settings) as client:
        report = build_report(client, "s-20250601-1", prices={"p5.48xlarge": 98.32})
    report.group(gpu_model="NVIDIA H100 80GB HBM3", virt="vgpu", batch_size=128, power_limit="60%")

:func:`run` does what the command does: read, analyse, write the HTML and JSON files asked for and
the ``model`` points, and return the terminal's summary with everything else (:class:`ReportOutcome`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuprobe import __version__
from gpuprobe.influx.client import InfluxClient
from gpuprobe.influx.retention import write_with_events
from gpuprobe.influx.settings import InfluxSettings
from gpuprobe.model.data import NoDataError
from gpuprobe.study.analysis import StudyReport, analyze
from gpuprobe.study.data import Progress, StudyData, load_study


@dataclass(frozen=True)
class ReportSettings:
    """Everything one ``gpuprobe study report`` needs; the CLI builds it from its options."""

    study: str
    influx: InfluxSettings = field(default_factory=InfluxSettings)
    hosts: tuple[str, ...] = ()
    prices: Mapping[str, float] | None = None  # instance type -> USD per hour (study/prices.py)
    prices_file: Path | None = None  # shown in the report only
    html: Path | None = None
    json: Path | None = None
    write_model: bool = True


@dataclass
class ReportOutcome:
    report: StudyReport
    summary: str
    html: Path | None
    json: Path | None
    model_points_written: int


def _all_lack_data(data: StudyData) -> str | None:
    """Why no figure can be computed, or None when some can."""
    if any(m.has_data for m in data.measurements):
        return None
    if not any(e.point is not None for e in data.events):
        return (
            f"probe {data.study!r} in database {data.database!r} is not a study: none of its `probe` events "
            "names a point (use `gpuprobe model --probe` for a plain probe)"
        )
    lines = [f"{m.host} gpu {m.gpu or '—'} point {m.point}: {m.reason}" for m in data.missing]
    lines += [f"{r.host} gpu {r.gpu or '—'} point {r.point}: refused: {r.message}" for r in data.refusals]
    if not lines:
        lines = ["no steady phase in its `probe` events"]
    shown = lines[:20] + ([f"… and {len(lines) - 20} more"] if len(lines) > 20 else [])
    return (
        f"study {data.study!r} in database {data.database!r}: none of its points has both throughput and power:\n  "
        + "\n  ".join(shown)
    )


def build_report(
    client: InfluxClient,
    study: str,
    *,
    hosts: Sequence[str] = (),
    prices: Mapping[str, float] | None = None,
    progress: Progress | None = None,
) -> StudyReport:
    """Read the study from InfluxDB and compute every figure. :class:`NoDataError` when the study has
    no ``probe`` events (the message names the database) or none of its points has data (it says which)."""
    data = load_study(client, study, hosts, progress)
    problem = _all_lack_data(data)
    if problem is not None:
        raise NoDataError(problem)
    if progress:
        progress(f"analysing {len(data.measurements)} GPU x point windows")
    return analyze(
        study=study,
        database=data.database,
        start_ns=data.start_ns,
        end_ns=data.end_ns,
        points=data.points,
        nodes=data.nodes,
        measurements=data.measurements,
        refusals=data.refusals,
        missing=data.missing,
        prices=prices,
    )


def shown_settings(s: ReportSettings) -> dict[str, Any]:
    """The settings as the report shows them (no secrets)."""
    return {
        "study": s.study,
        "influx_url": s.influx.url,
        "influx_db": s.influx.database,
        "influx_rp": s.influx.retention_policy,
        "hosts": ",".join(s.hosts),
        "prices": str(s.prices_file) if s.prices_file else "",
        "html": str(s.html) if s.html else "",
        "json": str(s.json) if s.json else "",
        "write_model": s.write_model,
    }


def run(settings: ReportSettings, progress: Progress | None = None) -> ReportOutcome:
    """Build the report, write the files asked for and (unless disabled) the ``model`` points."""
    from gpuprobe.study.report import model_lines, render_html, summary_table, to_jsonable

    with InfluxClient(settings.influx, user_agent="gpuprobe-study") as client:
        report = build_report(client, settings.study, hosts=settings.hosts, prices=settings.prices, progress=progress)
        shown = shown_settings(settings)
        if settings.html is not None:
            if progress:
                progress(f"drawing the plots and writing {settings.html}")
            settings.html.parent.mkdir(parents=True, exist_ok=True)
            settings.html.write_text(render_html(report, shown), encoding="utf-8")
        if settings.json is not None:
            document = to_jsonable(
                report, {"settings": shown, "generated_unix_ns": time.time_ns(), "version": __version__}
            )
            settings.json.parent.mkdir(parents=True, exist_ok=True)
            settings.json.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        written = write_with_events(client, "".join(model_lines(report))) if settings.write_model else 0
    return ReportOutcome(report, summary_table(report), settings.html, settings.json, written)
