"""On a simulated GPU the trainer drives the GPU's load, so the simulated power and temperature follow its phases."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuprobe.sim import perf
from gpuprobe.sim.profiles import PROFILES
from gpuprobe.sim.runner import SimMachine


def _events(machine: SimMachine, gpu: int = 0) -> list[tuple[int, str, int, int, int]]:
    out = []
    for line in (machine.state_dir / f"gpu{gpu}.events").read_text().splitlines():
        t, kind, value, pid, mem = line.split()
        out.append((int(t), kind, int(value), int(pid), int(mem)))
    return out


def _mean(values: list[float]) -> float:
    assert values
    return sum(values) / len(values)


@pytest.mark.slow
def test_the_simulated_gpu_follows_the_phases(
    train: Any, sim_machine: Callable[..., SimMachine], nvml_trace: Any
) -> None:
    machine = sim_machine("L4", count=2)
    # a cap, not the window: the trace is killed once the trainer ends, so a trainer that starts late on a
    # busy machine (torch takes seconds to import) still has every phase traced
    trace = nvml_trace(machine, 1, 150.0)
    proc = train.popen(
        "--workload", "matmul-burn", "--size", "tiny", "--device", "cuda:1", "--format", "json",
        "--idle-baseline", "2", "--warmup", "1", "--duration", "4", "--cooldown", "3",
        machine=machine,
    )  # fmt: skip
    # no --start-at: the idle baseline then lasts its 2 s however long torch takes to import on a busy
    # machine (a start time that passed while importing shrank it to nothing)
    out, err = proc.communicate(timeout=120)
    trace.kill()
    samples = [json.loads(line) for line in trace.communicate()[0].splitlines() if line.strip()]
    assert proc.returncode == 0, err
    result = json.loads(out)
    assert result["simulated"] and result["gpu"] == 1
    assert "simulated GPU 1 (L4)" in result["device"]
    phases = {p["phase"]: p for p in result["phases"]}

    # the simulated device's progress: the performance model at the SM clock NVML reports (no power cap
    # at this utilization, so the maximum clock), integrated over the steady phase
    truth = perf.ground_truth(PROFILES["L4"], "matmul-burn", "tiny", 64)
    assert result["device_kind"] == "sim"
    (point,) = result["points"]
    assert point["samples_per_s"] == pytest.approx(truth.samples_per_s, rel=0.01)
    assert point["step_time_s"] == pytest.approx(truth.step_time_s, rel=0.01)

    # the load events: one per phase with the trainer's pid and memory, then the reset to nothing; the
    # utilization is the performance model's for this workload and batch (warm-up: the catalog's share)
    steady_util = perf.utilization_pct(PROFILES["L4"], "matmul-burn", "tiny", 64)
    events = [e for e in _events(machine, 1) if e[1] == "U"]
    assert [e[2] for e in events] == [0, round(steady_util * 0.9), steady_util, 0, 0]
    pids = {e[3] for e in events[:-1]}
    assert pids == {proc.pid} or len(pids) == 1  # the trainer (the console script may exec python)
    assert all(e[4] > 0 for e in events[:-1])  # the model stays resident through the phases
    assert events[-1][2:] == (0, 0, 0)
    for event, name in zip(events, ["idle", "warmup", "steady", "cooldown"], strict=False):
        assert abs(event[0] - phases[name]["start_unix_ns"]) < 50_000_000
    assert _events(machine, 0) == []  # the other GPU is untouched

    # what pynvml reads follows the phases (L4: 16 W idle; the steady power the simulator's ground truth)
    def window(name: str, skip_s: float = 0.0) -> list[dict[str, Any]]:
        p = phases[name]
        return [s for s in samples if p["start_unix_ns"] + skip_s * 1e9 <= s["t"] <= p["end_unix_ns"]]

    idle, steady, cool = window("idle"), window("steady", 1.0), window("cooldown", 2.0)
    assert _mean([s["power_w"] for s in idle]) == pytest.approx(16, abs=2)
    assert _mean([s["power_w"] for s in steady]) == pytest.approx(truth.power_w, abs=2)
    assert _mean([s["power_w"] for s in cool]) == pytest.approx(16, abs=2)
    assert all(s["util"] == steady_util for s in steady)
    assert max(s["temp_c"] for s in steady) > max(s["temp_c"] for s in idle) + 5
    assert cool[-1]["temp_c"] < max(s["temp_c"] for s in steady) - 10


def test_sigterm_stops_the_run_and_frees_the_simulated_gpu(train: Any, sim_machine: Callable[..., SimMachine]) -> None:
    machine = sim_machine("L4")
    proc = train.popen(
        "--workload", "idle", "--device", "auto", "--format", "jsonl",
        "--idle-baseline", "0", "--warmup", "0", "--duration", "60", "--cooldown", "0", machine=machine,
    )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        if json.loads(line).get("phase") == "steady":
            break
    proc.send_signal(signal.SIGTERM)
    rest, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM, err
    result = [json.loads(line) for line in rest.splitlines() if line.strip()][-1]
    assert result["type"] == "result" and result["status"] == "cancelled"
    assert result["simulated"] and result["gpu"] == 0  # auto picks simulated GPU 0
    events = _events(machine)
    assert events[-1][1:] == ("U", 0, 0, 0)
    assert any(e[3] > 0 for e in events[:-1])


def test_a_cpu_run_leaves_the_simulated_gpus_alone(
    train: Any, sim_machine: Callable[..., SimMachine], tmp_path: Path
) -> None:
    machine = sim_machine("L4")
    done = train.run(
        "--workload", "idle", "--device", "cpu", "--duration", "0.2", "--idle-baseline", "0", "--warmup", "0",
        "--cooldown", "0", "--format", "json", machine=machine,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["device"] == "cpu"
    assert _events(machine) == []
