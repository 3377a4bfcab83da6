"""Part: sim. ``gpuprobe sim run|profiles|load|fail``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gpuprobe.config import Command, Option, parse_duration
from gpuprobe.sim import state
from gpuprobe.sim.build import SimBuildError
from gpuprobe.sim.profiles import (
    PROFILES,
    WORKLOAD_IDS,
    UnknownProfileError,
    parse_profile_list,
    with_overrides,
)
from gpuprobe.sim.runner import open_machine, run_command, temporary_machine

DEFAULT_PROFILE = "H100-SXM5-80GB"
DEFAULT_GPUS_FOR_ONE_PROFILE = 8

STATE_DIR = Option(
    "state_dir",
    "the simulated machine's state directory (default for load/fail: $GPUPROBE_SIM_DIR, set inside `sim run`)",
    type=Path,
    metavar="DIR",
)


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
        workload: str | None = values["workload"]
        state.workload_id(workload)  # an unknown name is a usage error before anything is written
        for i in indices:
            t_ns = state.set_load(state_dir, i, values["util"], values["pid"], values["mem_used_bytes"], workload)
        effective_ns = config.next_tick_ns(t_ns)
        running = f" ({workload})" if workload else ""
        print(f"utilization {values['util']:g} %{running} on GPU {values['gpu']} from {effective_ns} (unix ns)")
        return 0
    except state.SimStateError as e:
        return _error(str(e))


_INJECTIONS = ("xid", "ecc_dbe", "ecc_sbe", "remap_pending", "remap_failure", "nvlink_errors")


def _check_injection(values: dict[str, Any], gpu: state.SimGpu) -> None:
    """Raises SimStateError when an injection cannot happen on this GPU (its profile lacks the feature)."""
    p = gpu.profile
    if (values["ecc_dbe"] or values["ecc_sbe"]) and not p.ecc_supported:
        raise state.SimStateError(f"GPU {gpu.index} ({p.name}) has no ECC: --ecc-dbe/--ecc-sbe need an ECC part")
    if (values["remap_pending"] or values["remap_failure"]) and not (p.ecc_supported and p.row_remapping):
        raise state.SimStateError(
            f"GPU {gpu.index} ({p.name}) does not remap rows: --remap-pending/--remap-failure need row_remapping"
        )
    if values["nvlink_errors"] is not None:
        link = values["link"] or 0
        if p.nvlink_links == 0:
            raise state.SimStateError(f"GPU {gpu.index} ({p.name}) has no NVLink")
        if not 0 <= link < p.nvlink_links:
            raise state.SimStateError(
                f"--link {link} is beyond GPU {gpu.index}'s NVLink links (0-{p.nvlink_links - 1} on {p.name})"
            )


def _fail(values: dict[str, Any], args: argparse.Namespace) -> int:
    try:
        state_dir = _state_dir(values)
        config = state.load(state_dir)
        indices = _gpu_indices(values["gpu"], config)
        injecting = [name for name in _INJECTIONS if values[name] not in (None, False)]
        if values["recover"] and injecting:
            return _error("--recover cannot be combined with an injection (" + ", ".join(injecting) + ")")
        if values["link"] is not None and values["nvlink_errors"] is None:
            return _error("--link applies to --nvlink-errors only")
        if values["xid"] is not None and values["xid"] <= 0:
            return _error(f"--xid takes a positive XID code, not {values['xid']}")
        if values["nvlink_errors"] is not None and values["nvlink_errors"] <= 0:
            return _error(f"--nvlink-errors takes a positive count, not {values['nvlink_errors']}")
        answer = values["answer"]
        if answer != "gpu_is_lost" and (injecting or values["recover"]):
            return _error("--answer applies to losing a GPU only (no injection, no --recover)")
        if not injecting:
            for i in indices:
                state.set_failed(state_dir, i, not values["recover"], answer)
            print(f"GPU {values['gpu']} {'recovered (reset)' if values['recover'] else f'lost ({answer.upper()})'}")
            return 0
        for i in indices:  # all checked before anything is written
            _check_injection(values, config.gpus[i])
        done: list[str] = []
        for i in indices:
            if values["ecc_sbe"]:
                state.inject_ecc(state_dir, i, double_bit=False)
            if values["ecc_dbe"]:
                state.inject_ecc(state_dir, i, double_bit=True)
            if values["remap_pending"]:
                state.inject_remap(state_dir, i, failure=False)
            if values["remap_failure"]:
                state.inject_remap(state_dir, i, failure=True)
            if values["nvlink_errors"] is not None:
                state.inject_nvlink_errors(state_dir, i, values["link"] or 0, values["nvlink_errors"])
            if values["xid"] is not None:
                t_ns = state.inject_xid(state_dir, i, values["xid"])
                done = [f"effective {config.next_tick_ns(t_ns)} (unix ns)"]
        lost = " (GPU_IS_LOST)" if values["xid"] == state.XID_FALLEN_OFF_BUS else ""
        print(f"GPU {values['gpu']}: injected {', '.join(injecting)}{lost}" + (f"; {done[0]}" if done else ""))
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
            Option(
                "workload",
                "workload running, for the GPM activity mix ("
                + ", ".join(n for n in WORKLOAD_IDS if n != "generic")
                + "; default: generic)",
                metavar="NAME",
            ),
            STATE_DIR,
        ],
    ),
    Command(
        name="sim.fail",
        help="inject GPU faults: lose a GPU (GPU_IS_LOST), XID, ECC, row-remap and NVLink errors; or reset",
        description=(
            "Without an injection option the GPUs are lost (every NVML query answers GPU_IS_LOST, as a GPU "
            "fallen off the bus, or the code --answer names); --recover brings them back as a GPU reset does "
            "(volatile ECC counters and pending flags cleared; aggregate counters, remapped rows and a remap "
            "failure persist). The "
            "injection options add the errors named; each takes effect at the next update period and reaches "
            "NVML event sets registered before it."
        ),
        run=_fail,
        options=[
            Option("gpu", "GPU indices (0,1,...) or all", metavar="INDICES", default="0"),
            Option(
                "recover",
                "bring the GPUs back with a GPU reset (clears lost, pending flags, volatile ECC counts)",
                is_flag=True,
                default=False,
            ),
            Option(
                "answer",
                "what a lost GPU answers every NVML query (nvml.h's nvmlReturn_t)",
                choices=list(state.FAIL_ANSWERS),
                default="gpu_is_lost",
            ),
            Option("xid", "deliver an XID error event with this code (79 also makes the GPU lost)", int, metavar="N"),
            Option(
                "ecc_dbe",
                "a double-bit ECC error: event, XID 48, uncorrected counts +1, a remapped row (or retired page)",
                is_flag=True,
                default=False,
            ),
            Option("ecc_sbe", "a single-bit ECC error: event, corrected counts +1", is_flag=True, default=False),
            Option("remap_pending", "set the row-remap pending flag (XID 63)", is_flag=True, default=False),
            Option("remap_failure", "set the row-remap failure flag (XID 64)", is_flag=True, default=False),
            Option(
                "nvlink_errors",
                "add N CRC flit errors and N replays on the NVLink --link (no XID: replays correct them)",
                int,
                metavar="N",
            ),
            Option("link", "the NVLink link for --nvlink-errors (default 0)", int, metavar="L"),
            STATE_DIR,
        ],
    ),
]
