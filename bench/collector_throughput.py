"""Collector benchmark: encode rate per core, end-to-end throughput against InfluxDB's raw rate, and
the time from a sample to being queryable, all measured in one run on this machine.

    python bench/collector_throughput.py [--samples 300000] [--json out.json]

1. **Encode**: ``StreamEncoder.encode`` alone on realistic GPU batches (NVML-like values from
   ``gpuprobe.app.loadgen.SampleFactory``, 8 GPUs x 100 samples per batch, parsed from bytes as
   the server gets them), single process, CPU time (``time.process_time``).
2. **Raw**: a fresh InfluxDB (Debian's 1.6, own data directory) takes pre-encoded, pre-gzipped
   5 000-line batches of the same lines, POSTed by 3 threads as fast as it answers. Run before and
   after the end-to-end phase; the ratio uses their mean.
3. **End to end**: 8 synthetic agents (the agent's uplink over an in-memory spool, pre-serialized
   batches of 8 GPUs x 50 samples, 32 unacked in flight) -> ``gpuprobe collector`` (its own process,
   plaintext, default sink settings: 5 000-line gzip batches, 3 in flight) -> the same InfluxDB, from
   the first batch sent until InfluxDB counts every sample.
4. **Latency**: a steady fleet load (16 agents x 8 GPUs at 10 Hz, flushing every 0.5 s) plus one
   probe agent sending a one-sample batch every 100 ms stamped when sent; a poller queries InfluxDB
   every 20 ms and records when each probe sample becomes visible.

With ``--cpu-per-sample raw8,raw80,raw400,agg8`` only the collector's CPU per sample at fleet batch
shapes is measured instead: for each shape a fresh ``gpuprobe collector`` (``--ack-after wal``, a
real InfluxDB behind it) serves ``--cpu-agents`` synthetic 8-GPU agents that each send one batch a
second (spread over the second, as bench/fleet_scale.py does): ``raw8`` one sample per GPU (1 Hz),
``raw80`` ten (10 Hz), ``raw400`` fifty, ``agg8`` one 1 s ``GpuAggregate`` of ten readings per GPU,
``agg80`` ten of them (the batch of an agent flushing every 10 s).
After ``--cpu-warmup-s`` the collector's utime + stime (``/proc``, all threads; the event loop's
thread apart) over ``--cpu-steady-s`` is divided by the samples it counted (an aggregate counts as
one). ``--collector-python`` runs another checkout's collector (before/after comparisons).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuprobe.app.loadgen import AgentSpec, SampleFactory, SyntheticAgent
from gpuprobe.collector.compression import gzip_bytes
from gpuprobe.collector.encode import StreamEncoder
from gpuprobe.devservices import InfluxDBServer
from gpuprobe.devservices.ports import LOOPBACK, free_port, port_accepts
from gpuprobe.v1 import common_pb2, telemetry_pb2
from gpuprobe.wire.validate import Identity, Limits

NS = 1_000_000_000


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- 1. encode -----------------------------------------------------------------------------------


def encode_rate(fan: bool, batches: int = 40, repeat: int = 3) -> float:
    spec = AgentSpec("bench-node", gpus=8, fan=fan, virtualization=common_pb2.VIRTUALIZATION_PASSTHROUGH)
    factory = SampleFactory(spec, seed=1)
    start = time.time_ns() - 3600 * NS
    raw = [factory.batch(samples_per_gpu=100, start_ns=start + i * 10 * NS).SerializeToString() for i in range(batches)]
    parsed = [telemetry_pb2.SampleBatch.FromString(r) for r in raw]
    identity = Identity(
        agent_id="bench-node",
        host="bench-node",
        cluster="bench",
        cloud="aws",
        instance_type="p5.48xlarge",
        region="us-east-1",
        virt="passthrough",
    )
    encoder = StreamEncoder(identity, Limits())
    now = time.time_ns()
    encoder.encode(parsed[0], now)  # warm the caches
    best = 0.0
    samples = sum(len(b.gpu_samples) for b in parsed)
    for _ in range(repeat):
        cpu = time.process_time()
        for batch in parsed:
            encoded = encoder.encode(batch, now)
            assert not encoded.problems
        best = max(best, samples / (time.process_time() - cpu))
    return best


def reference_rate(lines: int = 200_000) -> float:
    """The yardstick on this machine: 4 tags + 8 float fields, an f-string with a cached, pre-escaped prefix."""
    prefix = "gpu,gpu=0,host=node-1,model=H100,uuid=GPU-1 "
    values = [(i * 0.5, 61.0 + i % 7, 300.25, 700.0, 12.5, 88.0, 1.0e6 + i, 42.0) for i in range(1000)]
    out: list[str] = []
    cpu = time.process_time()
    for i in range(lines):
        a, b, c, d, e, f, g, h = values[i % 1000]
        out.append(f"{prefix}a={a!r},b={b!r},c={c!r},d={d!r},e={e!r},f={f!r},g={g!r},h={h!r} {i}\n")
    return lines / (time.process_time() - cpu)


# --- the workload ----------------------------------------------------------------------------------


def make_agents_requests(agents: int, samples: int, per_batch_gpu: int = 50) -> list[tuple[AgentSpec, list[bytes]]]:
    """Pre-serialized SampleBatches: ``samples`` GPU samples spread over ``agents`` 8-GPU agents."""
    per_batch = 8 * per_batch_gpu
    batches_per_agent = max(1, samples // (agents * per_batch))
    start = time.time_ns() - 2 * 3600 * NS
    out = []
    for a in range(agents):
        spec = AgentSpec(f"bench-{a:03d}", gpus=8)
        factory = SampleFactory(spec, seed=a)
        requests = []
        for seq in range(1, batches_per_agent + 1):
            batch = factory.batch(samples_per_gpu=per_batch_gpu, start_ns=start + seq * per_batch_gpu * NS // 10)
            batch.agent_id, batch.seq = spec.id, seq
            requests.append(batch.SerializeToString())
        out.append((spec, requests))
    return out


def encoded_lines(workload: list[tuple[AgentSpec, list[bytes]]]) -> list[bytes]:
    lines: list[bytes] = []
    for spec, requests in workload:
        identity = Identity(agent_id=spec.id, host=spec.host, cluster=spec.cluster, virt="passthrough")
        encoder = StreamEncoder(identity, Limits())
        for request in requests:
            batch = telemetry_pb2.SampleBatch.FromString(request)
            lines.extend(encoder.encode(batch, time.time_ns()).lines.splitlines(keepends=True))
    return lines


def count(influx: InfluxDBServer, db: str) -> int:
    series = influx.query(db, "SELECT count(power_w) FROM gpu")
    return int(series[0].values[0][1]) if series else 0


# --- 2. raw ingest ----------------------------------------------------------------------------------


def raw_rate(influx: InfluxDBServer, db: str, lines: list[bytes], threads: int = 3, batch: int = 5000) -> float:
    influx.create_database(db)
    bodies = [gzip_bytes(b"".join(lines[i : i + batch]), 1) for i in range(0, len(lines), batch)]
    pending = list(range(len(bodies)))
    lock = threading.Lock()
    errors: list[str] = []

    def post() -> None:
        connection = http.client.HTTPConnection(LOOPBACK, influx.port, timeout=60)
        while True:
            with lock:
                if not pending:
                    break
                index = pending.pop()
            connection.request(
                "POST",
                f"/write?db={db}&precision=ns",
                body=bodies[index],
                headers={"Content-Encoding": "gzip", "Content-Type": "text/plain"},
            )
            response = connection.getresponse()
            response.read()
            if response.status != 204:
                errors.append(f"{response.status}")
        connection.close()

    started = time.perf_counter()
    workers = [threading.Thread(target=post) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - started
    assert not errors, errors[:5]
    assert count(influx, db) == len(lines), (count(influx, db), len(lines))
    return len(lines) / elapsed


# --- 3. end to end ------------------------------------------------------------------------------------


def start_collector(
    influx: InfluxDBServer, db: str, wal: Path, extra: list[str]
) -> tuple[subprocess.Popen[bytes], int, int]:
    port, metrics_port = free_port(), free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuprobe.app",
            "--log-level",
            "warning",
            "collector",
            "--insecure",
            "--listen",
            f"{LOOPBACK}:{port}",
            "--influx-url",
            influx.url,
            "--influx-db",
            db,
            "--influx-create-db",
            "--wal",
            str(wal),
            "--metrics-listen",
            f"{LOOPBACK}:{metrics_port}",
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(wal.parent / f"{wal.name}.log", "wb"),  # noqa: SIM115
    )
    deadline = time.monotonic() + 30
    while not port_accepts(LOOPBACK, port):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"collector did not start: {(wal.parent / f'{wal.name}.log').read_text()[-2000:]}")
        time.sleep(0.05)
    return proc, port, metrics_port


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def end_to_end(
    influx: InfluxDBServer, db: str, workload: list[tuple[AgentSpec, list[bytes]]], port: int
) -> tuple[float, int]:
    total = 0
    agents = []
    for spec, requests in workload:
        agent = SyntheticAgent(f"{LOOPBACK}:{port}", spec, window=32)
        for seq, request in enumerate(requests, start=1):
            samples = len(telemetry_pb2.SampleBatch.FromString(request).gpu_samples)
            agent.enqueue_raw(seq, request, samples)
            total += samples
        agents.append(agent)
    started = time.perf_counter()
    tasks = [asyncio.create_task(agent.run()) for agent in agents]
    for agent in agents:
        await agent.close(timeout_s=600)
    await asyncio.gather(*tasks)
    acked = time.perf_counter() - started
    while (stored := await asyncio.to_thread(count, influx, db)) < total:
        if time.perf_counter() - started > 900:
            raise RuntimeError(f"only {stored} of {total} stored")
        await asyncio.sleep(0.05)
    elapsed = time.perf_counter() - started
    log(f"  e2e: {total} samples acked after {acked:.2f} s, all queryable after {elapsed:.2f} s")
    return total / elapsed, total


# --- 4. latency ------------------------------------------------------------------------------------------


async def latency(influx: InfluxDBServer, db: str, port: int, duration_s: float) -> list[float]:
    target = f"{LOOPBACK}:{port}"
    fleet = [SyntheticAgent(target, AgentSpec(f"fleet-{i:03d}", gpus=8), window=8) for i in range(16)]
    probe = SyntheticAgent(target, AgentSpec("latency-probe", gpus=1), window=64)
    tasks = [asyncio.create_task(a.run()) for a in [*fleet, probe]]
    sent: dict[int, float] = {}
    seen: dict[int, float] = {}
    stop = asyncio.Event()

    async def produce_fleet() -> None:
        while not stop.is_set():
            for agent in fleet:
                agent.enqueue(agent.factory.batch(samples_per_gpu=5))
            await asyncio.sleep(0.5)

    async def produce_probe() -> None:
        while not stop.is_set():
            batch = probe.factory.batch(samples_per_gpu=1, start_ns=time.time_ns())
            sent[batch.gpu_samples[0].time_unix_ns] = time.time()
            probe.enqueue(batch)
            await asyncio.sleep(0.1)

    def poll() -> None:
        while not stop.is_set() or len(seen) < len(sent):
            oldest = min((t for t in sent if t not in seen), default=None)
            if oldest is not None:
                for series in influx.query(
                    db, f"SELECT power_w FROM gpu WHERE host = 'latency-probe' AND time >= {oldest}"
                ):
                    now = time.time()
                    for row in series.values:
                        seen.setdefault(int(row[0]), now)
            time.sleep(0.02)
            if stop.is_set() and time.monotonic() > poll_deadline[0]:
                break

    poll_deadline = [float("inf")]
    poller = asyncio.create_task(asyncio.to_thread(poll))
    producers = [asyncio.create_task(produce_fleet()), asyncio.create_task(produce_probe())]
    await asyncio.sleep(duration_s)
    stop.set()
    poll_deadline[0] = time.monotonic() + 30
    await asyncio.gather(*producers)
    for agent in [*fleet, probe]:
        await agent.close()
    await asyncio.gather(*tasks)
    await poller
    warmup = sorted(sent)[: int(len(sent) * 0.1)]  # skip the first 10 %: connections and caches warming up
    return sorted(seen[t] - t / NS for t in sent if t in seen and t not in warmup)


def percentile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


# --- 5. collector CPU per sample at fleet batch shapes ---------------------------------------------------

# per shape: GpuSamples (raw) or 1 s GpuAggregates (agg) of each of 8 GPUs per batch, and how many
SHAPES = {"raw8": ("raw", 1), "raw80": ("raw", 10), "raw400": ("raw", 50), "agg8": ("agg", 1), "agg80": ("agg", 10)}


async def paced_load(
    shape: str,
    address: str,
    agents: int,
    warmup_s: float,
    steady_s: float,
    collector_pid: int,
    metrics: Any,
    profile: Callable[[], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """``agents`` agents sending one ``shape`` batch a second; the collector's CPU over the steady
    window; then, under the same load, ``profile`` (py-spy, not in the figures)."""
    from fleet_scale import FleetAgent, produce, thread_cpu_seconds

    fleet = []
    for i in range(agents):
        spec = AgentSpec(f"cpu-{shape}-{i:04d}", gpus=8)
        factory = SampleFactory(spec, seed=i)
        kind, per_gpu = SHAPES[shape]
        make = factory.aggregate_batch if kind == "agg" else factory.batch
        template = make(per_gpu)
        agent = SyntheticAgent(address, spec, window=32)
        fleet.append(FleetAgent(agent, template, per_gpu, 1.0, phase_s=(i * 0.618034) % 1.0))
    tasks = [asyncio.create_task(member.agent.run()) for member in fleet]
    stop = asyncio.Event()
    producer = asyncio.create_task(produce(fleet, stop))
    await asyncio.sleep(warmup_s)

    def snapshot() -> tuple[float, dict[int, float], dict[str, float], float]:
        return time.monotonic(), thread_cpu_seconds(collector_pid), metrics(), time.process_time()

    before = await asyncio.to_thread(snapshot)
    load_before = os.getloadavg()[0]
    await asyncio.sleep(steady_s)
    after = await asyncio.to_thread(snapshot)
    profiled = await asyncio.to_thread(profile) if profile is not None else None
    stop.set()
    lag_s = await producer
    for member in fleet:
        await member.agent.close(timeout_s=120)
    await asyncio.gather(*tasks)
    seconds = after[0] - before[0]
    cpu = sum(after[1].values()) - sum(before[1].get(tid, 0.0) for tid in after[1])
    loop_cpu = after[1].get(collector_pid, 0.0) - before[1].get(collector_pid, 0.0)

    def delta(name: str) -> float:
        return after[2].get(name, 0.0) - before[2].get(name, 0.0)

    samples = delta("gpuprobe_collector_samples_received_total")
    batches = delta("gpuprobe_collector_batches_received_total")
    return {
        "shape": shape,
        "agents": agents,
        "samples_per_s": round(samples / seconds),
        "batches_per_s": round(batches / seconds, 1),
        "cpu_pct_of_core": round(100 * cpu / seconds, 1),
        "cpu_us_per_sample": round(cpu / samples * 1e6, 2),
        "cpu_us_per_batch": round(cpu / batches * 1e6),
        "event_loop_share": round(loop_cpu / cpu, 2),
        "batches_per_wal_commit": round(batches / max(1.0, delta("gpuprobe_collector_wal_commit_seconds_count")), 1),
        "influx_requests_per_s": round(delta("gpuprobe_collector_write_requests_total") / seconds, 1),
        "load_generator_pct_of_core": round(100 * (after[3] - before[3]) / seconds, 1),
        "load_average": round(load_before, 2),
        "producer_lag_s": round(lag_s, 3),
    } | ({"profile": profiled} if profiled else {})


def cpu_per_sample(args: argparse.Namespace) -> list[dict[str, Any]]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fleet_scale import profile, start_collector

    shapes = args.cpu_per_sample.split(",")
    unknown = sorted(set(shapes) - set(SHAPES))
    if unknown:
        raise SystemExit(f"--cpu-per-sample: unknown shape(s) {unknown}; known: {', '.join(SHAPES)}")
    results = []
    with tempfile.TemporaryDirectory(prefix="collector-cpu-") as tmp:
        base = Path(tmp)
        with InfluxDBServer(base / "influxdb", log_level="warn") as influx:
            for shape in shapes:
                wal = base / f"wal-{shape}"
                collector = start_collector(
                    shape, influx, wal, "wal", args.collector_args.split(), args.collector_python
                )
                try:
                    figures = asyncio.run(
                        paced_load(
                            shape,
                            collector.address,
                            args.cpu_agents,
                            args.cpu_warmup_s,
                            args.cpu_steady_s,
                            collector.proc.pid,
                            collector.metrics,
                            (lambda c=collector: profile([c], args.cpu_profile_s, args.cpu_profile_dir))
                            if args.cpu_profile_s
                            else None,
                        )
                    )
                finally:
                    collector.proc.terminate()
                    collector.proc.wait(60)
                log(f"  {json.dumps(figures)}")
                results.append(figures)
    return results


# --- main ---------------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=300_000, help="GPU samples in the raw and end-to-end phases")
    parser.add_argument("--latency-s", type=float, default=30.0, help="length of the latency phase")
    parser.add_argument("--collector-args", default="", help="extra `gpuprobe collector` flags, space-separated")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--cpu-per-sample",
        metavar="SHAPES",
        help=f"only measure the collector's CPU per sample for these batch shapes ({','.join(SHAPES)})",
    )
    parser.add_argument("--cpu-agents", type=int, default=100, help="--cpu-per-sample: agents, one batch a second each")
    parser.add_argument("--cpu-warmup-s", type=float, default=5.0, help="--cpu-per-sample: load before the window")
    parser.add_argument("--cpu-steady-s", type=float, default=20.0, help="--cpu-per-sample: the measured window")
    parser.add_argument(
        "--cpu-profile-s",
        type=float,
        default=0.0,
        help="--cpu-per-sample: after the window, py-spy the collector this long (py-spy next to this Python)",
    )
    parser.add_argument(
        "--cpu-profile-dir", type=Path, default=Path("/tmp"), help="--cpu-profile-s: where the profiles go"
    )
    parser.add_argument(
        "--collector-python",
        default=sys.executable,
        help="--cpu-per-sample: the interpreter whose `gpuprobe collector` runs (another checkout's venv)",
    )
    args = parser.parse_args()
    results: dict[str, Any] = {
        "machine": f"{platform.node()} {os.cpu_count()} CPUs, Python {platform.python_version()}"
    }
    if args.cpu_per_sample:
        results["started"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        results["collector_python"] = args.collector_python
        results["cpu_per_sample"] = cpu_per_sample(args)
        print(json.dumps(results, indent=2))
        if args.json:
            args.json.write_text(json.dumps(results, indent=2) + "\n")
        return 0

    log("1. encode (CPU time, one process)")
    results["encode_samples_per_s_per_core"] = round(encode_rate(fan=False))
    results["encode_samples_per_s_per_core_with_fan"] = round(encode_rate(fan=True))
    results["reference_8_float_lines_per_s_per_core"] = round(reference_rate())
    log(f"  {results}")

    workload = make_agents_requests(agents=8, samples=args.samples)
    lines = encoded_lines(workload)
    with tempfile.TemporaryDirectory(prefix="collector-bench-") as tmp:
        base = Path(tmp)
        with InfluxDBServer(base / "influxdb", log_level="warn") as influx:
            log(f"2. raw ingest of {len(lines)} lines")
            assert influx.pid is not None
            influx_cpu = cpu_seconds(influx.pid)
            raw_before = raw_rate(influx, "raw_before", lines)
            influx_raw_cpu = cpu_seconds(influx.pid) - influx_cpu
            log(f"  {raw_before:.0f} lines/s")

            log("3. end to end")
            proc, port, _ = start_collector(influx, "e2e", base / "wal-e2e", args.collector_args.split())
            try:
                cpu_before, influx_cpu, loadgen_cpu = (
                    cpu_seconds(proc.pid),
                    cpu_seconds(influx.pid),
                    time.process_time(),
                )
                e2e, total = asyncio.run(end_to_end(influx, "e2e", workload, port))
                collector_cpu = cpu_seconds(proc.pid) - cpu_before
                influx_e2e_cpu = cpu_seconds(influx.pid) - influx_cpu
                loadgen_cpu = time.process_time() - loadgen_cpu
            finally:
                proc.terminate()
                proc.wait(30)
            log(f"  {e2e:.0f} samples/s, collector CPU {collector_cpu:.1f} s")

            raw_after = raw_rate(influx, "raw_after", lines)
            log(f"2'. raw ingest again: {raw_after:.0f} lines/s")

            log(f"4. latency for {args.latency_s:g} s")
            proc, port, _ = start_collector(influx, "latency", base / "wal-latency", args.collector_args.split())
            try:
                delays = asyncio.run(latency(influx, "latency", port, args.latency_s))
            finally:
                proc.terminate()
                proc.wait(30)

    raw = (raw_before + raw_after) / 2
    results.update(
        raw_lines_per_s_before=round(raw_before),
        raw_lines_per_s_after=round(raw_after),
        e2e_samples_per_s=round(e2e),
        e2e_ratio_to_raw=round(e2e / raw, 3),
        e2e_samples=total,
        collector_cpu_us_per_sample=round(collector_cpu / total * 1e6, 2),
        influxdb_cpu_us_per_line_raw=round(influx_raw_cpu / len(lines) * 1e6, 2),
        influxdb_cpu_us_per_line_e2e=round(influx_e2e_cpu / total * 1e6, 2),
        load_generator_cpu_us_per_sample=round(loadgen_cpu / total * 1e6, 2),
        latency_samples=len(delays),
        latency_p50_s=round(percentile(delays, 0.50), 3),
        latency_p99_s=round(percentile(delays, 0.99), 3),
        latency_max_s=round(delays[-1], 3),
    )
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
