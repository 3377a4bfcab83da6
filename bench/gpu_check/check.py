"""The prepared check for a real NVIDIA GPU: NVML's answers, a thermal trace with load steps, the agent's CPU.

The simulator stands in for NVIDIA's driver everywhere else, so three things can only be learned on a
real GPU, and this script gathers them in one run of about 6 minutes (``--scale 1``):

1. **NVML's answers** (``nvml.json``): for every GPU, the field ids the agent could read in one
   ``nvmlDeviceGetFieldValues`` call side by side with the dedicated functions it calls today (ECC
   counts 3 to 6, remapped rows 142 to 145, PCIe replays 94, violation time 74 to 76 against
   ``nvmlDeviceGetViolationStatus``, link state 165 against ``nvmlDeviceGetNvLinkState``), GPM support,
   and the CPU time of the hot path's NVML calls (µs per call, 200 calls each, ``thread_time``). Also
   what the simulator and the agent assume from nvml.h and no GPU has confirmed: each NVLink error
   counter's answer per link next to the total fields 38/45/52/59 read per link (scopeId = the link, as
   nvml.h says), at scope 0 and at scope UINT_MAX, with their sums (``nvlink_errors``);
   ``nvmlDeviceGetBrand`` and ``nvmlDeviceGetArchitecture``; the driver's answer to a wrong version word
   (``version_words``: ``nvmlMemory_v2_t``, ``nvmlTemperature_t``, GPM metrics); and, on a GPU in MIG
   mode, the reads nvml.h documents for MIG made by an unprivileged user (``mig_unprivileged``: as
   ``nobody`` when the check runs as root). Each of these records its answer or its error and never
   stops the script.
2. **A thermal trace with load steps** (``nvidia-smi.csv``, 200 ms, when a real ``nvidia-smi`` is on
   PATH): the bundled trainer runs ResNet-50 at two batch sizes (two load levels, the trainer's own
   idle baseline, warm-ups and cool-down), then matmul-burn (the highest level) and a long cool-down.
   ``gpuprobe import nvidia-smi`` reads the file; ``gpuprobe model --holdout`` then fits it.
3. **The agent's CPU on real NVML** (``summary.json``): ``gpuprobe agent`` (10 Hz, health reads every
   second, ``--resolution full``) streams to the test receiver (``tests/agent/receiver.py``, whose
   ``batches.bin`` comes back too) during the whole trace; its CPU time (all threads, and per thread)
   over the idle baseline and over the whole run, per GPU-sample and as % of one core.

Everything lands in ``--out`` (at most 8 files: what the device tool brings back). On a machine
without a GPU, ``--sim PROFILE`` runs the same steps against a simulated GPU (the trainer on the CPU,
tiny models), which is how ``tests/bench/test_gpu_check.py`` keeps this script working; what it gives
there is SIMULATED and says so (``"simulated": true``).

    python3 bench/gpu_check/check.py --out DIR [--scale 1.0] [--nvml-only]
    python bench/gpu_check/check.py --sim H200-SXM-141GB --out DIR --scale 0.05
    python bench/gpu_check/check.py --sim H100-SXM5-80GB --sim-mig 2 --nvml-only --out DIR

``--nvml-only`` gathers step 1 alone (seconds). ``--sim-mig N`` puts the simulated GPU in MIG mode with N
instances and makes this script's user an unprivileged one there, as the agent ships.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# the repository; the MIG child that runs as nobody reads its source from stdin and needs none of it
REPO = Path(__file__).resolve().parents[2] if __file__ != "<stdin>" else Path("/nonexistent")
RECEIVER = REPO / "tests" / "agent" / "receiver.py"
TRACE_QUERY = "timestamp,index,power.draw,temperature.gpu,temperature.memory,utilization.gpu,clocks.sm,fan.speed"

# field id -> (what the agent reads today, how to read it with pynvml); all checked per GPU
ECC_FIELDS = {3: (0, 0), 4: (1, 0), 5: (0, 1), 6: (1, 1)}  # (error type, counter type)
REMAP_FIELDS = (142, 143, 144, 145)  # correctable, uncorrectable, pending, failure
VIOLATION_FIELDS = {74: 0, 75: 1, 76: 2}  # NVML_PERF_POLICY_POWER, THERMAL, SYNC_BOOST
FIELD_PCIE_REPLAY = 94
FIELD_NVLINK_STATE = 165
# nvmlNvLinkErrorCounter_t -> its total field (NVML_FI_DEV_NVLINK_*_ERROR_COUNT_TOTAL; DL_ECC_DATA has none)
NVLINK_COUNTERS = {
    "replay": (0, 52),
    "recovery": (1, 59),
    "crc_flit": (2, 38),
    "crc_data": (3, 45),
    "ecc_data": (4, None),
}
SCOPE_ALL = 0xFFFFFFFF  # UINT_MAX: nvml.h's aggregate over all links, documented for the throughput fields only
# versioned structs: the right version word, then wrong ones (another version of the same size; the right
# version with a wrong size)
MEMORY_V2_WORDS = (0x02000028, 0x01000028, 0x02000020)
TEMPERATURE_WORDS = (0x0100000C, 0x0200000C)
GPM_METRICS_GET_WORDS = (1, 2)
NOBODY = 65534


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the results (created)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies every phase's duration (1: ~6 min)")
    parser.add_argument("--sim", metavar="PROFILE", help="a simulated GPU of this profile instead of a real one")
    parser.add_argument(
        "--sim-mig", type=int, default=0, metavar="N", help="the simulated GPU in MIG mode, N instances"
    )
    parser.add_argument("--nvml-only", action="store_true", help="NVML's answers only (no trace, no agent)")
    args = parser.parse_args()
    if args.scale <= 0:
        parser.error("--scale must be positive")
    if args.sim_mig and not args.sim:
        parser.error("--sim-mig needs --sim")
    args.out.mkdir(parents=True, exist_ok=True)
    with machine(args.sim, args.sim_mig) as env:
        nvml = run_child_json(env, "nvml")
        # as the agent ships: without privileges (a real GPU: as nobody when this runs as root)
        nvml["mig_unprivileged"] = _guarded(lambda: run_child_json(env, "mig", drop_root=args.sim is None))
        nvml["simulated"] = bool(args.sim)
        (args.out / "nvml.json").write_text(json.dumps(nvml, indent=2))
        if args.nvml_only:
            return 0
        summary = trace_and_overhead(args, env, nvml)
    summary["simulated"] = bool(args.sim)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: summary[k] for k in ("simulated", "agent", "trainer")}, indent=2))
    return 0


@contextlib.contextmanager
def machine(profile: str | None, mig_instances: int = 0) -> Iterator[dict[str, str]]:
    """The environment the GPU processes run in: this one, or a simulated machine's (in MIG mode with
    ``mig_instances``, and then this user is not one of its privileged ones)."""
    if profile is None:
        yield dict(os.environ)
        return
    import tempfile

    from gpuprobe.sim.profiles import get_profile, with_overrides
    from gpuprobe.sim.runner import open_machine

    gpu = get_profile(profile)
    admins = (0,)
    if mig_instances:
        gpu = with_overrides(gpu, {"mig_instances": str(mig_instances)})
        admins = (os.geteuid() + 1,)
    with tempfile.TemporaryDirectory(prefix="gpuprobe-sim-") as tmp:
        env = open_machine(Path(tmp), [gpu], admin_uids=admins).environ()
        env.pop("NOTIFY_SOCKET", None)
        yield env


def run_child_json(env: dict[str, str], what: str, drop_root: bool = False) -> dict[str, Any]:
    """This script's ``--child WHAT`` in ``env`` (NVML is loaded from the environment's library path at
    start, so the simulated machine's needs a process of its own); its JSON. ``drop_root``: when this runs
    as root, the child runs as nobody (its source comes on stdin and it runs in /, so that it needs to read
    no file of the repository's)."""
    preexec = None
    if drop_root and os.geteuid() == 0:

        def preexec() -> None:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)

    done = subprocess.run(
        [sys.executable, "-", "--child", what],
        input=Path(__file__).read_text(),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=preexec,
        cwd="/" if preexec else None,
    )
    if done.returncode != 0:
        raise SystemExit(f"the {what} check failed:\n{done.stderr}")
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


# ---------------------------------------------------------------------------------------- 1. NVML's answers


def nvml_check() -> dict[str, Any]:
    import pynvml

    pynvml.nvmlInit()
    out: dict[str, Any] = {
        "driver": _text(pynvml.nvmlSystemGetDriverVersion()),
        "nvml": _text(pynvml.nvmlSystemGetNVMLVersion()),
    }
    out["gpus"] = [_gpu_check(pynvml, index) for index in range(pynvml.nvmlDeviceGetCount())]
    pynvml.nvmlShutdown()
    return out


def _gpu_check(pynvml: Any, index: int) -> dict[str, Any]:
    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    gpu: dict[str, Any] = {"index": index, "name": _text(pynvml.nvmlDeviceGetName(h))}
    gpu["ecc"] = {
        str(f): [_field(pynvml, h, f), _call(pynvml.nvmlDeviceGetTotalEccErrors, h, e, c)]
        for f, (e, c) in ECC_FIELDS.items()
    }
    rows = _call(pynvml.nvmlDeviceGetRemappedRows, h)
    gpu["remapped_rows"] = {"fields": [_field(pynvml, h, f) for f in REMAP_FIELDS], "function": rows}
    gpu["pcie_replay"] = [_field(pynvml, h, FIELD_PCIE_REPLAY), _call(pynvml.nvmlDeviceGetPcieReplayCounter, h)]

    def violation_ns(policy: int) -> int:
        return int(pynvml.nvmlDeviceGetViolationStatus(h, policy).violationTime)

    gpu["violation"] = {str(f): [_field(pynvml, h, f), _call(violation_ns, p)] for f, p in VIOLATION_FIELDS.items()}
    links = []
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        state = _call(pynvml.nvmlDeviceGetNvLinkState, h, link)
        if isinstance(state, str) and link > 0:
            break  # past the last link (or none at all: link 0's answer says which)
        links.append([_field(pynvml, h, FIELD_NVLINK_STATE, scope=link), state])
    gpu["nvlink_state"] = links
    gpu["gpm_supported"] = _call(lambda: bool(pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice))
    gpu["brand"] = _call(pynvml.nvmlDeviceGetBrand, h)
    gpu["architecture"] = _call(pynvml.nvmlDeviceGetArchitecture, h)
    active = [link for link, (_, state) in enumerate(links) if state == 1]
    gpu["nvlink_errors"] = _guarded(lambda: _nvlink_errors(pynvml, h, active))
    gpu["version_words"] = _guarded(lambda: _version_words(pynvml, h))
    gpu["call_cpu_us"] = {
        "power_usage": _cost(lambda: pynvml.nvmlDeviceGetPowerUsage(h)),
        "temperature": _cost(lambda: pynvml.nvmlDeviceGetTemperature(h, 0)),
        "utilization": _cost(lambda: pynvml.nvmlDeviceGetUtilizationRates(h)),
        "sm_clock": _cost(lambda: pynvml.nvmlDeviceGetClockInfo(h, 1)),
        "field_values_4": _cost(lambda: pynvml.nvmlDeviceGetFieldValues(h, [82, 83, 186, 190])),
        "clocks_event_reasons": _cost(lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)),
    }
    return gpu


def _nvlink_errors(pynvml: Any, h: Any, links: list[int]) -> dict[str, Any]:
    """Each error counter's answer per active link next to its total field read with scopeId = the link
    (nvml.h), and the fields at scope 0 and UINT_MAX; the sums over the links of what answered."""
    fields = {name: f for name, (_, f) in NVLINK_COUNTERS.items() if f is not None}
    per_link = []
    for link in links:
        counters = {
            n: _call(pynvml.nvmlDeviceGetNvLinkErrorCounter, h, link, c) for n, (c, _) in NVLINK_COUNTERS.items()
        }
        totals = {n: _field(pynvml, h, f, scope=link) for n, f in fields.items()}
        per_link.append({"link": link, "counters": counters, "total_fields": totals})

    def total(values: list[Any]) -> int | None:
        numbers = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
        return sum(numbers) if numbers else None

    return {
        "per_link": per_link,
        "counter_sums": {n: total([p["counters"][n] for p in per_link]) for n in NVLINK_COUNTERS},
        "total_field_sums": {
            n: total([p["total_fields"][n].get("value") for p in per_link if p["total_fields"][n].get("rc") == 0])
            for n in fields
        },
        # a whole-GPU reading of the total fields, if the driver gives one (nvml.h documents scope = link)
        "scope_0": {n: _field(pynvml, h, f) for n, f in fields.items()},
        "scope_uint_max": {n: _field(pynvml, h, f, scope=SCOPE_ALL) for n, f in fields.items()},
    }


def _version_words(pynvml: Any, h: Any) -> dict[str, Any]:
    """The return code of versioned calls given the right version word and wrong ones (nvml.h documents
    ARGUMENT_VERSION_MISMATCH), called through the C functions with pynvml's structures."""
    import ctypes

    def rc(name: str, *args: Any) -> int | str:
        try:
            return int(pynvml._nvmlGetFunctionPointer(name)(*args))
        except Exception as e:
            return f"error: {e}"

    out: dict[str, Any] = {}
    memory = {}
    for word in MEMORY_V2_WORDS:
        m = pynvml.c_nvmlMemory_v2_t()
        m.version = word
        memory[hex(word)] = rc("nvmlDeviceGetMemoryInfo_v2", h, ctypes.byref(m))
    out["nvmlDeviceGetMemoryInfo_v2"] = memory
    temperature = {}
    for word in TEMPERATURE_WORDS:
        t = pynvml.c_nvmlTemperature_v1_t()
        t.version = word
        t.sensorType = 0
        temperature[hex(word)] = rc("nvmlDeviceGetTemperatureV", h, ctypes.byref(t))
    out["nvmlDeviceGetTemperatureV"] = temperature
    gpm: dict[str, Any] = {}
    samples = [_guarded(pynvml.nvmlGpmSampleAlloc) for _ in range(2)]
    if all(not isinstance(sample, dict) for sample in samples):
        taken = [_call(lambda s=sample: _gpm_take(pynvml, h, s)) for sample in samples]
        for word in GPM_METRICS_GET_WORDS:
            request = pynvml.c_nvmlGpmMetricsGet_t()
            request.version = word
            request.numMetrics = 1
            request.sample1, request.sample2 = samples
            request.metrics[0].metricId = 2  # SM_UTIL
            gpm[str(word)] = rc("nvmlGpmMetricsGet", ctypes.byref(request)) if taken == [0, 0] else taken
        for sample in samples:
            _guarded(lambda s=sample: pynvml.nvmlGpmSampleFree(s))
    out["nvmlGpmMetricsGet"] = gpm or samples
    return out


def mig_check() -> dict[str, Any]:
    """On every GPU in MIG mode, the reads nvml.h documents for MIG (GPU-level memory and process lists:
    NO_PERMISSION without privileges; utilization, encoder/decoder, samples, remapped rows, process
    utilization: NOT_SUPPORTED), as this process's user, and what each MIG instance answers to it."""
    import pynvml

    pynvml.nvmlInit()
    gpus = [_guarded(lambda i=i: _mig_gpu(pynvml, i)) for i in range(pynvml.nvmlDeviceGetCount())]
    pynvml.nvmlShutdown()
    return {"euid": os.geteuid(), "gpus": gpus}


def _mig_gpu(pynvml: Any, index: int) -> dict[str, Any]:
    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    mode = _call(pynvml.nvmlDeviceGetMigMode, h)
    gpu: dict[str, Any] = {"index": index, "mig_mode": mode}
    if not isinstance(mode, list) or mode[0] != 1:
        return gpu
    gpu["parent"] = {
        "memory_v1": _call(lambda: pynvml.nvmlDeviceGetMemoryInfo(h).total),
        "memory_v2": _call(lambda: pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).total),
        "compute_processes": _call(lambda: len(pynvml.nvmlDeviceGetComputeRunningProcesses(h))),
        "graphics_processes": _call(lambda: len(pynvml.nvmlDeviceGetGraphicsRunningProcesses(h))),
        "utilization": _call(lambda: pynvml.nvmlDeviceGetUtilizationRates(h).gpu),
        "encoder": _call(lambda: pynvml.nvmlDeviceGetEncoderUtilization(h)[0]),
        "decoder": _call(lambda: pynvml.nvmlDeviceGetDecoderUtilization(h)[0]),
        "gpu_util_samples": _call(lambda: len(pynvml.nvmlDeviceGetSamples(h, 1, 0)[1])),
        "remapped_rows": _call(pynvml.nvmlDeviceGetRemappedRows, h),
        "process_utilization": _call(lambda: len(pynvml.nvmlDeviceGetProcessUtilization(h, 0))),
        "power_mw": _call(pynvml.nvmlDeviceGetPowerUsage, h),
        "gpm_sample": _call(lambda: _gpm_sample(pynvml, lambda s: pynvml.nvmlGpmSampleGet(h, s))),
    }
    instances = []
    for slot in range(_guarded(lambda: int(pynvml.nvmlDeviceGetMaxMigDeviceCount(h)), 0)):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, slot)
        except Exception:
            continue  # no MIG device in this slot
        instances.append(_mig_instance(pynvml, h, mig))
    gpu["instances"] = instances
    return gpu


def _mig_instance(pynvml: Any, h: Any, mig: Any) -> dict[str, Any]:
    gi = _call(pynvml.nvmlDeviceGetGpuInstanceId, mig)
    return {
        "gpu_instance_id": gi,
        "memory": _call(lambda: pynvml.nvmlDeviceGetMemoryInfo(mig).total),
        "compute_processes": _call(lambda: len(pynvml.nvmlDeviceGetComputeRunningProcesses(mig))),
        "gpm_sample_on_handle": _call(lambda: _gpm_sample(pynvml, lambda s: pynvml.nvmlGpmSampleGet(mig, s))),
        "gpm_mig_sample": _call(lambda: _gpm_sample(pynvml, lambda s: pynvml.nvmlGpmMigSampleGet(h, gi, s))),
    }


def _gpm_take(pynvml: Any, h: Any, sample: Any) -> int:
    """0 when nvmlGpmSampleGet filled ``sample`` (its error raised otherwise)."""
    pynvml.nvmlGpmSampleGet(h, sample)
    return 0


def _gpm_sample(pynvml: Any, take: Callable[[Any], Any]) -> int:
    """0 when ``take(sample)`` filled a GPM sample (its error raised otherwise)."""
    sample = pynvml.nvmlGpmSampleAlloc()
    try:
        take(sample)
    finally:
        pynvml.nvmlGpmSampleFree(sample)
    return 0


def _guarded(fn: Callable[[], Any], default: Any = None) -> Any:
    """``fn()``, or ``{"error": ...}`` (``default`` when given): an extra check never stops the script."""
    try:
        return fn()
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"} if default is None else default


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """The function's answer, or the NVML error's name."""
    try:
        value = fn(*args)
    except Exception as e:  # every NVML error is an answer worth recording
        return type(e).__name__ if not hasattr(e, "value") else f"error {e.value}: {e}"
    if isinstance(value, tuple | list):
        return [int(v) for v in value]
    return value if isinstance(value, bool | str) else int(value)


def _field(pynvml: Any, h: Any, field_id: int, scope: int = 0) -> dict[str, Any]:
    """One field's answer: its return code, value type and value (as every member it could be read as)."""
    try:
        (value,) = pynvml.nvmlDeviceGetFieldValues(h, [(field_id, scope)] if scope else [field_id])
    except Exception as e:
        return {"call_error": str(e)}
    members = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal")
    member = members[value.valueType] if 0 <= value.valueType < len(members) else "ullVal"
    return {"rc": int(value.nvmlReturn), "type": int(value.valueType), "value": getattr(value.value, member)}


def _cost(fn: Callable[[], Any], calls: int = 200) -> float | str:
    """CPU µs per call (this thread), warm: what the agent's hot path pays per call on this driver."""
    try:
        fn()
    except Exception as e:
        return f"error: {e}"
    t0 = time.thread_time()
    for _ in range(calls):
        fn()
    return round((time.thread_time() - t0) / calls * 1e6, 2)


# ------------------------------------------------------------------- 2 and 3. the trace and the agent's CPU


def trace_and_overhead(args: argparse.Namespace, env: dict[str, str], nvml: dict[str, Any]) -> dict[str, Any]:
    sys.path.insert(0, str(REPO / "bench"))
    from agent_overhead import NAMED_THREADS, Measured, received_gpu_samples

    out: Path = args.out
    # the processes run in here, not in the repository: with ``-m`` / ``-c`` Python puts the working
    # directory first on its path, and the repository's gpuprobe/ folder would shadow the installed package
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpuprobe-gpu-check-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    port = _free_port()
    receiver = subprocess.Popen(
        [sys.executable, str(RECEIVER), "--port", str(port), "--out", str(work)],
        stdout=subprocess.PIPE,
        env=env,
        cwd=work,
    )
    assert receiver.stdout is not None
    if not receiver.stdout.readline().startswith(b"READY"):
        raise SystemExit("the test receiver did not start")
    socket_path = work / "trainer.sock"
    agent_log = open(out / "agent.log", "wb")  # noqa: SIM115 - owned by the agent's process
    agent = subprocess.Popen(
        [sys.executable, "-c", NAMED_THREADS, "--log-level", "info", "agent", "--collector", f"127.0.0.1:{port}",
         "--spool", str(work / "spool"), "--interval", "0.1", "--health-interval", "1", "--resolution", "full",
         "--trainer-socket", str(socket_path)],
        env=env, stdout=agent_log, stderr=subprocess.STDOUT, cwd=work,
    )  # fmt: skip
    smi = _start_nvidia_smi(out / "nvidia-smi.csv", env) if args.sim is None else None
    summary: dict[str, Any] = {"nvml_driver": nvml.get("driver"), "trace": "nvidia-smi.csv" if smi else None}
    try:
        _wait_for(lambda: socket_path.exists(), 30, "the agent's trainer socket")
        time.sleep(3)  # the agent's first batches (its GPU facts) are out
        phases: list[dict[str, Any]] = []
        measured = Measured("gpuprobe agent", agent)
        cpu0, threads0, t0_ns = _cpu_s(agent.pid), measured.thread_cpu_s(), time.time_ns()
        size = "tiny" if args.sim else "full"
        s = args.scale
        runs = [
            ["--workload", "resnet50", "--size", size, "--batch-size", "16,256", "--idle-baseline", f"{40 * s:g}s",
             "--warmup", f"{10 * s:g}s", "--duration", f"{45 * s:g}s", "--cooldown", f"{45 * s:g}s"],
            ["--workload", "matmul-burn", "--size", size, "--idle-baseline", "0s", "--warmup", f"{5 * s:g}s",
             "--duration", f"{75 * s:g}s", "--cooldown", f"{75 * s:g}s"],
        ]  # fmt: skip
        idle_cpu: tuple[float, int] | None = None
        for i, run in enumerate(runs, 1):
            trainer = subprocess.Popen(
                [sys.executable, "-m", "gpuprobe.app", "train", *run, "--agent-socket", str(socket_path),
                 "--format", "json"],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=work,
            )  # fmt: skip
            if i == 1:  # the agent's CPU over the trainer's idle baseline, GPUs idle
                time.sleep(max(1.0, 40 * s - 2))
                idle_cpu = (_cpu_s(agent.pid) - cpu0, time.time_ns())
            stdout, stderr = trainer.communicate(timeout=3600)
            (out / f"trainer-{i}.json").write_text(stdout or json.dumps({"stderr": stderr[-4000:]}))
            phases.append({"run": run, "returncode": trainer.returncode, "result": _json_or_none(stdout)})
        cpu1, threads1, t1_ns = _cpu_s(agent.pid), measured.thread_cpu_s(), time.time_ns()
        time.sleep(2)  # the last batches arrive
        window_s = (t1_ns - t0_ns) / 1e9
        samples = received_gpu_samples(work / "batches.bin", t0_ns, t1_ns)
        agent_cpu_s = cpu1 - cpu0
        summary["agent"] = {
            "window_s": round(window_s, 1),
            "gpu_samples": samples,
            "core_pct": round(agent_cpu_s / window_s * 100, 3),
            "cpu_us_per_gpu_sample": round(agent_cpu_s / samples * 1e6, 1) if samples else None,
            "threads_core_pct": {
                name: round((threads1.get(name, 0.0) - threads0.get(name, 0.0)) / window_s * 100, 3)
                for name in threads1
            },
            "rss_mib": round(_rss_bytes(agent.pid) / 2**20, 1),
        }
        if idle_cpu is not None:
            idle_s = (idle_cpu[1] - t0_ns) / 1e9
            summary["agent"]["idle_baseline_core_pct"] = round(idle_cpu[0] / idle_s * 100, 3)
        summary["trainer"] = phases
    finally:
        for p in (agent, receiver, smi):
            if p is not None and p.poll() is None:
                p.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(10)
                if p.poll() is None:
                    p.kill()
        agent_log.close()
        if (work / "batches.bin").exists():
            shutil.copy(work / "batches.bin", out / "batches.bin")
        shutil.rmtree(work, ignore_errors=True)
    return summary


def _start_nvidia_smi(path: Path, env: dict[str, str]) -> subprocess.Popen[bytes] | None:
    """nvidia-smi logging every 200 ms into ``path`` (the CSV ``gpuprobe import nvidia-smi`` reads)."""
    if shutil.which("nvidia-smi", path=env.get("PATH")) is None:
        return None
    command = ["nvidia-smi", f"--query-gpu={TRACE_QUERY}", "--format=csv", "-lms", "200", "-f", str(path)]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_for(ready: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise SystemExit(f"{what} did not appear in {timeout_s:g} s")
        time.sleep(0.1)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(mig_check() if sys.argv[2:3] == ["mig"] else nvml_check()))
        sys.exit(0)
    sys.exit(main())
