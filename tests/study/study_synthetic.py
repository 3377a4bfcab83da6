"""A synthetic study written straight into a real InfluxDB, in the schema the runner writes
(docs/schema.md, `probe` and `trainer` in a study), with known throughput and power per point.

Two nodes, two GPU models, four points (batch 64 and 128, power limit as is and 60 %):

- ``node-a``: bare metal, p5.48xlarge, GPUs 0 and 1 are H100s (``H100_BARE``), measured (device cuda).
- ``node-b``: vgpu, g6.vgpu, GPU 0 an H100 at ``VGPU_FACTOR`` of the bare-metal throughput at the same
  power (device cuda, no slowdown threshold known), GPU 1 an L4 (``L4``) whose throughput is the
  simulator's (device sim); the L4 refuses point 3.

Each point: warm-up ``WARMUP_S`` (power and throughput deliberately different, so a wrong window
shows), steady ``STEADY_S``. Power alternates ±5 % around its value sample by sample, throughput ±2 %
report by report (both with exact means); the energy counter integrates the power exactly. Events of
the two GPUs of a node are 1 ms apart (``gpu`` is a field of `probe`: the same timestamp would be the
same point), and so are their phases in the samples.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuprobe.influx.lineprotocol import encode_line

STUDY = "s-20261201-synthetic"
WORKLOAD = "resnet50"
H100 = "NVIDIA H100 80GB HBM3"
L4 = "NVIDIA L4"
POINTS = [(64, ""), (128, ""), (64, "60%"), (128, "60%")]  # index -> (batch size, power limit label)
H100_BARE = {0: (1000.0, 500.0), 1: (1400.0, 650.0), 2: (800.0, 340.0), 3: (1200.0, 400.0)}  # samples/s, W
VGPU_FACTOR = 0.9
L4_POINTS = {0: (300.0, 70.0), 1: (380.0, 72.0), 2: (250.0, 43.0)}
L4_REFUSAL = "batch size 128 does not fit GPU 1's memory (24 GB)"
PRICES = {"p5.48xlarge": 98.32, "g6.vgpu": 4.6}
IDLE_S, WARMUP_S, STEADY_S, COOLDOWN_S = 5.0, 3.0, 20.0, 5.0
SLOWDOWN_C = {"H100": 87.0, "L4": 88.0}

NODES: dict[str, dict[str, str]] = {
    "node-a": {
        "cloud": "aws",
        "cluster": "lab",
        "instance_type": "p5.48xlarge",
        "region": "us-east-1",
        "virt": "bare_metal",
    },
    "node-b": {"cluster": "lab", "instance_type": "g6.vgpu", "region": "eu-west-1", "virt": "vgpu"},
}


StudyCommand = Callable[..., tuple[int, str, str]]  # the gpuprobe_study fixture: (status, stdout, stderr)


@dataclass(frozen=True)
class Gpu:
    host: str
    index: str
    model: str
    device: str  # the trainer's device tag
    points: dict[int, tuple[float, float]]  # point -> (samples/s, W) of the GPUs that run it
    full_limit_w: float
    slowdown_c: float | None
    refused: dict[int, str]


GPUS = [
    Gpu("node-a", "0", H100, "cuda", H100_BARE, 700.0, SLOWDOWN_C["H100"], {}),
    Gpu("node-a", "1", H100, "cuda", H100_BARE, 700.0, SLOWDOWN_C["H100"], {}),
    Gpu(
        "node-b",
        "0",
        H100,
        "cuda",
        {p: (s * VGPU_FACTOR, w) for p, (s, w) in H100_BARE.items()},
        700.0,
        None,
        {},
    ),
    Gpu("node-b", "1", L4, "sim", L4_POINTS, 72.0, SLOWDOWN_C["L4"], {3: L4_REFUSAL}),
]


def steady_temp_c(gpu: Gpu, point: int) -> float:
    return 40.0 + gpu.points[point][1] / 20.0


def peak_temp_c(gpu: Gpu, point: int) -> float:
    return steady_temp_c(gpu, point) + 3.0  # one sample per window is 3 °C hotter


def requested_limit_w(gpu: Gpu, point: int) -> float | None:
    label = POINTS[point][1]
    return gpu.full_limit_w * 0.6 if label == "60%" else None


def enforced_limit_w(gpu: Gpu, point: int) -> float:
    return requested_limit_w(gpu, point) or gpu.full_limit_w


def sm_clock_mhz(point: int) -> int:
    return 1500 if POINTS[point][1] else 1980


def est_dba(gpu: Gpu, point: int) -> float:
    return 40.0 + gpu.points[point][1] / 25.0


@dataclass(frozen=True)
class StudyRun:
    """A synthetic study in its own database (``server``, ``db``: what tests/grafana expects too)."""

    server: Any
    db: str
    study: str
    start_ns: int
    end_ns: int


def timeline(start_ns: int) -> tuple[list[tuple[int, int, int]], int, int]:
    """[(point, warm-up start ns, steady start ns)], cool-down start ns, end ns."""
    t = start_ns + int(IDLE_S * 1e9)
    out = []
    for point in range(len(POINTS)):
        out.append((point, t, t + int(WARMUP_S * 1e9)))
        t += int((WARMUP_S + STEADY_S) * 1e9)
    return out, t, t + int(COOLDOWN_S * 1e9)


def _event(gpu: Gpu, t_ns: int, study: str, **fields: Any) -> str:
    tags = {**NODES[gpu.host], "host": gpu.host, "probe": study}
    values = {"workload": WORKLOAD, "gpu": gpu.index, "status": "running", **fields}
    values = {k: v for k, v in values.items() if v is not None}
    if gpu.slowdown_c is not None:
        values["temp_slowdown_c"] = gpu.slowdown_c
    return encode_line("probe", tags, values, t_ns)


def study_lines(study: str, start_ns: int, *, trainer: bool = True, gpu_samples: bool = True) -> list[str]:
    """Every line of the study: events, trainer reports, gpu and acoustic samples."""
    lines: list[str] = []
    points, _, end_ns = timeline(start_ns)
    for g in GPUS:
        ms = 10**6 * int(g.index)  # the GPUs' events are 1 ms apart
        lines.append(_event(g, start_ns + ms, study, kind="start", phase="idle"))
        for point, reason in g.refused.items():
            batch, label = POINTS[point]
            lines.append(
                _event(
                    g,
                    start_ns + ms + 10**6 // 2,
                    study,
                    kind="point_refused",
                    point=point,
                    batch_size=batch,
                    power_limit=label or None,
                    message=reason,
                )
            )
        ran = [(p, warm + ms, steady + ms) for p, warm, steady in points if p not in g.refused]
        for point, warm_ns, steady_ns in ran:
            batch, label = POINTS[point]
            common = {"point": point, "batch_size": batch, "power_limit": label or None}
            common["power_limit_w"] = requested_limit_w(g, point)
            lines.append(_event(g, warm_ns, study, kind="phase_change", phase="warmup", **common))
            lines.append(_event(g, steady_ns, study, kind="phase_change", phase="steady", **common))
        last_ns = max(s for _, _, s in ran) + int(STEADY_S * 1e9)
        lines.append(_event(g, last_ns, study, kind="phase_change", phase="cooldown"))
        lines.append(_event(g, end_ns + ms, study, kind="end", phase="done", status="succeeded"))
        if trainer:
            lines += _trainer_lines(g, study, ran)
        if gpu_samples:
            lines += _gpu_lines(g, start_ns, end_ns, ran)
    return lines


def _trainer_lines(g: Gpu, study: str, ran: list[tuple[int, int, int]]) -> list[str]:
    tags = {**NODES[g.host], "host": g.host, "probe": study, "workload": WORKLOAD, "gpu": g.index, "device": g.device}
    lines = []
    step = 0
    for point, warm_ns, steady_ns in ran:
        rate, _ = g.points[point]
        batch = POINTS[point][0]
        for k in range(int(WARMUP_S)):
            step += 10
            fields = {"samples_per_s": 0.3 * rate, "phase": "warmup", "point": point, "batch_size": batch, "step": step}
            lines.append(encode_line("trainer", tags, fields, warm_ns + int((k + 0.5) * 1e9)))
        for k in range(int(STEADY_S)):  # an even number of reports: the ±2 % cancel exactly
            step += 10
            value = rate * (1.02 if k % 2 == 0 else 0.98)
            fields = {
                "samples_per_s": value,
                "step_time_s": batch / value,
                "phase": "steady",
                "point": point,
                "batch_size": batch,
                "step": step,
                "loss": 2.5,
            }
            lines.append(encode_line("trainer", tags, fields, steady_ns + int((k + 0.5) * 1e9)))
    return lines


def _gpu_lines(g: Gpu, start_ns: int, end_ns: int, ran: list[tuple[int, int, int]]) -> list[str]:
    tags = {**NODES[g.host], "host": g.host, "gpu": g.index, "model": g.model, "uuid": f"GPU-{g.host}-{g.index}"}
    idle_w = 60.0 if g.model == H100 else 18.0
    dt_ns = 10**8
    energy = 1.0e6 + 1000.0 * int(g.index)
    lines = []
    t = start_ns - 10 * 10**9
    k = 0
    peaked: set[int] = set()
    while t <= end_ns + 10 * 10**9:
        power, temp, limit, clock = idle_w, 35.0, g.full_limit_w, 1980
        for point, warm_ns, steady_ns in ran:
            steady_end = steady_ns + int(STEADY_S * 1e9)
            if warm_ns <= t < steady_ns:
                power = 0.6 * g.points[point][1]
                limit = enforced_limit_w(g, point)
                temp = steady_temp_c(g, point) - 5
            elif steady_ns <= t < steady_end:
                power = g.points[point][1] * (1.05 if k % 2 == 0 else 0.95)
                limit, clock = enforced_limit_w(g, point), sm_clock_mhz(point)
                temp = steady_temp_c(g, point)
                if point not in peaked and t >= steady_ns + 10 * 10**9:
                    temp = peak_temp_c(g, point)
                    peaked.add(point)
        fields = {
            "power_w": power,
            "energy_j": energy,
            "temp_c": temp,
            "power_limit_w": limit,
            "sm_clock_mhz": clock,
            "util_pct": 100.0 if power > idle_w else 0.0,
        }
        lines.append(encode_line("gpu", tags, fields, t))
        if k % 10 == 0:
            level = 30.0
            for point, _, steady_ns in ran:
                if steady_ns <= t < steady_ns + int(STEADY_S * 1e9):
                    level = est_dba(g, point)
            acoustic_tags = {**NODES[g.host], "host": g.host, "gpu": g.index, "source": "proxy"}
            lines.append(encode_line("acoustic", acoustic_tags, {"est_dba": level}, t))
        energy += power * dt_ns / 1e9
        t += dt_ns
        k += 1
    return lines


def write_study(
    server: Any,
    *,
    study: str = STUDY,
    db: str | None = None,
    start_ns: int | None = None,
    trainer: bool = True,
    gpu_samples: bool = True,
) -> StudyRun:
    """Writes the study into database ``db`` (created; default a fresh one) of ``server`` (an
    :class:`gpuprobe.devservices.InfluxDBServer`)."""
    import time

    name = db or f"study_{uuid.uuid4().hex[:10]}"
    server.create_database(name)
    if start_ns is None:
        start_ns = (time.time_ns() - 3600 * 10**9) // 10**9 * 10**9
    lines = study_lines(study, start_ns, trainer=trainer, gpu_samples=gpu_samples)
    for i in range(0, len(lines), 5000):
        server.write_lines(name, lines[i : i + 5000])
    _, _, end_ns = timeline(start_ns)
    return StudyRun(server, name, study, start_ns, end_ns + 10**6 * len(GPUS))


def expected(host: str, gpu: str, point: int) -> tuple[float, float]:
    """(samples/s, W) of one GPU at one point."""
    g = next(g for g in GPUS if (g.host, g.index) == (host, gpu))
    return g.points[point]


def samples_per_j(host: str, gpu: str, point: int) -> float:
    rate, watts = expected(host, gpu, point)
    return rate / watts


def close(a: float | None, b: float, rel: float = 0.005) -> bool:
    return a is not None and math.isclose(a, b, rel_tol=rel)
