"""Part: study. ``gpuprobe study``: one fleet probe whose steady phases run a matrix of points (workload x batch size x
power limit) on many nodes at once, and the report of what each point achieved (docs/studies.md).

The report reads only InfluxDB (:mod:`.data`), computes with pure functions (:mod:`.analysis`) and
writes the terminal table, JSON, HTML and ``model`` points (:mod:`.report`); prices come from a TOML
file (:mod:`.prices`)::

    from gpuprobe.study import build_report
    report = build_report(client, "s-20250601-1")   # client: gpuprobe.influx.client.InfluxClient
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# Lazy, so that `gpuprobe --help` does not import numpy or matplotlib.
if TYPE_CHECKING:
    from gpuprobe.model.data import NoDataError
    from gpuprobe.study.analysis import Group, GroupKey, Measurement, StudyReport
    from gpuprobe.study.api import ReportOutcome, ReportSettings, build_report, run
    from gpuprobe.study.prices import load_prices

__all__ = [
    "Group",
    "GroupKey",
    "Measurement",
    "NoDataError",
    "ReportOutcome",
    "ReportSettings",
    "StudyReport",
    "build_report",
    "load_prices",
    "run",
]

_HOMES = {
    "Group": "gpuprobe.study.analysis",
    "GroupKey": "gpuprobe.study.analysis",
    "Measurement": "gpuprobe.study.analysis",
    "NoDataError": "gpuprobe.model.data",
    "ReportOutcome": "gpuprobe.study.api",
    "ReportSettings": "gpuprobe.study.api",
    "StudyReport": "gpuprobe.study.analysis",
    "build_report": "gpuprobe.study.api",
    "load_prices": "gpuprobe.study.prices",
    "run": "gpuprobe.study.api",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'gpuprobe.study' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_HOMES[name]), name)
