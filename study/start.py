"""Part: study. ``gpuprobe study start``: the matrix of a study, as one signed ``ProbeStart`` with points.

A study runs every combination of workload x power limit x batch size as consecutive points of one
probe: every selected node runs the same point at the same time, each with a warm-up and a steady
phase, after one idle baseline and before one cool-down (docs/studies.md). This module turns the
options into that command; ``study/cli.py`` signs and sends it like ``gpuprobe probe start``.

Light on purpose (the CLI imports it to list the commands): protobuf loads only when a command is built.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuprobe.config import ConfigError, Option, parse_duration
from gpuprobe.control.settings import MAX_STUDY_POINTS, NODES, SIZE, START_IN, phase_option
from gpuprobe.workloads import (
    DEFAULT_COOLDOWN_S,
    DEFAULT_IDLE_BASELINE_S,
    DEFAULT_WARMUP_S,
    WORKLOAD_NAMES,
    WORKLOADS,
    parse_batch_sizes,
)

if TYPE_CHECKING:
    from gpuprobe.v1 import control_pb2


def _names(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in str(text).split(",") if part.strip())
    if not names:
        raise ValueError(f"expected a comma-separated list, not {text!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"{text!r} repeats a value")
    return names


def parse_power_limits(text: str) -> tuple[str, ...]:
    """``60%,80%,100%`` or ``250W,300W`` (``default`` leaves the limit as it is); checked here, so a
    typo is refused before anything is sent."""
    from gpuprobe.control.powerlimit import parse_limit

    labels = _names(text)
    for label in labels:
        parse_limit(label)  # ValueError says what is accepted
    return labels


STUDY_OPTIONS = [
    Option(
        "workloads",
        "workloads to compare: " + ", ".join(n for n in WORKLOAD_NAMES if n != "idle"),
        _names,
        metavar="W[,W...]",
    ),
    Option("batch_sizes", "batch sizes (samples per step) of every workload", parse_batch_sizes, metavar="B[,B...]"),
    Option(
        "power_limits",
        "GPU power limits: percent of each GPU's maximum limit (60%%) or watts (250W); `default` runs at the "
        "GPU's own limit (without this option every point does). The agents must allow limits "
        "(--allow-power-limits) and hold the privilege",
        parse_power_limits,
        metavar="L[,L...]",
    ),
    Option("duration", "steady phase of every point", parse_duration),
    phase_option("warmup", "warm-up before every point's steady phase, excluded from the results"),
    phase_option("idle_baseline", "idle baseline before the first point"),
    phase_option("cooldown", "cool-down after the last point"),
    NODES,
    SIZE,
    START_IN,
    Option("study_id", "the study's id (default: generated, s-YYYYMMDD-HHMMSS-xxxx)", default=""),
]


@dataclass(frozen=True)
class Matrix:
    """The study's points in the order they run: per workload, per power limit, per batch size."""

    workloads: tuple[str, ...]
    power_limits: tuple[str, ...]
    batch_sizes: tuple[int, ...]

    size: str = "full"

    def batch_sizes_of(self, workload: str) -> tuple[int, ...]:
        """``--batch-sizes``, or the workload's own default batch for the size."""
        return self.batch_sizes or (WORKLOADS[workload].default_batch[self.size],)

    def points(self) -> list[tuple[str, str, int]]:
        return [(w, limit, b) for w in self.workloads for limit in self.power_limits for b in self.batch_sizes_of(w)]


def matrix(values: dict[str, Any]) -> Matrix:
    """The matrix from the options; ConfigError says what is missing or wrong."""
    workloads = values["workloads"]
    if not workloads:
        raise ConfigError("--workloads is required, for example --workloads resnet50,bert-base")
    unknown = [w for w in workloads if w not in WORKLOADS or w == "idle"]
    if unknown:
        runnable = ", ".join(n for n in WORKLOAD_NAMES if n != "idle")
        raise ConfigError(f"unknown or untrainable workload(s) {', '.join(unknown)}; built in: {runnable}")
    limits = tuple(values["power_limits"] or ("default",))
    found = Matrix(tuple(workloads), limits, tuple(values["batch_sizes"] or ()), values["size"])
    count = len(found.points())
    if count > MAX_STUDY_POINTS:
        raise ConfigError(f"{count} points: a study has at most {MAX_STUDY_POINTS} (fewer batch sizes or limits)")
    return found


def phase_total_s(values: dict[str, Any], count: int) -> float:
    """The study's planned length (with the trainer's defaults for phases not given)."""
    idle = values["idle_baseline"] if values["idle_baseline"] is not None else DEFAULT_IDLE_BASELINE_S
    warmup = values["warmup"] if values["warmup"] is not None else DEFAULT_WARMUP_S
    cooldown = values["cooldown"] if values["cooldown"] is not None else DEFAULT_COOLDOWN_S
    return float(idle + count * (warmup + values["duration"]) + cooldown)


def build(values: dict[str, Any], command: control_pb2.Command, now_ns: int) -> tuple[Matrix, str]:
    """Fill ``command.probe_start`` from the options; returns the matrix and the study id."""
    from gpuprobe.control import selector, topics
    from gpuprobe.control.powerlimit import parse_limit
    from gpuprobe.v1 import control_pb2

    if values["duration"] is None or values["duration"] <= 0:
        raise ConfigError("--duration is required (the steady phase of every point) and must be positive")
    found = matrix(values)
    study_id = values["study_id"] or f"s-{dt.datetime.now():%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:4]}"
    topics.check_probe_id(study_id)
    node_selector = selector.parse(values["nodes"])
    start = command.probe_start
    start.probe_id = study_id
    start.workload = found.workloads[0]  # for agents that show one workload
    start.size = control_pb2.WORKLOAD_SIZE_TINY if values["size"] == "tiny" else control_pb2.WORKLOAD_SIZE_FULL
    start.start_at_unix_ns = now_ns + int(values["start_in"] * 1e9)
    start.duration_s = values["duration"]
    for opt, name in (("idle_baseline", "idle_baseline_s"), ("warmup", "warmup_s"), ("cooldown", "cooldown_s")):
        if values[opt] is not None:
            setattr(start, name, values[opt])
    start.selector.CopyFrom(node_selector)
    for workload, label, batch_size in found.points():
        point = start.points.add(workload=workload, batch_size=batch_size)
        request = parse_limit(label)
        if request.pct_of_max is not None:
            point.power_limit.percent_of_max = request.pct_of_max
        elif request.watts is not None:
            point.power_limit.watts = request.watts
    return found, study_id


def describe(found: Matrix, values: dict[str, Any]) -> str:
    count = len(found.points())
    minutes = phase_total_s(values, count) / 60
    limits = ", ".join(found.power_limits)
    batches = ", ".join(map(str, found.batch_sizes)) if found.batch_sizes else "each workload's default"
    return (
        f"{count} points ({', '.join(found.workloads)} x power limits {limits} x batch sizes {batches}), "
        f"{values['size']}, about {minutes:.1f} min"
    )


def point_rows(result: Any, labels: Sequence[str] = ()) -> list[dict[str, Any]]:
    """One row per point of a node's ``ProbeResult`` (for `study status`)."""
    rows = []
    for point in result.points:
        total = point.total
        rows.append(
            {
                "host": result.host,
                "point": point.index,
                "workload": point.workload,
                "batch_size": point.batch_size,
                "power_limit": point.power_limit or "as is",
                "samples_per_s": total.samples_per_s if total.HasField("samples_per_s") else None,
                "j_per_sample": total.j_per_sample if total.HasField("j_per_sample") else None,
                "mean_power_w": total.mean_power_w if total.HasField("mean_power_w") else None,
                "refused": point.refused,
                "device": point.device,
                "simulated": point.device == "sim",
            }
        )
    return rows
