"""Part: trainer. ``gpuprobe train``: run one built-in workload locally, in phases.

This module is imported by every ``gpuprobe`` invocation (to list the commands), so it imports
neither torch nor the workloads: they load when the command runs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from gpuprobe import workloads
from gpuprobe.config import Command, Option, parse_duration


def parse_start_at(text: str) -> int:
    """``--start-at``: ns since the Unix epoch, or an ISO 8601 time with a time zone."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"not a start time: {text!r} (ns since the epoch, or ISO 8601 with a zone)") from None
    if moment.tzinfo is None:
        raise ValueError(f"start time {text!r} needs a time zone (for example 2026-01-01T12:00:00Z)")
    return int(moment.timestamp() * 1e9)


TRAIN_OPTIONS = [
    Option("workload", "the workload: " + ", ".join(workloads.WORKLOAD_NAMES), choices=list(workloads.WORKLOAD_NAMES)),
    Option(
        "size",
        "model size: tiny (seconds on a CPU) or full (the standard model)",
        default="full",
        choices=list(workloads.SIZES),
    ),
    Option("device", "auto, cpu, cuda or cuda:N (a simulated GPU when GPUPROBE_SIM_DIR has one)", default="auto"),
    Option(
        "batch_size",
        "samples per step, or a sweep such as 8,16,32 (default: the workload's for the size)",
        workloads.parse_batch_sizes,
        metavar="B[,B...]",
    ),
    Option(
        "sweep",
        "sweep the workload's standard batch sizes (warm-up and steady phase per size)",
        is_flag=True,
        default=False,
    ),
    Option(
        "duration",
        "steady-load phase per batch size",
        parse_duration,
        workloads.DEFAULT_DURATION_S,
    ),
    Option(
        "idle_baseline",
        "idle baseline before the load",
        parse_duration,
        workloads.DEFAULT_IDLE_BASELINE_S,
    ),
    Option(
        "warmup",
        "warm-up before each steady phase (excluded from the results)",
        parse_duration,
        workloads.DEFAULT_WARMUP_S,
    ),
    Option("cooldown", "cool-down after the load", parse_duration, workloads.DEFAULT_COOLDOWN_S),
    Option(
        "agent_socket",
        "the local agent's trainer socket; progress goes there too (default: none)",
        Path,
        metavar="PATH",
    ),
    Option("probe_id", "probe id: the `probe` tag of the progress points (set by the control plane)", default=""),
    Option(
        "start_at",
        "start the idle baseline at this time: ns since the epoch or ISO 8601 (default: now)",
        parse_start_at,
        0,
        metavar="TIME",
    ),
    Option(
        "plan",
        "a study's points for this run, as JSON (set by the control plane; replaces --batch-size): "
        '[{"index": 0, "batch_size": 64, "power_limit": "60%%", "power_limit_w": 420, "refused": ""}, ...]',
        metavar="JSON",
    ),
    Option("threads", "torch CPU threads (0: torch's default)", int, 0, metavar="N"),
    Option("progress_interval", "time between progress reports", parse_duration, 1.0),
    Option("seed", "random seed of weights and synthetic data", int, 0, metavar="N"),
    Option(
        "format",
        "text: progress and a summary; json: the result as JSON on stdout (progress on stderr); "
        "jsonl: every event as a JSON line on stdout",
        default="text",
        choices=["text", "json", "jsonl"],
    ),
]


def _fmt(value: Any, spec: str, unit: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{unit}"


class TextPrinter:
    """Human-readable progress: one line per phase change and per progress report, then a summary."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def __call__(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "phase":
            stamp = dt.datetime.fromtimestamp(event["time_unix_ns"] / 1e9).strftime("%H:%M:%S.%f")[:-3]
            print(f"{stamp}  phase {event['phase']} (batch {event['batch_size']})", file=self.out, flush=True)
        elif kind == "progress":
            print(
                f"  [{event['phase']:<8} {event['elapsed_s']:7.1f}s {event['fraction_done'] * 100:5.1f}%] "
                f"step {event['step']:>7}  {_fmt(event['samples_per_s'], '.1f'):>10} samples/s  "
                f"step {_fmt(event['step_time_s'], '.4f', ' s'):>8}  loss {_fmt(event['loss'], '.4g')}",
                file=self.out,
                flush=True,
            )
        elif kind == "result":
            self.summary(event)

    def summary(self, result: dict[str, Any]) -> None:
        out = self.out
        params = f", {result['params'] / 1e6:.2f} M parameters" if result["params"] else ""
        if result.get("device_kind") == "sim":
            params += "; throughput SIMULATED (the simulator's performance model, not a measurement)"
        print(
            f"\n{result['workload']} ({result['size']}{params}) on {result['device']}: {result['status']}"
            + (f" - {result['message']}" if result["message"] else ""),
            file=out,
        )
        print(f"{'batch':>7} {'steps':>7} {'samples':>9} {'samples/s':>11} {'step time':>11} {'loss':>9}", file=out)
        for p in result["points"]:
            if p["error"]:
                print(f"{p['batch_size']:>7}  {p['error']}", file=out)
                continue
            print(
                f"{p['batch_size']:>7} {p['steps']:>7} {p['samples']:>9} {_fmt(p['samples_per_s'], '.2f'):>11} "
                f"{_fmt(p['step_time_s'], '.4f', ' s'):>11} {_fmt(p['last_loss'], '.4g'):>9}",
                file=out,
            )
        out.flush()


class JsonLines:
    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.lock = threading.Lock()

    def __call__(self, event: dict[str, Any]) -> None:
        with self.lock:
            self.out.write(json.dumps(event, separators=(",", ":")) + "\n")
            self.out.flush()


def _run(values: dict[str, Any], args: argparse.Namespace) -> int:
    from gpuprobe.trainer import device as device_mod
    from gpuprobe.trainer.run import Run, TrainSettings, parse_plan

    if not values["workload"]:
        print(
            "gpuprobe train: error: --workload is required (" + ", ".join(workloads.WORKLOAD_NAMES) + ")",
            file=sys.stderr,
        )
        return 2
    spec = workloads.WORKLOADS[values["workload"]]
    batch_sizes: tuple[int, ...] = values["batch_size"] or ()
    if values["sweep"]:
        if batch_sizes:
            print("gpuprobe train: error: give either --sweep or --batch-size, not both", file=sys.stderr)
            return 2
        batch_sizes = spec.sweep[values["size"]]
    plan: tuple[Any, ...] = ()
    if values["plan"]:
        if batch_sizes:
            print("gpuprobe train: error: give either --plan or --batch-size/--sweep, not both", file=sys.stderr)
            return 2
        try:
            plan = parse_plan(values["plan"])
        except ValueError as e:
            print(f"gpuprobe train: error: {e}", file=sys.stderr)
            return 2
    if spec.needs_torch and not workloads.torch_available():
        print(
            f"gpuprobe train: error: {spec.name} needs torch, torchvision and transformers: "
            "pip install 'gpuprobe[trainer]'",
            file=sys.stderr,
        )
        return 2
    config = TrainSettings(
        workload=spec.name,
        size=values["size"],
        device=values["device"],
        batch_sizes=batch_sizes,
        duration_s=values["duration"],
        idle_baseline_s=values["idle_baseline"],
        warmup_s=values["warmup"],
        cooldown_s=values["cooldown"],
        probe_id=values["probe_id"],
        agent_socket=values["agent_socket"],
        start_at_unix_ns=values["start_at"],
        progress_interval_s=values["progress_interval"],
        threads=values["threads"],
        seed=values["seed"],
        plan=plan,
    )
    fmt = values["format"]
    emit = JsonLines(sys.stdout) if fmt == "jsonl" else TextPrinter(sys.stderr if fmt == "json" else sys.stdout)
    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        config.validate()
        job = Run(config, emit, stop)
        try:
            job.prepare()
        except device_mod.DeviceError as e:
            print(f"gpuprobe train: error: {e}", file=sys.stderr)
            return 2
        except Exception as e:  # building the model failed (out of memory, broken install)
            result = job.finish("failed", f"could not build the workload: {type(e).__name__}: {e}")
        else:
            result = job.execute()
    except ValueError as e:
        print(f"gpuprobe train: error: {e}", file=sys.stderr)
        return 2
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if fmt == "json":
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
        sys.stdout.flush()
    if result["status"] == "succeeded":
        return 0
    if result["status"] == "cancelled" and received:
        return 128 + received[0]
    return 1


COMMANDS = [
    Command(
        name="train",
        help="run one built-in PyTorch workload locally in phases (idle, warm-up, steady, cool-down)",
        description=(
            "Train a built-in workload on synthetic data (resnet50, bert-base, gpt, matmul-burn, idle) through an "
            "idle baseline, a warm-up, a steady phase of --duration and a cool-down, report progress (to the local "
            "agent with --agent-socket) and print samples/s and step time of the steady phase. On a simulated GPU "
            "the trainer computes on the CPU and drives the simulated GPU's load. See docs/trainer.md."
        ),
        run=_run,
        options=TRAIN_OPTIONS,
    )
]
