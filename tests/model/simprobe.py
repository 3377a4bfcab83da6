"""Test scaffolding: one short probe on two simulated nodes, stored in a real InfluxDB in the storage schema.

The real path is agent -> collector -> InfluxDB and the trainer/probe code; this stands in for all of
them (``sim_reader.py`` reads the GPUs through pynvml at 10 Hz in a child process per node), so the
model and dashboard tests depend on none of their internals. What it writes follows the storage
schema (docs/schema.md): ``gpu``, ``node``, ``acoustic`` (proxy per GPU and per node; microphone on node-b),
``trainer``, ``probe``, ``agent`` and ``gpu_info`` (each GPU's static facts at the machine's start, its
thresholds from the profile, as an agent reads them through NVML).

The scenario, with time constants shortened so the whole probe takes about 45 s:

========  ======================================================  =========================
node      GPUs (profile, τ override, utilization)                 notes
========  ======================================================  =========================
node-a    4 x L4 at 80 %; τ 4, 4.5, 4, 4 s                        GPU 3 has R_th 1.0 °C/W
                                                                  (stock 0.70): the outlier;
                                                                  it reaches its slowdown
                                                                  threshold (92 °C) and throttles
node-b    H100 100 % (power-capped), H100 80 %, A100 90 %         a microphone on node-b
          (capped), RTX-4090 80 % (fans); τ 3, 3.5, 5, 3 s        only
========  ======================================================  =========================

Phases: idle baseline 4 s -> warm-up 2 s -> steady 16 s -> cool-down 18 s. The load step is the
same on every GPU, so each GPU's temperature is a clean RC step response up and down: every GPU runs
the simulator's former first-order physics (``FIRST_ORDER``: no fast die stage, no inlet coupling, no
fan effect), which the first-order fits here are checked against.

The microphone is a real capture device: ALSA's ``file`` plugin plays a 1 kHz tone (A-weighting is
0 dB at 1 kHz) whose level in each 1 s window is node-b's proxy level plus ``MIC_OFFSET_DB`` plus
Gaussian noise (standard deviation ``MIC_NOISE_DB``, seeded);
PortAudio (``sounddevice``) records it in a child process and the 1 s LAeq of the recording is
stored as ``acoustic,source=mic laeq_db``.
"""

from __future__ import annotations

import dataclasses
import fcntl
import math
import os
import pickle
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import support

from gpuprobe.devservices import InfluxDBServer
from gpuprobe.influx.lineprotocol import encode_line
from gpuprobe.sim.profiles import PROFILES, GpuProfile, with_overrides
from gpuprobe.sim.runner import SimMachine, temporary_machine

HERE = Path(__file__).resolve().parent
PROBE_ID = "p-test-0001"
WORKLOAD = "resnet50"
IDLE_S = 4.0
WARMUP_S = 2.0
STEADY_S = 16.0
COOLDOWN_S = 18.0
MIC_HOST = "node-b"
MIC_OFFSET_DB = 7.5
MIC_NOISE_DB = 0.7  # the room: Gaussian, seeded
MIC_CALIBRATION_DB = 100.0  # dB SPL of a full-scale (mean square 1) signal
MIC_FS_HZ = 48000
MIC_TONE_HZ = 1000.0
MIC_FAST_TAU_S = 0.125  # LAF: exponential time weighting "fast"
PRICE_PER_GPU_HOUR = 2.0
PUE = 1.2
GRID_KG_PER_KWH = 0.35

# The simulator's thermal model before the two-stage one (docs/simulator.md, "An older machine"): a single
# RC per GPU with R = r_th_c_per_w and tau = tau_s, which is what these first-order fits recover exactly.
FIRST_ORDER: dict[str, str] = {"r_fast_c_per_w": "0", "inlet_c_per_w": "0", "fan_conductance_floor": "1"}

# host -> (profile, overrides, utilization %, samples/s at steady load)
SCENARIO: dict[str, list[tuple[str, dict[str, str], float, float]]] = {
    "node-a": [
        ("L4", {"tau_s": "4"}, 80, 410.0),
        ("L4", {"tau_s": "4.5"}, 80, 400.0),
        ("L4", {"tau_s": "4"}, 80, 405.0),
        ("L4", {"tau_s": "4", "r_th_c_per_w": "1.0"}, 80, 405.0),
    ],
    "node-b": [
        ("H100-SXM5-80GB", {"tau_s": "3"}, 100, 2600.0),
        ("H100-SXM5-80GB", {"tau_s": "3.5"}, 80, 2300.0),
        ("A100-SXM4-80GB", {"tau_s": "5"}, 90, 1500.0),
        ("RTX-4090", {"tau_s": "3"}, 80, 1200.0),
    ],
}


@dataclass(frozen=True)
class GpuTruth:
    """One simulated GPU and what the probe did to it (the ground truth the fits are checked against)."""

    host: str
    gpu: int
    profile: GpuProfile
    util_pct: float
    samples_per_s: float
    load_tick_ns: int  # the driver tick at which the load step took effect
    unload_tick_ns: int
    machine_start_ns: int
    period_ns: int

    @property
    def idle_w(self) -> float:
        return self.profile.idle_w

    @property
    def load_w(self) -> float:
        """Power under load without thermal slowdown."""
        return self.profile.power_w(self.util_pct)

    def ticks(self, until_ns: int) -> Iterator[tuple[int, float, bool]]:
        """(tick start, power, slowed) of every tick from the machine's start: docs/simulator.md's model
        replayed independently of the C library (power from load and cap, RC temperature, slowdown with
        3 °C hysteresis)."""
        p = self.profile
        temp = p.ambient_c + p.r_th_c_per_w * p.idle_w
        slowed = False
        decay = math.exp(-self.period_ns / 1e9 / p.tau_s)
        t = self.machine_start_ns
        while t < until_ns:
            util = self.util_pct if self.load_tick_ns <= t < self.unload_tick_ns else 0.0
            if temp >= p.slowdown_c:
                slowed = True
            elif temp < p.slowdown_c - 3:
                slowed = False
            demand = p.idle_w + (p.peak_demand_w - p.idle_w) * util / 100.0
            if slowed:
                demand = p.idle_w + (demand - p.idle_w) * p.throttle_clock_factor
            power = min(demand, p.limit_default_w)
            yield t, power, slowed
            steady = p.ambient_c + p.r_th_c_per_w * power
            temp = steady + (temp - steady) * decay
            t += self.period_ns

    def energy_j(self, start_ns: int, end_ns: int) -> float:
        """∫P dt over [start, end]: the simulator's power is constant within a tick."""
        total = 0.0
        for t, power, _ in self.ticks(end_ns):
            total += power * max(0, min(t + self.period_ns, end_ns) - max(t, start_ns)) / 1e9
        return total

    def slowed_s(self, start_ns: int, end_ns: int) -> float:
        return sum(
            max(0, min(t + self.period_ns, end_ns) - max(t, start_ns)) / 1e9
            for t, _, slowed in self.ticks(end_ns)
            if slowed
        )


@dataclass
class Probe:
    """A finished probe as generated: its phases' times and the ground truth of every GPU."""

    probe_id: str
    start_ns: int
    warmup_ns: dict[str, int]
    steady_ns: dict[str, int]
    cooldown_ns: dict[str, int]
    end_ns: int
    truths: list[GpuTruth]
    line_counts: dict[str, int] = field(default_factory=dict)
    mic_windows: int = 0

    def truth(self, host: str, gpu: int) -> GpuTruth:
        return next(t for t in self.truths if t.host == host and t.gpu == gpu)


@dataclass(kw_only=True)
class ProbeRun(Probe):
    """The probe stored in its own database of the session's (the worker's) InfluxDB."""

    server: InfluxDBServer
    db: str


@dataclass
class GeneratedProbe:
    """What :func:`generate_probe` hands to :func:`store_probe`: the probe, and its points as the
    line-protocol bodies they are written in."""

    probe: Probe
    chunks: list[str]


def _profiles(host: str) -> list[GpuProfile]:
    return [with_overrides(PROFILES[name], {**FIRST_ORDER, **over}) for name, over, _, _ in SCENARIO[host]]


def _wait_for(paths: list[Path], timeout_s: float, procs: list[subprocess.Popen[bytes]]) -> None:
    def started() -> bool:
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"a GPU reader exited early with status {proc.returncode}")
        return all(p.exists() for p in paths)

    support.wait_until(started, timeout_s, "the GPU readers to start", describe=lambda: [p.exists() for p in paths])


# Every point below goes through the encoder the collector and the agent's tools write with
# (gpuprobe.influx.lineprotocol), so names and values are escaped and typed as in production.


def _probe_line(host: str, t_ns: int, kind: str, phase: str, status: str) -> str:
    tags = {"cluster": "test", "host": host, "probe": PROBE_ID}
    return encode_line("probe", tags, {"kind": kind, "phase": phase, "status": status, "workload": WORKLOAD}, t_ns)


_TAG = re.compile(r",(model|uuid)=((?:[^, \\]|\\.)*)")  # a gpu line's model and uuid tags, still escaped


def _gpu_info_lines(run: Probe, gpu_lines: dict[str, list[str]], start_ns: dict[str, int]) -> list[str]:
    """One ``gpu_info`` point per GPU at its machine's start (before the probe), with the series tags of
    its ``gpu`` points and the thresholds of its profile."""
    lines = []
    for t in run.truths:
        head = f"gpu,cluster=test,gpu={t.gpu},host={t.host},"
        first = next(line for line in gpu_lines[t.host] if line.startswith(head))
        named = {key: re.sub(r"\\(.)", r"\1", value) for key, value in _TAG.findall(first)}
        p = t.profile
        tags = {"cluster": "test", "gpu": str(t.gpu), "host": t.host, "model": named["model"], "uuid": named["uuid"]}
        fields = {  # thresholds are floats in the schema (docs/schema.md), whole degrees in the profiles
            "temp_slowdown_c": float(p.slowdown_c),
            "temp_shutdown_c": float(p.shutdown_c),
            "temp_gpu_max_c": float(p.gpu_max_c),
            "temp_mem_max_c": float(p.mem_max_c),
            "power_limit_default_w": float(p.limit_default_w),
            "memory_total_bytes": int(p.memory_total_bytes),
        }
        lines.append(encode_line("gpu_info", tags, fields, start_ns[t.host]))
    return lines


def _trainer_lines(run: Probe) -> list[str]:
    lines = []
    for t in run.truths:
        tags = {"cluster": "test", "gpu": str(t.gpu), "host": t.host, "probe": PROBE_ID, "workload": WORKLOAD}
        lines.append(
            encode_line("trainer", tags, {"step": 0, "batch_size": 64, "phase": "idle"}, run.start_ns + 1_000_000)
        )
        step = 0
        t_ns = run.warmup_ns[t.host] + 500_000_000
        while t_ns < run.cooldown_ns[t.host]:
            steady = t_ns >= run.steady_ns[t.host]
            rate = t.samples_per_s if steady else 0.5 * t.samples_per_s
            step += max(1, round(rate * 0.5 / 64))
            fields = {
                "step": step,
                "samples_per_s": float(rate),
                "step_time_s": 64 / rate,
                "loss": 2.5,
                "batch_size": 64,
                "phase": "steady" if steady else "warmup",
            }
            lines.append(encode_line("trainer", tags, fields, t_ns))
            t_ns += 500_000_000
        done = {"step": step, "batch_size": 64, "phase": "cooldown"}
        lines.append(encode_line("trainer", tags, done, run.cooldown_ns[t.host] + 1_000_000))
    return lines


def _energetic_mean(levels: list[float]) -> float:
    return 10 * math.log10(sum(10 ** (x / 10) for x in levels) / len(levels))


def _mic_lines(tmp: Path, run: Probe, node_proxy: list[tuple[int, float]]) -> list[str]:
    """A real capture through ALSA's file plugin and PortAudio; the proxy level + offset, as 1 kHz tones."""
    times = np.array([t for t, _ in node_proxy], dtype=np.int64)
    levels = np.array([v for _, v in node_proxy])
    rng = np.random.default_rng(6)
    targets: list[float] = []
    ends: list[int] = []
    t0 = run.start_ns
    j = 0
    while t0 + (j + 1) * 10**9 <= run.end_ns:
        lo, hi = t0 + j * 10**9, t0 + (j + 1) * 10**9
        inside = levels[(times > lo) & (times <= hi)]
        if len(inside):
            targets.append(_energetic_mean(list(inside)) + MIC_OFFSET_DB + float(rng.normal(0.0, MIC_NOISE_DB)))
            ends.append(hi)
        j += 1
    t = np.arange(MIC_FS_HZ) / MIC_FS_HZ
    tone = np.sin(2 * np.pi * MIC_TONE_HZ * t)  # 1000 whole cycles per window
    chunks = []
    for level in targets:
        amplitude = math.sqrt(2 * 10 ** ((level - MIC_CALIBRATION_DB) / 10))
        chunks.append(np.round(amplitude * 32767 * tone).astype("<i2"))
    raw = tmp / "mic.raw"
    raw.write_bytes(np.concatenate(chunks).tobytes())
    conf = tmp / "asound.conf"
    conf.write_text(
        f"""
pcm.filemic {{
    type file
    slave.pcm "null"
    file "/dev/null"
    infile "{raw}"
    format "raw"
}}
pcm.filemic_plug {{
    type plug
    slave {{ pcm "filemic" format S16_LE rate {MIC_FS_HZ} channels 1 }}
}}
pcm.!default {{
    type asym
    playback.pcm "null"
    capture.pcm "filemic_plug"
}}
"""
    )
    captured = tmp / "captured.npy"
    code = (
        "import sys, numpy as np, sounddevice as sd\n"
        f"x = sd.rec({len(targets) * MIC_FS_HZ}, samplerate={MIC_FS_HZ}, channels=1, dtype='int16', blocking=True)\n"
        "np.save(sys.argv[1], x[:, 0])\n"
    )
    env = dict(os.environ, ALSA_CONFIG_PATH=f"/usr/share/alsa/alsa.conf:{conf}")
    subprocess.run([sys.executable, "-c", code, str(captured)], env=env, check=True, timeout=60)
    from scipy.signal import lfilter

    x = np.load(captured).astype(np.float64) / 32768.0
    alpha = math.exp(-1.0 / (MIC_FS_HZ * MIC_FAST_TAU_S))
    fast = lfilter([1 - alpha], [1, -alpha], x * x)  # 1 kHz: A-weighting is 0 dB, nothing to filter
    lines = []
    for k, end in enumerate(ends):
        window = x[k * MIC_FS_HZ : (k + 1) * MIC_FS_HZ]
        laeq = 10 * math.log10(float(np.mean(window * window))) + MIC_CALIBRATION_DB
        laf = 10 * math.log10(float(fast[(k + 1) * MIC_FS_HZ - 1])) + MIC_CALIBRATION_DB
        tags = {"cluster": "test", "host": MIC_HOST, "source": "mic"}
        lines.append(encode_line("acoustic", tags, {"laeq_db": laeq, "laf_db": laf}, end))
    return lines


def store_probe(server: InfluxDBServer, generated: GeneratedProbe) -> ProbeRun:
    """The generated probe's points in a new database of ``server``."""
    db = f"model_probe_{uuid.uuid4().hex[:8]}"
    server.create_database(db)
    for chunk in generated.chunks:
        server.write_lines(db, chunk)
    facts = {f.name: getattr(generated.probe, f.name) for f in dataclasses.fields(Probe)}
    return ProbeRun(**facts, server=server, db=db)


def generate_probe(tmp: Path) -> GeneratedProbe:
    """Runs the scenario in real time (about 45 s): the probe and its points, not yet stored."""
    hosts = list(SCENARIO)
    with ExitStack() as stack:
        machines: dict[str, SimMachine] = {h: stack.enter_context(temporary_machine(_profiles(h))) for h in hosts}
        procs: dict[str, subprocess.Popen[bytes]] = {}
        outs = {h: tmp / f"{h}.lp" for h in hosts}
        readies = {h: tmp / f"{h}.ready" for h in hosts}
        for h in hosts:
            procs[h] = subprocess.Popen(
                [sys.executable, str(HERE / "sim_reader.py"), h, str(outs[h]), str(readies[h])],
                env=machines[h].environ(),
            )
        try:
            _wait_for(list(readies.values()), 60.0, list(procs.values()))
            probe_lines = []
            start_ns = time.time_ns()
            for h in hosts:
                probe_lines.append(_probe_line(h, start_ns, "start", "idle", "running"))
            support.pass_time(IDLE_S)  # the phase's length is the workload
            load_ticks: dict[tuple[str, int], int] = {}
            warmup_ns: dict[str, int] = {}
            for h in hosts:
                config = machines[h].config()
                warmup_ns[h] = time.time_ns()
                for i, (_, _, util, _) in enumerate(SCENARIO[h]):
                    load_ticks[h, i] = config.next_tick_ns(machines[h].set_load(i, util, pid=os.getpid()))
                probe_lines.append(_probe_line(h, warmup_ns[h], "phase_change", "warmup", "running"))
            support.pass_time(WARMUP_S)  # the phase's length is the workload
            steady_ns = {}
            for h in hosts:
                steady_ns[h] = time.time_ns()
                probe_lines.append(_probe_line(h, steady_ns[h], "phase_change", "steady", "running"))
            support.pass_time(STEADY_S)  # the phase's length is the workload
            unload_ticks: dict[tuple[str, int], int] = {}
            cooldown_ns: dict[str, int] = {}
            for h in hosts:
                config = machines[h].config()
                cooldown_ns[h] = time.time_ns()
                for i in range(len(SCENARIO[h])):
                    unload_ticks[h, i] = config.next_tick_ns(machines[h].set_load(i, 0))
                probe_lines.append(_probe_line(h, cooldown_ns[h], "phase_change", "cooldown", "running"))
            support.pass_time(COOLDOWN_S)  # the phase's length is the workload
            end_ns = time.time_ns()
            for h in hosts:
                probe_lines.append(_probe_line(h, end_ns, "end", "done", "succeeded"))
            support.pass_time(0.3)  # a few readings after the end, as a real agent keeps sampling
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in procs.values():
                proc.wait(timeout=30)
        configs = {h: machines[h].config() for h in hosts}
        truths = [
            GpuTruth(
                h,
                i,
                configs[h].gpus[i].profile,
                util,
                rate,
                load_ticks[h, i],
                unload_ticks[h, i],
                configs[h].start_ns,
                configs[h].period_ns,
            )
            for h in hosts
            for i, (_, _, util, rate) in enumerate(SCENARIO[h])
        ]
    run = Probe(PROBE_ID, start_ns, warmup_ns, steady_ns, cooldown_ns, end_ns, truths)
    chunks: list[str] = []
    node_proxy: list[tuple[int, float]] = []
    gpu_lines: dict[str, list[str]] = {}
    for h in hosts:
        lines = [line for line in outs[h].read_text().splitlines() if line]
        gpu_lines[h] = [line for line in lines if line.startswith("gpu,")]
        run.line_counts[h] = len(lines)
        if h == MIC_HOST:
            for line in lines:
                if line.startswith("acoustic,") and ",gpu=" not in line:
                    _, value, t_ns = line.split(" ")
                    node_proxy.append((int(t_ns), float(value.split("=")[1])))
        chunks += ["\n".join(lines[k : k + 5000]) for k in range(0, len(lines), 5000)]
    chunks.append("".join(probe_lines))
    chunks.append("".join(_trainer_lines(run)))
    chunks.append("".join(_gpu_info_lines(run, gpu_lines, {h: configs[h].start_ns for h in hosts})))
    mic = _mic_lines(tmp, run, node_proxy)
    run.mic_windows = len(mic)
    chunks.append("".join(mic))
    return GeneratedProbe(run, chunks)


_CACHE: dict[str, Any] = {}


def shared_probe(server: InfluxDBServer, tmp_factory: Any) -> ProbeRun:
    """The session's probe: generated once per run, whichever test directory (and worker) asks first,
    and stored in this process's InfluxDB."""
    if "run" not in _CACHE:
        generated, _ = _made_once(tmp_factory, "simprobe", lambda: generate_probe(tmp_factory.mktemp("simprobe")))
        _CACHE["run"] = store_probe(server, generated)
    run: ProbeRun = _CACHE["run"]
    return run


def shared_report(run: ProbeRun, tmp_factory: Any) -> Any:
    """The model run on the session's probe (report, JSON, ``model`` points), once per run: a worker that
    did not fit it writes the fitted run's ``model`` points into its own database, the lines and the
    writer ``gpuprobe.model.run`` writes them with, instead of fitting the same data again."""
    from gpuprobe.influx.client import InfluxClient
    from gpuprobe.influx.retention import write_with_events
    from gpuprobe.model import InfluxSettings, ModelSettings
    from gpuprobe.model import run as model_run
    from gpuprobe.model.output import model_lines

    if "report" not in _CACHE:
        settings = ModelSettings(
            influx=InfluxSettings(url=run.server.url, database=run.db),
            probe=run.probe_id,
            out_dir=tmp_factory.mktemp("model-report"),
            price_per_gpu_hour=PRICE_PER_GPU_HOUR,
            pue=PUE,
            grid_kg_per_kwh=GRID_KG_PER_KWH,
        )
        report, made_here = _made_once(tmp_factory, "model-report", lambda: model_run(settings))
        if not made_here:
            with InfluxClient(settings.influx, user_agent="gpuprobe-model") as client:
                written = write_with_events(client, "".join(model_lines(report.results)))
            assert written == report.model_points_written
        _CACHE["report"] = report
    return _CACHE["report"]


T = TypeVar("T")


def _made_once(tmp_factory: Any, name: str, make: Callable[[], T]) -> tuple[T, bool]:
    """``make()`` in the first pytest process of the run that asks, read back (pickled) by the others;
    and whether this process made it.

    Under pytest-xdist each worker has its own InfluxDB, and would run the 45 s scenario and fit it
    itself; the workers' temporary directories share a parent (``--basetemp``'s, per run), so the first
    one makes it under a lock there and leaves it pickled beside the lock. Without xdist the base
    temporary directory is this process's alone."""
    root = tmp_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    saved = root / f"{name}.pickle"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed, also when make() fails
        if saved.exists():
            made: T = pickle.loads(saved.read_bytes())
            return made, False
        made = make()
        partial = saved.with_suffix(".partial")
        partial.write_bytes(pickle.dumps(made))
        partial.replace(saved)
        return made, True
