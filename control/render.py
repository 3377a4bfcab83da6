"""Part: control. Tables and JSON for the operator commands (plain text: what a terminal and a log both read)."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence
from typing import Any

from gpuprobe.control import signing
from gpuprobe.control.gpus import health_name
from gpuprobe.texttable import text_table
from gpuprobe.v1 import common_pb2, control_pb2
from gpuprobe.wire.validate import CLOCK_CORRECTED_FROM_S


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    return "\n".join(text_table(headers, rows))


def bar(fraction: float, width: int = 20) -> str:
    fraction = min(1.0, max(0.0, fraction))
    filled = round(fraction * width)
    return "[" + "#" * filled + "-" * (width - filled) + f"] {fraction * 100:3.0f}%"


def age(t_ns: int, now_ns: int | None = None) -> str:
    if not t_ns:
        return "never"
    seconds = ((now_ns or time.time_ns()) - t_ns) / 1e9
    if seconds < 0:
        return "in the future"
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}h ago"
    return f"{seconds / 86400:.0f}d ago"


def clock(t_ns: int) -> str:
    if not t_ns:
        return "-"
    return dt.datetime.fromtimestamp(t_ns / 1e9).strftime("%H:%M:%S.%f")[:-3]


def enum_name(enum: Any, value: int, prefix: str) -> str:
    try:
        return str(enum.Name(value)).removeprefix(prefix).lower()
    except ValueError:
        return "unknown"


def phase(value: int) -> str:
    name = enum_name(common_pb2.ProbePhase, value, "PROBE_PHASE_")
    return {"idle_baseline": "idle"}.get(name, name)


def status(value: int) -> str:
    return enum_name(common_pb2.ProbeStatus, value, "PROBE_STATUS_")


def state(value: int) -> str:
    return enum_name(control_pb2.AgentState, value, "AGENT_STATE_")


def size(value: int) -> str:
    return "tiny" if value == control_pb2.WORKLOAD_SIZE_TINY else "full"


def num(msg: Any, name: str, spec: str = ".1f") -> str:
    return format(getattr(msg, name), spec) if msg.HasField(name) else "-"


def replies_table(replies: Sequence[control_pb2.CommandReply], expected: set[str]) -> str:
    rows = []
    for r in replies:
        reason = "" if r.accepted else signing.REASON_NAMES.get(r.reason, str(r.reason))
        rows.append([r.host, "accepted" if r.accepted else "refused", reason, r.message])
    for host in sorted(expected - {r.host for r in replies}):
        rows.append([host, "no reply", "", "online, selected, but did not answer in time"])
    return table(["HOST", "ANSWER", "REASON", "DETAIL"], rows)


def health(value: int) -> str:
    """``healthy``, ``degraded``, ``failed``, ``unknown``."""
    return health_name(value)


def unhealthy(p: control_pb2.AgentPresence) -> list[control_pb2.GpuHealthStatus]:
    """The presence's GPUs that are not healthy (failed first, then degraded, by index)."""
    bad = [g for g in p.gpu_health if g.health != common_pb2.GPU_HEALTH_HEALTHY]
    return sorted(bad, key=lambda g: (-g.health, g.index))


def health_summary(p: control_pb2.AgentPresence) -> str:
    """The fleet table's HEALTH column: ``ok``, ``1 failed``, ``1 failed, 2 degraded``; ``-`` when unknown."""
    if not p.gpu_health:
        return "-"
    counts: dict[str, int] = {}
    for g in unhealthy(p):
        counts[health(g.health)] = counts.get(health(g.health), 0) + 1
    return ", ".join(f"{n} {name}" for name, n in counts.items()) or "ok"


def fleet_table(presences: Sequence[control_pb2.AgentPresence]) -> str:
    """One row per agent, then one line per GPU that is not healthy: ``HOST: GPU 1 failed: REASON``."""
    rows = []
    for p in presences:
        gpus: dict[str, int] = {}
        for g in p.gpus:
            gpus[g.name or "GPU"] = gpus.get(g.name or "GPU", 0) + 1
        rows.append(
            [
                p.identity.host,
                state(p.state),
                age(p.last_seen_unix_ns),
                p.identity.cluster or "-",
                ", ".join(f"{n}x {name}" for name, n in gpus.items()) or "none",
                health_summary(p),
                str(len(p.workloads)),
                p.probe_id or "-",
                p.agent_version,
            ]
        )
    out = table(["HOST", "STATE", "LAST SEEN", "CLUSTER", "GPUS", "HEALTH", "WORKLOADS", "PROBE", "VERSION"], rows)
    notes = [
        f"{p.identity.host}: GPU {g.index} {health(g.health)}" + (f": {g.reason}" if g.reason else "")
        for p in presences
        for g in unhealthy(p)
    ]
    notes += [
        f"{p.identity.host}: clock {p.clock_offset_s:+.1f} s off its collector's (its samples are stored on the"
        " collector's clock)"
        for p in presences
        if p.HasField("clock_offset_s") and abs(p.clock_offset_s) >= CLOCK_CORRECTED_FROM_S
    ]
    return out + ("\n\n" + "\n".join(notes) if notes else "")


def presence_dict(p: control_pb2.AgentPresence) -> dict[str, Any]:
    ident = p.identity
    return {
        "host": ident.host,
        "state": state(p.state),
        "last_seen_unix_ns": p.last_seen_unix_ns,
        "last_seen_age_s": (time.time_ns() - p.last_seen_unix_ns) / 1e9 if p.last_seen_unix_ns else None,
        "started_unix_ns": p.started_unix_ns,
        "cluster": ident.cluster,
        "cloud": ident.cloud,
        "instance_type": ident.instance_type,
        "region": ident.region,
        "agent_version": p.agent_version,
        "gpus": [
            {"index": g.index, "uuid": g.uuid, "name": g.name, "memory_total_bytes": g.memory_total_bytes}
            for g in p.gpus
        ],
        "gpu_health": [{"index": g.index, "health": health(g.health), "reason": g.reason} for g in p.gpu_health],
        "workloads": list(p.workloads),
        "probe": p.probe_id,
        "uplink_connected": p.uplink_connected,
        "spool_bytes": p.spool_bytes,
        "clock_offset_s": p.clock_offset_s if p.HasField("clock_offset_s") else None,
    }


def progress_rows(
    probe_id: str,
    hosts: Sequence[str],
    progress: dict[tuple[str, str], control_pb2.ProbeProgress],
    results: dict[tuple[str, str], control_pb2.ProbeResult],
) -> list[list[str]]:
    rows = []
    for host in hosts:
        p = progress.get((probe_id, host))
        r = results.get((probe_id, host))
        if r is not None:
            rows.append(
                [host, "done", status(r.status), str(p.step) if p else "-", num(r.total, "samples_per_s"), bar(1.0)]
            )
        elif p is not None:
            rows.append(
                [
                    host,
                    phase(p.phase),
                    status(p.status),
                    str(p.step),
                    num(p, "samples_per_s"),
                    bar(p.fraction_done if p.HasField("fraction_done") else 0.0),
                ]
            )
    return rows


def progress_table(probe_id: str, workload: str, rows: list[list[str]]) -> str:
    head = f"probe {probe_id}" + (f"  ({workload})" if workload else "")
    return head + "\n" + table(["HOST", "PHASE", "STATUS", "STEP", "SAMPLES/S", "PROGRESS"], rows)


SIMULATED_NOTE = "SIMULATED throughput: the simulator's performance model, not a measurement"


def is_simulated(device: str) -> bool:
    """Whether a result's ``device`` (``ProbeResult.device``, ``PointResult.device``) names a simulated GPU."""
    return "sim" in device.split(",")


def throughput_source(device: str) -> str:
    """The THROUGHPUT cell: SIMULATED for a simulated GPU's figures, else what measured them (``-``: unknown)."""
    return "SIMULATED" if is_simulated(device) else (device or "-")


def results_table(results: Sequence[control_pb2.ProbeResult]) -> str:
    rows = []
    for r in results:
        t = r.total
        rows.append(
            [
                r.host,
                status(r.status),
                f"{r.workload} {size(r.size)}",
                str(r.batch_size or "-"),
                num(t, "samples_per_s", ".2f"),
                num(t, "energy_j", ".1f"),
                num(t, "j_per_sample", ".4f"),
                num(t, "mean_power_w", ".1f"),
                num(t, "peak_power_w", ".1f"),
                num(t, "peak_temp_c", ".0f"),
                num(t, "idle_power_w", ".1f"),
                clock(r.steady_start_unix_ns),
                throughput_source(r.device),
            ]
        )
    out = table(
        [
            "HOST",
            "STATUS",
            "WORKLOAD",
            "BATCH",
            "SAMPLES/S",
            "ENERGY J",
            "J/SAMPLE",
            "MEAN W",
            "PEAK W",
            "PEAK C",
            "IDLE W",
            "STEADY FROM",
            "THROUGHPUT",
        ],
        rows,
    )
    notes = [f"{r.host}: {r.message}" for r in results if r.message]
    if any(is_simulated(r.device) for r in results):
        notes.insert(0, SIMULATED_NOTE)
    return out + ("\n" + "\n".join(notes) if notes else "")


def metrics_dict(m: control_pb2.ProbeMetrics) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in (
        "gpu_index",
        "samples_per_s",
        "energy_j",
        "j_per_sample",
        "mean_power_w",
        "peak_power_w",
        "peak_temp_c",
        "samples",
        "idle_power_w",
    ):
        out[name] = getattr(m, name) if m.HasField(name) else None
    if m.gpu_uuid:
        out["gpu_uuid"] = m.gpu_uuid
    return out


def result_dict(r: control_pb2.ProbeResult) -> dict[str, Any]:
    return {
        "probe": r.probe_id,
        "host": r.host,
        "status": status(r.status),
        "message": r.message,
        "workload": r.workload,
        "size": size(r.size),
        "batch_size": r.batch_size,
        "started_unix_ns": r.started_unix_ns,
        "ended_unix_ns": r.ended_unix_ns,
        "steady_start_unix_ns": r.steady_start_unix_ns,
        "steady_end_unix_ns": r.steady_end_unix_ns,
        "total": metrics_dict(r.total),
        "gpus": [metrics_dict(g) for g in r.gpus],
        "device": r.device,
        "simulated": is_simulated(r.device),
        "points": [point_dict(p) for p in r.points],
    }


def point_dict(p: control_pb2.PointResult) -> dict[str, Any]:
    """One study point's result on one node (``probe results --json`` of a study)."""
    return {
        "index": p.index,
        "workload": p.workload,
        "batch_size": p.batch_size,
        "power_limit": p.power_limit,
        "refused": p.refused,
        "device": p.device,
        "simulated": is_simulated(p.device),
        "total": metrics_dict(p.total),
        "gpus": [metrics_dict(g) for g in p.gpus],
    }


def reply_dict(r: control_pb2.CommandReply) -> dict[str, Any]:
    return {
        "host": r.host,
        "accepted": r.accepted,
        "reason": None if r.accepted else signing.REASON_NAMES.get(r.reason, str(r.reason)),
        "message": r.message,
        "probe": r.probe_id,
        "command_id": r.command_id,
    }
