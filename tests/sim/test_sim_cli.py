"""`gpuprobe sim run` as a user runs it: the command sees simulated GPUs through the real pynvml."""

from __future__ import annotations

import json
import sys
import textwrap

import pynvml

from gpuprobe.nvml.sensor import ARCHITECTURES
from gpuprobe.sim import state
from gpuprobe.sim.profiles import PROFILES

LIST_GPUS = textwrap.dedent(
    """
    import json, pynvml as N
    N.nvmlInit()
    def text(v):
        return v.decode() if isinstance(v, bytes) else v
    out = []
    for i in range(N.nvmlDeviceGetCount()):
        h = N.nvmlDeviceGetHandleByIndex(i)
        pci = N.nvmlDeviceGetPciInfo(h)
        out.append({
            "name": text(N.nvmlDeviceGetName(h)),
            "uuid": text(N.nvmlDeviceGetUUID(h)),
            "bus_id": text(pci.busId),
            "bus": pci.bus,
            "enforced_mw": N.nvmlDeviceGetEnforcedPowerLimit(h),
            "default_mw": N.nvmlDeviceGetPowerManagementDefaultLimit(h),
            "memory_total": N.nvmlDeviceGetMemoryInfo(h).total,
            "index": N.nvmlDeviceGetIndex(h),
        })
    print(json.dumps(out))
    """
)


def test_sim_run_shows_eight_h100(cli):
    proc = cli("sim", "run", "--gpus", "8", "--profile", "H100-SXM5-80GB", "--", sys.executable, "-c", LIST_GPUS)
    assert proc.returncode == 0, proc.stderr
    gpus = json.loads(proc.stdout)
    assert len(gpus) == 8
    assert [g["index"] for g in gpus] == list(range(8))
    assert {g["name"] for g in gpus} == {"NVIDIA H100 80GB HBM3"}
    assert {g["enforced_mw"] for g in gpus} == {700_000}
    assert {g["default_mw"] for g in gpus} == {700_000}
    assert {g["memory_total"] for g in gpus} == {PROFILES["H100-SXM5-80GB"].memory_total_bytes}
    assert len({g["uuid"] for g in gpus}) == 8
    assert all(g["uuid"].startswith("GPU-") for g in gpus)
    assert len({g["bus_id"] for g in gpus}) == 8
    assert len({g["bus"] for g in gpus}) == 8


def test_sim_run_propagates_exit_status(cli):
    assert cli("sim", "run", "--gpus", "1", "--", sys.executable, "-c", "raise SystemExit(3)").returncode == 3
    assert cli("sim", "run", "--gpus", "1", "--", "true").returncode == 0
    # a command killed by a signal exits 128+N, as in a shell
    assert cli("sim", "run", "--gpus", "1", "--", "sh", "-c", "kill -TERM $$").returncode == 128 + 15


def test_sim_run_without_command_is_a_usage_error(cli):
    for args in (["sim", "run", "--gpus", "8"], ["sim", "run", "--gpus", "8", "--"]):
        proc = cli(*args)
        assert proc.returncode == 2
        assert "no command given" in proc.stderr


def test_sim_run_unknown_profile_is_a_usage_error(cli):
    proc = cli("sim", "run", "--profile", "B300-Imaginary", "--", "true")
    assert proc.returncode == 2
    assert "unknown GPU profile 'B300-Imaginary'" in proc.stderr
    assert "H100-SXM5-80GB" in proc.stderr  # it names the known ones


def test_sim_run_unknown_command_is_an_error(cli):
    proc = cli("sim", "run", "--gpus", "1", "--", "no-such-command-gpuprobe")
    assert proc.returncode == 2
    assert "command not found: no-such-command-gpuprobe" in proc.stderr


def test_mixed_profiles_in_order(cli):
    proc = cli("sim", "run", "--profile", "2xA100-SXM4-80GB,2xL4", "--", sys.executable, "-c", LIST_GPUS)
    assert proc.returncode == 0, proc.stderr
    gpus = json.loads(proc.stdout)
    assert [g["name"] for g in gpus] == ["NVIDIA A100-SXM4-80GB"] * 2 + ["NVIDIA L4"] * 2
    assert [g["enforced_mw"] for g in gpus] == [400_000] * 2 + [72_000] * 2
    # the same list with a matching --gpus is fine; a mismatch is a usage error
    ok = cli("sim", "run", "--gpus", "4", "--profile", "2xA100-SXM4-80GB,2xL4", "--", "true")
    assert ok.returncode == 0, ok.stderr
    bad = cli("sim", "run", "--gpus", "3", "--profile", "2xA100-SXM4-80GB,2xL4", "--", "true")
    assert bad.returncode == 2
    assert "describes 4 GPUs but --gpus is 3" in bad.stderr


IDENTITY = textwrap.dedent(
    """
    import json, pynvml as N
    N.nvmlInit()
    def text(v):
        return v.decode() if isinstance(v, bytes) else v
    hs = [N.nvmlDeviceGetHandleByIndex(i) for i in range(N.nvmlDeviceGetCount())]
    print(json.dumps({
        "driver": text(N.nvmlSystemGetDriverVersion()),
        "nvml": text(N.nvmlSystemGetNVMLVersion()),
        "cuda": N.nvmlSystemGetCudaDriverVersion(),
        "brand": [N.nvmlDeviceGetBrand(h) for h in hs],
        "architecture": [N.nvmlDeviceGetArchitecture(h) for h in hs],
    }))
    """
)


def test_identity_answers_what_a_driver_of_the_headers_api_answers(cli):
    """The NVML version is "<CUDA major>.<driver version>", as the driver's library answers; a driver of
    NVML API 13 (the nvml.h the interface is held against) says 13.x. The datacenter parts report
    NVML_BRAND_NVIDIA, as public `nvidia-smi -q` dumps of A100, H100 and L4 show ("Product Brand : NVIDIA"),
    the RTX 4090 GeForce."""
    profile = "A100-SXM4-80GB,H100-SXM5-80GB,H200-SXM-141GB,L4,RTX-4090"
    proc = cli("sim", "run", "--profile", profile, "--", sys.executable, "-c", IDENTITY)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["driver"] == state.DRIVER_VERSION
    assert out["nvml"] == f"13.{state.DRIVER_VERSION}" and out["cuda"] == 13000
    assert out["brand"] == [pynvml.NVML_BRAND_NVIDIA] * 4 + [pynvml.NVML_BRAND_GEFORCE]
    assert [ARCHITECTURES[a] for a in out["architecture"]] == ["ampere", "hopper", "hopper", "ada", "ada"]


def test_set_overrides_a_parameter_of_one_gpu(cli):
    code = (
        "import pynvml as N; N.nvmlInit(); print([N.nvmlDeviceGetPowerManagementDefaultLimit("
        "N.nvmlDeviceGetHandleByIndex(i)) for i in range(2)])"
    )
    proc = cli("sim", "run", "--gpus", "2", "--set", "1.limit_default_w=350", "--", sys.executable, "-c", code)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [700_000, 350_000]
    bad = cli("sim", "run", "--gpus", "2", "--set", "1.no_such_parameter=3", "--", "true")
    assert bad.returncode == 2
    assert "cannot override 'no_such_parameter'" in bad.stderr
    out_of_range = cli("sim", "run", "--gpus", "2", "--set", "5.tau_s=3", "--", "true")
    assert out_of_range.returncode == 2
    assert "--set names GPU 5" in out_of_range.stderr


def test_no_state_dir_means_driver_not_loaded(sim, tmp_path):
    machine = sim.machine(gpus=1)
    code = """
        import json, pynvml as N
        try:
            N.nvmlInit()
            print(json.dumps("initialised"))
        except N.NVMLError_DriverNotLoaded as e:
            print(json.dumps(["DriverNotLoaded", str(e)]))
    """
    env = machine.environ()
    del env["GPUPROBE_SIM_DIR"]
    verdict = sim.run(None, code, prelude=False, env=env)
    assert verdict[0] == "DriverNotLoaded"
    # a state directory without a machine in it is the same
    empty = tmp_path / "empty"
    empty.mkdir()
    env["GPUPROBE_SIM_DIR"] = str(empty)
    assert sim.run(None, code, prelude=False, env=env)[0] == "DriverNotLoaded"


def test_nvidia_smi_stand_in(cli):
    script = textwrap.dedent(
        f"""
        set -e
        command -v nvidia-smi | grep -q "$GPUPROBE_SIM_DIR/bin/nvidia-smi"
        nvidia-smi --help > /dev/null
        nvidia-smi -L
        echo ===
        {sys.executable} -c 'import pynvml as N; N.nvmlInit(); \\
            print("\\n".join(N.nvmlDeviceGetUUID(N.nvmlDeviceGetHandleByIndex(i)) for i in range(3)))'
        """
    )
    proc = cli("sim", "run", "--profile", "2xL4,RTX-4090", "--", "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    listing, uuids = proc.stdout.split("===\n")
    uuids = uuids.split()
    assert listing.splitlines() == [
        f"GPU 0: NVIDIA L4 (UUID: {uuids[0]})",
        f"GPU 1: NVIDIA L4 (UUID: {uuids[1]})",
        f"GPU 2: NVIDIA GeForce RTX 4090 (UUID: {uuids[2]})",
    ]
