"""Bytes on disk per GPU-day: raw 10 Hz `gpu` points and their `rollup_10s` and `rollup_1m`, in InfluxDB 1.x.

    python bench/storage_per_gpu_day.py [--gpus 8] [--hours 2] [--without-node] [--aggregates] [--json out.json]

1. A fresh InfluxDB (Debian's 1.6, own data directory) is set up by ``gpuprobe collector --init-db``'s
   own code (:func:`gpuprobe.influx.retention.init_db`: the raw policy, the rollups, the continuous
   queries), with the cache snapshotted and shards fully compacted after 1 s without writes
   (``cache-snapshot-write-cold-duration``, ``compact-full-write-cold-duration``) instead of 10 min
   and 4 h, so that what is measured is compacted TSM, as a shard is once its time has passed.
2. One node of ``--gpus`` GPUs sampled at 10 Hz for ``--hours``: a training job's cycle (5 min idle,
   20 min of steps), power with NVML's mW resolution and noise, an RC temperature in whole °C, clocks
   that step under the power cap, the energy counter in mJ; plus the node's 1 Hz host samples. The
   samples are protobuf ``GpuSample``/``NodeSample`` encoded by the collector's own ``StreamEncoder``
   (the line protocol the collector writes: full tag set, shortest float text) and written in
   5 000-line batches. ``--aggregates``: each GPU's second of samples becomes one ``GpuAggregate`` by
   the agent's own :func:`gpuprobe.agent.resolution.aggregate` (what ``--resolution auto`` ships outside
   probes), stored as one ``res=1s`` point.
3. The rollups are computed by the continuous queries' own ``SELECT ... INTO`` over the whole range
   (:func:`gpuprobe.influx.retention.backfill`; InfluxDB runs the same statements on its schedule).
4. Once the WAL is empty and the sizes stop changing, ``data/<db>/<rp>`` is summed per policy (every
   file: TSM, tombstones, field index) and, separately per measurement, by ``SELECT`` counts; the
   bytes are scaled to one GPU-day: ``bytes * 24 / (gpus * hours)``. The node's points are shared by
   its GPUs and counted in the per-policy total; ``--without-node`` leaves them out (gpu points only).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpuprobe.agent.resolution import aggregate
from gpuprobe.collector.encode import StreamEncoder
from gpuprobe.devservices import InfluxDBServer
from gpuprobe.influx.client import InfluxClient
from gpuprobe.influx.retention import ROLLUP_1M, ROLLUP_10S, RetentionPlan, backfill, init_db
from gpuprobe.influx.settings import InfluxSettings
from gpuprobe.v1 import telemetry_pb2
from gpuprobe.wire.validate import Identity, Limits

NS = 1_000_000_000
DB = "gpuprobe"
MODEL = "NVIDIA H100 80GB HBM3"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class CompactingInfluxDB(InfluxDBServer):
    """The development server with the cache and full compactions triggered after 1 s without writes."""

    def _environment(self) -> dict[str, str]:
        env = super()._environment()
        env["INFLUXDB_DATA_CACHE_SNAPSHOT_WRITE_COLD_DURATION"] = "1s"
        env["INFLUXDB_DATA_COMPACT_FULL_WRITE_COLD_DURATION"] = "1s"
        return env


class Gpu:
    """One H100-like GPU through a training job's cycle, read the way NVML reports it."""

    def __init__(self, index: int, rng: random.Random) -> None:
        self.index = index
        self.rng = rng
        self.temp = 33.0 + rng.random() * 3
        self.mem_temp = self.temp + 4
        self.energy_mj = rng.randrange(10**9, 10**10)
        self.offset_s = rng.random() * 20  # the GPUs of a job start within a few seconds of each other

    def sample(self, t_s: float, time_ns: int) -> telemetry_pb2.GpuSample:
        rng = self.rng
        phase = (t_s + self.offset_s) % 1500.0
        busy = phase >= 300.0
        if busy:
            util = min(100, max(0, round(rng.gauss(97, 3))))
            power_mw = int(rng.gauss(640_000, 25_000))
            capped = power_mw > 690_000
            sm_clock = 1980 if not capped else rng.choice((1875, 1905, 1935, 1950))
            reasons = 0x4 if capped else 0
            mem_used = 61_471_326_208
            mem_util = min(100, max(0, round(rng.gauss(45, 4))))
            pcie_rx = rng.gauss(2.2e9, 2e8)
            pcie_tx = rng.gauss(3.0e8, 5e7)
        else:
            util, mem_util = 0, 0
            power_mw = int(rng.gauss(72_000, 800))
            sm_clock, reasons, mem_used = 345, 0x1, 595_591_168
            pcie_rx = pcie_tx = float(rng.randrange(0, 4) * 4096)
        power_mw = max(power_mw, 0)
        self.energy_mj += power_mw // 10  # 100 ms
        # first-order thermal response: R_th 0.075 K/W, tau 60 s, 28 °C inlet
        steady = 28.0 + 0.075 * power_mw / 1000
        self.temp += (steady - self.temp) * (0.1 / 60.0)
        self.mem_temp += (steady + 6 - self.mem_temp) * (0.1 / 90.0)
        return telemetry_pb2.GpuSample(
            time_unix_ns=time_ns,
            gpu_index=self.index,
            util_pct=float(util),
            mem_util_pct=float(mem_util),
            mem_used_bytes=mem_used,
            mem_total_bytes=85_520_809_984,
            power_w=power_mw / 1000,
            power_instant_w=max(power_mw + int(rng.gauss(0, 30_000)), 0) / 1000,
            energy_j=self.energy_mj / 1000,
            temp_c=float(round(self.temp)),
            mem_temp_c=float(round(self.mem_temp)),
            sm_clock_mhz=sm_clock,
            mem_clock_mhz=2619,
            power_limit_w=700.0,
            clock_event_reasons=reasons,
            pcie_tx_bytes_per_s=float(max(int(pcie_tx), 0) // 1024 * 1024),
            pcie_rx_bytes_per_s=float(max(int(pcie_rx), 0) // 1024 * 1024),
        )


def node_sample(rng: random.Random, t_s: float, time_ns: int) -> telemetry_pb2.NodeSample:
    busy = t_s % 1500.0 >= 300.0
    sample = telemetry_pb2.NodeSample(
        time_unix_ns=time_ns,
        cpu_pct=round(rng.gauss(38 if busy else 2, 3 if busy else 0.5) % 100, 1),
        mem_used_bytes=(412 if busy else 35) * 2**30 + rng.randrange(0, 2**28),
        mem_total_bytes=2_164_663_517_184,
        load1=round(abs(rng.gauss(24 if busy else 0.4, 1)), 2),
    )
    for name in ("coretemp_package_id_0", "coretemp_package_id_1", "nvme_composite"):
        sample.hwmon_temp_c[name] = float(round(rng.gauss(62 if busy else 41, 1)))
    return sample


def write_data(
    client: InfluxClient, gpus: int, hours: float, start_ns: int, node: bool = True, aggregates: bool = False
) -> dict[str, int]:
    rng = random.Random(7)
    devices = [Gpu(i, rng) for i in range(gpus)]
    refs = [
        telemetry_pb2.GpuRef(index=i, uuid=f"GPU-5d5f3a4e-1c2b-4e8f-9a7d-0b6c5e4f3a{i:02d}", name=MODEL)
        for i in range(gpus)
    ]
    identity = Identity(
        agent_id="gpu-node-17",
        host="gpu-node-17",
        cluster="training-a",
        cloud="aws",
        instance_type="p5.48xlarge",
        region="us-east-1",
        virt="passthrough",
    )
    limits = Limits(max_sample_age_s=30 * 86400.0)
    encoder = StreamEncoder(identity, limits)
    ticks = int(hours * 3600 * 10)
    pending: list[bytes] = []
    pending_lines = lines_total = line_bytes = 0
    for first in range(0, ticks, 10):  # one batch per second, as an agent sends them
        batch = telemetry_pb2.SampleBatch(created_unix_ns=start_ns + first * NS // 10, gpus=refs)
        samples = [
            gpu.sample(tick / 10, start_ns + tick * NS // 10 + gpu.index)
            for tick in range(first, min(first + 10, ticks))
            for gpu in devices
        ]
        if aggregates:
            # what an agent ships outside probes (--resolution auto): one aggregate per GPU and second
            rows = [{"gpu_index": s.gpu_index, **{f.name: v for f, v in s.ListFields()}} for s in samples]
            batch.gpu_aggregates.extend(aggregate(rows, NS))
        else:
            batch.gpu_samples.extend(samples)
        if node:
            batch.node_samples.append(node_sample(rng, first / 10, start_ns + first * NS // 10 + 50_000_000))
        encoded = encoder.encode(batch, start_ns + first * NS // 10 + 60 * NS)
        assert not encoded.problems, encoded.problems
        pending.append(encoded.lines)
        pending_lines += encoded.line_count
        lines_total += encoded.line_count
        line_bytes += len(encoded.lines)
        if pending_lines >= 5000:
            client.write(b"".join(pending).rstrip(b"\n"), database=DB)
            pending, pending_lines = [], 0
    if pending:
        client.write(b"".join(pending).rstrip(b"\n"), database=DB)
    return {"lines": lines_total, "line_protocol_bytes": line_bytes}


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def wait_for_compaction(base: Path, timeout_s: float = 300.0) -> float:
    """Seconds until the database's WAL is empty and its data files have not changed for 5 s."""
    start = time.monotonic()
    last: tuple[int, ...] = ()
    stable_since = time.monotonic()
    while time.monotonic() - start < timeout_s:
        files = sorted((base / "data" / DB).rglob("*"))
        sizes = tuple(p.stat().st_size for p in files if p.is_file())
        wal = tree_bytes(base / "wal" / DB)
        tmp = any(p.suffix == ".tmp" for p in files)
        if sizes != last or wal > 0 or tmp:
            last, stable_since = sizes, time.monotonic()
        elif time.monotonic() - stable_since >= 5:
            return time.monotonic() - start
        time.sleep(0.5)
    raise TimeoutError(f"InfluxDB did not compact within {timeout_s} s (WAL {tree_bytes(base / 'wal' / DB)} B)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8, help="GPUs of the simulated node (default 8)")
    parser.add_argument("--hours", type=float, default=2.0, help="hours of data (default 2)")
    parser.add_argument("--without-node", action="store_true", help="gpu points only (no 1 Hz node points)")
    parser.add_argument(
        "--aggregates",
        action="store_true",
        help="store the agent's 1 s aggregates (res=1s points, as outside probes) instead of 10 Hz points",
    )
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="gpuprobe-storage-") as tmp, CompactingInfluxDB(tmp) as server:
        base = Path(tmp)
        plan = RetentionPlan(database=DB)
        with InfluxClient(InfluxSettings(url=server.url, database="", timeout_s=120.0)) as client:
            init_db(client, plan)
            minute = 60 * NS
            # whole minutes, ending 10 min ago: inside the raw policy, outside the CQs' own windows
            start_ns = (time.time_ns() - int(args.hours * 3600 * NS) - 10 * minute) // minute * minute
            end_ns = start_ns + int(args.hours * 3600 * NS)
            t0 = time.monotonic()
            written = write_data(
                client, args.gpus, args.hours, start_ns, node=not args.without_node, aggregates=args.aggregates
            )
            write_s = time.monotonic() - t0
            log(f"wrote {written['lines']} lines in {write_s:.1f} s")
            t0 = time.monotonic()
            backfill(client, plan, start_ns, end_ns + minute)
            log(f"rollups computed in {time.monotonic() - t0:.1f} s")
            points: dict[str, dict[str, int]] = {}
            for rp in (plan.raw_rp, ROLLUP_10S, ROLLUP_1M):
                points[rp] = {}
                for measurement, field in (("gpu", "power_w"), ("node", "load1")):
                    answer = client.query(f'SELECT count("{field}") FROM "{rp}"."{measurement}"', database=DB)
                    if answer:
                        points[rp][measurement] = int(answer[0].values[0][1])
        waited = wait_for_compaction(base)
        log(f"compacted after {waited:.1f} s")
        gpu_days = args.gpus * args.hours / 24
        result: dict[str, Any] = {
            "machine": f"{platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}",
            "gpus": args.gpus,
            "hours": args.hours,
            "node_points": not args.without_node,
            "gpu_points": "1 s aggregates (res=1s)" if args.aggregates else "10 Hz samples",
            "write_lines_per_s": round(written["lines"] / write_s),
            "raw_lines": written["lines"],
            "line_protocol_bytes_per_line": round(written["line_protocol_bytes"] / written["lines"], 1),
            "points": points,
        }
        for rp in (plan.raw_rp, ROLLUP_10S, ROLLUP_1M):
            size = tree_bytes(base / "data" / DB / rp)
            label = "raw" if rp == plan.raw_rp else rp
            result[f"{label}_bytes"] = size
            result[f"{label}_bytes_per_gpu_day"] = round(size / gpu_days)
            result[f"{label}_bytes_per_point"] = round(size / max(1, sum(points[rp].values())), 2)
        result["wal_bytes_left"] = tree_bytes(base / "wal" / DB)
        result["raw_mib_per_gpu_day"] = round(result["raw_bytes_per_gpu_day"] / 2**20, 2)
        result["raw_over_rollup_10s"] = round(result["raw_bytes"] / max(1, result[f"{ROLLUP_10S}_bytes"]), 1)
        result["raw_over_rollup_1m"] = round(result["raw_bytes"] / max(1, result[f"{ROLLUP_1M}_bytes"]), 1)
        # what one GPU keeps on disk once every policy is full, at the default durations
        kept_days = {"raw": 7, ROLLUP_10S: 90, ROLLUP_1M: 400}
        result["steady_state_mib_per_gpu_at_default_retention"] = round(
            sum(result[f"{label}_bytes_per_gpu_day"] * days for label, days in kept_days.items()) / 2**20, 1
        )
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0 if all(math.isfinite(v) for v in result.values() if isinstance(v, float)) else 1


if __name__ == "__main__":
    sys.exit(main())
