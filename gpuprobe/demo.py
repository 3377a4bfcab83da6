"""``gpuprobe demo``: the whole system on one machine, as far as it exists today.

Today that is the simulated fleet hardware read through the real NVML path: a simulated machine of
mixed GPUs goes through the phases a probe will use (idle baseline, steady load, cool-down) while a
sampler reads every GPU through the official ``pynvml`` at 10 Hz; the summary compares what NVML
reported with the simulator's documented ground truth (energy counter against the integral of
power, temperature against the RC curve). As the agent, collector, trainer and models land, the demo
grows into the full pipeline ending in the model report.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from gpuprobe.cli import Command
from gpuprobe.config import Option

DEMO_PROFILES = "2xH100-SXM5-80GB,2xA100-SXM4-80GB,L4,RTX-4090"
STEADY_UTIL_PCT = [100, 70, 100, 60, 90, 80]
SAMPLE_INTERVAL_S = 0.1


@dataclass(frozen=True)
class Phases:
    idle_s: float
    steady_s: float
    cooldown_s: float

    @property
    def total_s(self) -> float:
        return self.idle_s + self.steady_s + self.cooldown_s


def _sample(phases: Phases) -> dict[str, Any]:
    """Runs inside the simulated machine: drives the load phases and reads every GPU at 10 Hz."""
    import pynvml

    from gpuprobe.sim import state

    state_dir = state.state_dir_from_env()
    assert state_dir is not None, "run by `gpuprobe demo` inside the simulated machine"
    config = state.load(state_dir)
    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    samples: list[list[list[int]]] = [[] for _ in handles]
    start_s = time.time()
    step_ns: dict[str, int] = {}
    n = 0
    phase = "idle"
    print(f"demo: idle baseline for {phases.idle_s:g} s", file=sys.stderr, flush=True)
    while True:
        now_s = time.time()
        elapsed_s = now_s - start_s
        if phase == "idle" and elapsed_s >= phases.idle_s:
            phase = "steady"
            for i in range(len(handles)):
                t_ns = state.set_load(state_dir, i, STEADY_UTIL_PCT[i % len(STEADY_UTIL_PCT)])
            step_ns["up"] = config.next_tick_ns(t_ns)
            print(f"demo: steady load for {phases.steady_s:g} s", file=sys.stderr, flush=True)
        elif phase == "steady" and elapsed_s >= phases.idle_s + phases.steady_s:
            phase = "cooldown"
            for i in range(len(handles)):
                t_ns = state.set_load(state_dir, i, 0)
            step_ns["down"] = config.next_tick_ns(t_ns)
            print(f"demo: cool-down for {phases.cooldown_s:g} s", file=sys.stderr, flush=True)
        elif elapsed_s >= phases.total_s:
            break
        for i, h in enumerate(handles):
            energy, power = pynvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, 186])
            samples[i].append(
                [
                    power.timestamp * 1000,  # the driver's update time, µs -> ns
                    power.value.uiVal,  # mW
                    energy.value.ullVal,  # mJ
                    pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
                    pynvml.nvmlDeviceGetCurrentClocksEventReasons(h),
                ]
            )
        n += 1
        time.sleep(max(0.0, start_s + n * SAMPLE_INTERVAL_S - time.time()))  # drift-free schedule
    pynvml.nvmlShutdown()
    return {"step_ns": step_ns, "samples": samples}


def summarize(data: dict[str, Any], profiles: list[Any]) -> list[dict[str, Any]]:
    """Per GPU: what NVML reported against the simulator's ground truth."""
    rows = []
    up_ns, down_ns = data["step_ns"]["up"], data["step_ns"]["down"]
    for i, series in enumerate(data["samples"]):
        p = profiles[i]
        # one reading per driver update is enough: keep the first of each tick
        ticks: dict[int, list[float]] = {}
        for t_ns, power_mw, energy_mj, temp_c, reasons in series:
            ticks.setdefault(t_ns, [power_mw / 1000.0, energy_mj / 1000.0, temp_c, reasons])
        times = sorted(ticks)
        integral_j = sum(ticks[a][0] * (b - a) / 1e9 for a, b in itertools.pairwise(times))
        counter_j = ticks[times[-1]][1] - ticks[times[0]][1]
        steady = [t for t in times if up_ns <= t < down_ns]
        end_t = steady[-1]
        steady_power_w = ticks[end_t][0]
        t0_c = p.steady_temp_c(p.power_w(0))
        t_ss = p.steady_temp_c(steady_power_w)
        predicted_c = t_ss + (t0_c - t_ss) * math.exp(-(end_t - up_ns) / 1e9 / p.tau_s)
        reasons = 0
        for t in steady:
            reasons |= int(ticks[t][3])
        rows.append(
            {
                "gpu": i,
                "profile": p.name,
                "util_pct": STEADY_UTIL_PCT[i % len(STEADY_UTIL_PCT)],
                "steady_power_w": steady_power_w,
                "energy_counter_j": counter_j,
                "energy_integral_j": integral_j,
                "energy_error_pct": 100.0 * (counter_j - integral_j) / integral_j,
                "temp_start_c": ticks[times[0]][2],
                "temp_end_of_steady_c": ticks[end_t][2],
                "temp_rc_predicted_c": predicted_c,
                "power_capped": bool(reasons & 0x4),
            }
        )
    return rows


def _print_table(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'gpu':>3} {'profile':<15} {'util':>5} {'power':>7} {'energy (counter)':>17} {'∫P dt':>10} {'err':>7}"
        f" {'T start':>8} {'T end':>6} {'RC model':>9} {'capped':>7}"
    )
    for r in rows:
        print(
            f"{r['gpu']:>3} {r['profile']:<15} {r['util_pct']:>4}% {r['steady_power_w']:>6.0f}W"
            f" {r['energy_counter_j']:>16.1f}J {r['energy_integral_j']:>9.1f}J {r['energy_error_pct']:>6.2f}%"
            f" {r['temp_start_c']:>7.0f}C {r['temp_end_of_steady_c']:>5.0f}C {r['temp_rc_predicted_c']:>8.1f}C"
            f" {'yes' if r['power_capped'] else 'no':>7}"
        )


def _run(values: dict[str, Any], args: argparse.Namespace) -> int:
    from gpuprobe.sim.profiles import parse_profile_list
    from gpuprobe.sim.runner import temporary_machine

    phases = Phases(values["idle_s"], values["steady_s"], values["cooldown_s"])
    profiles = parse_profile_list(DEMO_PROFILES, None)
    print(
        f"demo: a simulated machine with {len(profiles)} GPUs ({DEMO_PROFILES}), read through pynvml at 10 Hz;"
        f" about {phases.total_s:.0f} s",
        file=sys.stderr,
    )
    with temporary_machine(profiles) as machine:
        cmd = [sys.executable, "-m", "gpuprobe.demo", json.dumps(phases.__dict__)]
        proc = subprocess.run(cmd, env=machine.environ(), stdout=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            print("demo: the sampler failed (see above)", file=sys.stderr)
            return 1
        rows = summarize(json.loads(proc.stdout), profiles)
    _print_table(rows)
    if values["json"]:
        print(json.dumps(rows, indent=2))
    worst_energy = max(abs(r["energy_error_pct"]) for r in rows)
    worst_temp = max(abs(r["temp_end_of_steady_c"] - r["temp_rc_predicted_c"]) for r in rows)
    print(
        f"\nenergy counter vs ∫P dt: worst {worst_energy:.3f} %; temperature vs RC model: worst {worst_temp:.2f} °C"
    )
    return 0


COMMANDS = [
    Command(
        name="demo",
        help="run the whole system on one machine with simulated GPUs and print a summary",
        description=__doc__,
        run=_run,
        options=[
            Option("idle_s", "idle baseline before the load step, s", float, default=3.0, metavar="S"),
            Option("steady_s", "steady load, s", float, default=20.0, metavar="S"),
            Option("cooldown_s", "cool-down after the load, s", float, default=8.0, metavar="S"),
            Option("json", "also print the summary as JSON", is_flag=True, default=False),
        ],
    )
]


if __name__ == "__main__":
    # the sampler half, started by `gpuprobe demo` inside the simulated machine
    json.dump(_sample(Phases(**json.loads(sys.argv[1]))), sys.stdout)
