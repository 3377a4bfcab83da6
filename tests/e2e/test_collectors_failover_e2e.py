"""Several collectors, one fleet, nothing stranded (issue 14), all real: a dozen ``gpuprobe agent``
processes (one simulated GPU each) stream to three ``gpuprobe collector`` processes, each agent
starting at the collector a stable hash of its id picks (``--collector a,b,c``). Mid-stream collector
A, which acks only what InfluxDB has (``--ack-after sink``), is killed with SIGKILL, and collector B
(``--ack-after wal``, the default) is drained with SIGTERM; neither is started again. The agents
fail over to the collector that is left and finally stop, each having had every sample acknowledged.

Then every sample is in InfluxDB exactly once, per agent: the points stored equal the samples the
agent says it took, no timestamp is stored twice, and the GPU series has no hole (its point count
matches 10 Hz over the time it covers, less the ticks the agent reported as missed). Five runs.
"""

from __future__ import annotations

import re
import signal
import sqlite3
import time
import uuid
from collections import Counter as Tally
from pathlib import Path

import pytest
from support import clean_env, gpuprobe_command, stays, wait_until
from test_fleet_e2e import INTERVAL_S, STOPPED, Proc, System, influx_rows

from gpuprobe.agent.uplink import first_choice
from gpuprobe.devservices import InfluxDBDatabase
from gpuprobe.devservices.ports import free_ports, port_accepts
from gpuprobe.sim.profiles import PROFILES
from gpuprobe.sim.runner import open_machine

pytestmark = pytest.mark.slow

AGENTS = [f"node-{i:02d}" for i in range(1, 13)]
KILLED, DRAINED, LEFT = 0, 1, 2  # the collectors, in --collector order
REQUIRED = {"gpu": "power_w", "node": "cpu_pct", "acoustic": "est_dba"}  # one field every point has


def streaming_to(agent: Proc) -> list[str]:
    return re.findall(r"streaming to collector (\S+)", agent.log())


def wal_agents(wal_dir: Path) -> set[str]:
    """The agents of which a collector's WAL holds batches not yet written to InfluxDB."""
    held: set[str] = set()
    for path in wal_dir.glob("collector-*.sqlite"):
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            held |= {agent for (agent,) in db.execute("SELECT DISTINCT agent_id FROM pending")}
        except sqlite3.OperationalError:  # the collector has not created its tables yet
            pass
        finally:
            db.close()
    return held


@pytest.mark.parametrize("run", range(1, 6))
def test_a_killed_and_a_drained_collector_strand_nothing(
    run: int, tmp_path: Path, system: System, influxdb: InfluxDBDatabase
) -> None:
    started = time.monotonic()
    ports = free_ports(3)
    addresses = [f"127.0.0.1:{port}" for port in ports]
    first = Tally(first_choice(agent_id, 3) for agent_id in AGENTS)
    assert all(first[i] for i in range(3)), first  # each collector is some agents' first choice

    collectors = []
    for i, port in enumerate(ports):
        argv = [
            *gpuprobe_command(), "--log-level", "info", "collector", "--insecure",
            "--listen", f"127.0.0.1:{port}", "--collector-id", f"collector-{'ABC'[i]}",
            "--influx-url", influxdb.server.url, "--influx-db", influxdb.name,
            "--wal", str(tmp_path / f"wal-{i}"), "--sink-max-backoff", "1", "--drain-timeout", "20",
            "--ack-after", "sink" if i == KILLED else "wal",
            # A and B hold partly filled writes back for 30 s, as if InfluxDB were slow to take them:
            # A (acks after InfluxDB) has acked none of its batches when it dies, and B's WAL holds
            # every line it acked when SIGTERM comes, which the drain must write
            "--sink-linger", "30" if i in (KILLED, DRAINED) else "0.05",
        ]  # fmt: skip
        collectors.append(system.start(f"collector-{'ABC'[i]}", argv))
    for c, port in zip(collectors, ports, strict=True):
        wait_until(lambda c=c, port=port: port_accepts("127.0.0.1", port, 0.2) or not c.alive(), 60, f"{c.name}")
        assert c.alive(), c.log()

    machine = open_machine(tmp_path / "sim", [PROFILES["L4"]])
    cluster = f"ha-{uuid.uuid4().hex[:6]}"
    agents = {}
    for agent_id in AGENTS:
        argv = [
            *gpuprobe_command(), "--log-level", "info", "agent", "--host", agent_id, "--cluster", cluster,
            "--cloud", "test", "--instance-type", "sim", "--collector", ",".join(addresses),
            "--spool", str(tmp_path / agent_id / "spool"), "--reconnect-min", "0.2", "--reconnect-max", "1",
            "--grace", "30", "--resolution", "full",  # every sample taken is counted in InfluxDB
        ]  # fmt: skip
        agents[agent_id] = system.start(agent_id, argv, env=machine.environ(clean_env()))

    def all_streaming() -> bool:
        for p in [*collectors, *agents.values()]:
            assert p.alive(), f"{p.name} exited ({p.proc.returncode})\n{system.logs()}"
        return all(streaming_to(a) for a in agents.values())

    wait_until(all_streaming, 90, "every agent streaming to a collector", interval_s=0.5)
    # each starts at its first choice, which the stable hash picked
    for agent_id, agent in agents.items():
        assert streaming_to(agent)[0] == addresses[first_choice(agent_id, 3)], (agent_id, agent.log()[-2000:])
    # A and B hold back what they took (their 30 s linger): A dies holding unacknowledged batches and B's
    # drain has lines to write only once every agent that started there has had batches taken in
    for i in (KILLED, DRAINED):
        expected = {a for a in AGENTS if first_choice(a, 3) == i}
        wal_dir = tmp_path / f"wal-{i}"
        wait_until(
            lambda wal_dir=wal_dir, expected=expected: expected <= wal_agents(wal_dir),
            30,
            f"batches of {sorted(expected)} in collector {'ABC'[i]}'s WAL",
            interval_s=0.2,
            describe=lambda wal_dir=wal_dir: sorted(wal_agents(wal_dir)),
        )

    collectors[KILLED].proc.kill()  # SIGKILL: its WAL is never read again
    collectors[KILLED].proc.wait(10)
    # A's agents fail over to the next address in their order (B) before B is drained, so that B's drain
    # moves them a second time, on to C
    on_killed = [agents[a] for a in AGENTS if first_choice(a, 3) == KILLED]
    wait_until(
        lambda: all(streaming_to(a)[-1] != addresses[KILLED] for a in on_killed),
        30,
        "the agents of the killed collector streaming to another",
        interval_s=0.2,
        describe=lambda: {a.name: streaming_to(a) for a in on_killed},
    )
    drain_started = time.monotonic()
    collectors[DRAINED].proc.send_signal(signal.SIGTERM)
    assert collectors[DRAINED].proc.wait(40) == 0, collectors[DRAINED].log()
    drain_s = time.monotonic() - drain_started
    drained = re.search(r"drained in ([\d.]+) s .* the WAL is empty, (\d+) queued", collectors[DRAINED].log())
    assert drained, collectors[DRAINED].log()
    assert int(drained[2]) > 0  # B had acknowledged lines that InfluxDB did not have yet: the drain wrote them

    # the agents that were on A or B moved on, in order, and all end up at C
    def moved() -> bool:
        return all(streaming_to(a)[-1] == addresses[LEFT] for a in agents.values())

    wait_until(moved, 30, "every agent streaming to the collector left", interval_s=0.5)
    # and C stores what they take from then on (its linger is 0.05 s), before the agents stop
    moved_ns = time.time_ns()

    def newer_hosts() -> set[str]:
        rows = influx_rows(influxdb, f'SELECT count("power_w") FROM "gpu" WHERE time > {moved_ns} GROUP BY "host"')
        return {row["host"] for row in rows if row["count"]}

    wait_until(
        lambda: set(AGENTS) <= newer_hosts(),
        30,
        "samples of every agent taken after the failover in InfluxDB",
        interval_s=0.5,
        describe=lambda: sorted(newer_hosts()),
    )

    for agent in agents.values():
        agent.proc.send_signal(signal.SIGTERM)
    taken: dict[str, int] = {}
    for agent_id, agent in agents.items():
        assert agent.proc.wait(60) == 0, agent.log()[-4000:]
        match = STOPPED.search(agent.log())
        assert match, f"{agent_id} did not deliver everything:\n{agent.log()[-4000:]}"
        n_taken, spooled, acked, dropped = map(int, match.groups())
        assert n_taken == spooled == acked and dropped == 0, match.group(0)
        taken[agent_id] = n_taken

    def stored() -> dict[str, int]:
        counts = Tally[str]()
        for measurement, field in REQUIRED.items():
            for row in influx_rows(influxdb, f'SELECT count("{field}") FROM "{measurement}" GROUP BY "host"'):
                counts[row["host"]] += int(row["count"])
        return dict(counts)

    try:
        wait_until(
            lambda: all(stored().get(a, 0) >= taken[a] for a in AGENTS), 60, "every sample in InfluxDB", interval_s=0.5
        )
    except AssertionError:
        raise AssertionError(f"stored {stored()} of {taken}\n{collectors[LEFT].log()}") from None
    # anything more (a doubled point) would arrive within C's 0.05 s linger and 1 s backoff
    stays(lambda: stored() == taken, 1.0, "exactly the samples taken in InfluxDB", describe=stored)
    counts = stored()
    assert counts == taken, {a: (counts.get(a), taken[a]) for a in AGENTS if counts.get(a) != taken[a]}
    for agent_id in AGENTS:
        series = influxdb.query(f'SELECT "power_w" FROM "gpu" WHERE "host" = \'{agent_id}\' GROUP BY *')
        assert len(series) == 1, (agent_id, [s.tags for s in series])
        times = [row[0] for row in series[0].values]
        assert len(times) == len(set(times)), f"{agent_id}: a timestamp is stored twice"
        missed_rows = influx_rows(influxdb, f'SELECT sum("missed_ticks") FROM "agent" WHERE "host" = \'{agent_id}\'')
        missed = int(missed_rows[0]["sum"] or 0) if missed_rows else 0
        ticks = (max(times) - min(times)) / (INTERVAL_S * 1e9)
        assert abs(len(times) + missed - 1 - ticks) < 1.0, f"{agent_id}: a hole ({len(times)}, {missed}, {ticks:.1f})"

    # what the killed collector left in its WAL was never acknowledged: the agents sent it again
    db = sqlite3.connect(f"file:{tmp_path / 'wal-0' / 'collector-0.sqlite'}?mode=ro", uri=True)
    try:
        stranded = db.execute("SELECT count(*), coalesce(sum(line_count), 0) FROM pending").fetchone()
    finally:
        db.close()
    assert stranded[0] > 0  # A died holding batches: they reached InfluxDB through B and C
    assert collectors[LEFT].alive()
    assert collectors[LEFT].proc.send_signal(signal.SIGTERM) is None and collectors[LEFT].proc.wait(30) == 0
    print(
        f"run {run}: {sum(taken.values())} samples of {len(AGENTS)} agents stored exactly once; first choices"
        f" {dict(sorted(first.items()))}; B drained in {drained[1]} s ({drained[2]} queued lines; SIGTERM to exit"
        f" {drain_s:.2f} s); the killed A's WAL kept {stranded[0]} unacknowledged batches ({stranded[1]} lines);"
        f" {time.monotonic() - started:.0f} s"
    )
