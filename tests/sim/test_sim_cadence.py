"""Values update on the driver's cadence, and every process sees the same machine."""

from __future__ import annotations

import itertools
import subprocess
import time
from collections import defaultdict

# The first read replays the machine's history (an hour of ticks for an old machine): the poller says
# "polling" once it is done, and its window of `seconds` starts then.
POLL = """
loads = list({loads!r})
last_ts, s = snapshot(H[0])
seen = [[last_ts, s]]
emit("polling")
t0 = time.time()
while time.time() - t0 < {seconds}:
    ts, s = snapshot(H[0])
    if ts != last_ts and last_ts is not None and loads:
        set_load(0, loads.pop(0))  # takes effect at the next boundary
    last_ts = ts
    seen.append([ts, s])
    time.sleep({sleep})
emit(seen)
"""


def started(child: subprocess.Popen[str]) -> None:
    """Returns once a POLL child has made its first read (and starts its window)."""
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line.strip() == '"polling"', line + (child.stderr.read() if child.stderr else "")


def test_values_constant_within_a_period_and_change_across(sim):
    """Holds with the other core busy (a pytest worker or a spinning process beside it): a poller starved
    for a whole period misses that tick, which shortens the list of ticks but breaks no claim."""
    period_s = 0.5
    machine = sim.machine("H100-SXM5-80GB", period_s=period_s, tau_s=1.0)
    # idle until the poller runs (however late a busy machine starts it), then a new load every tick
    readings = sim.run(machine, POLL.format(loads=[30, 60, 90, 100, 45], seconds=3.5, sleep=0.02))
    by_tick: dict[int, list[dict]] = defaultdict(list)
    for ts, s in readings:
        by_tick[ts].append(s)
    ticks = sorted(by_tick)
    assert len(ticks) >= 6
    period_us = round(period_s * 1e6)
    # on the period's grid (a tick the starved poller missed leaves a gap of whole periods)
    assert all((b - a) % period_us == 0 and b > a for a, b in itertools.pairwise(ticks)), ticks
    # constant inside a period, however many times it is read (most periods are read many times)
    assert sum(len(by_tick[ts]) >= 3 for ts in ticks) >= 5, {ts: len(by_tick[ts]) for ts in ticks}
    for ts in ticks:
        assert all(s == by_tick[ts][0] for s in by_tick[ts]), ts
    per_tick = [by_tick[ts][0] for ts in ticks]
    # ...and moving from one period to the next under load
    energies = [s["energy_mj"] for s in per_tick]
    assert all(b > a for a, b in itertools.pairwise(energies))
    temps = [s["temp_c"] for s in per_tick if s["util"]]
    assert all(b > a for a, b in itertools.pairwise(temps[:4])), temps  # heating, tau = 2 periods
    for key in ("util", "power_instant_mw", "power_usage_mw", "sm_mhz"):
        assert len({s[key] for s in per_tick}) >= 3, (key, [s[key] for s in per_tick])


def test_processes_agree_on_every_tick(sim):
    """Two processes reading the same GPU in the same tick see identical values.

    The machine was created an hour ago (so the second process replays 72 000 ticks on its first
    call), and the load changes every ~70 ms while both poll, so both must attribute every event
    to the same tick.
    """
    machine = sim.machine("H100-SXM5-80GB", gpus=1, period_s=0.05, tau_s=1.0, start_ns=time.time_ns() - 3600 * 10**9)
    machine.set_load(0, 40)
    early = sim.spawn(machine, POLL.format(loads=[], seconds=3.0, sleep=0.003))
    started(early)
    late = None
    for i in range(24):
        machine.set_load(0, (i * 37) % 101)
        time.sleep(0.067)
        if i == 6:
            late = sim.spawn(machine, POLL.format(loads=[], seconds=1.5, sleep=0.003))
            started(late)  # the load goes on changing while both poll
    a = {ts: s for ts, s in sim.collect(early)}
    b = {ts: s for ts, s in sim.collect(late)}
    common = sorted(set(a) & set(b))
    assert len(common) >= 15
    for ts in common:
        assert a[ts] == b[ts], ts
    # the overlap spans load changes, clock and temperature movement
    assert len({a[ts]["util"] for ts in common}) >= 5
    assert len({a[ts]["temp_c"] for ts in common}) >= 2


FORKED = """
import os
N.nvmlDeviceGetPowerUsage(H[0])  # the parent's reader has the GPU's history open now
r, w = os.pipe()
loaded_r, loaded_w = os.pipe()  # the parent says when it has written the load (a starved parent is late)
pid = os.fork()
if pid == 0:
    os.close(r)
    os.read(loaded_r, 1)
    wait_ticks(H[0], 3)  # the load written after the fork is in force
    util = N.nvmlDeviceGetUtilizationRates(H[0]).gpu
    os.write(w, str(util).encode())
    os._exit(0)
os.close(w)
set_load(0, 77)
os.write(loaded_w, b"L")
wait_ticks(H[0], 3)
parent = N.nvmlDeviceGetUtilizationRates(H[0]).gpu
child = int(os.read(r, 16) or b"-1")
os.waitpid(pid, 0)
emit({"parent": parent, "child": child})
"""


def test_a_forked_child_reads_the_same_machine(sim):
    """A reader keeps each GPU's history open between ticks; a child forked after the first read opens
    its own (a shared open file would share its lock), and both see a load written after the fork."""
    machine = sim.machine("H100-SXM5-80GB", period_s=0.05)
    assert sim.run(machine, FORKED) == {"parent": 77, "child": 77}
