"""Peer tools run unmodified under `gpuprobe sim run` and report the simulated values."""

from __future__ import annotations

import json
import sys
import textwrap
import time

import pytest
import support

from gpuprobe.sim import state, thermal
from gpuprobe.sim.profiles import PROFILES, with_overrides
from gpuprobe.sim.runner import open_machine

H100 = PROFILES["H100-SXM5-80GB"]
UTIL = 60


@pytest.fixture(scope="module")
def settled(tmp_path_factory):
    """8 H100s at a constant 60 % load, settled: power, its 1 s average and temperature constant."""
    state_dir = tmp_path_factory.mktemp("peers") / "sim"
    profiles = [with_overrides(H100, {"tau_s": "0.1", "tau_fast_s": "0.1", "inlet_tau_s": "0.1"})] * 8
    state.create(state_dir, profiles, 0.1, start_ns=time.time_ns() - 10**9)
    machine = open_machine(state_dir)
    for gpu in range(8):
        machine.set_load(gpu, UTIL)  # what `gpuprobe sim load --util 60` does
    support.pass_time(1.5)  # the physics: > 1 s of averaging window and 15 time constants
    return machine


def expected():
    power_w = H100.power_w(UTIL)
    return {
        "power_mw": round(power_w * 1000),
        # settled with all eight drawing the same: the inlet air carries the whole machine's power
        "temp_c": thermal.reading_c(thermal.steady_temp_c(H100, power_w, 8 * power_w)),
        "limit_mw": round(H100.limit_default_w * 1000),
    }


PYNVML_READ = """
emit([{"power_mw": N.nvmlDeviceGetPowerUsage(h), "temp_c": N.nvmlDeviceGetTemperature(h, 0),
       "limit_mw": N.nvmlDeviceGetEnforcedPowerLimit(h), "name": N.nvmlDeviceGetName(h),
       "uuid": N.nvmlDeviceGetUUID(h), "memory_total": N.nvmlDeviceGetMemoryInfo(h).total} for h in H])
"""


def test_gpustat_json(settled, sim, cli, venv_bin):
    proc = cli("sim", "run", "--state-dir", str(settled.state_dir), "--", str(venv_bin / "gpustat"), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    ours = sim.run(settled, PYNVML_READ)
    want = expected()
    assert len(report["gpus"]) == 8
    assert report["driver_version"] == state.DRIVER_VERSION
    for gpu, mine in zip(report["gpus"], ours, strict=True):
        assert gpu["uuid"] == mine["uuid"] and gpu["name"] == mine["name"] == H100.nvml_name
        # gpustat shows whole watts (mW // 1000) and whole degrees
        assert gpu["power.draw"] == mine["power_mw"] // 1000 == want["power_mw"] // 1000
        assert gpu["enforced.power.limit"] == mine["limit_mw"] // 1000 == 700
        assert gpu["temperature.gpu"] == mine["temp_c"] == want["temp_c"]
        assert gpu["utilization.gpu"] == UTIL
        assert gpu["memory.total"] == H100.memory_total_bytes // 2**20
        assert gpu["fan.speed"] is None  # passive part


def test_nvitop_device_api(settled, sim, cli):
    code = textwrap.dedent(
        """
        import json
        from nvitop import Device
        print(json.dumps([{"name": d.name(), "power_mw": d.power_usage(), "temp_c": d.temperature(),
                           "memory_total": d.memory_total(), "limit_mw": d.power_limit(), "uuid": d.uuid(),
                           "util": d.gpu_utilization()} for d in Device.all()]))
        """
    )
    proc = cli("sim", "run", "--state-dir", str(settled.state_dir), "--", sys.executable, "-c", code)
    assert proc.returncode == 0, proc.stderr
    devices = json.loads(proc.stdout.splitlines()[-1])
    ours = sim.run(settled, PYNVML_READ)
    want = expected()
    assert len(devices) == 8
    for dev, mine in zip(devices, ours, strict=True):
        assert dev["name"] == mine["name"] == H100.nvml_name
        assert dev["uuid"] == mine["uuid"]
        assert dev["power_mw"] == mine["power_mw"] == want["power_mw"]
        assert dev["temp_c"] == mine["temp_c"] == want["temp_c"]
        assert dev["memory_total"] == mine["memory_total"] == H100.memory_total_bytes
        assert dev["limit_mw"] == want["limit_mw"]
        assert dev["util"] == UTIL


def test_zeus_monitor_window_energy(settled, sim, cli):
    """ZeusMonitor's window energy is the NVML counter's delta, and the integral of power.

    zeus reads the counter once per GPU at begin_window and at end_window. The test reads the counter
    in the same tick as each of zeus's reads (same_tick retries until no tick boundary fell in
    between), so the two deltas must agree exactly, and both must equal the sum of P_k * period over
    the window's ticks (GetSamples). Against zeus's own wall-clock window the energy may differ by up
    to one tick of energy at each end (the counter only moves at tick boundaries), so P * time agrees
    within 2 * period / time.
    """
    code = """
        from zeus.monitor import ZeusMonitor
        mon = ZeusMonitor(gpu_indices=[0, 1], cpu_indices=[])
        counters = lambda: [N.nvmlDeviceGetTotalEnergyConsumption(h) for h in H[:2]]
        wait_ticks(H[0], 1)
        ts_a, (e_a, _) = same_tick(H[0], lambda: (counters(), mon.begin_window("w", sync_execution=False,
                                                                               restart=True)))
        time.sleep(2.0)
        wait_ticks(H[0], 1)  # a whole tick ahead, so the three reads below share one
        ts_b1 = tick_us(H[0])
        m = mon.end_window("w", sync_execution=False)
        e_b = counters()
        ts_b2 = tick_us(H[0])
        _, samples = N.nvmlDeviceGetSamples(H[0], N.NVML_TOTAL_POWER_SAMPLES, 0)
        emit({"zeus": {str(k): v for k, v in m.gpu_energy.items()}, "time": m.time, "e_a": e_a, "e_b": e_b,
              "ts_a": ts_a, "ts_b": [ts_b1, ts_b2],
              "samples": [[s.timeStamp, s.sampleValue.uiVal] for s in samples]})
    """
    proc = cli("sim", "run", "--state-dir", str(settled.state_dir), "--", sys.executable, "-c", sim.script(code))
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout.splitlines()[-1])
    # end_window ran a whole tick before the boundary; on a badly stalled machine a boundary may
    # still fall between zeus's read and ours, and then they differ by exactly one tick of energy
    same = r["ts_b"][0] == r["ts_b"][1]
    period_s = 0.1
    p_w = H100.power_w(UTIL)
    tick_j = p_w * period_s
    # sum of P_k * period over the window's ticks, ending at the tick of zeus's end read
    integrals_j = [sum(mw for ts, mw in r["samples"] if r["ts_a"] <= ts < end) * period_s / 1000 for end in r["ts_b"]]
    assert {mw for ts, mw in r["samples"] if ts >= r["ts_a"]} == {round(p_w * 1000)}
    for gpu in (0, 1):
        delta_j = (r["e_b"][gpu] - r["e_a"][gpu]) / 1000
        zeus_j = r["zeus"][str(gpu)]
        if same:
            assert zeus_j == pytest.approx(delta_j, abs=1e-9)
            assert zeus_j == pytest.approx(integrals_j[0], rel=0.005)
        else:  # zeus read on one side of the boundary or the other
            assert any(zeus_j == pytest.approx(delta_j - k * tick_j, abs=0.002) for k in (0, 1))
            assert any(zeus_j == pytest.approx(i, rel=0.005) for i in integrals_j)
        assert zeus_j == pytest.approx(p_w * r["time"], rel=2 * period_s / r["time"])


def test_nvitop_nvlink_and_process_views(sim, cli):
    """nvitop's NVLink view (link count, per-link throughput) and process view read the simulated GPUs: the
    SXM H100's 18 links carry traffic while it works, the PCIe L4 has none, and the process holding the GPU
    is listed with its memory and SM share."""
    machine = sim.machine([PROFILES["H100-SXM5-80GB"], PROFILES["L4"]])
    code = textwrap.dedent(
        """
        import json, subprocess, sys
        from pathlib import Path
        from nvitop import Device
        from gpuprobe.sim import state
        holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        state.set_load(Path(sys.argv[1]), 0, 70, holder.pid, 4 << 30, workload="gpt")
        h100, l4 = Device.all()
        h100.nvlink_total_throughput(interval=0.3)  # the load has reached the counters
        out = {
            "links": [h100.nvlink_link_count(), l4.nvlink_link_count()],
            "per_link": [t.tx for t in h100.nvlink_throughput(interval=0.5)],
            "l4": l4.nvlink_throughput(),
            "processes": {pid: [p.name(), p.gpu_memory(), p.gpu_sm_utilization()]
                          for pid, p in h100.processes().items()},
            "holder": holder.pid,
        }
        holder.kill()
        print(json.dumps(out))
        """
    )
    proc = cli(
        "sim", "run", "--state-dir", str(machine.state_dir), "--", sys.executable, "-c", code, str(machine.state_dir)
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout.splitlines()[-1])
    assert r["links"] == [18, 0]
    assert len(r["per_link"]) == 18 and all(isinstance(tx, int) and tx > 0 for tx in r["per_link"]), r["per_link"]
    assert r["l4"] == []
    (name, memory_bytes, sm_pct) = r["processes"][str(r["holder"])]
    assert list(r["processes"]) == [str(r["holder"])] and name.startswith("python")
    assert memory_bytes == 4 << 30 and sm_pct == 70
