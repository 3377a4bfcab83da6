"""The agent's CPU time per GPU-sample and RSS, beside gpustat and nvitop polling the same simulated GPUs.

One run, one simulated machine (8 GPUs by default, H100 at 50 % load so values move), four processes
started together, each in the machine's environment:

- ``gpuprobe agent`` at the rate, streaming to the test receiver (``tests/agent/receiver.py``, a
  real gRPC server in its own process, not measured) with its spool on local disk: everything the
  agent does (host sensor, acoustic proxy, health reads every second (ECC, NVLink, GPM, processes)
  and the GPU events thread, batching, SQLite spool with fsync, gRPC) is in its figure;
- gpustat: ``gpustat.new_query()`` in a loop at the rate, touching every field it reports. A query
  sleeps 0.1 s per GPU (gpustat measures its processes' CPU use), so with 8 GPUs it completes only
  about 1.2 queries per second: it polls back to back and its CPU is divided by the polls it made;
- nvitop: ``nvitop.Device.all()`` once, then for every device, at the rate: utilization, memory
  utilization, memory used/total, power usage, power limit, temperature, fan speed, SM and memory
  clocks and PCIe TX/RX throughput (the agent's fields that nvitop has);
- the floor: one raw NVML call per GPU at the rate. Each first call in a new driver period makes
  the simulator bring that GPU up to date (it reads the GPU's event file), so this is what any
  NVML reader pays here before reading a single field; the table also gives every process's CPU
  above this floor.

After a warm-up, CPU time (utime + stime of the whole process, all threads, from ``/proc/PID/stat``
via psutil) and RSS (sampled every 0.5 s; peak from ``VmHWM``) are measured over the window. The
agent's GPU-samples are counted at the receiver (samples stamped inside the window); a peer's are its
completed polls in the window times the GPU count. Usage::

    python bench/agent_overhead.py [--seconds 60] [--gpus 8] [--rate-hz 10] [--warmup 5] [--health-interval 1]
                                   [--resolution auto|full] [--per-thread] [--alone] [--scrape-interval 1]
                                   [--pair [--rounds 8]] [--busy]

With ``--resolution auto`` the agent ships aggregates: each counts the samples it holds. ``--per-thread``
adds the agent's CPU per thread (by OS thread name) to the table and the JSON. ``--alone`` runs the agent
without the peers: the peers poll at 10 Hz too and evict the agent's code and data from the caches between
its ticks, which the agent pays for after every wake-up. ``--scrape-interval S`` starts the agent with
``--prometheus-listen`` and fetches its GPU page every S seconds from this process, as a Prometheus
would (the fetching is not in the agent's figure; run once with and once without to compare).

``--pair`` measures what a scrape costs the agent within one run, which two runs on shared cores cannot
resolve: two identical agents (no peers) on the same simulated GPUs, each streaming to a receiver of its
own and both serving ``--prometheus-listen``. The window is cut into ``--rounds`` rounds; in each, one of
the two is scraped every ``--scrape-interval`` (1 s unless given; a GET with the headers Prometheus 2.42
sends) and the other not, in the order A B B A A B B A ..., so that each agent is scraped in half the
rounds and a drift of the machine's load cancels. Each agent's CPU per round is read from the kernel's
per-process CPU clock (``clock_getcpuclockid``: every thread, those that ended included, in ns) and, as
a cross-check, from ``/proc/PID/stat``. The figures: the scraped and the unscraped role's CPU summed
over the rounds, their ratio (with its standard error from the rounds' paired differences) and the CPU
the scrapes added per scrape; with ``--per-thread``, that difference per thread
(``/proc/PID/task/TID/schedstat``), which shows how much of it the endpoint's own thread spends.

``--busy`` adds a busy loop (not measured) for the whole run, so the other core is saturated, and reports
how many of the agent's samples carry a timestamp on their tick (within 5 ms of the grid the agent's
stamps define) and how many ticks are missing at the receiver (with ``--resolution full``: the samples
themselves arrive).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from gpuprobe.devservices.ports import free_port
from gpuprobe.sim import state
from gpuprobe.sim.profiles import get_profile
from gpuprobe.sim.runner import temporary_machine
from gpuprobe.v1 import telemetry_pb2

REPO = Path(__file__).resolve().parent.parent
RECEIVER = REPO / "tests" / "agent" / "receiver.py"

# With --per-thread the agent runs under this wrapper: each Python thread gives its name to its OS thread
# (prctl PR_SET_NAME, 15 bytes), so /proc/PID/task/TID/stat says which thread spent the CPU. Python 3.11
# does not name OS threads itself; the cost is one prctl per thread start.
NAMED_THREADS = """
import ctypes, sys, threading
_libc = ctypes.CDLL(None, use_errno=True)
def _name_os_thread(name):
    _libc.prctl(15, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
_inner = threading.Thread._bootstrap_inner
def _named(self):
    _name_os_thread(self.name)
    _inner(self)
threading.Thread._bootstrap_inner = _named
_name_os_thread("main")
from gpuprobe.app.cli import main
sys.argv[0] = "gpuprobe"
sys.exit(main())
"""

# A peer polls at the rate on a drift-free schedule (back to back when a poll takes longer than the
# period) for DURATION seconds and prints the wall time of every completed poll.
PEER_LOOP = """
import json, sys, time
RATE, DURATION = float(sys.argv[1]), float(sys.argv[2])
{setup}
period = 1.0 / RATE
start = time.monotonic()
stamps = []
n = 0
while time.monotonic() - start < DURATION:
    delay = start + n * period - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    else:
        n = int((time.monotonic() - start) / period)  # behind: poll now, do not try to catch up
    {poll}
    stamps.append(time.time())
    n += 1
print(json.dumps(stamps))
"""

GPUSTAT_SETUP = "import gpustat"
GPUSTAT_POLL = textwrap.dedent(
    """\
    q = gpustat.new_query()
        for g in q:
            (g.utilization, g.memory_used, g.memory_total, g.temperature, g.fan_speed, g.power_draw, g.power_limit)
    """
)
# The floor: what any NVML reader pays here per GPU and tick (one call, which makes the simulator
# bring that GPU up to date) plus a 10 Hz Python loop.
FLOOR_SETUP = (
    "import ctypes, pynvml\npynvml.nvmlInit()\n"
    "handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]\n"
    "fn = pynvml._nvmlGetFunctionPointer('nvmlDeviceGetPowerUsage')\nmw = ctypes.c_uint()\nref = ctypes.byref(mw)"
)
FLOOR_POLL = "for h in handles:\n        fn(h, ref)\n"
NVITOP_SETUP = "from nvitop import Device\ndevices = Device.all()"
NVITOP_POLL = textwrap.dedent(
    """\
    for d in devices:
            (d.gpu_utilization(), d.memory_utilization(), d.memory_used(), d.memory_total(), d.power_usage(),
             d.power_limit(), d.temperature(), d.fan_speed(), d.sm_clock(), d.memory_clock(),
             d.pcie_tx_throughput(), d.pcie_rx_throughput())
    """
)


@dataclass
class Measured:
    name: str
    proc: subprocess.Popen[bytes]
    cpu_start_s: float = 0.0
    cpu_end_s: float = 0.0
    rss_bytes: list[int] = field(default_factory=list)
    peak_rss_bytes: int = 0
    gpu_samples: int = 0
    thread_cpu_start_s: dict[str, float] = field(default_factory=dict)
    thread_cpu_end_s: dict[str, float] = field(default_factory=dict)

    def thread_cpu_s(self) -> dict[str, float]:
        """CPU time (utime + stime) per OS thread name, threads of one name summed (gRPC's pollers)."""
        tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
        out: dict[str, float] = {}
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            try:
                stat = (task / "stat").read_text()
            except OSError:
                continue  # the thread ended
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2 :].split()
            out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) * tick_s
        return out

    def cpu_s(self) -> float:
        times = psutil.Process(self.proc.pid).cpu_times()
        return float(times.user + times.system)

    def sample_rss(self) -> None:
        self.rss_bytes.append(psutil.Process(self.proc.pid).memory_info().rss)

    def read_peak(self) -> None:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                self.peak_rss_bytes = int(line.split()[1]) * 1024


def received_gpu_samples(path: Path, t0_ns: int, t1_ns: int) -> int:
    data = path.read_bytes() if path.exists() else b""
    seen: set[tuple[int, int]] = set()
    aggregated: dict[tuple[int, int], int] = {}
    i = 0
    while i + 4 <= len(data):
        (n,) = struct.unpack(">I", data[i : i + 4])
        batch = telemetry_pb2.StreamRequest.FromString(data[i + 4 : i + 4 + n]).batch
        seen.update((s.gpu_index, s.time_unix_ns) for s in batch.gpu_samples if t0_ns <= s.time_unix_ns < t1_ns)
        # with --resolution auto the samples arrive as aggregates: each counts the samples it holds
        for a in getattr(batch, "gpu_aggregates", ()):
            if t0_ns <= a.start_unix_ns < t1_ns:
                aggregated[(a.gpu_index, a.start_unix_ns)] = a.sample_count
        i += 4 + n
    return len(seen) + sum(aggregated.values())


ON_TICK_NS = 5_000_000


def tick_report(path: Path, t0_ns: int, t1_ns: int, interval_ns: int) -> dict[str, Any]:
    """The agent's raw GPU samples stamped in the window: how many, how many within ON_TICK_NS of their tick,
    and how many ticks of each GPU are missing between its first and last sample. The grid is the agent's
    own (monotonic, started at some wall-clock phase): each stamp's offset from the first stamp modulo the
    interval, measured from the smallest such offset (the stamps of ticks that woke on time)."""
    data = path.read_bytes() if path.exists() else b""
    stamps: dict[int, set[int]] = {}
    i = 0
    while i + 4 <= len(data):
        (n,) = struct.unpack(">I", data[i : i + 4])
        batch = telemetry_pb2.StreamRequest.FromString(data[i + 4 : i + 4 + n]).batch
        for sample in batch.gpu_samples:
            if t0_ns <= sample.time_unix_ns < t1_ns:
                stamps.setdefault(sample.gpu_index, set()).add(sample.time_unix_ns)
        i += 4 + n
    every = sorted(t for ts in stamps.values() for t in ts)
    if not every:
        return {"samples": 0, "on_tick": 0, "on_tick_fraction": 0.0, "missing_ticks": 0}
    ref = every[0]

    def offset(t: int) -> int:
        d = (t - ref) % interval_ns
        return d if d < interval_ns // 2 else d - interval_ns

    base = min(offset(t) for t in every)
    on_tick = sum(1 for t in every if offset(t) - base <= ON_TICK_NS)
    missing = 0
    for ts in stamps.values():
        ticks = sorted({round((t - ref - base) / interval_ns) for t in ts})
        missing += ticks[-1] - ticks[0] + 1 - len(ticks)
    late_ms = sorted((offset(t) - base) / 1e6 for t in every)

    return {
        "samples": len(every),
        "on_tick": on_tick,
        "on_tick_fraction": on_tick / len(every),
        "missing_ticks": missing,
        "late_ms_p50": late_ms[len(late_ms) // 2],
        "late_ms_p999": late_ms[min(len(late_ms) - 1, int(len(late_ms) * 0.999))],
        "late_ms_max": late_ms[-1],
    }


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="measured window (s)")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds before the window opens")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--rate-hz", type=float, default=10.0)
    parser.add_argument("--profile", default="H100-SXM5-80GB")
    parser.add_argument(
        "--health-interval", type=float, default=1.0, help="the agent's --health-interval (s; 0: no health reads)"
    )
    parser.add_argument(
        "--resolution", choices=("auto", "full"), help="the agent's --resolution (default: the agent's default)"
    )
    parser.add_argument(
        "--per-thread",
        action="store_true",
        help="also give the agent's CPU per thread (the agent runs under a wrapper that names its OS threads)",
    )
    parser.add_argument(
        "--alone",
        action="store_true",
        help="run the agent without the peers (its figure without their competition for the CPUs and caches)",
    )
    parser.add_argument(
        "--scrape-interval",
        type=float,
        default=0.0,
        help="fetch the agent's --prometheus-listen page this often (s; 0: no page, no scrapes)",
    )
    parser.add_argument(
        "--pair",
        action="store_true",
        help="two identical agents (no peers), both serving the page; in each round one is scraped every"
        " --scrape-interval (1 s unless given), the other not: their CPU and its ratio",
    )
    parser.add_argument("--rounds", type=int, default=8, help="with --pair: rounds in the window (A B B A ...)")
    parser.add_argument(
        "--busy",
        action="store_true",
        help="saturate the other core with a busy loop for the whole run; report the samples on their tick",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if args.pair and args.scrape_interval <= 0:
        args.scrape_interval = 1.0
    args.prometheus_port = free_port() if args.scrape_interval > 0 and not args.pair else None

    with temporary_machine([get_profile(args.profile)] * args.gpus) as sim, tempfile.TemporaryDirectory() as tmp:
        for i in range(args.gpus):
            state.set_load(sim.state_dir, i, 50)
        env = sim.environ()
        env.pop("NOTIFY_SOCKET", None)
        out = Path(tmp)
        if args.pair:
            figures = run_pair(args, env, out)
            if args.json:
                args.json.write_text(json.dumps(figures, indent=2))
            return 0
        port = free_port()
        receiver = subprocess.Popen(
            [sys.executable, str(RECEIVER), "--port", str(port), "--out", str(out / "rx")], stdout=subprocess.PIPE
        )
        assert receiver.stdout is not None and receiver.stdout.readline().startswith(b"READY")
        total_s = args.warmup + args.seconds + 2
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
        procs = start_processes(args, env, out, port, total_s)
        try:
            window_s = measure(procs, args, out / "rx" / "batches.bin", total_s)
            interval_ns = round(1e9 / args.rate_hz)
            ticks = tick_report(out / "rx" / "batches.bin", *args.window_ns, interval_ns) if args.busy else None
        finally:
            for p in procs:
                if p.proc.poll() is None:
                    p.proc.kill()
            if busy is not None:
                busy.kill()
                busy.wait()
            receiver.terminate()
            receiver.wait(10)
    rows = report(procs, args, window_s)
    if ticks is not None:
        print(
            f"with the other core busy: {ticks['on_tick']} of {ticks['samples']} samples"
            f" ({100 * ticks['on_tick_fraction']:.2f} %) within {ON_TICK_NS / 1e6:g} ms of their tick;"
            f" {ticks['missing_ticks']} ticks missing; lateness p50 {ticks.get('late_ms_p50', 0):.2f} ms,"
            f" p99.9 {ticks.get('late_ms_p999', 0):.2f} ms, max {ticks.get('late_ms_max', 0):.2f} ms"
        )
    if args.json:
        args.json.write_text(json.dumps({"window_s": window_s, "rows": rows, "ticks": ticks}, indent=2))
    return 0


def agent_process(
    args: argparse.Namespace, env: dict[str, str], out: Path, name: str, port: int, prometheus_port: int | None
) -> Measured:
    """``gpuprobe agent`` streaming to the receiver on ``port``, its spool and log under ``out``."""
    gpuprobe = Path(sys.executable).parent / "gpuprobe"
    command = [sys.executable, "-c", NAMED_THREADS] if args.per_thread else [str(gpuprobe)]
    resolution = ["--resolution", args.resolution] if args.resolution else []
    out.mkdir(parents=True, exist_ok=True)
    agent_log = open(out / "agent.log", "wb")  # noqa: SIM115 - owned by the process
    return Measured(
        name,
        subprocess.Popen(
            [
                *command,
                "--log-level",
                "warning",
                "agent",
                "--collector",
                f"127.0.0.1:{port}",
                "--spool",
                str(out / "spool"),
                "--interval",
                str(1 / args.rate_hz),
                "--health-interval",  # 1 s (the default): the health reads are part of the figure
                f"{args.health_interval:g}",
                *resolution,
                *(["--prometheus-listen", f"127.0.0.1:{prometheus_port}"] if prometheus_port else []),
            ],
            env=env,
            stdout=agent_log,
            stderr=subprocess.STDOUT,
        ),
    )


def start_processes(
    args: argparse.Namespace, env: dict[str, str], out: Path, port: int, total_s: float
) -> list[Measured]:
    """The agent (streaming to the receiver on ``port``) and the peers, all reading the same GPUs."""
    procs = [agent_process(args, env, out, "gpuprobe agent", port, args.prometheus_port)]
    peers = (
        ("gpustat", GPUSTAT_SETUP, GPUSTAT_POLL),
        ("nvitop", NVITOP_SETUP, NVITOP_POLL),
        ("floor: 1 call/GPU", FLOOR_SETUP, FLOOR_POLL),
    )
    for name, setup, poll in () if args.alone else peers:
        code = PEER_LOOP.format(setup=setup, poll=poll)
        procs.append(
            Measured(
                name,
                subprocess.Popen(
                    [sys.executable, "-c", code, str(args.rate_hz), str(total_s)], env=env, stdout=subprocess.PIPE
                ),
            )
        )
    return procs


# What Prometheus 2.42 sends with every scrape (its scrape loop's request); the agent answers the text format.
PROMETHEUS_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
    "User-Agent": "Prometheus/2.42.0",
    "X-Prometheus-Scrape-Timeout-Seconds": "10",
}


def fetch(port: int) -> bool:
    """One scrape of the agent's page on ``port`` as Prometheus makes it; False while it does not answer."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=PROMETHEUS_HEADERS)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            response.read()
    except (OSError, urllib.error.URLError):  # not listening yet
        return False
    return True


def scrape(port: int, interval_s: float, total_s: float) -> None:
    """Fetch the agent's GPU page every ``interval_s`` (as a Prometheus scrape job would)."""
    end = time.monotonic() + total_s
    next_s = time.monotonic()
    while time.monotonic() < end:
        fetch(port)
        next_s += interval_s
        time.sleep(max(0.0, next_s - time.monotonic()))


def measure(procs: list[Measured], args: argparse.Namespace, received: Path, total_s: float) -> float:
    """CPU and RSS of every process over the window, and the GPU-samples each took; the window in s."""
    if args.prometheus_port:
        threading.Thread(target=scrape, args=(args.prometheus_port, args.scrape_interval, total_s), daemon=True).start()
    time.sleep(args.warmup)
    t0_ns = time.time_ns()
    for p in procs:
        p.cpu_start_s = p.cpu_s()
    if args.per_thread:
        procs[0].thread_cpu_start_s = procs[0].thread_cpu_s()
    window_end = time.monotonic() + args.seconds
    while time.monotonic() < window_end:
        for p in procs:
            p.sample_rss()
        time.sleep(0.5)
    for p in procs:
        p.cpu_end_s = p.cpu_s()
        p.read_peak()
    if args.per_thread:
        procs[0].thread_cpu_end_s = procs[0].thread_cpu_s()
    t1_ns = time.time_ns()
    agent = procs[0]
    agent.proc.terminate()
    agent.proc.wait(60)
    agent.gpu_samples = received_gpu_samples(received, t0_ns, t1_ns)
    args.window_ns = (t0_ns, t1_ns)  # for tick_report
    for p in procs[1:]:
        stdout, _ = p.proc.communicate(timeout=total_s + 60)
        stamps = json.loads(stdout)
        p.gpu_samples = args.gpus * sum(1 for s in stamps if t0_ns / 1e9 <= s < t1_ns / 1e9)
    return (t1_ns - t0_ns) / 1e9


def report(procs: list[Measured], args: argparse.Namespace, window_s: float) -> list[dict[str, Any]]:
    """Prints the table; the rows, with the ratios against the agent."""
    rows: list[dict[str, Any]] = []
    for p in procs:
        cpu = p.cpu_end_s - p.cpu_start_s
        rows.append(
            {
                "name": p.name,
                "cpu_s": cpu,
                "core_pct": 100 * cpu / window_s,
                "gpu_samples": p.gpu_samples,
                "cpu_us_per_gpu_sample": 1e6 * cpu / p.gpu_samples if p.gpu_samples else float("nan"),
                "rss_steady_mib": statistics.median(p.rss_bytes) / 2**20,
                "rss_peak_mib": p.peak_rss_bytes / 2**20,
            }
        )
    agent_row = rows[0]
    print(
        f"{args.gpus} simulated {args.profile} GPUs at {args.rate_hz:g} Hz, {window_s:.1f} s window "
        f"after {args.warmup:g} s warm-up; {os.cpu_count()} CPUs (shared)"
    )
    floor_us = rows[-1]["cpu_us_per_gpu_sample"] if len(rows) > 1 else 0.0  # --alone: no floor measured
    print(
        f"{'process':<18} {'CPU s':>6} {'% core':>7} {'GPU-samples':>11} {'CPU µs/GPU-sample':>17}"
        f" {'above floor':>11} {'RSS MiB median':>14} {'peak':>6} {'ratio':>6} {'ratio above floor':>17}"
    )
    for r in rows:
        ratio = r["cpu_us_per_gpu_sample"] / agent_row["cpu_us_per_gpu_sample"]
        above = r["cpu_us_per_gpu_sample"] - floor_us
        ratio_above = above / (agent_row["cpu_us_per_gpu_sample"] - floor_us) if floor_us else float("nan")
        r.update(ratio_vs_agent=ratio, above_floor_us=above, ratio_above_floor=ratio_above)
        print(
            f"{r['name']:<18} {r['cpu_s']:>6.2f} {r['core_pct']:>7.2f} {r['gpu_samples']:>11d}"
            f" {r['cpu_us_per_gpu_sample']:>17.1f} {above:>11.1f} {r['rss_steady_mib']:>14.1f}"
            f" {r['rss_peak_mib']:>6.1f} {ratio:>5.1f}x {ratio_above:>16.1f}x"
        )
    print(
        "targets (docs/architecture.md): agent < 0.5 % of one core and < 64 MiB RSS;"
        " peers' CPU per GPU-sample >= 5x the agent's"
    )
    agent = procs[0]
    if agent.thread_cpu_end_s:
        threads = {name: end - agent.thread_cpu_start_s.get(name, 0.0) for name, end in agent.thread_cpu_end_s.items()}
        agent_row["threads_core_pct"] = {name: 100 * cpu / window_s for name, cpu in threads.items()}
        print("agent per thread (% of one core; /proc tick resolution, 10 ms):")
        for name, pct in sorted(agent_row["threads_core_pct"].items(), key=lambda kv: -kv[1]):
            print(f"  {name:<16} {pct:>6.3f}")
    return rows


def process_cpu_ns(pid: int) -> int:
    """CPU time of the whole process ``pid`` in ns (the kernel's per-process CPU clock: all threads, those
    that ended included, at ns resolution instead of ``/proc/PID/stat``'s 10 ms ticks)."""
    clock = ctypes.c_int()
    if _libc.clock_getcpuclockid(pid, ctypes.byref(clock)) != 0:
        raise OSError(ctypes.get_errno(), f"clock_getcpuclockid({pid})")
    return time.clock_gettime_ns(clock.value)


_libc = ctypes.CDLL(None, use_errno=True)


@dataclass
class PairRound:
    scraped: int  # which agent (0 or 1) was scraped in this round
    seconds: float
    scrapes: int
    cpu_ns: tuple[int, int]  # each agent's CPU in the round (process CPU clock)
    proc_cpu_s: tuple[float, float]  # the same from /proc/PID/stat (10 ms ticks), as a cross-check
    thread_cpu_ns: tuple[dict[str, int], dict[str, int]]  # with --per-thread: by thread name (else empty)


def thread_cpu_ns(pid: int) -> dict[str, int]:
    """CPU time in ns per OS thread name (``/proc/PID/task/TID/schedstat``; threads of one name summed)."""
    out: dict[str, int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
            ns = int((task / "schedstat").read_text().split()[0])
        except OSError:
            continue  # the thread ended
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        out[name] = out.get(name, 0) + ns
    return out


def thread_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {name: ns - before.get(name, 0) for name, ns in after.items()}


def run_pair(args: argparse.Namespace, env: dict[str, str], out: Path) -> dict[str, Any]:
    """Two identical agents on the same GPUs, each streaming to a receiver of its own, both serving
    ``--prometheus-listen``; in each round one of them is scraped every ``--scrape-interval``, in the order
    A B B A A B B A ... so that each agent is scraped in half the rounds and a drift of the machine's load
    cancels. The figures: each role's CPU summed over the rounds and their ratio."""
    receivers: list[subprocess.Popen[bytes]] = []
    agents: list[Measured] = []
    ports: list[int] = []
    try:
        for name in ("agent A", "agent B"):
            home = out / name.replace(" ", "_")
            port = free_port()
            receiver = subprocess.Popen(
                [sys.executable, str(RECEIVER), "--port", str(port), "--out", str(home / "rx")], stdout=subprocess.PIPE
            )
            receivers.append(receiver)
            assert receiver.stdout is not None and receiver.stdout.readline().startswith(b"READY")
            ports.append(free_port())
            agents.append(agent_process(args, env, home, name, port, ports[-1]))
        # Warm-up: both are scraped, so that the first page's one-off costs fall outside the window.
        warm_end = time.monotonic() + args.warmup
        answered = [False, False]
        while time.monotonic() < warm_end or not all(answered):
            if time.monotonic() > warm_end + 60:
                raise RuntimeError(f"an agent's page did not answer: {answered}")
            answered = [fetch(port) or done for port, done in zip(ports, answered, strict=True)]
            time.sleep(args.scrape_interval)
        rounds: list[PairRound] = []
        round_s = args.seconds / args.rounds
        for k in range(args.rounds):
            scraped = (k + k // 2) % 2  # A B B A A B B A ...
            cpu0 = [process_cpu_ns(a.proc.pid) for a in agents]
            proc0 = [a.cpu_s() for a in agents]
            threads0 = [thread_cpu_ns(a.proc.pid) for a in agents] if args.per_thread else [{}, {}]
            start = time.monotonic()
            end = start + round_s
            scrapes = 0
            next_s = start
            while next_s < end:
                time.sleep(max(0.0, next_s - time.monotonic()))
                scrapes += fetch(ports[scraped])
                next_s += args.scrape_interval
            time.sleep(max(0.0, end - time.monotonic()))
            cpu1 = [process_cpu_ns(a.proc.pid) for a in agents]
            proc1 = [a.cpu_s() for a in agents]
            threads1 = [thread_cpu_ns(a.proc.pid) for a in agents] if args.per_thread else [{}, {}]
            rounds.append(
                PairRound(
                    scraped,
                    time.monotonic() - start,
                    scrapes,
                    (cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]),
                    (proc1[0] - proc0[0], proc1[1] - proc0[1]),
                    (thread_delta(threads0[0], threads1[0]), thread_delta(threads0[1], threads1[1])),
                )
            )
            r = rounds[-1]
            print(
                f"round {k + 1:>2}: {'AB'[scraped]} scraped {r.scrapes:>3}x in {r.seconds:5.1f} s;"
                f" CPU A {r.cpu_ns[0] / 1e6:7.1f} ms, B {r.cpu_ns[1] / 1e6:7.1f} ms",
                flush=True,
            )
        for agent in agents:
            if agent.proc.poll() is not None:
                raise RuntimeError(f"{agent.name} exited early: see its agent.log")
    finally:
        for p in [a.proc for a in agents] + receivers:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
    return pair_figures(rounds, args)


def pair_figures(rounds: list[PairRound], args: argparse.Namespace) -> dict[str, Any]:
    """Prints and returns the scraped and unscraped CPU, their ratio and the CPU per scrape."""
    window_s = sum(r.seconds for r in rounds)
    scraped_ns = sum(r.cpu_ns[r.scraped] for r in rounds)
    unscraped_ns = sum(r.cpu_ns[1 - r.scraped] for r in rounds)
    scrapes = sum(r.scrapes for r in rounds)
    # each round is a paired comparison (same seconds, same load on the machine): its spread gives the error
    diffs_ns = [r.cpu_ns[r.scraped] - r.cpu_ns[1 - r.scraped] for r in rounds]
    stderr_ns = statistics.stdev(diffs_ns) / len(diffs_ns) ** 0.5 * len(diffs_ns) if len(diffs_ns) > 1 else 0.0
    per_agent = []
    for i, name in enumerate(("A", "B")):
        on = [r for r in rounds if r.scraped == i]
        off = [r for r in rounds if r.scraped != i]
        on_pct = 100 * sum(r.cpu_ns[i] for r in on) / 1e9 / sum(r.seconds for r in on) if on else float("nan")
        off_pct = 100 * sum(r.cpu_ns[i] for r in off) / 1e9 / sum(r.seconds for r in off) if off else float("nan")
        per_agent.append({"agent": name, "scraped_core_pct": on_pct, "unscraped_core_pct": off_pct})
    proc_scraped = sum(r.proc_cpu_s[r.scraped] for r in rounds)
    proc_unscraped = sum(r.proc_cpu_s[1 - r.scraped] for r in rounds)
    threads: dict[str, float] = {}  # per thread name: its CPU when scraped minus when not, µs per scrape
    if args.per_thread and scrapes:
        names = {name for r in rounds for d in r.thread_cpu_ns for name in d}
        for name in names:
            on = sum(r.thread_cpu_ns[r.scraped].get(name, 0) for r in rounds)
            off = sum(r.thread_cpu_ns[1 - r.scraped].get(name, 0) for r in rounds)
            threads[name] = (on - off) / 1e3 / scrapes
    figures: dict[str, Any] = {
        "gpus": args.gpus,
        "rate_hz": args.rate_hz,
        "health_interval_s": args.health_interval,
        "scrape_interval_s": args.scrape_interval,
        "rounds": len(rounds),
        "window_s": window_s,
        "scrapes": scrapes,
        "scraped_cpu_s": scraped_ns / 1e9,
        "unscraped_cpu_s": unscraped_ns / 1e9,
        "scraped_core_pct": 100 * scraped_ns / 1e9 / window_s,
        "unscraped_core_pct": 100 * unscraped_ns / 1e9 / window_s,
        "ratio": scraped_ns / unscraped_ns,
        "overhead_pct": 100 * (scraped_ns / unscraped_ns - 1),
        "overhead_pct_stderr": 100 * stderr_ns / unscraped_ns,
        "cpu_us_per_scrape": (scraped_ns - unscraped_ns) / 1e3 / scrapes if scrapes else float("nan"),
        "cpu_us_per_scrape_stderr": stderr_ns / 1e3 / scrapes if scrapes else float("nan"),
        "proc_stat_ratio": proc_scraped / proc_unscraped if proc_unscraped else float("nan"),
        "per_agent": per_agent,
        "threads_us_per_scrape": threads,
        "load_average_1m_end": os.getloadavg()[0],
        "cpus": os.cpu_count(),
        "round_cpu_ms": [[r.scraped, round(r.cpu_ns[0] / 1e6, 1), round(r.cpu_ns[1] / 1e6, 1)] for r in rounds],
    }
    print(
        f"{args.gpus} simulated {args.profile} GPUs at {args.rate_hz:g} Hz, health every {args.health_interval:g} s;"
        f" two agents, {len(rounds)} rounds, {window_s:.1f} s; {os.cpu_count()} CPUs (shared),"
        f" load average {figures['load_average_1m_end']:.2f}"
    )
    print(
        f"scraped every {args.scrape_interval:g} s: {figures['scraped_core_pct']:.3f} % of a core;"
        f" not scraped: {figures['unscraped_core_pct']:.3f} %"
    )
    print(
        f"ratio {figures['ratio']:.4f}: the scrapes add {figures['overhead_pct']:.2f} %"
        f" ± {figures['overhead_pct_stderr']:.2f} % (standard error over the rounds);"
        f" {figures['cpu_us_per_scrape']:.0f} ± {figures['cpu_us_per_scrape_stderr']:.0f} µs of the agent's CPU"
        f" per scrape ({scrapes} scrapes); /proc/PID/stat ratio {figures['proc_stat_ratio']:.4f}"
    )
    for a in per_agent:
        print(
            f"  agent {a['agent']}: {a['scraped_core_pct']:.3f} % of a core when scraped,"
            f" {a['unscraped_core_pct']:.3f} % when not"
        )
    if threads:
        print("the scraped agent's CPU minus the other's, per thread, µs per scrape (/proc/PID/task/TID/schedstat):")
        for name, us in sorted(threads.items(), key=lambda kv: -abs(kv[1])):
            print(f"  {name:<20} {us:>8.1f}")
    print("target (issue 26): the scrapes add under 5 %")
    return figures


if __name__ == "__main__":
    sys.exit(main())
