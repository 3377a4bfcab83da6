"""A study the whole way: simulated GPUs -> agents -> collector -> InfluxDB -> `gpuprobe study report`,
checked against the simulator's ground truth.

Four real agents (``gpuprobe sim run -- gpuprobe agent --broker ... --allow-power-limits``), one GPU
each, of three instance types plus one vGPU node (an H100 whose simulated NVML reports
virtualization mode VGPU), a real collector, InfluxDB and Mosquitto. The operator's own commands
start the study (ResNet-50 at two batch sizes and four power limits, one of them in watts that only
the A100 accepts), wait for it, and report it. The report, which reads nothing but InfluxDB, must
recover for every point the simulator's ground truth (``gpuprobe.sim.perf.ground_truth``: the
performance model at the clock the power limit allows, the power the physics draws): throughput
within 2 %, samples/J within 3 %; the energy-optimal power limit and the ranking of GPU models and
instance types by samples/J must be the ground truth's; the vGPU overhead must come out within one
percentage point of what the simulator applies; refused limits must be listed with their reasons
while every other point and node ran.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from support import gpuprobe_command, wait_until
from test_fleet_e2e import System, influx_rows, run

from gpuprobe.devservices import InfluxDBDatabase, MosquittoServer
from gpuprobe.devservices.ports import free_port
from gpuprobe.sim import perf
from gpuprobe.sim.profiles import PROFILES, GpuProfile, with_overrides

pytestmark = pytest.mark.slow

NODES: dict[str, dict[str, Any]] = {  # host -> its GPU, labels and simulator overrides
    "st-h100": {"profile": "H100-SXM5-80GB", "instance_type": "p5.48xlarge", "virt": "bare_metal", "set": {}},
    "st-a100": {"profile": "A100-SXM4-80GB", "instance_type": "p4de.24xlarge", "virt": "bare_metal", "set": {}},
    "st-l4": {"profile": "L4", "instance_type": "g6.xlarge", "virt": "bare_metal", "set": {}},
    "st-vgpu": {"profile": "H100-SXM5-80GB", "instance_type": "vgpu-h100", "virt": "auto", "set": {"virt": "vgpu"}},
}
BATCH_SIZES = (8, 32)
LIMITS = ("40%", "70%", "100%", "150W")  # 150 W: inside the A100's range only
PRICES = {"p5.48xlarge": 98.32, "p4de.24xlarge": 40.96575, "g6.xlarge": 0.8048, "vgpu-h100": 12.0}
WORKLOAD, SIZE = "resnet50", "tiny"
# Eight points of one slot each (warm-up 3 s + steady): most of the study's length. The simulator's power
# and clock follow the load and the limit within one 100 ms tick (sim/perf.py, no thermal term at these
# lengths), so the warm-up covers the limit being set, and 5 s of steady load give each point five of the
# trainer's once-a-second reports and a 5 s energy-counter difference (8 s until issue 23, 24 s longer).
STEADY_S = 5.0
# The trainers import torch and build the tiny model while the study is pending: 5-20 s, 45 s on a 2-core
# machine with load average 10; one later than the idle baseline and the first warm-up eats into the
# points' warm-ups (docs/control.md), so the margin stays 30 s.
START_IN_S = 30.0


def profile_of(host: str) -> GpuProfile:
    node = NODES[host]
    return with_overrides(PROFILES[node["profile"]], {k: str(v) for k, v in node["set"].items()})


def limit_w(profile: GpuProfile, label: str) -> float | None:
    """What the label asks of this GPU; None when the GPU's range refuses it."""
    watts = profile.limit_max_w * float(label[:-1]) / 100 if label.endswith("%") else float(label[:-1])
    return watts if profile.limit_min_w <= watts <= profile.limit_max_w else None


def truth(host: str, batch_size: int, label: str) -> perf.GroundTruth:
    profile = profile_of(host)
    limit = limit_w(profile, label)
    assert limit is not None
    return perf.ground_truth(profile, WORKLOAD, SIZE, batch_size, limit)


def start_system(tmp_path: Path, system: System, influxdb: InfluxDBDatabase, broker: str, cluster: str) -> Path:
    """The collector and the four agents, online; the operator's private key."""
    port = free_port()
    system.start(
        "collector",
        [
            *gpuprobe_command(), "collector", "--insecure", "--listen", f"127.0.0.1:{port}",
            "--influx-url", influxdb.server.url, "--influx-db", influxdb.name, "--wal", str(tmp_path / "wal"),
            "--sink-linger", "0.2",
        ],
    )  # fmt: skip
    keygen = run("probe", "keygen", "--out", str(tmp_path / "keys"))
    assert keygen.returncode == 0, keygen.stderr
    public = tmp_path / "keys/operator.pub"
    for host, node in NODES.items():
        sets = [a for k, v in node["set"].items() for a in ("--set", f"0.{k}={v}")]
        system.start(
            host,
            [
                *gpuprobe_command(), "sim", "run", "--gpus", "1", "--profile", node["profile"], *sets,
                "--state-dir", str(tmp_path / host / "sim"), "--",
                *gpuprobe_command(), "--log-level", "info", "agent", "--host", host, "--cluster", cluster,
                "--instance-type", node["instance_type"], "--virt", node["virt"], "--region", "lab-1",
                "--collector", f"127.0.0.1:{port}", "--broker", broker, "--trusted-keys", str(public),
                "--allow-power-limits", "--spool", str(tmp_path / host / "spool"), "--presence-interval", "2",
            ],
        )  # fmt: skip

    def online() -> bool:
        for p in system.procs:
            assert p.alive(), f"{p.name} exited ({p.proc.returncode})\n{system.logs()}"
        done = run("fleet", "--broker", broker, "--json")
        hosts = {p["host"] for p in json.loads(done.stdout or "[]") if p.get("state") == "online"}
        return set(NODES) <= hosts

    wait_until(online, 90, "four agents online", interval_s=1.0)
    return tmp_path / "keys/operator.key"


def test_a_study_recovers_the_simulators_ground_truth(
    tmp_path: Path, system: System, influxdb: InfluxDBDatabase, mqtt_broker: MosquittoServer
) -> None:
    broker = mqtt_broker.url
    cluster = f"study-{uuid.uuid4().hex[:6]}"
    key = start_system(tmp_path, system, influxdb, broker, cluster)
    study_id = f"s-e2e-{uuid.uuid4().hex[:6]}"

    started = run(
        "study", "start", "--broker", broker, "--key", str(key), "--study-id", study_id,
        "--workloads", WORKLOAD, "--size", SIZE, "--batch-sizes", ",".join(map(str, BATCH_SIZES)),
        "--power-limits", ",".join(LIMITS), "--duration", f"{STEADY_S:g}", "--warmup", "3", "--idle-baseline", "3",
        "--cooldown", "2", "--start-in", f"{START_IN_S:g}s", "--nodes", f"cluster={cluster}", "--json",
    )  # fmt: skip
    assert started.returncode == 0, started.stdout + started.stderr + system.logs()
    body = json.loads(started.stdout)
    assert len(body["points"]) == len(LIMITS) * len(BATCH_SIZES)
    replies = {r["host"]: r for r in body["replies"]}
    assert set(replies) == set(NODES) and all(r["accepted"] for r in replies.values()), replies
    # the 150 W points are refused where the GPU's range excludes them: said at once, in the reply
    for host in NODES:
        refused_here = limit_w(profile_of(host), "150W") is None
        assert ("point(s) refused here" in replies[host]["message"]) == refused_here, replies[host]

    done = run("probe", "results", study_id, "--broker", broker, "--json", "--wait", "240", timeout_s=300)
    assert done.returncode == 0, done.stdout + done.stderr + system.logs()
    results = {r["host"]: r for r in json.loads(done.stdout)["results"]}
    assert set(results) == set(NODES) and all(r["status"] == "succeeded" for r in results.values()), results

    status = run("study", "status", study_id, "--broker", broker, "--once", timeout_s=60)
    assert status.returncode == 0, status.stderr
    assert "J/sample" in status.stdout and all(host in status.stdout for host in NODES)

    # the collector has written the last steady phase's data
    def stored() -> bool:
        rows = influx_rows(
            influxdb,
            f'SELECT count("point") FROM "trainer" WHERE "probe" = \'{study_id}\' AND "point" = '
            f'{len(LIMITS) * len(BATCH_SIZES) - 1} GROUP BY "host"',
        )
        return len(rows) == len(NODES)

    wait_until(stored, 60, "the last point's trainer reports in InfluxDB", interval_s=1.0)

    prices = tmp_path / "prices.toml"
    prices.write_text("".join(f'"{k}" = {v}\n' for k, v in PRICES.items()))
    html, numbers = tmp_path / "study.html", tmp_path / "study.json"
    report = run(
        "study", "report", study_id, "--influx-url", influxdb.server.url, "--influx-db", influxdb.name,
        "--prices", str(prices), "--html", str(html), "--json", str(numbers), timeout_s=180,
    )  # fmt: skip
    assert report.returncode == 0, report.stdout + report.stderr
    assert "simulated" in report.stdout.lower()
    data = json.loads(numbers.read_text())
    assert data["simulated"] is True and html.exists()
    check_measurements(data)
    check_probe_results_agree(results, data)
    check_model_agrees(tmp_path, influxdb, study_id, results)
    check_groups(data)
    check_refusals(data)


def _host_profile_model(host: str) -> str:
    return profile_of(host).nvml_name


def check_measurements(data: dict[str, Any]) -> None:
    """Every point every node ran: throughput within 2 %, samples/J within 3 % of the ground truth."""
    ran = [m for m in data["measurements"] if m["samples_per_j"] is not None]
    expected = {
        (host, b, label)
        for host in NODES
        for b in BATCH_SIZES
        for label in LIMITS
        if limit_w(profile_of(host), label) is not None
    }
    assert {(m["host"], m["batch_size"], m["power_limit"]) for m in ran} == expected
    for m in ran:
        gt = truth(m["host"], m["batch_size"], m["power_limit"])
        where = f"{m['host']} batch {m['batch_size']} limit {m['power_limit']}"
        assert m["simulated"] and m["throughput_source"] == "simulated", where
        assert m["samples_per_s"] == pytest.approx(gt.samples_per_s, rel=0.02), where
        assert m["samples_per_j"] == pytest.approx(gt.samples_per_j, rel=0.03), where
        assert m["gpu_model"] == _host_profile_model(m["host"])


def check_probe_results_agree(results: dict[str, dict[str, Any]], data: dict[str, Any]) -> None:
    """Each GPU's J/sample at each point is the same to 4 significant digits in ``probe results`` (the
    agent's own readings) and in ``study report`` (the same samples read back from InfluxDB): one energy
    formula over the same window, divided by the same count of the trainer's."""
    reported = {(m["host"], str(m["gpu"]), m["point"]): m for m in data["measurements"] if m["j_per_sample"]}
    compared = set()
    for host, result in results.items():
        for point in result["points"]:
            for g in point.get("gpus", []):
                if g.get("j_per_sample") is None:
                    continue
                key = (host, str(g["gpu_index"]), point.get("index", 0))
                assert key in reported, (key, sorted(reported))
                where = f"{host} GPU {key[1]} point {key[2]}"
                # the trainer's count reached the report (without it the report fell back to the mean rate
                # times the window, 2e-6..6e-5 off: the count never went out with the events before 2026-12-04)
                assert reported[key]["steady_samples"] == g["samples"], (where, reported[key]["steady_samples"], g)
                assert reported[key]["j_per_sample"] == pytest.approx(g["j_per_sample"], rel=2e-4), (where, g)
                compared.add(key)
    assert compared == set(reported), sorted(set(reported) - compared)


def check_model_agrees(
    tmp_path: Path, influxdb: InfluxDBDatabase, study_id: str, results: dict[str, dict[str, Any]]
) -> None:
    """``gpuprobe model`` of the study: each GPU's J/sample over all its steady phases is the probe's,
    the points' energies over the points' counts, to 4 significant digits (the third of the three
    commands that give a J/sample; the thermal e2e compares it with a one-point probe's)."""
    fitted = run(
        "model", "--probe", study_id, "--influx-url", influxdb.server.url, "--influx-db", influxdb.name,
        "--no-write-model", "--out", str(tmp_path / "model"), timeout_s=180,
    )  # fmt: skip
    assert fitted.returncode == 0, fitted.stdout + fitted.stderr
    by_gpu = {
        (g["host"], g["gpu"]): g for g in json.loads((tmp_path / "model" / f"{study_id}.json").read_text())["gpus"]
    }
    for host, result in results.items():
        ran = [g for point in result["points"] for g in point.get("gpus", []) if g.get("j_per_sample") is not None]
        efficiency = by_gpu[(host, "0")]["efficiency"]
        assert efficiency["steady_samples"] == sum(g["samples"] for g in ran), (host, efficiency)
        j_per_sample = sum(g["energy_j"] for g in ran) / sum(g["samples"] for g in ran)
        assert efficiency["j_per_sample"] == pytest.approx(j_per_sample, rel=2e-4), (host, efficiency)


def _key(group: dict[str, Any]) -> tuple[str, str, int, str]:
    k = group["key"]
    return (k["instance_type"], k["virt"], k["batch_size"], k["power_limit"])


def check_groups(data: dict[str, Any]) -> None:
    """Energy-optimal points, rankings, the vGPU overhead and costs against the ground truth."""
    host_of = {(NODES[h]["instance_type"]): h for h in NODES}
    groups = [g for g in data["groups"] if g["samples_per_j"] is not None]

    # the energy-optimal group of each GPU model: the ground truth's best (ties within 1 % accepted)
    for frontier in data["pareto"]:
        model_groups = [g for g in groups if g["key"]["gpu_model"] == frontier["gpu_model"]]
        truths = {
            _key(g): truth(host_of[g["key"]["instance_type"]], g["key"]["batch_size"], g["key"]["power_limit"])
            for g in model_groups
        }
        best = max(t.samples_per_j for t in truths.values())
        chosen = frontier["energy_optimal"]
        chosen_key = (chosen["instance_type"], chosen["virt"], chosen["batch_size"], chosen["power_limit"])
        assert truths[chosen_key].samples_per_j >= best * 0.99, (frontier["gpu_model"], chosen_key, truths)
        fastest = max(t.samples_per_s for t in truths.values())
        time_key = frontier["time_optimal"]
        t_key = (time_key["instance_type"], time_key["virt"], time_key["batch_size"], time_key["power_limit"])
        assert truths[t_key].samples_per_s >= fastest * 0.99

    # rankings by samples/J: GPU models and instance types, in the ground truth's order
    best_truth: dict[str, dict[str, float]] = {"gpu_model": {}, "instance_type": {}}
    for host in NODES:
        for b in BATCH_SIZES:
            for label in LIMITS:
                if limit_w(profile_of(host), label) is None:
                    continue
                spj = truth(host, b, label).samples_per_j
                for by, name in (
                    ("gpu_model", _host_profile_model(host)),
                    ("instance_type", NODES[host]["instance_type"]),
                ):
                    best_truth[by][name] = max(best_truth[by].get(name, 0.0), spj)
    for ranking in data["rankings"]:
        names = [e["name"] for e in ranking["entries"]]
        expected = sorted(best_truth[ranking["by"]], key=lambda n: -best_truth[ranking["by"]][n])
        assert names == expected, (ranking["by"], names, best_truth[ranking["by"]])

    # the vGPU node's overhead against the bare-metal H100 at every common point: what the simulator applies
    applied = perf.virt_overhead_pct(profile_of("st-vgpu"))
    assert 3 <= applied <= 6  # the published range for vGPU
    overheads = [o for o in data["virt_overhead"] if o["overhead_pct"] is not None]
    assert len(overheads) == len(BATCH_SIZES) * 3  # every point the H100s ran (not the refused 150 W)
    for o in overheads:
        assert o["key"]["virt"] == "vgpu"
        assert o["overhead_pct"] == pytest.approx(applied, abs=1.0), o

    # cost per million samples from the prices file: price per hour over the node's throughput
    for g in groups:
        price = PRICES[g["key"]["instance_type"]]
        expected_cost = price / 3600 / g["samples_per_s"] * 1e6  # one GPU per node here
        assert g["cost_per_million_samples_usd"] == pytest.approx(expected_cost, rel=1e-6)


def check_refusals(data: dict[str, Any]) -> None:
    """Every limit outside a GPU's range is refused with that range (150 W on the H100s and the L4, 40 %
    = 28.8 W on the L4), and only those: the A100 ran its 150 W points."""
    refused = {(r["host"], r["batch_size"], r["power_limit"]): r["message"] for r in data["refusals"]}
    expected = {
        (h, b, label) for h in NODES for b in BATCH_SIZES for label in LIMITS if limit_w(profile_of(h), label) is None
    }
    assert set(refused) == expected
    assert ("st-a100", 8, "150W") not in refused and ("st-l4", 8, "40%") in refused
    for (host, _, label), message in refused.items():
        low, high = profile_of(host).limit_min_w, profile_of(host).limit_max_w
        assert label in message and f"{low:.0f} W to {high:.0f} W" in message, message
