"""The thermal model on data that went the whole way: simulated GPUs -> agent -> collector -> InfluxDB
-> ``gpuprobe model``.

One simulated machine holds one GPU of every profile (the RTX 4090 with its fans), with the simulator's
two-stage physics, the inlet air heated by the whole machine's power and one slot running hotter. A
signed probe runs the bundled trainer's real phases (idle baseline, a warm-up at a lower load than
steady, steady, cool-down); the agent streams what it reads through NVML to a real collector and a real
InfluxDB; ``gpuprobe model`` fits the probe. Each GPU's total R_th and slow tau must come out within
5 % and T_amb within 1 degC of the ground truth that
``gpuprobe.sim.thermal`` computes from the simulator's parameters (the model itself never reads them).

The time constants are shortened with ``--set`` (fast stage 1 s, heatsink 12 s at full fan, inlet
48 s: the stock 4 : 1 of inlet to heatsink) so that the probe is under three minutes long instead of ten.
"""

from __future__ import annotations

import json
import statistics
import uuid
from pathlib import Path

import pytest
from support import gpuprobe_command, wait_until
from test_fleet_e2e import System, influx_rows, operator_keys, run, start_collector, stop_agents

from gpuprobe.devservices import InfluxDBDatabase, MosquittoServer
from gpuprobe.sim import thermal
from gpuprobe.sim.profiles import PROFILES, with_overrides

pytestmark = pytest.mark.slow

HOST = "therm-1"
PROFILE_NAMES = ["A100-SXM4-80GB", "H100-SXM5-80GB", "H200-SXM-141GB", "L4", "RTX-4090"]
SHORT_TAUS = {"tau_fast_s": "1", "tau_s": "12", "inlet_tau_s": "48", "mem_tau_s": "15"}
HOT_SLOT = 3  # the L4 runs 6 degC hotter at every load (a slot with poor airflow)
HOT_SLOT_OFFSET_C = 6.0
PHASES = {"idle_baseline": 15.0, "warmup": 12.0, "duration": 60.0, "cooldown": 75.0}
START_IN_S = 30.0
# issue 11's target; the inlet's ~1 degC share of the rise, read in whole degrees, once made the slow tau
# spread by +-5 % between runs, until the fit counted only errors beyond each reading's +-0.5 degC and
# took in the memory temperatures (docs/models.md has the runs and the sensitivity bench)
TAU_TOLERANCE = 0.05


def overrides(index: int) -> dict[str, str]:
    out = dict(SHORT_TAUS)
    if index == HOT_SLOT:
        out["slot_offset_c"] = f"{HOT_SLOT_OFFSET_C:g}"
    return out


def set_args() -> list[str]:
    args = []
    for i in range(len(PROFILE_NAMES)):
        for key, value in overrides(i).items():
            args += ["--set", f"{i}.{key}={value}"]
    return args


def test_every_profile_recovers_its_thermal_ground_truth_through_the_pipeline(
    tmp_path: Path, system: System, influxdb: InfluxDBDatabase, mqtt_broker: MosquittoServer
) -> None:
    cluster = f"therm-{uuid.uuid4().hex[:6]}"
    collector, port = start_collector(tmp_path, system, influxdb)
    public, private = operator_keys(tmp_path)
    agent = system.start(
        HOST,
        [
            *gpuprobe_command(), "sim", "run", "--profile", ",".join(PROFILE_NAMES), *set_args(),
            "--state-dir", str(tmp_path / "sim"), "--",
            *gpuprobe_command(), "--log-level", "info", "agent", "--host", HOST, "--cluster", cluster,
            "--collector", f"127.0.0.1:{port}", "--broker", mqtt_broker.url, "--trusted-keys", str(public),
            "--spool", str(tmp_path / "spool"), "--presence-interval", "2", "--reconnect-max", "1",
            "--resolution", "full",  # stop_agents checks that every sample taken was stored
        ],
    )  # fmt: skip

    def online() -> bool:
        assert agent.alive() and collector.alive(), system.logs()
        fleet = json.loads(run("fleet", "--broker", mqtt_broker.url, "--json").stdout or "[]")
        return any(p["host"] == HOST and p.get("state") == "online" and p["uplink_connected"] for p in fleet)

    wait_until(online, 60, "the agent online and streaming", interval_s=1.0)

    probe_id = f"p-therm-{uuid.uuid4().hex[:6]}"
    started = run(
        "probe", "start", "--broker", mqtt_broker.url, "--key", str(private), "--probe-id", probe_id,
        "--workload", "resnet50", "--size", "tiny", "--duration", f"{PHASES['duration']:g}",
        "--idle-baseline", f"{PHASES['idle_baseline']:g}", "--warmup", f"{PHASES['warmup']:g}",
        "--cooldown", f"{PHASES['cooldown']:g}", "--start-in", f"{START_IN_S:g}s", "--nodes", f"cluster={cluster}",
        "--json",
    )  # fmt: skip
    assert started.returncode == 0, started.stdout + started.stderr + system.logs()
    total_s = START_IN_S + sum(PHASES.values())
    done = run(
        "probe", "results", probe_id, "--broker", mqtt_broker.url, "--json", "--wait", f"{total_s + 60:g}",
        timeout_s=total_s + 120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr + system.logs()
    probe_result = json.loads(done.stdout)["results"][0]
    assert probe_result["status"] == "succeeded", done.stdout
    taken = stop_agents({HOST: agent}, mqtt_broker.url)
    assert taken[HOST] > 0

    def stored() -> bool:
        rows = influx_rows(influxdb, f'SELECT count("phase") FROM "probe" WHERE "probe" = \'{probe_id}\'')
        return bool(rows) and int(rows[0]["count"]) >= 5

    wait_until(stored, 30, "the probe's events in InfluxDB", interval_s=0.5)

    out = tmp_path / "report"
    fitted = run(
        "model", "--probe", probe_id, "--influx-url", influxdb.server.url, "--influx-db", influxdb.name,
        "--out", str(out), timeout_s=300,
    )  # fmt: skip
    assert fitted.returncode == 0, fitted.stdout + fitted.stderr
    results = json.loads((out / f"{probe_id}.json").read_text())
    by_gpu = {g["gpu"]: g for g in results["gpus"] if g["host"] == HOST}
    assert sorted(by_gpu) == [str(i) for i in range(len(PROFILE_NAMES))]

    # the probe's figures (the agent's own readings, every tick) and the model's (the same samples read
    # back from InfluxDB) come from one energy formula over each GPU's own steady window, divided by its
    # trainer's count: they agree to 4 significant digits, GPU by GPU (one run: within 2e-5). With the probe
    # reading one tick a second they were 0.26 % apart; with the host's window for every GPU, 4.7e-4.
    for g in probe_result["gpus"]:
        efficiency = by_gpu[str(g["gpu_index"])]["efficiency"]
        print(
            f"GPU {g['gpu_index']}: probe {g['energy_j']:.1f} J, {g['j_per_sample']:.6g} J/sample;"
            f" model {efficiency['steady_energy_j']:.1f} J, {efficiency['j_per_sample']:.6g} J/sample"
        )
        assert efficiency["steady_samples"] == g["samples"], (g, efficiency)  # the trainer's count reached it
        assert efficiency["steady_energy_j"] == pytest.approx(g["energy_j"], rel=2e-4), (g, efficiency)
        assert efficiency["j_per_sample"] == pytest.approx(g["j_per_sample"], rel=2e-4), (g, efficiency)

    truths = ground_truths(influxdb, probe_id)
    failures = []
    for i, truth in enumerate(truths):
        fit = by_gpu[str(i)]["thermal"]
        rc = fit["rc"]
        r_err = rc["r_th_c_per_w"] / truth.r_th_c_per_w - 1
        tau_err = rc["tau_s"] / truth.tau_s - 1
        amb_err = rc["t_amb_c"] - truth.t_amb_c
        line = (
            f"GPU {i} {PROFILE_NAMES[i]}: model {fit['model']}, R {r_err:+.1%}, tau {tau_err:+.1%}, "
            f"T_amb {amb_err:+.2f} C, fit {fit['fit_rmse_c']:.2f} C, held out {fit['holdout_rmse_c']:.3f} C"
            f" (rc1: {fit['rc1_holdout_rmse_c']:.3f} C)"
        )
        print(line)
        if abs(r_err) > 0.05 or abs(tau_err) > TAU_TOLERANCE or abs(amb_err) > 1.0:
            failures.append(line)
        # the two-stage model explains the held-out end better than the first-order one
        assert fit["model"].startswith("rc2"), line
        assert fit["holdout_rmse_c"] < fit["rc1_holdout_rmse_c"], line
    assert not failures, "\n".join(failures)


def ground_truths(influxdb: InfluxDBDatabase, probe_id: str) -> list[thermal.ThermalTruth]:
    """Each GPU's ground truth at the powers it drew at the end of the steady phase (as stored)."""
    events = influx_rows(
        influxdb, f'SELECT "phase" FROM "probe" WHERE "probe" = \'{probe_id}\' AND "kind" = \'phase_change\''
    )
    starts = {e["phase"]: e["time"] for e in events}
    steady_from, steady_to = starts["steady"], starts["cooldown"]
    profiles = [with_overrides(PROFILES[name], overrides(i)) for i, name in enumerate(PROFILE_NAMES)]
    powers_w = []
    for i in range(len(profiles)):
        rows = influx_rows(
            influxdb,
            f'SELECT "power_w" FROM "gpu" WHERE "host" = \'{HOST}\' AND "gpu" = \'{i}\' '
            f"AND time >= {steady_from} AND time < {steady_to}",
        )
        tail = [r["power_w"] for r in rows[len(rows) // 2 :]]
        assert tail, f"no steady power of GPU {i}"
        powers_w.append(statistics.median(tail))
    return thermal.ground_truth(profiles, powers_w)
