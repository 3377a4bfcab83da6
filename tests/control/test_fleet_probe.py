"""Probes over the control plane alone: a broker restart mid-probe, simulated throughput marked.

Three nodes running one synchronized probe through the whole system (live status, results against the
simulator's ground truth) is tests/e2e/test_fleet_e2e.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuprobe.devservices import MosquittoServer


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
