"""Part: model. ``gpuprobe model``: thermal, acoustic and efficiency models fitted from the telemetry in InfluxDB.

One call does it all (the CLI and the demo use it)::

    from gpuprobe.model import InfluxSettings, ModelSettings, run

    paths = run(ModelSettings(influx=InfluxSettings(url="http://127.0.0.1:8086", database="gpuprobe"),
                              probe="p-20250101-120000-ab12", out_dir=Path("report")))
    print(paths.summary)            # the terminal table
    print(paths.html, paths.json)   # the self-contained report and every number

Steps: find the window (:mod:`.data`: a probe's phases, or a time range), read the ``gpu``,
``acoustic`` and ``trainer`` series, fit (:mod:`.analysis` with :mod:`.thermal`, :mod:`.acoustic`,
:mod:`.efficiency`), write the HTML report (:mod:`.report`) and the JSON, and write the fitted
parameters back as the ``model`` measurement (:mod:`.output`). Methods and sources: docs/models.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# Lazy, so that `gpuprobe --help` and the other roles' commands do not import numpy/scipy/matplotlib.
if TYPE_CHECKING:
    from gpuprobe.influx.influxql import InfluxError
    from gpuprobe.influx.settings import InfluxSettings
    from gpuprobe.model.analysis import ModelSettings, Results
    from gpuprobe.model.api import ReportPaths, fit, run
    from gpuprobe.model.data import NoDataError

__all__ = [
    "InfluxError",
    "InfluxSettings",
    "ModelSettings",
    "NoDataError",
    "ReportPaths",
    "Results",
    "fit",
    "run",
]

_HOMES = {
    "InfluxError": "gpuprobe.influx.influxql",
    "InfluxSettings": "gpuprobe.influx.settings",
    "ModelSettings": "gpuprobe.model.analysis",
    "NoDataError": "gpuprobe.model.data",
    "ReportPaths": "gpuprobe.model.api",
    "Results": "gpuprobe.model.analysis",
    "fit": "gpuprobe.model.api",
    "run": "gpuprobe.model.api",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'gpuprobe.model' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_HOMES[name]), name)
