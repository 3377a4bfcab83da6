"""``gpuprobe sim run|profiles|load|fail``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gpuprobe.config import Command, Option, parse_duration
from gpuprobe.sim import state
from gpuprobe.sim.build import SimBuildError
from gpuprobe.sim.profiles import PROFILES, UnknownProfileError, parse_profile_list, with_overrides
from gpuprobe.sim.runner import open_machine, run_command, temporary_machine

DEFAULT_PROFILE = "H100-SXM5-80GB"
DEFAULT_GPUS_FOR_ONE_PROFILE = 8

STATE_DIR = Option(
    "state_dir",
    "the simulated machine's state directory (default for load/fail: $GPUPROBE_SIM_DIR, set inside `sim run`)",
    type=Path,
    metavar="DIR",
)


def _milliseconds(text: str) -> float:
    """The deprecated ``--period-ms``: a number of ms, as it always took it, in s."""
    period_ms = float(text)
    if not period_ms >= 0:
        raise ValueError(f"{text} is not a non-negative number of ms")
    return period_ms / 1000.0


def _error(message: str) -> int:
    print(f"gpuprobe sim: error: {message}", file=sys.stderr)
    return 2


def _parse_overrides(items: list[str]) -> dict[int, dict[str, str]]:
    overrides: dict[int, dict[str, str]] = {}
    for item in items:
        target, eq, value = item.partition("=")
        gpu, dot, key = target.partition(".")
        if not eq or not dot or not gpu.isdigit():
            raise UnknownProfileError(f"--set expects GPU.KEY=VALUE (for example 3.r_th_c_per_w=0.09), not {item!r}")
        overrides.setdefault(int(gpu), {})[key] = value
    return overrides


def _run(values: dict[str, Any], args: argparse.Namespace) -> int:
    command = list(args.sim_command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        return _error("no command given: gpuprobe sim run [OPTIONS] -- COMMAND [ARGS...]")
    try:
        spec: str = values["profile"]
        gpus: int | None = values["gpus"]
        if gpus is not None and not 1 <= gpus <= 64:
            return _error(f"--gpus must be between 1 and 64, not {gpus}")
        profiles = parse_profile_list(spec, gpus, default_count=DEFAULT_GPUS_FOR_ONE_PROFILE)
        if len(profiles) > 64:
            return _error(f"at most 64 simulated GPUs, not {len(profiles)}")
        for index, changes in _parse_overrides(values["set"]).items():
            if index >= len(profiles):
                return _error(f"--set names GPU {index} but the machine has {len(profiles)} GPUs")
            profiles[index] = with_overrides(profiles[index], changes)
        period_s: float = values["period"]
        state_dir: Path | None = values["state_dir"]
        if state_dir is not None:
            return run_command(open_machine(state_dir, profiles, period_s), command)
        with temporary_machine(profiles, period_s) as machine:
            return run_command(machine, command)
    except (UnknownProfileError, state.SimStateError, SimBuildError) as e:
        return _error(str(e))


def _profiles(values: dict[str, Any], args: argparse.Namespace) -> int:
    print(
        f"{'profile':<16} {'NVML name':<26} {'memory':>9} {'TDP':>6} {'idle':>6} {'R_th':>9} {'tau':>6}"
        f" {'slowdown':>8} {'fp16':>10} {'mem BW':>11}  cooling"
    )
    for p in PROFILES.values():
        cooling = f"{p.fan_count} fans" if p.fan_count else "passive"
        print(
            f"{p.name:<16} {p.nvml_name:<26} {p.memory_total_bytes / 2**30:>7.1f}Gi {p.limit_default_w:>5.0f}W"
            f" {p.idle_w:>5.0f}W {p.r_th_c_per_w:>5.3f}C/W {p.tau_s:>5.0f}s {p.slowdown_c:>7d}C"
            f" {p.peak_fp16_tflops:>6.1f}TF/s {p.mem_bandwidth_gb_s:>6.0f}GB/s  {cooling}"
        )
    return 0


def _state_dir(values: dict[str, Any]) -> Path:
    state_dir: Path | None = values["state_dir"] or state.state_dir_from_env()
    if state_dir is None:
        raise state.SimStateError(
            "no simulated machine: pass --state-dir or run inside `gpuprobe sim run`"
            f" (which sets {state.STATE_DIR_ENV})"
        )
    return state_dir


def _gpu_indices(spec: str, config: state.SimSettings) -> list[int]:
    if spec == "all":
        return [g.index for g in config.gpus]
    try:
        indices = [int(part) for part in spec.split(",")]
    except ValueError:
        raise state.SimStateError(f"--gpu expects 'all' or indices such as 0,3, not {spec!r}") from None
    for i in indices:
        if not 0 <= i < len(config.gpus):
            raise state.SimStateError(f"GPU {i} does not exist (the machine has {len(config.gpus)})")
    return indices


def _load(values: dict[str, Any], args: argparse.Namespace) -> int:
    try:
        state_dir = _state_dir(values)
        config = state.load(state_dir)
        indices = _gpu_indices(values["gpu"], config)
        for i in indices:
            profile = config.gpus[i].profile
            free_bytes = profile.memory_total_bytes - profile.memory_reserved_bytes
            if not 0 <= values["mem_used_bytes"] <= free_bytes:
                raise state.SimStateError(f"--mem-used-bytes must be between 0 and {free_bytes} on GPU {i}")
        for i in indices:
            t_ns = state.set_load(state_dir, i, values["util"], values["pid"], values["mem_used_bytes"])
        effective_ns = config.next_tick_ns(t_ns)
        print(f"utilization {values['util']:g} % on GPU {values['gpu']} from {effective_ns} (unix ns)")
        return 0
    except state.SimStateError as e:
        return _error(str(e))


def _fail(values: dict[str, Any], args: argparse.Namespace) -> int:
    try:
        state_dir = _state_dir(values)
        config = state.load(state_dir)
        for i in _gpu_indices(values["gpu"], config):
            state.set_failed(state_dir, i, not values["recover"])
        print(f"GPU {values['gpu']} {'recovered' if values['recover'] else 'lost (GPU_IS_LOST)'}")
        return 0
    except state.SimStateError as e:
        return _error(str(e))


def _command_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "sim_command",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND [ARGS...]",
        help="the command to run against the simulated GPUs",
    )


COMMANDS = [
    Command(
        name="sim.run",
        help="run any command against simulated GPUs",
        description=(
            "Run COMMAND with simulated GPUs: NVML calls (pynvml, nvitop, gpustat, zeus, codecarbon, the "
            "gpuprobe agent) reach a simulated libnvidia-ml.so.1 whose power, temperature, clocks and energy "
            "follow the load set with `gpuprobe sim load` (inside the command, GPUPROBE_SIM_DIR names the "
            "machine). Exits with COMMAND's status."
        ),
        run=_run,
        options=[
            Option(
                "gpus",
                "number of GPUs (default: 8 for one profile name, else as many as --profile lists)",
                int,
            ),
            Option(
                "profile",
                "GPU profile, or a list such as 4xH100-SXM5-80GB,4xA100-SXM4-80GB (see `gpuprobe sim profiles`)",
                default=DEFAULT_PROFILE,
                metavar="NAME",
            ),
            Option(
                "period",
                "update period of the simulated driver (1ms to 10s)",
                parse_duration,
                default=0.1,
                deprecated_name="period_ms",
                deprecated_type=_milliseconds,
            ),
            Option(
                "set",
                "override one GPU's parameter, GPU.KEY=VALUE (e.g. 3.r_th_c_per_w=0.09, 0.virt=vgpu); repeatable",
                multiple=True,
                default=[],
                metavar="GPU.KEY=VALUE",
            ),
            STATE_DIR,
        ],
        extra_arguments=_command_argument,
    ),
    Command(name="sim.profiles", help="list the GPU profiles and their ground-truth parameters", run=_profiles),
    Command(
        name="sim.load",
        help="set simulated GPUs' utilization (takes effect at the next update period)",
        run=_load,
        options=[
            Option("gpu", "GPU indices (0,1,...) or all", default="all", metavar="INDICES"),
            Option("util", "utilization in percent, 0-100", float, default=100.0, metavar="PCT"),
            Option("pid", "process listed as holding the GPU (0: none)", int, default=0),
            Option("mem_used_bytes", "GPU memory that process holds", int, default=0, metavar="BYTES"),
            STATE_DIR,
        ],
    ),
    Command(
        name="sim.fail",
        help="make simulated GPUs fail (every NVML query answers GPU_IS_LOST) or recover",
        run=_fail,
        options=[
            Option("gpu", "GPU indices (0,1,...) or all", metavar="INDICES", default="0"),
            Option("recover", "bring the GPUs back instead", is_flag=True, default=False),
            STATE_DIR,
        ],
    ),
]
