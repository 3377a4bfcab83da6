"""Processes holding a GPU, and GPUs that fall off the bus."""

from __future__ import annotations

import subprocess

from gpuprobe.sim.profiles import PROFILES

H100 = PROFILES["H100-SXM5-80GB"]

PROCESSES = """
wait_ticks(H[0], 1)
def procs(h):
    return [[p.pid, p.usedGpuMemory] for p in N.nvmlDeviceGetComputeRunningProcesses(h)]
out = []
for h in H:
    m1 = N.nvmlDeviceGetMemoryInfo(h)
    m2 = N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)
    out.append({"procs": procs(h), "graphics": len(N.nvmlDeviceGetGraphicsRunningProcesses(h)),
                "used": m1.used, "free": m1.free, "total": m1.total, "used_v2": m2.used,
                "util": N.nvmlDeviceGetUtilizationRates(h).gpu})
emit(out)
"""


def test_holder_process_is_listed_with_its_memory(sim, cli):
    machine = sim.machine("H100-SXM5-80GB", gpus=2, period_s=0.05)
    reserved = H100.memory_reserved_bytes
    idle = sim.run(machine, PROCESSES)
    for gpu in idle:
        assert gpu["procs"] == [] and gpu["graphics"] == 0
        assert gpu["used"] == reserved and gpu["used_v2"] == 0
        assert gpu["used"] + gpu["free"] == gpu["total"] == H100.memory_total_bytes

    holder = subprocess.Popen(["sleep", "60"])
    try:
        mem = 12 * 2**30
        proc = cli(
            "sim",
            "load",
            "--state-dir",
            str(machine.state_dir),
            "--gpu",
            "0",
            "--util",
            "80",
            "--pid",
            str(holder.pid),
            "--mem-used-bytes",
            str(mem),
        )
        assert proc.returncode == 0, proc.stderr
        busy, other = sim.run(machine, PROCESSES)
        assert busy["procs"] == [[holder.pid, mem]]
        assert busy["util"] == 80
        assert busy["used"] == reserved + mem and busy["used_v2"] == mem
        assert busy["used"] + busy["free"] == busy["total"]
        assert other["procs"] == [] and other["used"] == reserved  # GPU 1 untouched
    finally:
        holder.kill()
        holder.wait()
    # once the holder is gone it is no longer listed and its memory is free again
    gone, _ = sim.run(machine, PROCESSES)
    assert gone["procs"] == []
    assert gone["used"] == reserved and gone["used_v2"] == 0
    assert gone["util"] == 80  # the load stays until someone sets another


def test_load_refuses_more_memory_than_the_gpu_has(sim, cli):
    machine = sim.machine("L4", gpus=1)
    too_much = H100.memory_total_bytes  # more than an L4's 22.5 GiB
    proc = cli("sim", "load", "--state-dir", str(machine.state_dir), "--mem-used-bytes", str(too_much))
    assert proc.returncode == 2
    assert "--mem-used-bytes must be between 0 and" in proc.stderr
    assert (machine.state_dir / "gpu0.events").read_text() == ""  # nothing was applied


def test_failed_gpu_is_lost_and_recovers(sim, cli):
    machine = sim.machine("H100-SXM5-80GB", gpus=3, period_s=0.05)
    probe = """
        wait_ticks(H[0], 1)
        out = []
        for h in H:
            try:
                out.append([N.nvmlDeviceGetName(h), N.nvmlDeviceGetTemperature(h, 0),
                            N.nvmlDeviceGetTotalEnergyConsumption(h)])
            except N.NVMLError_GpuIsLost:
                out.append("GPUIsLost")
        emit(out)
    """
    state_dir = str(machine.state_dir)
    fail = cli("sim", "fail", "--state-dir", state_dir, "--gpu", "1")
    assert fail.returncode == 0, fail.stderr
    lost = sim.run(machine, probe)
    assert lost[1] == "GPUIsLost"
    assert lost[0][0] == lost[2][0] == H100.nvml_name  # the others keep working
    assert sim.run(None, probe, env=machine.environ())[1] == "GPUIsLost"  # in every process

    recover = cli("sim", "fail", "--state-dir", state_dir, "--gpu", "1", "--recover")
    assert recover.returncode == 0, recover.stderr
    back = sim.run(machine, probe)
    assert back[1][0] == H100.nvml_name
    assert back[1][2] > 0  # it kept its energy counter

    bad = cli("sim", "fail", "--state-dir", state_dir, "--gpu", "7")
    assert bad.returncode == 2 and "GPU 7 does not exist" in bad.stderr
    nowhere = cli("sim", "fail", "--gpu", "0")
    assert nowhere.returncode == 2 and "no simulated machine" in nowhere.stderr


def test_sim_load_inside_sim_run_finds_the_machine(cli, venv_bin):
    """Inside `sim run`, `sim load` needs no --state-dir: GPUPROBE_SIM_DIR names the machine."""
    script = f"""
        set -e
        {venv_bin}/gpuprobe sim load --gpu 1 --util 65
        sleep 0.3
        {venv_bin}/python -c 'import pynvml as N; N.nvmlInit(); \\
            print([N.nvmlDeviceGetUtilizationRates(N.nvmlDeviceGetHandleByIndex(i)).gpu for i in range(2)])'
    """
    proc = cli("sim", "run", "--gpus", "2", "--period", "50ms", "--", "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert "utilization 65 % on GPU 1 from" in proc.stdout
    assert proc.stdout.splitlines()[-1] == "[0, 65]"
