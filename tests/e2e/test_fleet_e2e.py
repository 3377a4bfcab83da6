"""The whole system, all real: three agents -> one collector -> InfluxDB, and a fleet probe over MQTT.

Issues 3 (agent), 4 (collector) and 5 (trainer and probes) fit together only if this passes:

- a real InfluxDB (a fresh database on the session's server), a real Mosquitto, one collector
  process (``gpuprobe collector --insecure``), three ``gpuprobe agent --broker`` processes, each
  under its own simulated machine (``gpuprobe sim run``) with two GPUs of mixed profiles and its own
  host name, and the operator's own commands (``probe keygen``, ``probe start``, ``probe results``);
- (a) a signed resnet50 probe is accepted by all three agents and ``probe results`` lists all three;
- (b) InfluxDB holds the probe's ``trainer`` points (probe tag) and ``probe`` phase points for every
  host, ``gpu`` points for every host and GPU, and the stored ``power_w`` / ``temp_c`` of every GPU
  rise from the idle baseline to the steady phase (the simulated GPUs followed the trainers); every
  stored field and tag is in docs/schema.md with the type written there; and one ``gpu_info`` point per
  host and GPU holds the simulated GPU's own thresholds, limits and PCIe link (what ``gpuprobe model``
  takes its slowdown threshold from);
- (c) every sample is stored exactly once (see ``test_every_sample_is_stored_exactly_once``).
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import support
from support import free_port, gpuprobe_command, wait_until

from gpuprobe.devservices import InfluxDBDatabase, MosquittoServer
from gpuprobe.sim import perf, state
from gpuprobe.sim.profiles import PROFILES

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
INTERVAL_S = 0.1  # the agents' default sampling interval (10 Hz)
NODES = {  # host -> its simulated GPUs (mixed: passive datacenter parts, a fan-cooled RTX 4090)
    "node-1": ["H100-SXM5-80GB", "L4"],
    "node-2": ["A100-SXM4-80GB", "RTX-4090"],
    "node-3": ["L4", "H100-SXM5-80GB"],
}
PHASES = {"idle_baseline": 4.0, "warmup": 2.0, "duration": 20.0, "cooldown": 3.0}
# the agents' samples beside gpu, node and acoustic: GPU events (clock changes on the simulated GPUs),
# processes (the trainers), NVLink links (the H100s and the A100); no MIG here
HEALTH_MEASUREMENTS = ("gpu_event", "gpu_process", "gpu_nvlink")
START_IN_S = 35.0  # six trainers import torch and build ResNet-50 on two shared cores meanwhile
STOPPED = re.compile(
    r"stopped: (\d+) samples taken, (\d+) spooled, (\d+) acknowledged, (\d+) dropped by the spool cap;"
    r" everything was delivered"
)
# What an agent logs when something was refused (agent/uplink.py, agent/trainer_input.py,
# control/agent_side.py, control/mqtt.py): the collector refusing samples or the agent itself, the agent
# refusing a command or a trainer's line, the broker refusing the connection. Not the word alone: a normal
# reconnect while the collector starts says "Connection refused" too.
REFUSALS = re.compile(
    r"collector \S+ refused (\d+ samples of batch|the agent)"
    r"|refused (a message on|command) "
    r"|trainer socket \S+: refused a line"
    r"|point\(s\) refused here"
    r"|MQTT broker \S+ refused the connection"
)


def test_refusals_are_told_from_a_reconnect() -> None:
    """The log lines ``stop_agents`` fails on: each kind of refusal, never a collector still starting."""
    refusals = [
        "collector 127.0.0.1:7447 refused 12 samples of batch 3 (REJECT_REASON_INVALID): power_w is NaN",
        "collector 127.0.0.1:7447 refused the agent (FAILED_PRECONDITION: spool id changed): it will refuse it",
        "collector 127.0.0.1:7447 refused the agent's credentials (UNAUTHENTICATED: bad token): check the token",
        "refused command c-1: REFUSAL_REASON_BAD_SIGNATURE (the signature does not verify with any trusted key)",
        "refused a message on gpuprobe/commands: not a SignedCommand (12 bytes)",
        "trainer socket /run/gpuprobe/trainer.sock: refused a line from pid 12: not JSON",
        "the MQTT broker mqtt://127.0.0.1:1883 refused the connection without a user name: not authorized"
        " (the broker needs a user name and password)",
    ]
    assert all(REFUSALS.search(line) for line in refusals), [x for x in refusals if not REFUSALS.search(x)]
    reconnect = (
        "stream to collector 127.0.0.1:7447 ended (UNAVAILABLE: failed to connect to all addresses; last error:"
        " UNKNOWN: ipv4:127.0.0.1:7447: Failed to connect to remote host: Connection refused); 0 batches"
        " (0 samples) stay spooled; reconnecting in 0.6 s"
    )
    assert not REFUSALS.search(reconnect)


def clean_env() -> dict[str, str]:
    """The trainers get one torch thread each (two cores, six trainers)."""
    return support.clean_env(GPUPROBE_THREADS="1")


@dataclass
class Proc:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class System:
    """Every process the test started (and stops, by pid)."""

    tmp: Path
    procs: list[Proc]

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        log_path = self.tmp / f"{name}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(argv, env=env or clean_env(), stdout=log, stderr=subprocess.STDOUT)
        started = Proc(name, proc, log_path)
        self.procs.append(started)
        return started

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.log()[-6000:]}" for p in self.procs)

    def stop_all(self) -> None:
        # SIGTERM first, last started first: `sim run` forwards it to its agent (a SIGKILL would orphan
        # the agent), and the agents go before the collector they deliver to
        for p in reversed(self.procs):
            if p.alive():
                p.proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.proc.wait(30)
        for p in self.procs:
            if p.alive():
                p.proc.kill()
                p.proc.wait(10)


def run(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*gpuprobe_command(), *args], env=clean_env(), capture_output=True, text=True, timeout=timeout_s
    )


def documented(measurement: str) -> tuple[dict[str, str], set[str]]:
    """docs/schema.md's fields (name -> type) of one measurement, and the tags it names for it: the
    agent's tags and every name in backticks before the section's field table."""
    text = (REPO / "docs/schema.md").read_text()
    match = re.search(rf"^## `{measurement}`.*?(?=^## )", text, re.S | re.M)
    assert match, f"docs/schema.md has no section for {measurement}"
    body = match.group(0)
    fields = dict(re.findall(r"^\| `([a-z0-9_<>]+)` \| (float|integer|boolean|string) \|", body, re.M))
    head = body[: body.index("| field |")]
    tags = {"host", "cluster", "cloud", "instance_type", "region", "virt"} | set(re.findall(r"`([a-z_]+)`", head))
    return fields, tags


def influx_rows(db: InfluxDBDatabase, query: str) -> list[dict[str, Any]]:
    return [row for series in db.query(query) for row in series.rows()]


def mean(values: list[float]) -> float:
    assert values, "no stored values in that window"
    return sum(values) / len(values)


def test_three_agents_a_collector_and_a_probe_fit_together(
    tmp_path: Path, system: System, influxdb: InfluxDBDatabase, mqtt_broker: MosquittoServer
) -> None:
    broker = mqtt_broker.url
    cluster = f"e2e-{uuid.uuid4().hex[:6]}"  # the session's broker may hold other tests' agents
    collector, agents, private = start_fleet(tmp_path, system, influxdb, broker, cluster)
    probe_id = run_probe(system, broker, private, cluster)
    taken = stop_agents(agents, broker)
    measurements = ("gpu", "node", "acoustic", "trainer", "probe", *HEALTH_MEASUREMENTS)
    counts = wait_stored(influxdb, collector, measurements, taken)
    # (c) exactly once: see the comment of check_exactly_once
    check_exactly_once(influxdb, counts, taken)
    check_probe_points(influxdb, probe_id, cluster)
    check_gpu_info(influxdb, cluster)
    check_schema_doc(influxdb, (*measurements, "gpu_info"))


def start_collector(tmp_path: Path, system: System, influxdb: InfluxDBDatabase) -> tuple[Proc, int]:
    """One collector (no TLS) on a free port, writing into ``influxdb``; the process and its port."""
    port = free_port()
    collector = system.start(
        "collector",
        [
            *gpuprobe_command(), "collector", "--insecure", "--listen", f"127.0.0.1:{port}",
            "--influx-url", influxdb.server.url, "--influx-db", influxdb.name, "--wal", str(tmp_path / "wal"),
            "--sink-linger", "0.2",
        ],
    )  # fmt: skip
    return collector, port


def operator_keys(tmp_path: Path) -> tuple[Path, Path]:
    """A fresh operator key pair made by ``gpuprobe probe keygen``: (public, private)."""
    keygen = run("probe", "keygen", "--out", str(tmp_path / "keys"))
    assert keygen.returncode == 0, keygen.stderr
    return tmp_path / "keys/operator.pub", tmp_path / "keys/operator.key"


def start_fleet(
    tmp_path: Path, system: System, influxdb: InfluxDBDatabase, broker: str, cluster: str
) -> tuple[Proc, dict[str, Proc], Path]:
    """A collector and the three agents under their simulated machines, online and streaming; the
    operator's private key."""
    collector, port = start_collector(tmp_path, system, influxdb)
    public, private = operator_keys(tmp_path)

    agents = {}
    for host, profiles in NODES.items():
        agents[host] = system.start(
            host,
            [
                *gpuprobe_command(), "sim", "run", "--profile", ",".join(profiles),
                "--state-dir", str(tmp_path / host / "sim"), "--",
                *gpuprobe_command(), "--log-level", "info", "agent", "--host", host, "--cluster", cluster,
                "--collector", f"127.0.0.1:{port}", "--broker", broker, "--trusted-keys", str(public),
                "--spool", str(tmp_path / host / "spool"), "--presence-interval", "2",
                "--mqtt-reconnect-max", "1", "--reconnect-max", "1",
                "--resolution", "full",  # (c) counts every sample the agents took, probe or not
            ],
        )  # fmt: skip

    def online() -> bool:
        for p in [collector, *agents.values()]:
            assert p.alive(), f"{p.name} exited ({p.proc.returncode})\n{system.logs()}"
        done = run("fleet", "--broker", broker, "--json")
        # online, and the presence shows the agent's uplink to the collector (the agent's status)
        hosts = {
            p["host"] for p in json.loads(done.stdout or "[]") if p.get("state") == "online" and p["uplink_connected"]
        }
        return set(NODES) <= hosts

    wait_until(online, 60, "three agents online on the broker and streaming to the collector", interval_s=1.0)
    fleet = {p["host"]: p for p in json.loads(run("fleet", "--broker", broker, "--json").stdout)}
    for host, profiles in NODES.items():
        # the presence comes from the agent itself: its GPUs, its identity, its uplink
        assert [g["name"] for g in fleet[host]["gpus"]] == [PROFILES[p].nvml_name for p in profiles]
        assert fleet[host]["cluster"] == cluster

    return collector, agents, private


def run_probe(system: System, broker: str, private: Path, cluster: str) -> str:
    """(a) the operator starts a signed probe; all three accept it, follow it live to the end, start
    their steady phases within 1 s of each other and report the simulated GPUs' ground truth."""
    probe_id = f"p-e2e-{uuid.uuid4().hex[:6]}"
    started = run(
        "probe", "start", "--broker", broker, "--key", str(private), "--probe-id", probe_id,
        "--workload", "resnet50", "--size", "tiny", "--duration", f"{PHASES['duration']:g}",
        "--idle-baseline", f"{PHASES['idle_baseline']:g}", "--warmup", f"{PHASES['warmup']:g}",
        "--cooldown", f"{PHASES['cooldown']:g}", "--start-in", f"{START_IN_S:g}s", "--nodes", f"cluster={cluster}",
    )  # fmt: skip
    assert started.returncode == 0, started.stdout + started.stderr + system.logs()
    assert f"({len(NODES)} online agent(s) selected)" in started.stdout, started.stdout
    for host in NODES:
        assert f"{host}  accepted" in started.stdout, started.stdout

    # the live view runs until every node has its result
    status = run("probe", "status", probe_id, "--broker", broker, "--refresh", "2", timeout_s=150)
    assert status.returncode == 0, status.stdout + status.stderr + system.logs()
    tables = status.stdout.split(f"probe {probe_id}")
    assert len(tables) > 5 and "steady" in status.stdout and "[####" in status.stdout, status.stdout
    for host in NODES:
        row = next(line for line in tables[-1].splitlines() if line.startswith(host))
        assert row.split()[1:3] == ["done", "succeeded"] and "100%" in row, row

    done = run("probe", "results", probe_id, "--broker", broker, "--json")
    assert done.returncode == 0, done.stdout + done.stderr + system.logs()
    results = {r["host"]: r for r in json.loads(done.stdout)["results"]}
    assert set(results) == set(NODES)
    steady_starts = [r["steady_start_unix_ns"] for r in results.values()]
    assert (max(steady_starts) - min(steady_starts)) / 1e9 < 1.0, "steady phases must start within 1 s"
    for host, r in results.items():
        assert r["status"] == "succeeded" and r["workload"] == "resnet50" and r["size"] == "tiny", r
        assert r["batch_size"] == 8 and r["device"] == "sim" and r["simulated"], r
        steady_s = (r["steady_end_unix_ns"] - r["steady_start_unix_ns"]) / 1e9
        assert PHASES["duration"] - 0.1 < steady_s < PHASES["duration"] + 1, steady_s
        assert sorted(g["gpu_index"] for g in r["gpus"]) == [0, 1]
        # computed from the agent's own GPU samples (one NVML reader per node): energy from the simulated
        # NVML counter, throughput the simulated device's, against the simulator's ground truth
        for g in r["gpus"]:
            profile = PROFILES[NODES[host][g["gpu_index"]]]
            truth = perf.ground_truth(profile, "resnet50", "tiny", 8)
            where = f"{host} GPU {g['gpu_index']} ({profile.name})"
            assert g["gpu_uuid"].startswith("GPU-"), where
            assert g["mean_power_w"] == pytest.approx(truth.power_w, rel=0.03), (where, g)
            assert g["samples_per_s"] == pytest.approx(truth.samples_per_s, rel=0.02), (where, g)
            assert g["energy_j"] == pytest.approx(g["mean_power_w"] * PHASES["duration"], rel=0.05), (where, g)
            assert g["j_per_sample"] == pytest.approx(g["energy_j"] / g["samples"]), (where, g)
            assert 0 < g["idle_power_w"] < g["mean_power_w"], (where, g)  # its idle level: check_probe_points
            assert g["peak_power_w"] >= g["mean_power_w"] - 1 and g["peak_temp_c"] > 40, (where, g)
        t = r["total"]
        assert t["energy_j"] == pytest.approx(sum(g["energy_j"] for g in r["gpus"])), r
        assert t["samples_per_s"] == pytest.approx(sum(g["samples_per_s"] for g in r["gpus"])), r
    table = run("probe", "results", probe_id, "--broker", broker)
    assert table.returncode == 0 and all(host in table.stdout for host in NODES)
    rows = [line for line in table.stdout.splitlines() if line.startswith("node-")]
    assert len(rows) == len(NODES) and all(row.split()[-1] == "SIMULATED" for row in rows), table.stdout
    assert "SIMULATED throughput: the simulator's performance model, not a measurement" in table.stdout

    return probe_id


def stop_agents(agents: dict[str, Proc], broker: str) -> dict[str, int]:
    """Every agent stops cleanly: the control plane first (OFFLINE), then it delivers what it spooled;
    the samples each took."""
    for a in agents.values():
        a.proc.send_signal(signal.SIGTERM)
    taken: dict[str, int] = {}
    for host, a in agents.items():
        assert a.proc.wait(60) == 0, a.log()[-6000:]
        match = STOPPED.search(a.log())
        assert match, f"{host} did not deliver everything:\n{a.log()[-4000:]}"
        n_taken, spooled, acked, dropped = map(int, match.groups())
        assert n_taken == spooled == acked and dropped == 0, match.group(0)
        refusal = REFUSALS.search(a.log())
        assert refusal is None, f"{host}: something was refused ({refusal[0]!r}):\n{a.log()}"
        taken[host] = n_taken
    offline = {p["host"]: p["state"] for p in json.loads(run("fleet", "--broker", broker, "--json").stdout)}
    assert all(offline[h] == "offline" for h in agents), offline

    return taken


def wait_stored(
    influxdb: InfluxDBDatabase, collector: Proc, measurements: tuple[str, ...], taken: dict[str, int]
) -> dict[str, dict[str, int]]:
    """The collector writes its WAL into InfluxDB: waits until every point of every host is there."""
    required = {"gpu": "power_w", "node": "cpu_pct", "acoustic": "est_dba", "trainer": "step", "probe": "kind"}

    def stored() -> dict[str, dict[str, int]]:
        counts: dict[str, dict[str, int]] = {h: {} for h in taken}
        for m in measurements:
            if m in required:
                for row in influx_rows(influxdb, f'SELECT count("{required[m]}") FROM "{m}" GROUP BY "host"'):
                    if row["host"] in counts:
                        counts[row["host"]][m] = int(row["count"])
            else:  # the health measurements: no field is in every point (docs/schema.md), so count rows
                for row in influx_rows(influxdb, f'SELECT * FROM "{m}"'):
                    if row["host"] in counts:
                        counts[row["host"]][m] = counts[row["host"]].get(m, 0) + 1
        return counts

    def complete() -> dict[str, dict[str, int]] | None:
        counts = stored()
        return counts if all(sum(counts[h].values()) >= taken[h] for h in taken) else None

    try:
        counts = wait_until(complete, 30, "every sample in InfluxDB", interval_s=0.5)
    except AssertionError:
        raise AssertionError(f"stored {stored()} of {taken}\n{collector.log()[-4000:]}") from None
    return counts


def check_probe_points(influxdb: InfluxDBDatabase, probe_id: str, cluster: str) -> None:
    """(b) the probe's trainer and probe points, and the GPUs following the phases."""
    trainer = influx_rows(
        influxdb,
        f'SELECT "step", "phase", "samples_per_s" FROM "trainer" WHERE "probe" = \'{probe_id}\''
        ' GROUP BY "host", "gpu", "workload", "cluster"',
    )
    assert {(r["host"], r["gpu"]) for r in trainer} == {(h, g) for h in NODES for g in ("0", "1")}
    assert {r["workload"] for r in trainer} == {"resnet50"} and {r["cluster"] for r in trainer} == {cluster}
    for host in NODES:
        steady = [r for r in trainer if r["host"] == host and r["phase"] == "steady"]
        assert steady and max(r["step"] for r in steady) > 0 and any(r["samples_per_s"] for r in steady)

    events = influx_rows(
        influxdb, f'SELECT "kind", "phase", "status" FROM "probe" WHERE "probe" = \'{probe_id}\' GROUP BY "host"'
    )
    for host in NODES:
        mine = [e for e in events if e["host"] == host]
        phases = [e["phase"] for e in mine]
        assert {"idle", "warmup", "steady", "cooldown", "done"} <= set(phases), phases
        assert any(e["kind"] == "end" and e["status"] == "succeeded" for e in mine), mine
        # the phase boundaries, as the trainers stored them (the first trainer's: they are synchronized)
        start = {p: min(e["time"] for e in mine if e["phase"] == p) for p in ("idle", "warmup", "steady", "cooldown")}
        for gpu, profile in enumerate(NODES[host]):
            readings = influx_rows(
                influxdb,
                f'SELECT "power_w", "temp_c" FROM "gpu" WHERE "host" = \'{host}\' AND "gpu" = \'{gpu}\''
                f" AND time >= {start['idle']} AND time < {start['cooldown']}",
            )
            # power_w is a 1 s average on newer GPUs: leave its first second out of each window
            idle = [r for r in readings if start["idle"] + 1e9 <= r["time"] < start["warmup"]]
            load = [r for r in readings if start["steady"] + 1.5e9 <= r["time"]]
            idle_w, load_w = mean([r["power_w"] for r in idle]), mean([r["power_w"] for r in load])
            idle_c, load_c = mean([r["temp_c"] for r in idle]), max(r["temp_c"] for r in load)
            where = f"{host} GPU {gpu} ({profile})"
            assert idle_w == pytest.approx(PROFILES[profile].idle_w, rel=0.25), (where, idle_w)
            assert load_w > 1.5 * idle_w, (where, idle_w, load_w)
            assert load_c > idle_c + 4, (where, idle_c, load_c)


def check_gpu_info(influxdb: InfluxDBDatabase, cluster: str) -> None:
    """(b) every GPU's static facts, read through NVML at the agent's start: one point per host and GPU
    (nothing changed, and a replay overwrites itself), the simulated profile's values, the same
    ``uuid`` and ``model`` tags as the GPU's ``gpu`` points."""
    rows = influx_rows(
        influxdb,
        'SELECT "temp_slowdown_c", "temp_shutdown_c", "temp_gpu_max_c", "temp_mem_max_c", "power_limit_min_w",'
        ' "power_limit_max_w", "power_limit_default_w", "memory_total_bytes", "pcie_gen_max", "pcie_width_max",'
        ' "driver_version", "vbios_version", "architecture", "compute_capability", "passive_cooling"'
        f' FROM "gpu_info" WHERE "cluster" = \'{cluster}\' GROUP BY "host", "gpu", "uuid", "model"',
    )
    assert sorted((r["host"], r["gpu"]) for r in rows) == sorted((h, str(g)) for h in NODES for g in range(2))
    for r in rows:
        p = PROFILES[NODES[r["host"]][int(r["gpu"])]]
        where = f"{r['host']} GPU {r['gpu']} ({p.name})"
        assert r["model"] == p.nvml_name, where
        assert (r["temp_slowdown_c"], r["temp_shutdown_c"]) == (p.slowdown_c, p.shutdown_c), where
        assert (r["temp_gpu_max_c"], r["temp_mem_max_c"]) == (p.gpu_max_c, p.mem_max_c), where
        assert (r["power_limit_min_w"], r["power_limit_max_w"]) == (p.limit_min_w, p.limit_max_w), where
        assert r["power_limit_default_w"] == p.limit_default_w, where
        assert r["memory_total_bytes"] == p.memory_total_bytes, where
        assert (r["pcie_gen_max"], r["pcie_width_max"]) == (p.pcie_gen, p.pcie_width), where
        assert r["driver_version"] == state.DRIVER_VERSION and r["vbios_version"], where
        assert r["passive_cooling"] == (p.fan_count == 0), where
        gpu_series = influxdb.query(
            f'SELECT last("temp_c") FROM "gpu" WHERE "host" = \'{r["host"]}\' AND "gpu" = \'{r["gpu"]}\''
            ' GROUP BY "uuid", "model"'
        )
        assert [(x.tags["uuid"], x.tags["model"]) for x in gpu_series] == [(r["uuid"], r["model"])], where


def check_schema_doc(influxdb: InfluxDBDatabase, measurements: tuple[str, ...]) -> None:
    """Every stored field and tag is documented in docs/schema.md, with the type written there."""
    types = {"float": "float", "integer": "integer", "boolean": "boolean", "string": "string"}
    for m in (*measurements, "agent"):
        fields, tags = documented(m)
        for row in influx_rows(influxdb, f'SHOW FIELD KEYS FROM "{m}"'):
            name = row["fieldKey"]
            key = "hwmon_<sensor>_c" if name.startswith("hwmon_") else name
            assert fields.get(key) == types[row["fieldType"]], f"{m}.{name} ({row['fieldType']}) vs docs/schema.md"
        stored_tags = {row["tagKey"] for row in influx_rows(influxdb, f'SHOW TAG KEYS FROM "{m}"')}
        assert stored_tags <= tags, f"{m}: tags {stored_tags - tags} are not in docs/schema.md"


def check_exactly_once(db: InfluxDBDatabase, counts: dict[str, dict[str, int]], taken: dict[str, int]) -> None:
    """Every sample an agent took is stored once: none lost, none doubled. Three checks that each fail
    on a kind of error the others could miss:

    1. Per host, the points stored in gpu + node + acoustic + trainer + probe (and the health
       measurements gpu_event, gpu_process, gpu_nvlink) equal the number of samples the agent says it
       took (its own counter, ``samples_taken``, in its final log line;
       each sample is exactly one point, and the agent spooled and had acknowledged every one).
       A lost batch, anywhere in the run (also the first or the last), makes the sum smaller; a
       replay that changed a tag (so it does not overwrite itself) makes it larger.
    2. Per (host, GPU) there is one series and no timestamp twice (a replay stored as a second point).
    3. Per (host, GPU), the count matches 10 Hz over the time covered: ``count + missed - 1`` ticks
       span ``(last - first) / interval`` (``missed`` = ticks the agent skipped and reported in the
       ``agent`` measurement). A tick runs at most half an interval late (later ones are skipped and
       counted), so the two differ by less than one tick unless samples were lost in the middle or
       taken twice (10 samples per GPU for one lost 1 s batch: far outside the bound). Both GPUs of a
       node are read on every tick, so their counts are equal.
    """
    for host in taken:
        assert sum(counts[host].values()) == taken[host], (host, counts[host], taken[host])
        missed_rows = influx_rows(db, f'SELECT sum("missed_ticks") FROM "agent" WHERE "host" = \'{host}\'')
        missed = int(missed_rows[0]["sum"] or 0) if missed_rows else 0
        per_gpu: dict[str, int] = {}
        for gpu in ("0", "1"):
            series = db.query(f'SELECT "power_w" FROM "gpu" WHERE "host" = \'{host}\' AND "gpu" = \'{gpu}\' GROUP BY *')
            assert len(series) == 1, (
                f"{host} GPU {gpu}: {len(series)} series (a tag changed): {[s.tags for s in series]}"
            )
            times = [row[0] for row in series[0].values]
            assert len(times) == len(set(times)), f"{host} GPU {gpu}: a timestamp is stored twice"
            ticks = (max(times) - min(times)) / (INTERVAL_S * 1e9)
            assert abs(len(times) + missed - 1 - ticks) < 1.0, (host, gpu, len(times), missed, ticks)
            per_gpu[gpu] = len(times)
        assert per_gpu["0"] == per_gpu["1"], (host, per_gpu)
        assert per_gpu["0"] == counts[host]["gpu"] / 2
