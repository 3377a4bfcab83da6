"""Issue 12 through the whole system: simulated faults -> agent -> collector -> InfluxDB, and the fleet.

One agent (``gpuprobe agent --broker``) under a simulated machine with an H100, an A100, an L4 and an
H200, one collector, a real InfluxDB and a real Mosquitto:

- GPM fields (true utilization) are stored for the H100 and the H200 and absent for the A100 and the L4;
- during a probe, ``gpu_process`` points name the trainer's pid and command;
- ``gpuprobe sim fail --xid 79`` makes the GPU ``failed`` in ``gpuprobe fleet`` within 2 s, and a probe
  aimed at it is refused with the reason;
- each injected fault (XID 79, a double-bit ECC error and its XID 48, a pending row remap and its XID 63)
  is stored exactly once in ``gpu_event``, with its code and text, across a collector SIGKILL and an
  agent SIGKILL (both restarted), and is not repeated after the faults are cleared.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest
from support import gpuprobe_command, stays, wait_until
from test_fleet_e2e import Proc, System, influx_rows, operator_keys, run, start_collector

from gpuprobe.devservices import InfluxDBDatabase, MosquittoServer
from gpuprobe.v1 import telemetry_pb2

pytestmark = pytest.mark.slow

HOST = "health-node"
PROFILES = ["H100-SXM5-80GB", "A100-SXM4-80GB", "L4", "H200-SXM-141GB"]
GPM_GPUS = {"0", "3"}  # Hopper: H100 and H200
LOST_GPU = 2  # the L4 falls off the bus (XID 79)
ECC_GPU = 1  # the A100 gets a double-bit ECC error (XID 48) and a pending row remap (XID 63)
# long batches: only the flush an event triggers at once gets the XID 63 into the spool before the SIGKILL
FLUSH_INTERVAL = "5"
GPM_FIELDS = ("sm_active_pct", "sm_occupancy_pct", "tensor_active_pct", "dram_bw_util_pct")


def start_agent(system: System, tmp_path: Path, port: int, broker: str, cluster: str, public: Path, name: str) -> Proc:
    return system.start(
        name,
        [
            *gpuprobe_command(), "sim", "run", "--profile", ",".join(PROFILES),
            "--state-dir", str(tmp_path / "sim"), "--",
            *gpuprobe_command(), "--log-level", "info", "agent", "--host", HOST, "--cluster", cluster,
            "--collector", f"127.0.0.1:{port}", "--broker", broker, "--trusted-keys", str(public),
            "--spool", str(tmp_path / "spool"), "--presence-interval", "30", "--flush-interval", FLUSH_INTERVAL,
            "--mqtt-reconnect-max", "1", "--reconnect-max", "1",
        ],
    )  # fmt: skip


def fleet_host(broker: str) -> dict[str, Any] | None:
    listed = run("fleet", "--broker", broker, "--json")
    for presence in json.loads(listed.stdout or "[]"):
        if presence["host"] == HOST:
            return dict(presence)
    return None


def gpu_health(presence: dict[str, Any]) -> dict[int, tuple[str, str]]:
    return {int(g["index"]): (g["health"], g.get("reason", "")) for g in presence.get("gpu_health", [])}


def sim_fail(tmp_path: Path, *args: str) -> None:
    done = run("sim", "fail", "--state-dir", str(tmp_path / "sim"), *args)
    assert done.returncode == 0, done.stdout + done.stderr


def kill_agent(wrapper: Proc) -> None:
    """SIGKILL the agent itself (the child of ``sim run``), as the OOM killer would."""
    children = psutil.Process(wrapper.proc.pid).children(recursive=True)
    agents = [c for c in children if "agent" in c.cmdline()]
    assert agents, "no agent process under sim run"
    for a in agents:
        a.send_signal(signal.SIGKILL)
    wrapper.proc.wait(30)


def spooled_xids(spool_dir: Path) -> set[tuple[int, int]]:
    """The (GPU, XID) events in the agent's spool: batches written, not yet acknowledged."""
    db = sqlite3.connect(f"file:{spool_dir / 'spool.sqlite3'}?mode=ro", uri=True, timeout=5)
    try:
        payloads = [payload for (payload,) in db.execute("SELECT payload FROM batches")]
    finally:
        db.close()
    found = set()
    for payload in payloads:
        batch = telemetry_pb2.SampleBatch.FromString(payload)
        found |= {(e.gpu_index, e.data) for e in batch.gpu_events if e.kind == telemetry_pb2.GPU_EVENT_KIND_XID}
    return found


def events(influxdb: InfluxDBDatabase) -> list[dict[str, Any]]:
    return influx_rows(
        influxdb, f'SELECT "kind", "gpu", "xid", "data", "text" FROM "gpu_event" WHERE "host" = \'{HOST}\''
    )


def test_faults_are_events_stored_once_and_failed_gpus_are_refused(
    tmp_path: Path, system: System, influxdb: InfluxDBDatabase, mqtt_broker: MosquittoServer
) -> None:
    broker = mqtt_broker.url
    cluster = f"health-{uuid.uuid4().hex[:6]}"
    collector, port = start_collector(tmp_path, system, influxdb)
    public, private = operator_keys(tmp_path)
    agent = start_agent(system, tmp_path, port, broker, cluster, public, "agent")

    def online() -> dict[str, Any] | None:
        assert agent.alive(), system.logs()
        presence = fleet_host(broker)
        if presence and presence["state"] == "online" and presence["uplink_connected"]:
            return presence
        return None

    presence = wait_until(online, 60, "the agent online and streaming", interval_s=1.0)
    assert gpu_health(presence) == {i: ("healthy", "") for i in range(len(PROFILES))}, presence

    # GPM on Hopper only: the fields are stored for the H100 and H200 and absent (not zero) on the others
    def gpm_stored() -> dict[str, int] | None:
        rows = influx_rows(
            influxdb, f'SELECT count("sm_active_pct") FROM "gpu" WHERE "host" = \'{HOST}\' GROUP BY "gpu"'
        )
        counts = {r["gpu"]: int(r["count"]) for r in rows}
        return counts if set(counts) >= GPM_GPUS else None

    assert set(wait_until(gpm_stored, 30, "GPM fields of the Hopper GPUs in InfluxDB", interval_s=1.0)) == GPM_GPUS
    for name in GPM_FIELDS:
        rows = influx_rows(influxdb, f'SELECT count("{name}") FROM "gpu" WHERE "host" = \'{HOST}\' GROUP BY "gpu"')
        assert {r["gpu"] for r in rows} == GPM_GPUS, (name, rows)

    # a probe on the H100: its trainer's pid and command in gpu_process while it runs
    probe_id = f"p-health-{uuid.uuid4().hex[:6]}"
    started = run(
        "probe", "start", "--broker", broker, "--key", str(private), "--probe-id", probe_id,
        "--workload", "matmul-burn", "--size", "tiny", "--duration", "12", "--idle-baseline", "2",
        "--warmup", "2", "--cooldown", "1", "--start-in", "25s", "--nodes", f"cluster={cluster}",
        "--gpus", "0", "--json",
    )  # fmt: skip
    assert started.returncode == 0, started.stdout + started.stderr + system.logs()

    def trainer_pids() -> set[int]:
        children = psutil.Process(agent.proc.pid).children(recursive=True)
        return {c.pid for c in children if any("train" in part for part in c.cmdline())}

    def processes_stored() -> list[dict[str, Any]] | None:
        pids = trainer_pids()
        rows = influx_rows(
            influxdb,
            f'SELECT "pid", "command", "used_memory_bytes", "sm_pct", "energy_j" FROM "gpu_process"'
            f" WHERE \"host\" = '{HOST}' AND \"gpu\" = '0'",
        )
        return [r for r in rows if int(r["pid"]) in pids] or None

    process_rows = wait_until(processes_stored, 90, "the trainer's gpu_process points", interval_s=1.0)
    trainer = psutil.Process(int(process_rows[0]["pid"]))
    assert {r["command"] for r in process_rows} == {trainer.name()}, process_rows
    done = run("probe", "results", probe_id, "--broker", broker, "--json", "--wait", "90", timeout_s=150)
    assert done.returncode == 0, done.stdout + done.stderr + system.logs()

    # the trainer has ended: its last point says so, and it was given a share of the GPU's energy
    def ended() -> list[dict[str, Any]] | None:
        rows = influx_rows(
            influxdb,
            f'SELECT "energy_j", "ended" FROM "gpu_process" WHERE "host" = \'{HOST}\' AND "pid" = \'{trainer.pid}\'',
        )
        return rows if rows and rows[-1]["ended"] else None

    later = wait_until(ended, 15, "the trainer's last gpu_process point (ended)", interval_s=0.5)
    assert later[-1]["ended"] is True and sum(bool(r["ended"]) for r in later) == 1, later[-3:]
    assert later[-1]["energy_j"] > 0, later[-3:]
    # the simulated tensor pipes followed the workload: matmul-burn keeps them busy whenever the SMs are (the
    # share scales with the load, which the tiny size keeps partial), the idle H200's are not
    peaks = influx_rows(
        influxdb,
        f'SELECT max("tensor_active_pct") AS "tensor", max("sm_active_pct") AS "sm" FROM "gpu"'
        f' WHERE "host" = \'{HOST}\' GROUP BY "gpu"',
    )
    by_gpu = {r["gpu"]: r for r in peaks}
    assert by_gpu["0"]["sm"] > 20 and by_gpu["0"]["tensor"] > 0.85 * by_gpu["0"]["sm"], by_gpu
    assert by_gpu["3"]["tensor"] < 1, by_gpu

    # XID 79: the L4 falls off the bus; failed in `gpuprobe fleet` within 2 s
    sim_fail(tmp_path, "--gpu", str(LOST_GPU), "--xid", "79")
    injected = time.monotonic()

    def failed() -> dict[str, Any] | None:
        presence = fleet_host(broker)
        return presence if presence and gpu_health(presence).get(LOST_GPU, ("", ""))[0] == "failed" else None

    presence = wait_until(failed, 10, f"GPU {LOST_GPU} failed in gpuprobe fleet", interval_s=0.1)
    assert time.monotonic() - injected <= 2.0 + 0.5, (
        "a failed GPU must show in the fleet within 2 s"
    )  # 0.5 s: CLI start
    assert "79" in gpu_health(presence)[LOST_GPU][1], presence
    assert gpu_health(presence)[0] == ("healthy", ""), presence
    table = run("fleet", "--broker", broker)
    assert "failed" in table.stdout and "79" in table.stdout, table.stdout

    # a probe aimed at the failed GPU is refused with the reason
    refused = run(
        "probe", "start", "--broker", broker, "--key", str(private), "--workload", "idle", "--duration", "5",
        "--start-in", "10s", "--nodes", f"cluster={cluster}", "--gpus", str(LOST_GPU), "--json",
    )  # fmt: skip
    assert refused.returncode != 0, refused.stdout
    assert "gpu_failed" in refused.stdout and "XID 79" in refused.stdout, refused

    # a double-bit ECC error on the A100 (XID 48 and the ECC event)
    sim_fail(tmp_path, "--gpu", str(ECC_GPU), "--ecc-dbe")
    wait_until(
        lambda: gpu_health(fleet_host(broker) or {}).get(ECC_GPU, ("", ""))[0] == "failed",
        10,
        "the A100 failed",
        interval_s=0.2,
    )

    # the collector dies; a pending row remap (XID 63) happens while it is away, so its event is spooled but
    # not acknowledged when the agent dies too (SIGKILL) a moment later; both come back, the agent with its spool
    collector.proc.send_signal(signal.SIGKILL)
    collector.proc.wait(10)
    sim_fail(tmp_path, "--gpu", str(ECC_GPU), "--remap-pending")
    # the event thread has it and the agent spools it at once (it flushes on an event, not after 5 s)
    wait_until(
        lambda: (ECC_GPU, 63) in spooled_xids(tmp_path / "spool"),
        10,
        "the XID 63 event in the agent's spool",
        describe=lambda: spooled_xids(tmp_path / "spool"),
    )
    kill_agent(agent)
    system.start("collector-2", [str(a) for a in collector.proc.args])  # the same command line, the same WAL
    agent = start_agent(system, tmp_path, port, broker, cluster, public, "agent-2")
    wait_until(online, 60, "the restarted agent online and streaming", interval_s=1.0)

    expected = sorted([(str(LOST_GPU), 79), (str(ECC_GPU), 48), (str(ECC_GPU), 63)])

    def xids() -> list[tuple[str, int, str]]:
        return sorted((r["gpu"], int(r["xid"]), r["text"]) for r in events(influxdb) if r["kind"] == "xid")

    # clear everything (a GPU reset): no event is repeated afterwards
    sim_fail(tmp_path, "--gpu", f"{LOST_GPU},{ECC_GPU}", "--recover")
    wait_until(
        lambda: all(h == "healthy" for h, _ in gpu_health(fleet_host(broker) or {}).values()),
        15,
        "every GPU healthy again after the reset",
        interval_s=0.5,
    )

    def once_each() -> bool:
        seen = [(gpu, xid) for gpu, xid, _ in xids()]
        return len(seen) == len(set(seen)) and set(seen) <= set(expected)

    # the agent keeps running a while after the reset: no fault comes back as a new event meanwhile
    stays(once_each, 3.0, "each XID stored at most once after the reset", describe=xids)
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(60) == 0, agent.log()[-4000:]
    assert "everything was delivered" in agent.log(), agent.log()[-4000:]

    wait_until(
        lambda: [(gpu, xid) for gpu, xid, _ in xids()] == expected, 15, f"XIDs {expected} in InfluxDB", interval_s=0.5
    )
    # nothing more arrives: each event is stored once, none repeated after the reset (everything was
    # acknowledged, so it is in the collector's WAL, which it writes with a 0.2 s linger)
    stays(lambda: [(gpu, xid) for gpu, xid, _ in xids()] == expected, 1.0, f"exactly XIDs {expected}", describe=xids)
    stored = events(influxdb)
    assert [(gpu, xid) for gpu, xid, _ in xids()] == expected, stored
    texts = {xid: text for _, xid, text in xids()}
    assert "fallen off the bus" in texts[79], texts
    assert "ECC" in texts[48] or "double" in texts[48].lower(), texts
    assert "remap" in texts[63].lower(), texts
    assert [r["gpu"] for r in stored if r["kind"] == "ecc_dbe"] == [str(ECC_GPU)], stored
    # the lost GPU: one `lost` event and one `recovered` event (after the reset)
    assert sorted(r["kind"] for r in stored if r["gpu"] == str(LOST_GPU)) == ["lost", "recovered", "xid"], stored
