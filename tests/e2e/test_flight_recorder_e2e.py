"""The resolution policy through the whole system: simulated GPUs -> agent -> collector -> InfluxDB.

One agent (default ``--resolution auto``) under a simulated machine with two GPUs, a real collector and
a real InfluxDB; the windows are short so the test is quick (``--flight-recorder 12s``,
``--hires-after 6s``):

- outside windows only ``res=1s`` aggregate points arrive, one per GPU per second, each summarising
  about 10 samples, with ``min <= mean <= max`` and the idle power the simulator gives the profile;
- an injected XID (``gpuprobe sim fail --xid 63``) switches to raw 10 Hz points from then on AND for
  the flight recorder's 12 s before it, without a hole (each tick once), and after ``--hires-after``
  without a trigger back to aggregates;
- a probe's ``start`` on the trainer socket switches to raw points until its ``end``;
- on the aggregates alone, ``gpuprobe model`` over a time range gives each GPU's energy, and
  every dashboard panel query of the ``gpu`` measurement answers with data exactly where it answers
  with data on the raw points.
"""

from __future__ import annotations

import itertools
import json
import re
import socket
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support import gpuprobe_command, wait_until
from test_fleet_e2e import REPO, System, influx_rows, run, start_collector

from gpuprobe.devservices import InfluxDBDatabase
from gpuprobe.sim.profiles import PROFILES

pytestmark = pytest.mark.slow

HOST = "recorder-node"
GPU_PROFILES = ["H100-SXM5-80GB", "L4"]
RECORDER_S = 10.0
HIRES_AFTER_S = 5.0
TICK_NS = 100_000_000  # 10 Hz
S = 1_000_000_000


def raw_times(db: InfluxDBDatabase, gpu: int, since_ns: int = 0) -> list[int]:
    rows = influx_rows(
        db,
        f'SELECT "power_w" FROM "gpu" WHERE "host" = \'{HOST}\' AND "gpu" = \'{gpu}\' AND "res" = \'\''
        f" AND time >= {since_ns}",
    )
    return sorted(r["time"] for r in rows)


def aggregates(db: InfluxDBDatabase, since_ns: int = 0) -> list[dict[str, Any]]:
    return influx_rows(
        db,
        'SELECT "power_w", "power_w_min", "power_w_max", "power_w_last", "energy_j", "samples", "temp_c_min"'
        f' FROM "gpu" WHERE "host" = \'{HOST}\' AND "res" = \'1s\' AND time >= {since_ns} GROUP BY "gpu"',
    )


def gpu_panel_queries() -> list[tuple[str, str]]:
    """(where, query) of every dashboard panel target that reads the ``gpu`` measurement."""
    found = []
    for path in sorted((REPO / "deploy/grafana/dashboards").glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for p in [panel, *panel.get("panels", [])]:
                for t in p.get("targets", []):
                    if re.search(r'FROM \S*"gpu"', t["query"]):
                        found.append((f"{path.name} {p['title']!r} {t['refId']}", t["query"]))
    return found


def panel_answers(db: InfluxDBDatabase, query: str, from_ns: int, to_ns: int) -> bool:
    """Whether the query, substituted as Grafana does on the default policy, has a non-null value."""
    text = query.replace("$timeFilter", f"time >= {from_ns}ns and time <= {to_ns}ns").replace("$__interval", "1s")
    text = text.replace('"$rp".', "").replace("/^$host$/", f"/^({HOST})$/").replace("/^$gpu$/", "/^(0|1)$/")
    assert not re.search(r"\$\w", text), text
    for series in db.query(text):
        for row in series.values:
            if any(v is not None for c, v in zip(series.columns, row, strict=True) if c != "time"):
                return True
    return False


def agent_metrics(port: int) -> dict[str, float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {m[1]: float(m[2]) for m in re.finditer(r"^gpuprobe_agent_(\w+) (\S+)$", body, re.M)}


def not_taken(db: InfluxDBDatabase) -> int:
    """Samples the agent reported as not taken in its ``agent`` points: ticks it skipped (a tick overran
    on the shared CPUs) and failed reads (a GPU that fails a read leaves that tick out)."""
    query = 'SELECT sum("missed_ticks") AS "missed", sum("read_errors") AS "errors" FROM "agent" WHERE "host" = '
    rows = influx_rows(db, f"{query}'{HOST}'")
    return int(rows[0]["missed"] or 0) + int(rows[0]["errors"] or 0) if rows else 0


def assert_no_holes(times: list[int], what: str, not_taken: int, origin_ns: int) -> None:
    """Every 10 Hz tick between the first and the last once, less what the agent did not take: the count
    matches the span (a late tick, at most half an interval, moves a timestamp but loses nothing)."""
    assert times, f"{what}: no raw points"
    assert len(times) == len(set(times)), f"{what}: a timestamp twice"
    missing = (times[-1] - times[0]) / TICK_NS + 1 - len(times)
    gaps = [round((a - origin_ns) / S, 2) for a, b in itertools.pairwise(times) if b - a > 1.75 * TICK_NS]
    assert missing < not_taken + 1.0, f"{what}: {missing:.1f} ticks missing (gaps at {gaps} s), {not_taken} not taken"


def test_aggregates_outside_windows_and_the_flight_recorder_around_a_trigger_and_a_probe(
    tmp_path: Path, influxdb: InfluxDBDatabase, system: System
) -> None:
    # (influxdb before system: the processes stop first, so the collector drains into a database that exists)
    collector, port = start_collector(tmp_path, system, influxdb)
    trainer_socket = tmp_path / "trainer.sock"
    agent = system.start(
        HOST,
        [
            *gpuprobe_command(), "sim", "run", "--profile", ",".join(GPU_PROFILES),
            "--state-dir", str(tmp_path / "sim"), "--",
            *gpuprobe_command(), "--log-level", "info", "agent", "--host", HOST,
            "--collector", f"127.0.0.1:{port}", "--spool", str(tmp_path / "spool"), "--reconnect-max", "1",
            "--trainer-socket", str(trainer_socket), "--grace", "2", "--metrics-listen", "127.0.0.1:0",
            "--flight-recorder", f"{RECORDER_S:g}s", "--hires-after", f"{HIRES_AFTER_S:g}s",
        ],
    )  # fmt: skip

    # 1. outside windows: aggregates only, about one per GPU per second
    def aggregated_for_a_while() -> list[dict[str, Any]] | None:
        assert agent.alive() and collector.alive(), system.logs()
        rows = aggregates(influxdb)
        per_gpu = {g: [r for r in rows if r["gpu"] == str(g)] for g in range(len(GPU_PROFILES))}
        return rows if all(len(v) >= RECORDER_S + 3 for v in per_gpu.values()) else None

    rows = wait_until(aggregated_for_a_while, 60, f"{RECORDER_S + 3:g} s of aggregates per GPU", interval_s=1.0)
    for g, profile in enumerate(GPU_PROFILES):
        mine = sorted((r for r in rows if r["gpu"] == str(g)), key=lambda r: r["time"])
        assert all(r["time"] % S == 0 for r in mine), "aggregates are aligned to whole seconds"
        assert all(b["time"] - a["time"] == S for a, b in itertools.pairwise(mine)), "one per second, none missing"
        inner = mine[1:-1]  # the first interval may have started before the agent's first tick
        assert all(9 <= r["samples"] <= 11 for r in inner), [r["samples"] for r in inner]
        assert sum(r["samples"] for r in inner) == pytest.approx(10 * len(inner), abs=2)
        for r in mine:
            assert r["power_w_min"] <= r["power_w"] <= r["power_w_max"], r
            assert r["power_w_min"] <= r["power_w_last"] <= r["power_w_max"], r
            assert r["temp_c_min"] is not None and r["energy_j"] > 0, r
        idle_w = PROFILES[profile].idle_w  # simulated: an idle GPU of this profile
        assert sum(r["power_w"] for r in inner) / len(inner) == pytest.approx(idle_w, rel=0.25), (profile, idle_w)
        assert [r["energy_j"] for r in mine] == sorted(r["energy_j"] for r in mine), "the counter only grows"
    assert not raw_times(influxdb, 0) and not raw_times(influxdb, 1), "no raw point outside a window"
    aggregated_from_ns = min(r["time"] for r in rows)
    aggregated_to_ns = max(r["time"] for r in rows) + S - 1

    # gpuprobe model over the aggregates alone (a time range; no probe): each GPU's energy as simulated
    out = tmp_path / "model"
    modelled = run(
        "model", "--from", f"{aggregated_from_ns / S:.3f}", "--to", f"{aggregated_to_ns / S:.3f}", "--hosts", HOST,
        "--influx-url", influxdb.server.url, "--influx-db", influxdb.name, "--out", str(out), "--no-write-model",
        timeout_s=180,
    )  # fmt: skip
    assert modelled.returncode == 0, modelled.stdout + modelled.stderr
    (report,) = out.glob("*.json")
    by_gpu = {g["gpu"]: g for g in json.loads(report.read_text())["gpus"] if g["host"] == HOST}
    assert sorted(by_gpu) == ["0", "1"], by_gpu
    for g, profile in enumerate(GPU_PROFILES):
        # a range has no steady phase: the energy over it, from the energy counter (its last value per second)
        energy_j = by_gpu[str(g)]["efficiency"]["probe_energy_j"]
        mean_w = energy_j / ((aggregated_to_ns - aggregated_from_ns) / S)
        assert mean_w == pytest.approx(PROFILES[profile].idle_w, rel=0.25), (profile, energy_j, mean_w)

    port = int(wait_until(lambda: re.search(r"metrics on http://127.0.0.1:(\d+)/", agent.log()), 10, "metrics")[1])
    metrics = agent_metrics(port)
    assert metrics["high_resolution"] == 0 and metrics["gpu_aggregates_total"] >= 2 * (RECORDER_S + 3), metrics
    # the recorder holds the last 10 s of both GPUs' samples (the batches created in them: a flush more at most)
    assert 2 * 10 * RECORDER_S * 0.8 <= metrics["recorder_samples"] <= 2 * 10 * (RECORDER_S + 2), metrics
    assert metrics["recorder_bytes"] > 0 and metrics["samples_promoted_total"] == 0, metrics

    # 2. a trigger: raw points from then on, and for the flight recorder's window before it
    trigger_ns = time.time_ns()
    failed = system.start("sim-fail", [*gpuprobe_command(), "sim", "fail", "--state-dir", str(tmp_path / "sim"),
                                       "--gpu", "0", "--xid", "63"])  # fmt: skip
    assert failed.proc.wait(60) == 0, failed.log()

    def raw_since_trigger() -> dict[int, list[int]] | None:
        times = {g: raw_times(influxdb, g) for g in range(len(GPU_PROFILES))}
        return times if all(t and t[-1] >= trigger_ns + 3 * S for t in times.values()) else None

    wait_until(raw_since_trigger, 30, "raw points after the trigger", interval_s=0.5)
    # the window is measured from the XID as the agent received it (its gpu_event point), not from when
    # this test started `sim fail`: on a busy machine that command starts seconds late
    (xid,) = influx_rows(influxdb, f'SELECT "xid" FROM "gpu_event" WHERE "host" = \'{HOST}\' AND "kind" = \'xid\'')
    assert xid["time"] >= trigger_ns and xid["xid"] == 63, xid
    trigger_ns = xid["time"]
    # the window lasts --hires-after from the XID; then aggregates again
    back_ns = trigger_ns + int((HIRES_AFTER_S + 3) * S)
    wait_until(
        lambda: len(aggregates(influxdb, back_ns)) >= 2 * 3, 30, "aggregates again after the window", interval_s=0.5
    )
    for g in range(len(GPU_PROFILES)):
        times = raw_times(influxdb, g)
        window = [t for t in times if t < back_ns]
        assert_no_holes(window, f"GPU {g} around the trigger", not_taken(influxdb), trigger_ns)
        before_s = (trigger_ns - window[0]) / S
        # the recorder keeps the batches created in the last 12 s when the window opens (within a flush)
        assert RECORDER_S - 2 <= before_s <= RECORDER_S + 2.5, f"GPU {g}: raw points from {before_s:.1f} s before"
        after_s = (window[-1] - trigger_ns) / S
        # decided once per batch: the last batch taken inside the window ends up to a flush interval early
        assert HIRES_AFTER_S - 1.5 <= after_s <= HIRES_AFTER_S + 2.5, f"GPU {g}: raw points until {after_s:.1f} s"
        assert [t for t in times if t >= back_ns] == [], "back to aggregates: no raw point"

    # the dashboards' gpu panels: data on the aggregates alone exactly where there is on raw points alone
    # (after the trigger, before the window's end; the flight recorder's minutes hold both)
    raw_from_ns, raw_to_ns = trigger_ns + 2 * S, trigger_ns + int((HIRES_AFTER_S - 1.5) * S)
    differ = [
        f"{where}: aggregates {on_aggregates}, raw {on_raw}"
        for where, query in gpu_panel_queries()
        if (on_aggregates := panel_answers(influxdb, query, aggregated_from_ns, aggregated_to_ns))
        != (on_raw := panel_answers(influxdb, query, raw_from_ns, raw_to_ns))
    ]
    assert not differ, "\n".join(differ)

    # 3. a probe on this node: raw points from its start to its end
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as trainer:
        trainer.connect(str(trainer_socket))
        probe_start_ns = time.time_ns()
        event = {"type": "probe_event", "probe": "p-rec", "workload": "idle", "phase": "idle", "status": "running"}
        trainer.sendall((json.dumps({**event, "kind": "start"}) + "\n").encode())

        def raw_in_probe() -> bool:
            return all(
                (t := raw_times(influxdb, g, probe_start_ns)) and t[-1] >= probe_start_ns + 3 * S
                for g in range(len(GPU_PROFILES))
            )

        wait_until(raw_in_probe, 30, "raw points during the probe", interval_s=0.5)
        metrics = agent_metrics(port)
        assert metrics["high_resolution"] == 1 and metrics["samples_promoted_total"] >= 2 * 2 * 10 * RECORDER_S * 0.5
        assert metrics["recorder_samples"] == 0, "promoted: the recorder gave its batches to the sequence"
        # raw points for longer than a trigger's window: the probe holds it open
        held_ns = probe_start_ns + int((HIRES_AFTER_S + 1) * S)
        wait_until(
            lambda: all(raw_times(influxdb, g, held_ns) for g in range(len(GPU_PROFILES))),
            HIRES_AFTER_S + 30,
            f"raw points more than {HIRES_AFTER_S + 1:g} s into the probe",
            interval_s=0.5,
        )
        end = {**event, "kind": "end", "phase": "done", "status": "succeeded"}
        trainer.sendall((json.dumps(end) + "\n").encode())
        probe_end_ns = time.time_ns()
    after_ns = probe_end_ns + 3 * S
    wait_until(lambda: len(aggregates(influxdb, after_ns)) >= 2 * 2, 30, "aggregates after the probe", interval_s=0.5)
    for g in range(len(GPU_PROFILES)):
        during = [t for t in raw_times(influxdb, g, probe_start_ns) if t < after_ns]
        assert_no_holes(during, f"GPU {g} during the probe", not_taken(influxdb), probe_start_ns)
        assert during[-1] >= probe_end_ns - S, f"GPU {g}: raw points stopped before the probe's end"
        assert not raw_times(influxdb, g, after_ns), f"GPU {g}: raw points after the probe"
    assert not re.search(r"collector \S+ refused \d+ samples", agent.log()), "the collector refused samples"
