"""Part: agent. GPU processes: who runs on each GPU, their share of it and the energy attributed to them.

Fed once per health interval per GPU by the sampler with what the GPU sensor read
(``nvmlDeviceGetComputeRunningProcesses``, ``nvmlDeviceGetProcessUtilization``) and that tick's
``energy_j``; it returns the ``ProcessSample`` points of that read:

- every process on the GPU gets a point at each read: a new one at the first read that lists it, a
  running one once per interval;
- a process no longer listed gets one last point with ``ended=true`` and is forgotten;
- ``command`` is ``/proc/PID/comm`` (the first word of ``cmdline`` where ``comm`` is unreadable),
  ``cgroup`` the unified (v2) path of ``/proc/PID/cgroup`` (else the first line's path), read when
  the process is first seen; empty when unreadable (another PID namespace, a process gone);
- ``energy_j`` is the GPU energy attributed to the process since the agent first saw it: each
  interval's increase of the GPU's ``energy_j`` counter is split over the processes listed at both
  ends of the interval by their SM share, equally when no process has a share;
- at most :data:`MAX_PROCESSES_PER_GPU` processes are tracked per GPU (more are left out, logged once).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from gpuprobe.nvml.sensor import ProcessRead
from gpuprobe.v1 import telemetry_pb2

log = logging.getLogger(__name__)

MAX_PROCESSES_PER_GPU = 256
MAX_TEXT = 256  # characters of command and cgroup kept


@dataclass
class _Process:
    command: str
    cgroup: str
    energy_j: float = 0.0


class ProcessTracker:
    """The processes of every GPU; used by the sampler thread only."""

    def __init__(self, proc_dir: Path = Path("/proc"), max_per_gpu: int = MAX_PROCESSES_PER_GPU) -> None:
        self._proc = proc_dir
        self._max = max_per_gpu
        self._gpus: dict[int, dict[int, _Process]] = {}
        self._energy_j: dict[int, float] = {}
        self._capped_logged: set[int] = set()

    def update(
        self,
        gpu_index: int,
        time_unix_ns: int,
        processes: list[ProcessRead] | None,
        utilization: dict[int, tuple[float, float]],
        energy_j: float | None,
    ) -> list[telemetry_pb2.ProcessSample]:
        """This read's points of GPU ``gpu_index``; ``processes`` None: unknown (nothing changes)."""
        if processes is None:
            return []
        table = self._gpus.setdefault(gpu_index, {})
        listed: dict[int, ProcessRead] = {}
        tracked = set(table)
        for p in processes:
            if p.pid in tracked or len(tracked) < self._max:
                tracked.add(p.pid)
                listed[p.pid] = p
            elif gpu_index not in self._capped_logged:
                self._capped_logged.add(gpu_index)
                log.warning("GPU %d: more than %d processes; the others are left out", gpu_index, self._max)
        # the interval's energy, split over the processes present at both ends
        previous_energy = self._energy_j.get(gpu_index)
        if energy_j is not None:
            self._energy_j[gpu_index] = energy_j
        stayed = [pid for pid in listed if pid in table]
        if energy_j is not None and previous_energy is not None and energy_j >= previous_energy and stayed:
            delta = energy_j - previous_energy
            shares = {pid: max(0.0, utilization.get(pid, (0.0, 0.0))[0]) for pid in stayed}
            total = sum(shares.values())
            for pid in stayed:
                table[pid].energy_j += delta * shares[pid] / total if total > 0 else delta / len(stayed)
        out: list[telemetry_pb2.ProcessSample] = []
        for pid, p in listed.items():
            known = table.get(pid)
            if known is None:
                known = table[pid] = _Process(self._command(pid), self._cgroup(pid))
            sample = telemetry_pb2.ProcessSample(
                time_unix_ns=time_unix_ns,
                gpu_index=gpu_index,
                pid=pid,
                command=known.command,
                cgroup=known.cgroup,
                energy_j=known.energy_j,
            )
            if p.used_memory_bytes is not None:
                sample.used_memory_bytes = p.used_memory_bytes
            share = utilization.get(pid)
            if share is not None:
                sample.sm_pct, sample.mem_util_pct = share
            out.append(sample)
        for pid in [pid for pid in table if pid not in listed]:
            gone = table.pop(pid)
            out.append(
                telemetry_pb2.ProcessSample(
                    time_unix_ns=time_unix_ns,
                    gpu_index=gpu_index,
                    pid=pid,
                    command=gone.command,
                    cgroup=gone.cgroup,
                    energy_j=gone.energy_j,
                    ended=True,
                )
            )
        return out

    def _read(self, pid: int, name: str) -> bytes:
        try:
            return (self._proc / str(pid) / name).read_bytes()
        except OSError:
            return b""

    def _command(self, pid: int) -> str:
        comm = self._read(pid, "comm").decode(errors="replace").strip()
        if not comm:
            argv = self._read(pid, "cmdline").split(b"\0")
            comm = Path(argv[0].decode(errors="replace")).name if argv and argv[0] else ""
        return _printable(comm)

    def _cgroup(self, pid: int) -> str:
        lines = self._read(pid, "cgroup").decode(errors="replace").splitlines()
        for line in lines:
            if line.startswith("0::"):
                return _printable(line[3:])
        return _printable(lines[0].split(":", 2)[-1]) if lines else ""


def _printable(text: str) -> str:
    return "".join(c for c in text if c.isprintable())[:MAX_TEXT]
