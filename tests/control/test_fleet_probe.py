"""End to end: three control agents on simulated GPUs run one probe started by the operator's command."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from gpuprobe.devservices import MosquittoServer
from gpuprobe.sim import perf
from gpuprobe.sim.profiles import PROFILES


def _trace(child: Any) -> list[dict[str, Any]]:
    child.kill()
    out, _ = child.communicate()
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def _mean(values: list[float]) -> float:
    assert values, "no readings in that window"
    return sum(values) / len(values)


@pytest.mark.slow
def test_three_nodes_run_a_synchronized_resnet50_probe(
    fleet: Any, cli: Any, operator_key: Any, mqtt_broker: Any, nvml_trace: Any
) -> None:
    cluster = f"c-{uuid.uuid4().hex[:6]}"
    agents = [fleet.agent(mqtt_broker.url, f"{cluster}-n{i}", extra_args=["--cluster", cluster]) for i in range(3)]
    traces = [nvml_trace(a.machine, 90) for a in agents]
    probe_id = f"p-e2e-{uuid.uuid4().hex[:6]}"
    started = cli(
        "probe", "start", "--workload", "resnet50", "--size", "tiny", "--duration", "20",
        "--nodes", f"cluster={cluster}", "--idle-baseline", "4", "--warmup", "2", "--cooldown", "4",
        "--start-in", "25s", "--key", str(operator_key.private), "--probe-id", probe_id,
    )  # fmt: skip
    assert started.returncode == 0, started.stdout + started.stderr
    assert "(3 online agent(s) selected)" in started.stdout
    for a in agents:
        assert f"{a.host}  accepted" in started.stdout

    # the live view runs until every node has its result
    status = cli("probe", "status", probe_id, "--refresh", "2", timeout=150)
    assert status.returncode == 0, status.stderr
    tables = status.stdout.split(f"probe {probe_id}")
    assert len(tables) > 5
    assert "steady" in status.stdout and "[####" in status.stdout
    final = tables[-1]
    for a in agents:
        row = next(line for line in final.splitlines() if line.startswith(a.host))
        assert row.split()[1:3] == ["done", "succeeded"] and "100%" in row

    done = cli("probe", "results", probe_id, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    results = {r["host"]: r for r in json.loads(done.stdout)["results"]}
    assert set(results) == {a.host for a in agents}
    steady_starts = [r["steady_start_unix_ns"] for r in results.values()]
    assert (max(steady_starts) - min(steady_starts)) / 1e9 < 1.0, "steady phases must start within 1 s"
    # the simulated L4's ground truth for tiny ResNet-50 at batch 8: the utilization the performance
    # model gives that batch, and the power the simulator's physics draws at it
    truth = perf.ground_truth(PROFILES["L4"], "resnet50", "tiny", 8)
    for r in results.values():
        t = r["total"]
        assert r["status"] == "succeeded" and r["workload"] == "resnet50" and r["size"] == "tiny"
        assert r["batch_size"] == 8
        assert 19.9 < (r["steady_end_unix_ns"] - r["steady_start_unix_ns"]) / 1e9 < 21
        assert t["samples_per_s"] > 0 and t["samples"] > 0
        # energy from the simulated NVML counter; the L4 idles at 16 W
        assert t["mean_power_w"] == pytest.approx(truth.power_w, abs=2)
        assert t["samples_per_s"] == pytest.approx(truth.samples_per_s, rel=0.02)  # the simulated device's
        assert t["energy_j"] == pytest.approx(t["mean_power_w"] * 20, rel=0.05)
        assert t["j_per_sample"] == pytest.approx(t["energy_j"] / t["samples"])
        assert t["idle_power_w"] == pytest.approx(16, abs=2)
        assert t["peak_power_w"] >= t["mean_power_w"] - 1
        assert t["peak_temp_c"] > 60
        (gpu,) = r["gpus"]
        assert gpu["gpu_index"] == 0 and gpu["gpu_uuid"].startswith("GPU-")
        assert r["device"] == "sim" and r["simulated"]  # the throughput is the performance model's
    table = cli("probe", "results", probe_id)
    assert table.returncode == 0 and all(a.host in table.stdout for a in agents)
    rows = [line for line in table.stdout.splitlines() if line.startswith(cluster)]
    assert len(rows) == 3 and all(row.split()[-1] == "SIMULATED" for row in rows), table.stdout
    assert "SIMULATED throughput: the simulator's performance model, not a measurement" in table.stdout

    # read independently through pynvml: power and temperature follow each node's phases
    for a, trace in zip(agents, traces, strict=True):
        r, samples = results[a.host], _trace(trace)
        s0, s1 = r["steady_start_unix_ns"], r["steady_end_unix_ns"]
        idle = [x for x in samples if r["started_unix_ns"] + 0.5e9 < x["t"] < s0 - 2.5e9]
        steady = [x for x in samples if s0 + 1e9 < x["t"] < s1]
        cool = [x for x in samples if s1 + 3e9 < x["t"] < r["ended_unix_ns"]]
        assert _mean([x["power_w"] for x in idle]) == pytest.approx(16, abs=2)
        assert _mean([x["power_w"] for x in steady]) == pytest.approx(truth.power_w, abs=2)
        assert _mean([x["power_w"] for x in cool]) < 25
        assert max(x["temp_c"] for x in steady) > max(x["temp_c"] for x in idle) + 15
        assert cool[-1]["temp_c"] < max(x["temp_c"] for x in steady) - 10


@pytest.mark.slow
def test_a_broker_restart_during_a_probe_loses_no_result(
    tmp_path: Path, fleet: Any, operator_key: Any, make_cli: Any
) -> None:
    with MosquittoServer(tmp_path / "broker") as broker:
        cli = make_cli(broker.url)
        agents = [fleet.agent(broker.url) for _ in range(3)]
        probe_id = "p-restart"
        started = cli(
            "probe", "start", "--workload", "matmul-burn", "--size", "tiny", "--duration", "6",
            "--idle-baseline", "1", "--warmup", "1", "--cooldown", "1", "--start-in", "12s",
            "--key", str(operator_key.private), "--probe-id", probe_id,
        )  # fmt: skip
        assert started.returncode == 0, started.stdout + started.stderr
        for a in agents:
            a.wait_log("phase steady", timeout_s=60)
        broker.stop()  # down while the probes end: their results cannot be published
        for a in agents:
            a.wait_log(f"probe {probe_id} ended: succeeded", timeout_s=60)
            assert "reconnecting" in a.log()
        broker.start()  # same port, no persistence: every retained message is gone
        for a in agents:
            a.wait_log("connected to", count=2, timeout_s=30)
        done = cli("probe", "results", probe_id, "--json", "--wait", "20")
        assert done.returncode == 0, done.stdout + done.stderr
        results = json.loads(done.stdout)["results"]
        assert sorted(r["host"] for r in results) == sorted(a.host for a in agents)
        assert all(r["status"] == "succeeded" and r["total"]["samples"] > 0 for r in results)
        fleet_view = json.loads(cli("fleet", "--json").stdout)
        assert sorted((p["host"], p["state"]) for p in fleet_view) == sorted((a.host, "online") for a in agents)


def test_probe_results_mark_simulated_throughput() -> None:
    """`probe results` showed a simulated GPU's samples/s like a measured one (`study status` marked it)."""
    from gpuprobe.control import render
    from gpuprobe.v1 import common_pb2, control_pb2

    def result(host: str, device: str) -> control_pb2.ProbeResult:
        r = control_pb2.ProbeResult(host=host, status=common_pb2.PROBE_STATUS_SUCCEEDED, workload="resnet50")
        r.device = device
        r.total.samples_per_s = 173.6
        return r

    table = render.results_table([result("sim-node", "sim"), result("real-node", "cuda"), result("old-agent", "")])
    head, *rows = table.splitlines()
    assert head.split()[-1] == "THROUGHPUT"
    cells = {row.split()[0]: row.split()[-1] for row in rows if row.endswith(("SIMULATED", "cuda", "-"))}
    assert cells == {"sim-node": "SIMULATED", "real-node": "cuda", "old-agent": "-"}, table
    assert render.SIMULATED_NOTE in rows
    assert render.SIMULATED_NOTE not in render.results_table([result("real-node", "cuda")])
    assert render.result_dict(result("sim-node", "sim"))["simulated"] is True
    assert render.result_dict(result("mixed", "cuda,sim"))["simulated"] is True
    assert render.result_dict(result("real-node", "cuda"))["simulated"] is False
