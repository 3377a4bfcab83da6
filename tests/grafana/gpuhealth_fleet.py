"""A small fleet with GPU faults, as SampleBatch messages encoded by the collector's own encoder.

Three nodes, four minutes up to ``end_ns``, the way an agent sends them: one batch per second per
node with ten GPU samples per GPU (10 Hz), the health fields in the first sample of each second
(once per health interval), the node's processes, NVLink links and MIG instances once per second,
the GPU events when they happen and the agent's stats in every batch.

- ``node-h1`` GPU 0 is healthy and busy; GPU 1 fails ``FAIL_AT_S`` seconds before the end: XID 79
  (fallen off the bus), a double-bit ECC error, a row-remap failure; health ``failed``.
- ``node-h2`` GPU 0 is degraded: a pending row remap, thermal slowdown (clock-event reason 0x20)
  from ``THROTTLE_FROM_S`` on, PCIe replays and NVLink CRC errors that keep growing, and a spool
  that grows (the agent cannot deliver as fast as it samples). It is MIG-enabled (two instances).
- ``node-h3`` GPU 0 is healthy, but its agent falls silent ``SILENT_S`` seconds before the end.
- ``node-h1``'s clock is 15 minutes fast from ``CLOCK_OFF_FROM_S`` on (its streams' ``clock_offset_s``);
  the others keep time to within a millisecond.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuprobe.collector.encode import StreamEncoder
from gpuprobe.devservices import InfluxDBServer
from gpuprobe.v1 import common_pb2, telemetry_pb2
from gpuprobe.wire.validate import Identity, Limits

S = 10**9
SPAN_S = 240
FAIL_AT_S = 30  # before the end
THROTTLE_FROM_S = 60  # after the start
SILENT_S = 90  # before the end
CLOCK_OFF_FROM_S = 120  # after the start
CLOCK_OFF_NS = 900 * S
MODEL = "NVIDIA H100 80GB HBM3"
GIB = 1024**3
XID_79 = "GPU has fallen off the bus"
FAULTY = {
    "xid": {("node-h1", "1")},
    "failed": {("node-h1", "1")},
    "degraded": {("node-h2", "0")},
    "thermal": {("node-h2", "0")},
    "silent": {("node-h3",)},
    "spool": {("node-h2",)},
    "clock": {("node-h1",)},
}
NODES = {"node-h1": 2, "node-h2": 1, "node-h3": 1}


@dataclass
class HealthFleet:
    """Where the fleet's lines went, and when (``end_ns``: the last sample)."""

    server: InfluxDBServer
    db: str
    start_ns: int
    end_ns: int
    lines: int = 0
    kinds: set[str] = field(default_factory=set)


def _health(host: str, gpu: int, t_s: int) -> tuple[int, str]:
    """(GpuHealth, reason) of a GPU at second ``t_s`` after the start."""
    if host == "node-h1" and gpu == 1 and t_s >= SPAN_S - FAIL_AT_S:
        return common_pb2.GPU_HEALTH_FAILED, f"XID 79: {XID_79}"
    if host == "node-h2":
        return common_pb2.GPU_HEALTH_DEGRADED, "row remap pending; thermal slowdown"
    return common_pb2.GPU_HEALTH_HEALTHY, ""


def _gpu_samples(host: str, gpu: int, t_ns: int, t_s: int) -> list[telemetry_pb2.GpuSample]:
    throttled = host == "node-h2" and t_s >= THROTTLE_FROM_S
    failed = host == "node-h1" and gpu == 1 and t_s >= SPAN_S - FAIL_AT_S
    samples = []
    for tick in range(10):
        sample = telemetry_pb2.GpuSample(
            time_unix_ns=t_ns + tick * S // 10,
            gpu_index=gpu,
            util_pct=0.0 if failed else 90.0 - 5 * gpu,
            mem_util_pct=40.0,
            mem_used_bytes=40 * GIB,
            mem_total_bytes=80 * GIB,
            power_w=350.0 if not throttled else 280.0,
            energy_j=1000.0 + 350.0 * t_s + 35.0 * tick,
            temp_c=88.0 if throttled else 65.0,
            mem_temp_c=70.0,
            sm_clock_mhz=1400 if throttled else 1980,
            mem_clock_mhz=2619,
            power_limit_w=700.0,
            clock_event_reasons=0x20 if throttled else 0,
        )
        if tick == 0:  # the health fields: once per health interval
            health, reason = _health(host, gpu, t_s)
            sample.ecc_corrected_volatile = 3 + t_s // 60
            sample.ecc_uncorrected_volatile = 2 if failed else 0
            sample.ecc_corrected_aggregate = 120 + t_s // 60
            sample.ecc_uncorrected_aggregate = 2 if failed else 0
            sample.retired_pages_sbe = 1
            sample.retired_pages_dbe = 1 if failed else 0
            sample.retired_pages_pending = failed
            sample.remapped_rows_correctable = 4 if host == "node-h2" else 0
            sample.remapped_rows_uncorrectable = 1 if failed else 0
            sample.remap_pending = host == "node-h2"
            sample.remap_failure = failed
            sample.pcie_replay_count = 7 * t_s if host == "node-h2" else 2
            sample.power_violation_us = 100_000 * t_s
            sample.thermal_violation_us = 900_000 * max(0, t_s - THROTTLE_FROM_S) if host == "node-h2" else 0
            sample.sync_boost_violation_us = 0
            sample.fan_rpm = 3200.0
            sample.sm_active_pct = 0.0 if failed else 62.0
            sample.sm_occupancy_pct = 31.0
            sample.tensor_active_pct = 0.0 if failed else 44.0
            sample.dram_bw_util_pct = 35.0
            sample.fp16_active_pct = 38.0
            sample.fp32_active_pct = 9.0
            sample.fp64_active_pct = 0.5
            sample.nvlink_tx_bytes_per_s = 2 * 40e9
            sample.nvlink_rx_bytes_per_s = 2 * 38e9
            sample.health = health  # type: ignore[assignment]
            sample.health_reason = reason
        samples.append(sample)
    return samples


def _batch(host: str, seq: int, t_ns: int, t_s: int, spool: int) -> telemetry_pb2.SampleBatch:
    gpus = range(NODES[host])
    batch = telemetry_pb2.SampleBatch(
        agent_id=f"agent-{host}",
        seq=seq,
        created_unix_ns=t_ns + S - 1,
        gpus=[telemetry_pb2.GpuRef(index=g, uuid=f"GPU-{host}-{g}", name=MODEL) for g in gpus],
        stats=telemetry_pb2.AgentStats(spool_bytes=spool),
    )
    for g in gpus:
        batch.gpu_samples.extend(_gpu_samples(host, g, t_ns, t_s))
        batch.process_samples.append(
            telemetry_pb2.ProcessSample(
                time_unix_ns=t_ns,
                gpu_index=g,
                pid=4000 + g,
                command="python",
                cgroup=f"/kubepods/burstable/pod-{host}-{g}",
                used_memory_bytes=38 * GIB,
                sm_pct=93.0,
                mem_util_pct=40.0,
                energy_j=350.0 * t_s,
                ended=False,
            )
        )
        for link in range(2):
            errors = 3 * t_s if host == "node-h2" and link == 1 else 0
            batch.nvlink_samples.append(
                telemetry_pb2.NvLinkSample(
                    time_unix_ns=t_ns,
                    gpu_index=g,
                    link=link,
                    tx_bytes_per_s=40e9,
                    rx_bytes_per_s=38e9,
                    crc_flit_errors=errors,
                    crc_data_errors=errors // 3,
                    replay_errors=errors // 2,
                    recovery_errors=0,
                )
            )
    if host == "node-h2":
        for instance in (1, 2):
            batch.mig_samples.append(
                telemetry_pb2.MigSample(
                    time_unix_ns=t_ns,
                    gpu_index=0,
                    gpu_instance_id=instance,
                    mig_uuid=f"MIG-{host}-{instance}",
                    name=f"{MODEL} MIG 3g.40gb",
                    mem_used_bytes=10 * GIB * instance,
                    mem_total_bytes=40 * GIB,
                    multiprocessor_count=60,
                )
            )
    return batch


def _events(host: str, t_ns: int, t_s: int) -> list[telemetry_pb2.GpuEvent]:
    events = []
    if host == "node-h1" and t_s == SPAN_S - FAIL_AT_S:
        events += [
            telemetry_pb2.GpuEvent(
                time_unix_ns=t_ns + S // 2, gpu_index=1, kind=telemetry_pb2.GPU_EVENT_KIND_XID, data=79, text=XID_79
            ),
            telemetry_pb2.GpuEvent(
                time_unix_ns=t_ns + S // 2 + 1000, gpu_index=1, kind=telemetry_pb2.GPU_EVENT_KIND_ECC_DOUBLE_BIT, data=1
            ),
            telemetry_pb2.GpuEvent(
                time_unix_ns=t_ns + S // 2 + 2000, gpu_index=1, kind=telemetry_pb2.GPU_EVENT_KIND_LOST, data=0
            ),
        ]
    if host == "node-h2" and t_s == THROTTLE_FROM_S:
        events.append(
            telemetry_pb2.GpuEvent(
                time_unix_ns=t_ns,
                gpu_index=0,
                kind=telemetry_pb2.GPU_EVENT_KIND_CLOCK_CHANGE,
                data=0x20,
                gpu_instance_id=1,
            )
        )
    if host == "node-h1" and t_s == 20:  # an old XID on the healthy GPU: outside every alert window
        events.append(
            telemetry_pb2.GpuEvent(
                time_unix_ns=t_ns,
                gpu_index=0,
                kind=telemetry_pb2.GPU_EVENT_KIND_XID,
                data=13,
                text="Graphics Engine Exception",
            )
        )
    return events


def write_health_fleet(server: InfluxDBServer, db: str, end_ns: int) -> HealthFleet:
    """Encodes the fleet with one StreamEncoder per agent and writes it into ``db``."""
    start_ns = end_ns - SPAN_S * S
    fleet = HealthFleet(server, db, start_ns, end_ns)
    for host in NODES:
        encoder = StreamEncoder(
            Identity(agent_id=f"agent-{host}", host=host, cluster="c1", virt="bare_metal"), Limits()
        )
        chunks: list[bytes] = []
        seconds = SPAN_S - SILENT_S if host == "node-h3" else SPAN_S
        for t_s in range(seconds):
            t_ns = start_ns + t_s * S
            spool = 1_000_000 * max(0, t_s - 100) if host == "node-h2" else 0
            batch = _batch(host, t_s + 1, t_ns, t_s, spool)
            batch.gpu_events.extend(_events(host, t_ns, t_s))
            fleet.kinds.update(telemetry_pb2.GpuEventKind.Name(e.kind) for e in batch.gpu_events)
            offset_ns = CLOCK_OFF_NS if host == "node-h1" and t_s >= CLOCK_OFF_FROM_S else 400_000
            encoded = encoder.encode(batch, now_ns=end_ns, clock_offset_ns=offset_ns)
            assert not encoded.problems, encoded.problems.rejections()
            chunks.append(encoded.lines)
            fleet.lines += encoded.line_count
        server.write_lines(db, b"".join(chunks))
    return fleet
