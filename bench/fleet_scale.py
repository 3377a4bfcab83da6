"""Fleet-scale collector benchmark: many synthetic agents on two collectors, one of them killed.

    python bench/fleet_scale.py [--agents 2000] [--fast-share 0.1] [--json out.json]

Starts a fresh InfluxDB (Debian's 1.6, own data directory, ``gpuprobe.devservices``) and two
``gpuprobe collector`` processes (plaintext on 127.0.0.1, free ports): A with ``--ack-after sink``
(it holds nothing an agent does not also hold, so killing it strands nothing) and B with the default
``--ack-after wal``. The synthetic agents (``gpuprobe.app.loadgen.SyntheticAgent``, real gRPC
clients, in this process) get both addresses and start at the one the agent's SHA-256 hash of their
id picks, failing over in order, as ``gpuprobe agent --collector a,b`` does.

Every agent has ``--gpus`` GPUs and sends one batch every ``--flush-s`` (the agent's
``--flush-interval``, 1 s by default): most sample at 1 Hz (at 1 s, a batch of one sample per GPU),
``--fast-share`` of them at 10 Hz (ten per GPU). With ``--aggregates`` the 1 Hz agents send instead,
as agents outside probes do, one 1 s ``GpuAggregate`` per GPU per second (of ten readings; one
point each, counted as one sample). Agents are spread evenly over the period. Batches
are made from one template per agent (values from ``SampleFactory``) with fresh, never repeating
timestamps, so generating them costs little.

Phases: connect (agents started over ``--ramp-s``), warm-up, a **steady window** (``--steady-s``)
that gives the figures, an optional py-spy profile of both collectors (``--profile-s``, not counted
in the figures), then collector A is killed with SIGKILL; the run goes on for ``--after-kill-s``,
the agents stop producing and wait for every batch to be acked, and InfluxDB is queried until it
holds the samples. Figures:

- streams held per collector (``gpuprobe_collector_streams_open`` from its metrics endpoint);
- collector RSS (``/proc/PID/status``, median over the window) and RSS per stream (above the RSS
  measured before any agent connected);
- collector CPU per sample: utime + stime of both collectors (``/proc/PID/stat``) over the window
  divided by the samples they received in it (``gpuprobe_collector_samples_received``), per batch,
  per thread, batches per WAL commit and InfluxDB writes per second; InfluxDB's and this process's
  (the load generator's) CPU over the same window;
- ack latency p50 / p99 / max, from a batch being put in the agent's spool to its ack, per collector;
- after the kill: how long until every agent that was on A had a ``Welcome`` from B;
- InfluxDB holds every sample exactly once: points per (host, gpu) series equal what was acked;
- first, how fast the shared cores are now: the encoder alone (``encode_rate`` of
  bench/collector_throughput.py, 402 000 samples/s per core on a quiet machine; ``--no-calibrate``).

Exits 1 if a check fails: an agent did not move within ``--move-limit-s``, a batch was never acked,
or InfluxDB's counts differ.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuprobe.agent.uplink import first_choice
from gpuprobe.app.loadgen import AgentSpec, SampleFactory, SyntheticAgent
from gpuprobe.devservices import InfluxDBServer
from gpuprobe.devservices.ports import LOOPBACK, free_ports, port_accepts
from gpuprobe.v1 import telemetry_pb2

NS = 1_000_000_000
DB = "fleet"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- processes -------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """utime + stime of each thread of ``pid``, by thread id."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            out[int(task.name)] = cpu_seconds_of(task / "stat")
    return out


def cpu_seconds_of(stat: Path) -> float:
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


@dataclass
class Collector:
    name: str
    port: int
    metrics_port: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    idle_rss_mib: float = 0.0

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def metrics(self) -> dict[str, float]:
        """The metrics without labels, by name (counters with their ``_total`` suffix)."""
        with urllib.request.urlopen(f"http://{LOOPBACK}:{self.metrics_port}/metrics", timeout=10) as response:
            text = response.read().decode()
        values: dict[str, float] = {}
        for line in text.splitlines():
            match = re.match(r"^(gpuprobe_collector_\w+)(?:\{.*\})? (\S+)$", line)
            if match:  # labelled series are summed
                values[match[1]] = values.get(match[1], 0.0) + float(match[2])
        return values

    def streams(self) -> int:
        return int(self.metrics().get("gpuprobe_collector_streams_open", 0))

    def counters(self) -> tuple[float, float, float, float]:
        """Samples and batches received, WAL commits, write requests to InfluxDB."""
        m = self.metrics()
        return (
            m.get("gpuprobe_collector_samples_received_total", 0.0),
            m.get("gpuprobe_collector_batches_received_total", 0.0),
            m.get("gpuprobe_collector_wal_commit_seconds_count", 0.0),
            m.get("gpuprobe_collector_write_requests_total", 0.0),
        )


def start_collector(
    name: str, influx: InfluxDBServer, wal: Path, ack_after: str, extra: list[str], python: str = sys.executable
) -> Collector:
    """The ``gpuprobe collector`` beside ``python`` (another interpreter: another checkout's collector,
    whose package may be laid out differently; its console script is the stable entry point)."""
    port, metrics_port = free_ports(2)
    log_path = wal.parent / f"{name}.log"
    script = Path(python).with_name("gpuprobe")
    command = [str(script)] if script.exists() else [python, "-m", "gpuprobe.app"]
    argv = [
        *command, "--log-level", "warning", "collector", "--insecure",
        "--listen", f"{LOOPBACK}:{port}", "--metrics-listen", f"{LOOPBACK}:{metrics_port}",
        "--collector-id", name, "--influx-url", influx.url, "--influx-db", DB, "--influx-create-db",
        "--wal", str(wal), "--ack-after", ack_after, *extra,
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log_path.open("wb"))
    deadline = time.monotonic() + 60
    while not (port_accepts(LOOPBACK, port) and port_accepts(LOOPBACK, metrics_port)):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"collector {name} did not start: {log_path.read_text()[-2000:]}")
        time.sleep(0.05)
    return Collector(name, port, metrics_port, proc, log_path)


# --- the fleet -------------------------------------------------------------------------------------


@dataclass
class FleetAgent:
    agent: SyntheticAgent
    template: telemetry_pb2.SampleBatch
    rate_hz: int  # samples per GPU per second: 1 or 10
    period_s: float  # one batch every period (the agent's --flush-interval)
    phase_s: float  # when in each period it sends
    t0_ns: int = 0
    batches: int = 0  # batches enqueued
    sent_at: deque[tuple[int, float]] = field(default_factory=deque)  # (seq, perf_counter) not yet acked

    @property
    def samples_per_batch(self) -> int:
        """GPU samples and aggregates (one point each) in a batch."""
        return len(self.template.gpu_samples) + len(self.template.gpu_aggregates)

    @property
    def per_gpu(self) -> int:
        """Samples per GPU in a batch."""
        return self.samples_per_batch // int(self.agent.spec.gpus)

    def next_batch(self) -> telemetry_pb2.SampleBatch:
        """The template with the timestamps of batch number ``self.batches`` (one period each)."""
        step = NS // self.rate_hz
        base = self.t0_ns + self.batches * round(self.period_s * NS)
        for k, sample in enumerate(self.template.gpu_samples):
            sample.time_unix_ns = base + (k // self.agent.spec.gpus) * step + sample.gpu_index
        # aggregates start on whole seconds (1 s intervals); periods are whole seconds with --aggregates
        for k, aggregate in enumerate(self.template.gpu_aggregates):
            aggregate.start_unix_ns = base // NS * NS + (k // self.agent.spec.gpus) * NS
        self.template.created_unix_ns = time.time_ns()
        self.batches += 1
        return self.template


@dataclass
class Acks:
    """Every ack as it arrives: (perf_counter, latency s, samples, collector address)."""

    records: list[tuple[float, float, int, str]] = field(default_factory=list)

    def window(self, start: float, end: float) -> list[tuple[float, float, int, str]]:
        return [r for r in self.records if start <= r[0] < end]


def make_fleet(args: argparse.Namespace, addresses: list[str], acks: Acks, cluster: str) -> list[FleetAgent]:
    fleet: list[FleetAgent] = []
    fast_every = round(1 / args.fast_share) if args.fast_share > 0 else 0
    by_agent: dict[str, FleetAgent] = {}

    def on_ack(agent: SyntheticAgent, durable: int) -> None:
        now = time.perf_counter()
        member = by_agent[agent.spec.id]
        while member.sent_at and member.sent_at[0][0] <= durable:
            _, sent = member.sent_at.popleft()
            acks.records.append((now, now - sent, member.samples_per_batch, agent.target))

    for i in range(args.agents):
        fast = fast_every > 0 and (i % fast_every == fast_every - 1 or args.fast_share >= 1)
        spec = AgentSpec(f"fleet-{i:05d}", gpus=args.gpus, cluster=cluster)
        rate = 10 if fast else 1
        per_gpu = max(1, round(rate * args.flush_s))
        factory = SampleFactory(spec, seed=i)
        if args.aggregates and not fast:
            # as an agent outside probes sends: one 1 s aggregate of 10 readings per GPU per second
            template = factory.aggregate_batch(seconds=round(args.flush_s))
        else:
            template = factory.batch(samples_per_gpu=per_gpu, interval_s=1 / rate)
        agent = SyntheticAgent(addresses, spec, window=args.window, on_ack=on_ack, reconnect_max_s=1.0)
        member = FleetAgent(agent, template, rate, args.flush_s, phase_s=(i * 0.618034) % 1.0 * args.flush_s)
        by_agent[spec.id] = member
        fleet.append(member)
    return fleet


async def produce(fleet: list[FleetAgent], stop: asyncio.Event, tick_s: float = 0.02) -> float:
    """Enqueues each agent's batch once a period at its phase; returns the worst lag seen (s)."""
    order = sorted(fleet, key=lambda m: m.phase_s)
    period = order[0].period_s
    start = time.monotonic()
    start_ns = time.time_ns()
    for member in fleet:  # batch n covers the period before it is sent
        member.t0_ns = start_ns + round((member.phase_s - period) * NS)
    cycle, index, worst = 0.0, 0, 0.0
    while not stop.is_set():
        now = time.monotonic() - start
        while cycle + order[index].phase_s <= now:
            member = order[index]
            worst = max(worst, now - cycle - member.phase_s)
            seq = member.agent.enqueue(member.next_batch())
            member.sent_at.append((seq, time.perf_counter()))
            index += 1
            if index == len(order):
                index, cycle = 0, cycle + period
        await asyncio.sleep(tick_s)
    return worst


# --- measuring -------------------------------------------------------------------------------------


@dataclass
class Snapshot:
    at: float
    cpu: list[float]
    counters: list[tuple[float, float, float, float]]
    threads: list[dict[int, float]]
    loadgen_cpu: float
    influxdb_cpu: float


def snapshot(collectors: list[Collector], influxdb_pid: int) -> Snapshot:
    return Snapshot(
        time.perf_counter(),
        [cpu_seconds(c.proc.pid) for c in collectors],
        [c.counters() for c in collectors],
        [thread_cpu_seconds(c.proc.pid) for c in collectors],
        time.process_time(),
        cpu_seconds(influxdb_pid),
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def latency_figures(records: list[tuple[float, float, int, str]]) -> dict[str, Any]:
    delays = [r[1] for r in records]
    return {
        "acks": len(delays),
        "p50_s": round(percentile(delays, 0.5), 4),
        "p99_s": round(percentile(delays, 0.99), 4),
        "max_s": round(max(delays), 4) if delays else None,
    }


async def sample_every(period_s: float, stop: asyncio.Event, what: Callable[[], None]) -> None:
    while not stop.is_set():
        await asyncio.to_thread(what)
        with_timeout = asyncio.ensure_future(stop.wait())
        await asyncio.wait({with_timeout}, timeout=period_s)
        with_timeout.cancel()


def profile(collectors: list[Collector], seconds: float, out: Path) -> dict[str, Any]:
    """py-spy (sampling, 100 Hz, every thread, no idle) on both collectors at once; summarised."""
    py_spy = Path(os.environ.get("PY_SPY") or Path(sys.executable).with_name("py-spy"))
    if not py_spy.exists():
        log("  py-spy not installed next to this Python (pip install py-spy) nor named by $PY_SPY: no profile")
        return {}
    procs = []
    for c in collectors:
        path = out / f"profile-{c.name}.txt"
        argv = [str(py_spy), "record", "--pid", str(c.proc.pid), "--duration", str(round(seconds)), "--rate", "100"]
        argv += ["--format", "raw", "--threads", "--nonblocking", "--output", str(path)]
        procs.append((c, path, subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
    summary: dict[str, Any] = {}
    for c, path, proc in procs:
        _, err = proc.communicate(timeout=seconds + 60)
        if proc.returncode or not path.exists():
            log(f"  py-spy on {c.name} failed: {err.decode()[-500:]}")
            continue
        summary[c.name] = summarise_profile(path)
        summary[c.name]["file"] = str(path)
    return summary


def summarise_profile(path: Path, top: int = 25) -> dict[str, Any]:
    """Self and inclusive shares of the samples (folded stacks: ``frame;frame;... count``), by thread
    and by function (``name (file)``, line numbers dropped)."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        thread, frames = frames[0], frames[1:]
        threads[re.sub(r"\s*\(0x[0-9a-f]+\)", "", thread)] += count
        total += count
        if frames:
            own[frames[-1]] += count
        for name in set(frames):
            inclusive[name] += count

    def shares(counter: Counter[str]) -> dict[str, float]:
        return {k: round(100 * v / total, 1) for k, v in counter.most_common(top)}

    return {
        "samples": total,
        "threads_pct": shares(threads),
        "self_pct": shares(own),
        "inclusive_pct": shares(inclusive),
    }


def influx_counts(influx: InfluxDBServer, cluster: str) -> dict[tuple[str, str], int]:
    counts = {}
    for series in influx.query(DB, f"SELECT count(power_w) FROM gpu WHERE cluster = '{cluster}' GROUP BY host, gpu"):
        counts[(series.tags["host"], series.tags["gpu"])] = int(series.values[0][1])
    return counts


# --- the run ---------------------------------------------------------------------------------------


async def run(
    args: argparse.Namespace, influx: InfluxDBServer, collectors: list[Collector], out: Path
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    assert influx.pid is not None
    influxdb_pid = influx.pid
    addresses = [c.address for c in collectors]
    acks = Acks()
    cluster = f"fleet-{os.getpid()}"
    fleet = make_fleet(args, addresses, acks, cluster)
    first = Counter(first_choice(m.agent.spec.id, len(addresses)) for m in fleet)
    results["agents"] = len(fleet)
    results["agents_10hz"] = sum(m.rate_hz == 10 for m in fleet)
    results["samples_per_s_offered"] = round(sum(m.samples_per_batch for m in fleet) / args.flush_s)
    results["first_choice"] = {collectors[i].name: n for i, n in sorted(first.items())}
    log(
        f"fleet: {len(fleet)} agents x {args.gpus} GPUs ({results['agents_10hz']} at 10 Hz), "
        f"{results['samples_per_s_offered']} samples/s in {len(fleet) / args.flush_s:g} batches/s; "
        f"first choices {results['first_choice']}"
    )

    log(f"connecting over {args.ramp_s:g} s")
    tasks = []
    connect_started = time.monotonic()
    for i, member in enumerate(fleet):
        tasks.append(asyncio.create_task(member.agent.run()))
        if args.ramp_s > 0 and i % 50 == 49:
            await asyncio.sleep(args.ramp_s * 50 / len(fleet))
    while sum(1 for m in fleet if m.agent.welcomed_at) < len(fleet):
        if time.monotonic() - connect_started > args.ramp_s + 120:
            raise RuntimeError(f"only {sum(1 for m in fleet if m.agent.welcomed_at)} agents connected")
        await asyncio.sleep(0.2)
    results["connect_s"] = round(time.monotonic() - connect_started, 1)
    log(f"all {len(fleet)} agents streaming after {results['connect_s']} s")
    if args.idle_s > 0:
        await asyncio.sleep(1.0)
        idle = await asyncio.to_thread(snapshot, collectors, influxdb_pid)
        await asyncio.sleep(args.idle_s)
        idle_cpu = sum(await asyncio.to_thread(lambda: [cpu_seconds(c.proc.pid) for c in collectors])) - sum(idle.cpu)
        results["idle_streams_cpu_pct_of_core"] = round(100 * idle_cpu / (time.perf_counter() - idle.at), 2)
        log(
            f"  streams open, no batches for {args.idle_s:g} s: "
            f"collectors at {results['idle_streams_cpu_pct_of_core']} % of a core"
        )
    stop_producing = asyncio.Event()
    producer = asyncio.create_task(produce(fleet, stop_producing))
    log(f"producing; warm-up {args.warmup_s:g} s")
    await asyncio.sleep(args.warmup_s)

    # --- the steady window
    log(f"steady window: {args.steady_s:g} s")
    rss: list[list[float]] = [[] for _ in collectors]
    streams: list[list[int]] = [[] for _ in collectors]

    def observe() -> None:
        for k, c in enumerate(collectors):
            rss[k].append(rss_mib(c.proc.pid))
            streams[k].append(c.streams())

    stop_observing = asyncio.Event()
    before = await asyncio.to_thread(snapshot, collectors, influxdb_pid)
    observer = asyncio.create_task(sample_every(1.0, stop_observing, observe))
    progress_at = time.perf_counter()
    while time.perf_counter() - before.at < args.steady_s:
        await asyncio.sleep(1.0)
        if time.perf_counter() - progress_at >= 5:
            progress_at = time.perf_counter()
            recent = acks.window(progress_at - 5, progress_at)
            log(
                f"  streams {[s[-1] for s in streams if s]}, RSS {[round(r[-1]) for r in rss if r]} MiB, "
                f"{sum(r[2] for r in recent) / 5:.0f} samples/s acked, ack p99 {latency_figures(recent)['p99_s']} s"
            )
    after = await asyncio.to_thread(snapshot, collectors, influxdb_pid)
    stop_observing.set()
    await observer
    seconds = after.at - before.at
    received = [a[0] - b[0] for a, b in zip(after.counters, before.counters, strict=True)]
    batches = [a[1] - b[1] for a, b in zip(after.counters, before.counters, strict=True)]
    commits = [a[2] - b[2] for a, b in zip(after.counters, before.counters, strict=True)]
    writes = [a[3] - b[3] for a, b in zip(after.counters, before.counters, strict=True)]
    cpu = [a - b for a, b in zip(after.cpu, before.cpu, strict=True)]
    window = acks.window(before.at, after.at)
    per: dict[str, Any] = {}
    for k, c in enumerate(collectors):
        held = statistics.median(streams[k])
        median_rss = statistics.median(rss[k])
        per[c.name] = {
            "ack_after": args.ack_after_a if k == 0 else args.ack_after_b,
            "streams_held": held,
            "rss_mib_idle": round(c.idle_rss_mib, 1),
            "rss_mib_median": round(median_rss, 1),
            "rss_kib_per_stream": round((median_rss - c.idle_rss_mib) * 1024 / held, 1) if held else None,
            "samples_per_s": round(received[k] / seconds),
            "cpu_pct_of_core": round(100 * cpu[k] / seconds, 1),
            "cpu_us_per_sample": round(cpu[k] / received[k] * 1e6, 2) if received[k] else None,
            "cpu_us_per_batch": round(cpu[k] / batches[k] * 1e6, 1) if batches[k] else None,
            "batches_per_wal_commit": round(batches[k] / commits[k], 2) if commits[k] else None,
            "influxdb_writes_per_s": round(writes[k] / seconds, 1),
            "threads_cpu_pct_of_core": {
                tid: round(100 * (t - before.threads[k].get(tid, 0.0)) / seconds, 1)
                for tid, t in sorted(after.threads[k].items(), key=lambda kv: -kv[1] + before.threads[k].get(kv[0], 0))
                if t - before.threads[k].get(tid, 0.0) > 0.005 * seconds
            },
            "ack_latency": latency_figures([r for r in window if r[3] == c.address]),
        }
    results["window_s"] = round(seconds, 1)
    results["collectors"] = per
    results["samples_per_s_received"] = round(sum(received) / seconds)
    results["collector_cpu_us_per_sample"] = round(sum(cpu) / sum(received) * 1e6, 2) if sum(received) else None
    results["collector_cpu_pct_of_core"] = round(100 * sum(cpu) / seconds, 1)
    results["ack_latency"] = latency_figures(window)
    results["loadgen_cpu_pct_of_core"] = round(100 * (after.loadgen_cpu - before.loadgen_cpu) / seconds, 1)
    results["influxdb_cpu_pct_of_core"] = round(100 * (after.influxdb_cpu - before.influxdb_cpu) / seconds, 1)
    results["load_average"] = os.getloadavg()[0]
    log(f"  {json.dumps(per)}")
    log(
        f"  both: {results['samples_per_s_received']} samples/s, "
        f"{results['collector_cpu_us_per_sample']} us CPU/sample, "
        f"ack p50/p99 {results['ack_latency']['p50_s']}/{results['ack_latency']['p99_s']} s"
    )

    if args.profile_s > 0:
        log(f"profiling both collectors for {args.profile_s:g} s (py-spy; not part of the figures above)")
        results["profile"] = await asyncio.to_thread(profile, collectors, args.profile_s, out)
        for name, summary in results["profile"].items():  # name the threads of the CPU figures
            names = {m[1]: m[2] for t in summary["threads_pct"] if (m := re.match(r"thread \((\d+)\): (.*)", t))}
            threads = per[name]["threads_cpu_pct_of_core"]
            per[name]["threads_cpu_pct_of_core"] = {f"{t} {names.get(str(t), '?')}": v for t, v in threads.items()}

    # --- kill A
    victim = collectors[0]
    on_victim = [m for m in fleet if m.agent.target == victim.address]
    log(f"killing {victim.name} (SIGKILL) with {len(on_victim)} agents on it")
    killed_at = time.monotonic()
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait(10)

    def moved_at(member: FleetAgent) -> float | None:
        return next((t for t, a in member.agent.welcomed_at if t > killed_at and a != victim.address), None)

    while True:
        pending = [m for m in on_victim if moved_at(m) is None]
        if not pending or time.monotonic() - killed_at > args.move_limit_s + 30:
            break
        await asyncio.sleep(0.1)
    moves = [t - killed_at for m in on_victim if (t := moved_at(m)) is not None]
    results["kill"] = {
        "agents_on_killed": len(on_victim),
        "agents_moved": len(moves),
        "all_moved_s": round(max(moves), 2) if moves else None,
        "moved_p50_s": round(percentile(moves, 0.5), 2) if moves else None,
        "within_limit": len(moves) == len(on_victim) and (not moves or max(moves) <= args.move_limit_s),
    }
    log(f"  {results['kill']}")
    await asyncio.sleep(args.after_kill_s)
    results["streams_after_kill"] = {c.name: c.streams() for c in collectors[1:]}

    # --- stop, wait for every ack, then for InfluxDB
    stop_producing.set()
    results["producer_worst_lag_s"] = round(await producer, 3)
    log("stopping: waiting for every batch to be acked")
    close_started = time.monotonic()
    closing = await asyncio.gather(
        *(m.agent.close(timeout_s=args.close_timeout_s) for m in fleet), return_exceptions=True
    )
    unacked = sum(m.agent.unacked for m in fleet)
    if unacked:  # the figures so far still count; what InfluxDB holds is compared with what was acked
        log(f"  {unacked} batches of {sum(isinstance(c, Exception) for c in closing)} agents unacked: giving up")
        for task in tasks:
            task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    results["all_acked_after_stop_s"] = None if unacked else round(time.monotonic() - close_started, 1)
    results["batches_unacked"] = unacked
    expected = {
        (m.agent.spec.host, str(g)): (m.batches - m.agent.unacked) * m.per_gpu for m in fleet for g in range(args.gpus)
    }
    total = sum(expected.values())
    log(f"  all acked after {results['all_acked_after_stop_s']} s; waiting for InfluxDB to hold {total} samples")
    # the collectors left say when their WALs are empty (cheaper than counting in InfluxDB meanwhile)
    deadline = time.monotonic() + args.close_timeout_s
    drain_started = progress_at = time.monotonic()
    while time.monotonic() < deadline:
        queued = [
            (await asyncio.to_thread(c.metrics)).get("gpuprobe_collector_wal_queued_lines", 0) for c in collectors[1:]
        ]
        if not any(queued):
            break
        if time.monotonic() - progress_at >= 5:
            progress_at = time.monotonic()
            log(f"  lines still in the WALs: {queued}")
        await asyncio.sleep(0.5)
    results["wal_empty_after_stop_s"] = round(time.monotonic() - drain_started, 1)
    await asyncio.sleep(2.0)  # a late duplicate would have arrived by now (it would overwrite anyway)
    counts = await asyncio.to_thread(influx_counts, influx, cluster)
    wrong = {f"{h}/{g}": (counts.get((h, g), 0), n) for (h, g), n in expected.items() if counts.get((h, g), 0) != n}
    extra = sorted(set(counts) - set(expected))
    results["influxdb"] = {
        "samples_sent": total,
        "samples_stored": sum(counts.values()),
        "series": len(counts),
        "series_wrong": len(wrong) + len(extra),
        "examples_wrong": dict(list(wrong.items())[:5]),
        "exactly_once": not wrong and not extra,
    }
    results["rejections"] = sum(len(m.agent.rejections) for m in fleet)
    results["stream_errors"] = Counter(e.code.name if e.code else "no status" for m in fleet for e in m.agent.errors)
    log(f"  InfluxDB: {results['influxdb']}")
    return results


def main() -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog=(
            "Exits 1 if an agent on the killed collector did not move within --move-limit-s, a batch was "
            "never acked or InfluxDB's counts differ from what was acked."
        ),
    )
    parser.add_argument("--agents", type=int, default=2000, help="synthetic agents")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per agent")
    parser.add_argument("--fast-share", type=float, default=0.1, help="share of agents sampling at 10 Hz (others 1 Hz)")
    parser.add_argument(
        "--flush-s", type=float, default=1.0, help="each agent sends a batch this often (the agent's --flush-interval)"
    )
    parser.add_argument(
        "--aggregates",
        action="store_true",
        help="the 1 Hz agents send one 1 s GpuAggregate per GPU per second (of 10 readings) instead of raw samples;"
        " the --fast-share agents send raw 10 Hz samples; needs a whole-second --flush-s",
    )
    parser.add_argument("--window", type=int, default=32, help="unacked batches an agent keeps in flight")
    parser.add_argument("--ramp-s", type=float, default=10.0, help="start the agents over this long")
    parser.add_argument("--idle-s", type=float, default=5.0, help="streams open, no batches: collector CPU")
    parser.add_argument("--warmup-s", type=float, default=10.0, help="load before the steady window")
    parser.add_argument("--steady-s", type=float, default=30.0, help="the steady window that gives the figures")
    parser.add_argument("--profile-s", type=float, default=0.0, help="py-spy both collectors this long (0: no)")
    parser.add_argument("--after-kill-s", type=float, default=15.0, help="load after collector A is killed")
    parser.add_argument("--move-limit-s", type=float, default=30.0, help="every agent on A must have moved by then")
    parser.add_argument(
        "--close-timeout-s",
        type=float,
        default=180.0,
        help="at the end, wait this long for every ack, then as long for the WALs to empty",
    )
    parser.add_argument("--ack-after-a", default="sink", choices=["wal", "sink"], help="collector A (killed)")
    parser.add_argument("--ack-after-b", default="wal", choices=["wal", "sink"], help="collector B (kept)")
    parser.add_argument("--collector-args", default="", help="extra `gpuprobe collector` flags for both")
    parser.add_argument(
        "--calibrate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="time the encoder alone first: how fast the shared cores are now",
    )
    parser.add_argument(
        "--keep", type=Path, help="keep InfluxDB, WALs, logs and py-spy profiles in this folder, not a temporary one"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if args.aggregates and (args.flush_s < 1 or args.flush_s != round(args.flush_s)):
        parser.error("--aggregates needs --flush-s to be a whole number of seconds (1 s aggregates)")
    if args.ack_after_a != "sink":
        log("note: collector A in --ack-after wal mode strands what it acked when killed: expect missing samples")

    results: dict[str, Any] = {
        "machine": f"{platform.node()} {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "load_average_before": os.getloadavg()[0],
    }
    if args.calibrate:
        # how slow the shared cores are now: the encoder alone (bench/collector_throughput.py's figure,
        # 402 000 samples/s per core on a quiet machine), so CPU figures of runs can be compared
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from collector_throughput import encode_rate

        results["calibration_encode_samples_per_s_per_core"] = round(encode_rate(fan=False))
        log(f"calibration: encoder alone at {results['calibration_encode_samples_per_s_per_core']} samples/s per core")
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        out = args.keep or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        with InfluxDBServer(out / "influxdb", log_level="warn") as influx:
            influx.create_database(DB)
            collectors = []
            try:
                for name, mode in (("A", args.ack_after_a), ("B", args.ack_after_b)):
                    collectors.append(
                        start_collector(name, influx, out / f"wal-{name}", mode, args.collector_args.split())
                    )
                time.sleep(1.0)
                for c in collectors:
                    c.idle_rss_mib = rss_mib(c.proc.pid)
                log(f"InfluxDB on {influx.port}; collectors {[(c.name, c.address) for c in collectors]}")
                results.update(asyncio.run(run(args, influx, collectors, out)))
            finally:
                for c in collectors:
                    if c.proc.poll() is None:
                        c.proc.terminate()
                        try:
                            c.proc.wait(60)
                        except subprocess.TimeoutExpired:
                            c.proc.kill()
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    ok = results["kill"]["within_limit"] and not results["batches_unacked"] and results["influxdb"]["exactly_once"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
