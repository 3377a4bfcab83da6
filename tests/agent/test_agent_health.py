"""GPU health (issue 12): events, health counters, processes and the health rule.

The agent tests run a real ``gpuprobe agent`` against the simulator (the failures are injected through
the simulator's state functions, the ones ``gpuprobe sim fail --xid`` and friends call; tests/sim checks
that command) and read what the receiver stored; the rule and the process table are also checked directly
(pure Python, no NVML).
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
from agent_helpers import AgentFactory, Receiver, batch_samples, machine, unique_batches, wait_for_batches

from gpuprobe.agent.health import DEGRADED, FAILED, HEALTHY, HealthTracker
from gpuprobe.agent.sensors.events import lost_event, xid_text
from gpuprobe.agent.sensors.processes import ProcessTracker
from gpuprobe.nvml.sensor import NVLINK_ERROR_COUNTERS, ProcessRead
from gpuprobe.sim import state
from gpuprobe.sim.profiles import PROFILES, with_overrides
from gpuprobe.v1 import telemetry_pb2

XID = telemetry_pb2.GPU_EVENT_KIND_XID


def xid(code: int, gpu: int = 0) -> telemetry_pb2.GpuEvent:
    return telemetry_pb2.GpuEvent(time_unix_ns=1, gpu_index=gpu, kind=XID, data=code, text=xid_text(code))


# ---------------------------------------------------------------------- the rule, directly


def test_the_health_rule() -> None:
    changes: list[int] = []
    t = HealthTracker([0, 1])
    t.on_change = lambda: changes.append(1)
    assert t.health == {0: (HEALTHY, ""), 1: (HEALTHY, "")}
    before = t.health
    t.event(xid(79), now_mono=0.0)
    assert t.health[0] == (FAILED, "XID 79: GPU has fallen off the bus")
    assert t.health[1] == (HEALTHY, "")
    assert before == {0: (HEALTHY, ""), 1: (HEALTHY, "")}, "replaced, never mutated"
    assert changes == [1]
    t.event(xid(13), now_mono=0.1)  # not in the rule's sets: no change
    assert changes == [1]
    t.event(lost_event(0, True), now_mono=0.2)
    assert t.health[0] == (
        FAILED,
        "GPU_IS_LOST: the GPU fell off the bus or stopped answering; XID 79: GPU has fallen off the bus",
    )
    t.event(lost_event(0, False), now_mono=0.3)  # answers again: a reset, the XID is forgotten
    assert t.health[0] == (HEALTHY, "")

    for code in (48, 94, 95, 64):
        t = HealthTracker([0])
        t.event(xid(code), now_mono=0.0)
        assert t.health[0][0] == FAILED, code
    for code in (63, 74, 92):
        t = HealthTracker([0])
        t.event(xid(code), now_mono=0.0)
        assert t.health[0] == (DEGRADED, xid_text(code)), code

    # counters: uncorrected volatile ECC fails; the volatile counters going down is a reset
    t = HealthTracker([0])
    assert t.observe(0, {"ecc_corrected_volatile": 3, "ecc_uncorrected_volatile": 0}, now_mono=0)[0] == HEALTHY
    t.event(xid(94), now_mono=0.5)
    assert t.observe(0, {"ecc_corrected_volatile": 3, "ecc_uncorrected_volatile": 1}, now_mono=1)[0] == FAILED
    assert t.observe(0, {"ecc_corrected_volatile": 0, "ecc_uncorrected_volatile": 0}, now_mono=2) == (HEALTHY, "")
    assert t.observe(0, {"remap_failure": True}, now_mono=3)[0] == FAILED
    assert t.observe(0, {"remap_pending": True}, now_mono=4)[0] == DEGRADED
    assert t.observe(0, {"retired_pages_pending": True}, now_mono=5)[0] == DEGRADED
    assert t.observe(0, {}, now_mono=6) == (HEALTHY, "")

    # NVLink CRC/replay errors that grew within 60 s
    t = HealthTracker([0])
    assert t.observe(0, {}, nvlink_errors=5, now_mono=0)[0] == HEALTHY, "a first reading is no growth"
    assert t.observe(0, {}, nvlink_errors=7, now_mono=1)[0] == DEGRADED
    assert t.observe(0, {}, nvlink_errors=7, now_mono=60)[0] == DEGRADED
    assert t.observe(0, {}, nvlink_errors=7, now_mono=61.5)[0] == HEALTHY

    # thermal slowdown held for 10 s (0x40 HW thermal, 0x20 SW thermal, 0x8 HW slowdown)
    for bits in (0x40, 0x20, 0x8):
        t = HealthTracker([0])
        for second in range(10):
            assert t.observe(0, {"clock_event_reasons": bits | 0x1}, now_mono=second)[0] == HEALTHY
        verdict = t.observe(0, {"clock_event_reasons": bits}, now_mono=10)
        assert verdict[0] == DEGRADED and "thermal slowdown" in verdict[1]
        assert t.observe(0, {"clock_event_reasons": 0x4}, now_mono=11) == (HEALTHY, ""), "SW power cap is not"

    # the worst level wins; its causes are all named
    t = HealthTracker([0])
    t.event(xid(63), now_mono=0)
    t.event(xid(79), now_mono=0)
    t.observe(0, {"remap_failure": True, "remap_pending": True}, now_mono=0)
    level, reason = t.health[0]
    assert level == FAILED
    assert reason == "XID 79: GPU has fallen off the bus; row remap failure: the GPU needs service"


def test_xid_texts() -> None:
    for code in (13, 31, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 119, 120, 140):
        assert xid_text(code).startswith(f"XID {code}: ") and len(xid_text(code)) > 12
    assert xid_text(79) == "XID 79: GPU has fallen off the bus"
    assert xid_text(12345) == "XID 12345 (see NVIDIA's XID catalog)"


def test_process_table(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    for pid, comm, cgroup in ((10, "python3", "0::/system.slice/job.service\n"), (11, "trainer", "")):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "comm").write_text(comm + "\n")
        (proc / str(pid) / "cgroup").write_text(cgroup)
    t = ProcessTracker(proc, max_per_gpu=2)
    first = t.update(0, 1, [ProcessRead(10, 1 << 30)], {}, 100.0)
    assert [(p.pid, p.command, p.cgroup, p.used_memory_bytes, p.ended) for p in first] == [
        (10, "python3", "/system.slice/job.service", 1 << 30, False)
    ]
    assert first[0].energy_j == 0
    # 10 J over the interval: all of it to the one process present at both ends
    second = t.update(0, 2, [ProcessRead(10, 1 << 30), ProcessRead(11, None)], {10: (50.0, 5.0)}, 110.0)
    assert {p.pid: p.energy_j for p in second} == {10: 10.0, 11: 0.0}
    assert not second[1].HasField("used_memory_bytes")
    assert second[0].sm_pct == 50.0
    # split by SM share, equally when none is reported
    third = t.update(
        0, 3, [ProcessRead(10, 0), ProcessRead(11, 0), ProcessRead(12, 0)], {10: (30, 0), 11: (10, 0)}, 130.0
    )
    assert {p.pid: p.energy_j for p in third} == {10: 25.0, 11: 5.0}, "capped at 2: pid 12 is left out"
    fourth = t.update(0, 4, [ProcessRead(11, 0)], {}, 140.0)
    assert [(p.pid, p.ended, p.energy_j) for p in fourth] == [(11, False, 15.0), (10, True, 25.0)]
    assert t.update(0, 5, [ProcessRead(11, 0)], {}, 150.0)[0].energy_j == 25.0
    assert t.update(0, 6, None, {}, 160.0) == [], "unknown: nothing changes"


# ---------------------------------------------------------------------- through a real agent


def health_samples(batches: dict[int, telemetry_pb2.SampleBatch], gpu: int) -> list[telemetry_pb2.GpuSample]:
    return [s for b in batches.values() for s in b.gpu_samples if s.gpu_index == gpu and s.HasField("health")]


def health_reads(gpus: range, at_least: int) -> Callable[[dict[int, telemetry_pb2.SampleBatch]], bool]:
    """A ``wait_for_batches`` predicate: every GPU in ``gpus`` has ``at_least`` health samples received."""
    return lambda batches: all(len(health_samples(batches, g)) >= at_least for g in gpus)


def test_health_fields_once_a_second_and_absent_where_unsupported(
    tmp_path: Path, receiver: Receiver, agent_factory: AgentFactory
) -> None:
    sim = machine(tmp_path / "sim", ["H100-SXM5-80GB", "A100-SXM4-80GB", "RTX-4090"])
    agent = agent_factory(sim, [receiver.address])
    agent.wait_for_log("streaming to collector")

    # 3 health reads and 33 ticks of every GPU: past the stops (after 21..24 or 31..32 ticks) at which one
    # read in 10 ticks would not yet show as more than 8 plain samples per health sample
    def three_reads(batches: dict[int, telemetry_pb2.SampleBatch]) -> bool:
        plain = Counter(s.gpu_index for b in batches.values() for s in b.gpu_samples)
        return health_reads(range(3), 3)(batches) and all(plain[g] >= 33 for g in range(3))

    wait_for_batches(receiver, three_reads, "3 health reads and 33 ticks of every GPU", agent=agent)
    assert agent.terminate() == 0
    batches = unique_batches(receiver.batches())
    infos = {i.index: i for b in batches.values() for i in b.gpu_info}
    assert infos[0].gpm_supported and not infos[1].gpm_supported, "GPM: Hopper and newer"
    for gpu in (0, 1, 2):
        samples = health_samples(batches, gpu)
        # once a second by the sample's own clock (a count over the test's wall time would depend on
        # how soon the wait saw the batches, which a busy machine delays)
        gaps_s = np.diff(sorted(s.time_unix_ns for s in samples)) / 1e9
        assert len(samples) >= 3 and np.all(gaps_s > 0.95), f"GPU {gpu}: health reads more often than 1 Hz: {gaps_s}"
        assert np.median(gaps_s) < 1.05, f"GPU {gpu}: health reads less often than 1 Hz: {gaps_s}"
        plain = [s for b in batches.values() for s in b.gpu_samples if s.gpu_index == gpu]
        assert len(plain) > 8 * len(samples), "the other ticks stay plain"
        for s in samples:
            assert s.health == HEALTHY and s.health_reason == ""
            assert not s.HasField("pcie_replay_count") or s.pcie_replay_count >= 0
    # every GPU's health reads are made on the same tick (the first of each second), so the GPUs' health
    # fields line up in time: each health sample of GPU 0 has one of GPUs 1 and 2 within that tick
    ticks_ns = [sorted(s.time_unix_ns for s in health_samples(batches, g)) for g in (0, 1, 2)]
    for t_ns in ticks_ns[0][:-1]:  # the last one's tick may have been cut by the stop
        for other in ticks_ns[1:]:
            assert min(abs(t_ns - o) for o in other) < 50_000_000, (ticks_ns, "not on one tick")
    h100, a100, rtx = (health_samples(batches, g)[-1] for g in (0, 1, 2))
    assert h100.HasField("ecc_uncorrected_volatile") and h100.ecc_uncorrected_volatile == 0
    assert h100.HasField("remap_pending") and not h100.remap_pending
    assert not rtx.HasField("ecc_uncorrected_volatile"), "no ECC on the RTX 4090: absent, not zero"
    assert not rtx.HasField("remap_pending")
    assert rtx.HasField("fan_rpm") and rtx.fan_rpm > 0
    assert not h100.HasField("fan_rpm"), "passive part: absent"
    assert h100.HasField("sm_active_pct"), "GPM on Hopper (from the second read on)"
    assert not a100.HasField("sm_active_pct"), "no GPM on the A100: absent, not zero"
    nvlinks = [n for b in batches.values() for n in b.nvlink_samples]
    assert {n.gpu_index for n in nvlinks} <= {0, 1} and {n.gpu_index for n in nvlinks}, "NVLink on SXM parts only"
    assert all(n.HasField("crc_flit_errors") for n in nvlinks)
    log = agent.log()
    assert "Traceback" not in log


def test_an_xid_arrives_once_and_fails_the_gpu(tmp_path: Path, receiver: Receiver, agent_factory: AgentFactory) -> None:
    sim = machine(tmp_path / "sim", ["H100-SXM5-80GB", "H100-SXM5-80GB"])
    agent = agent_factory(sim, [receiver.address])
    agent.wait_for_log("streaming to collector")
    wait_for_batches(receiver, health_reads(range(2), 1), "a healthy read of both GPUs", agent=agent)
    state.inject_xid(sim.state_dir, 1, 13)
    agent.wait_for_log(r"GPU 1: XID 13: Graphics engine exception")
    state.inject_xid(sim.state_dir, 0, 79)
    agent.wait_for_log(r"GPU 0 health: failed \(.*XID 79: GPU has fallen off the bus")
    agent.wait_for_log(r"GPU 0 \(.*\) is lost \(.*GPU_IS_LOST\)")  # the reads found it gone: its LOST event
    state.set_failed(sim.state_dir, 0, False)  # a GPU reset
    agent.wait_for_log(r"GPU 0 health: healthy")

    def healthy_after_recovery(batches: dict[int, telemetry_pb2.SampleBatch]) -> bool:
        recovered = [
            e.time_unix_ns
            for b in batches.values()
            for e in b.gpu_events
            if e.kind == telemetry_pb2.GPU_EVENT_KIND_RECOVERED
        ]
        return bool(recovered) and any(s.time_unix_ns > recovered[0] for s in health_samples(batches, 0))

    wait_for_batches(receiver, healthy_after_recovery, "a health read of GPU 0 after it recovered", agent=agent)
    assert agent.terminate() == 0
    # a restart does not send them again: the second agent's first batches (where a replay of NVML's
    # event history would land) carry none of them
    last_seq = max(unique_batches(receiver.batches()))
    agent2 = agent_factory(sim, [receiver.address])
    agent2.wait_for_log("streaming to collector")
    wait_for_batches(receiver, lambda got: max(got) >= last_seq + 2, "two batches of the restarted agent", agent=agent2)
    assert agent2.terminate() == 0

    batches = unique_batches(receiver.batches())
    events = [e for b in batches.values() for e in b.gpu_events]
    xids = [(e.gpu_index, e.data, e.text) for e in events if e.kind == XID]
    assert xids == [(1, 13, "XID 13: Graphics engine exception"), (0, 79, "XID 79: GPU has fallen off the bus")]
    kinds = [(e.gpu_index, e.kind) for e in events if e.kind != XID]
    assert kinds == [(0, telemetry_pb2.GPU_EVENT_KIND_LOST), (0, telemetry_pb2.GPU_EVENT_KIND_RECOVERED)]
    assert len({(e.gpu_index, e.time_unix_ns, e.kind) for e in events}) == len(events)
    # GPU 1 keeps healthy samples (XID 13 is not in the rule); GPU 0 is healthy again after the reset
    assert all(s.health == HEALTHY for s in health_samples(batches, 1))
    recovered_ns = next(e.time_unix_ns for e in events if e.kind == telemetry_pb2.GPU_EVENT_KIND_RECOVERED)
    after = [s for s in health_samples(batches, 0) if s.time_unix_ns > recovered_ns]
    assert after and all(s.health == HEALTHY for s in after)


def test_double_bit_ecc_fails_and_a_pending_remap_degrades(
    tmp_path: Path, receiver: Receiver, agent_factory: AgentFactory
) -> None:
    sim = machine(tmp_path / "sim", ["A100-SXM4-80GB", "A100-SXM4-80GB", "H100-SXM5-80GB"])
    agent = agent_factory(sim, [receiver.address])
    agent.wait_for_log("streaming to collector")

    def link3(batches: dict[int, telemetry_pb2.SampleBatch]) -> list[telemetry_pb2.NvLinkSample]:
        return [n for b in batches.values() for n in b.nvlink_samples if n.gpu_index == 2 and n.link == 3]

    # the first health read (every link's first point, no errors yet) before the faults
    wait_for_batches(receiver, health_reads(range(3), 1), "a health read of every GPU", agent=agent)
    assert link3(unique_batches(receiver.batches()))
    state.inject_ecc(sim.state_dir, 0, double_bit=True)
    state.inject_remap(sim.state_dir, 1, failure=False)
    state.inject_nvlink_errors(sim.state_dir, 2, 3, 5)
    agent.wait_for_log(r"GPU 0 health: failed")
    agent.wait_for_log(r"GPU 1 health: degraded \(row remap pending")
    agent.wait_for_log(r"GPU 2 health: degraded \(NVLink CRC/replay errors grew in the last 60 s\)")

    def verdicts_received(batches: dict[int, telemetry_pb2.SampleBatch]) -> bool:
        last = [health_samples(batches, g)[-1].health for g in range(3)]
        return last == [FAILED, DEGRADED, DEGRADED] and len(link3(batches)) >= 2

    wait_for_batches(receiver, verdicts_received, "the health reads with the new verdicts", agent=agent)
    assert agent.terminate() == 0
    batches = unique_batches(receiver.batches())
    last0 = health_samples(batches, 0)[-1]
    assert last0.health == FAILED
    assert "XID 48: Double-bit ECC error" in last0.health_reason
    assert last0.ecc_uncorrected_volatile == 1
    last1 = health_samples(batches, 1)[-1]
    assert last1.health == DEGRADED and last1.remap_pending
    assert "XID 63" in last1.health_reason
    events = [e for b in batches.values() for e in b.gpu_events]
    assert [e.data for e in events if e.kind == XID and e.gpu_index == 0] == [48]
    assert [e for e in events if e.kind == telemetry_pb2.GPU_EVENT_KIND_ECC_DOUBLE_BIT and e.gpu_index == 0]
    taken = int(agent.wait_for_log(r"stopped: (\d+) samples taken").group(1))
    assert sum(batch_samples(b) for b in batches.values()) == taken, "events and link samples count as samples"
    points = link3(batches)
    assert points[0].crc_flit_errors == 0 and points[-1].crc_flit_errors == 5 and points[-1].replay_errors == 5
    # a link's point goes out when its counters move, else once a minute: in this run of a few seconds, link 3
    # of GPU 2 has its first point and the one after the errors, every other link its first point only
    assert len(points) == 2, [(n.time_unix_ns, n.crc_flit_errors) for n in points]
    per_link = Counter((n.gpu_index, n.link) for b in batches.values() for n in b.nvlink_samples)
    assert len(per_link) == 12 + 12 + 18, per_link  # A100 SXM: 12 links, H100 SXM: 18
    assert {k: v for k, v in per_link.items() if v != 1} == {(2, 3): 2}, per_link
    assert health_samples(batches, 2)[-1].health == DEGRADED


def test_processes_name_pid_and_command(tmp_path: Path, receiver: Receiver, agent_factory: AgentFactory) -> None:
    sim = machine(tmp_path / "sim", ["L4"])
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

    def points_of(batches: dict[int, telemetry_pb2.SampleBatch]) -> list[telemetry_pb2.ProcessSample]:
        return [p for b in batches.values() for p in b.process_samples if p.pid == holder.pid]

    try:
        agent = agent_factory(sim, [receiver.address])
        agent.wait_for_log("streaming to collector")
        state.set_load(sim.state_dir, 0, 80, holder.pid, 2 << 30)
        # two health reads while it runs: the second attributes energy to it
        wait_for_batches(receiver, lambda got: len(points_of(got)) >= 2, "2 points of the process", agent=agent)
        state.set_load(sim.state_dir, 0, 0)
        ended = "the process's last point, when it left the GPU"
        wait_for_batches(receiver, lambda got: any(p.ended for p in points_of(got)), ended, agent=agent)
        assert agent.terminate() == 0
    finally:
        holder.kill()
        holder.wait(10)
    points = points_of(unique_batches(receiver.batches()))
    assert len(points) >= 2
    assert all(p.command.startswith("python") for p in points), [p.command for p in points]
    assert points[0].used_memory_bytes == 2 << 30
    assert [p.ended for p in points].count(True) == 1 and points[-1].ended, "one last point when it leaves"
    assert points[-1].energy_j > 0, "energy attributed while it ran"


def test_mig_instances_once_per_health_interval(
    tmp_path: Path, receiver: Receiver, agent_factory: AgentFactory
) -> None:
    sim = machine(tmp_path / "sim", ["H100-SXM5-80GB"], mig_instances=2)
    agent = agent_factory(sim, [receiver.address])
    agent.wait_for_log("streaming to collector")
    wait_for_batches(receiver, health_reads(range(1), 2), "2 health reads", agent=agent)
    assert agent.terminate() == 0
    batches = unique_batches(receiver.batches())
    assert [i.mig_enabled for b in batches.values() for i in b.gpu_info] == [True]
    migs = [m for b in batches.values() for m in b.mig_samples]
    instances = sorted({m.gpu_instance_id for m in migs})
    assert len(instances) == 2
    assert all(m.mig_uuid.startswith("MIG-") and "MIG" in m.name and m.mem_total_bytes > 0 for m in migs)
    per_read = len(migs) / len(health_samples(batches, 0))
    assert per_read == 2, "one MigSample per GPU instance per health read"


def test_an_unsupported_nvlink_counter_is_left_out_alone_and_the_others_are_kept(
    tmp_path: Path, receiver: Receiver, agent_factory: AgentFactory
) -> None:
    """nvml.h: the DL error counters can be NOT_SUPPORTED one by one (Blackwell and newer). A GPU whose
    DL_CRC_DATA counter (and its total field) answers so keeps its replay, recovery and CRC flit counters,
    their health rule still fires, and the unsupported one is logged once and never counted as an error."""
    crc_data = dict(NVLINK_ERROR_COUNTERS)["crc_data_errors"]
    h100 = with_overrides(PROFILES["H100-SXM5-80GB"], {"nvlink_unsupported_counters": str(1 << crc_data)})
    sim = machine(tmp_path / "sim", [h100])
    agent = agent_factory(sim, [receiver.address])
    agent.wait_for_log("streaming to collector")

    def link3(batches: dict[int, telemetry_pb2.SampleBatch]) -> list[telemetry_pb2.NvLinkSample]:
        return [n for b in batches.values() for n in b.nvlink_samples if n.link == 3]

    wait_for_batches(receiver, health_reads(range(1), 2), "two health reads", agent=agent)
    state.inject_nvlink_errors(sim.state_dir, 0, 3, 5)
    agent.wait_for_log(r"GPU 0 health: degraded \(NVLink CRC/replay errors grew in the last 60 s\)")
    wait_for_batches(
        receiver,
        lambda b: any(n.crc_flit_errors == 5 for n in link3(b)),
        "link 3's point after the errors",
        agent=agent,
    )
    assert agent.terminate() == 0
    batches = unique_batches(receiver.batches())
    points = link3(batches)
    assert points[0].crc_flit_errors == 0 and points[-1].crc_flit_errors == 5 and points[-1].replay_errors == 5
    for point in points:
        assert point.HasField("replay_errors") and point.HasField("recovery_errors")
        assert not point.HasField("crc_data_errors"), "no fake zero for the unsupported counter"
    log = agent.log()
    assert log.count("nvlink crc_data_errors is not supported") == 1, "logged once"
    assert "nvlink replay_errors is not supported" not in log
    assert sum(b.stats.read_errors for b in batches.values()) == 0, "an unsupported counter is no read error"


def test_nvlink_errors_on_any_link_are_read_within_a_health_interval(
    tmp_path: Path, receiver: Receiver, agent_factory: AgentFactory
) -> None:
    """nvml.h: the NVLink error total fields (38, 45, 52, 59) are per link (scopeId is the link), and the
    simulator answers so. The agent reads every active link's totals to see which links' counters moved, so
    errors on links other than 0 are stored at the next health read, not up to a minute later; the GPU's
    total is the sum of its links' counters."""
    sim = machine(tmp_path / "sim", ["H100-SXM5-80GB"])
    agent = agent_factory(sim, [receiver.address])
    agent.wait_for_log("streaming to collector")
    wait_for_batches(receiver, health_reads(range(1), 2), "two health reads", agent=agent)
    t_ns = state.inject_nvlink_errors(sim.state_dir, 0, 3, 5)
    state.inject_nvlink_errors(sim.state_dir, 0, 11, 7)

    def latest(batches: dict[int, telemetry_pb2.SampleBatch]) -> dict[int, telemetry_pb2.NvLinkSample]:
        points = sorted((n for b in batches.values() for n in b.nvlink_samples), key=lambda n: n.time_unix_ns)
        return {n.link: n for n in points}

    def moved(batches: dict[int, telemetry_pb2.SampleBatch]) -> bool:
        last = latest(batches)
        return 3 in last and 11 in last and last[3].crc_flit_errors == 5 and last[11].crc_flit_errors == 7

    wait_for_batches(receiver, moved, "links 3 and 11 with their errors", agent=agent, timeout_s=10)
    agent.wait_for_log(r"GPU 0 health: degraded \(NVLink CRC/replay errors grew in the last 60 s\)")
    assert agent.terminate() == 0
    batches = unique_batches(receiver.batches())
    points = [n for b in batches.values() for n in b.nvlink_samples]
    first_seen = {
        link: min(n.time_unix_ns for n in points if n.link == link and n.crc_flit_errors > 0) for link in (3, 11)
    }
    for link, seen_ns in first_seen.items():
        assert seen_ns - t_ns < 2.5e9, f"link {link}: stored {(seen_ns - t_ns) / 1e9:.1f} s after the errors"
    last = latest(batches)
    assert sum(n.crc_flit_errors for n in last.values()) == 12, "the GPU's total: the sum over its links"
    assert sum(n.replay_errors for n in last.values()) == 12
    assert all(last[link].crc_flit_errors == 0 for link in last if link not in (3, 11))
    assert sum(b.stats.read_errors for b in batches.values()) == 0


def test_a_lost_gpu_is_taken_out_of_the_event_set_and_the_others_keep_their_events(
    tmp_path: Path, receiver: Receiver, agent_factory: AgentFactory
) -> None:
    """nvml.h: nvmlEventSetWait_v2 may answer GPU_IS_LOST, and the simulator does so while a registered GPU
    is lost. The agent makes its set again without that GPU, so the other GPUs' XID and ECC events still
    arrive, and registers the GPU again once it answers."""
    sim = machine(tmp_path / "sim", ["A100-SXM4-80GB"] * 3)
    agent = agent_factory(sim, [receiver.address])
    agent.wait_for_log("streaming to collector")
    agent.wait_for_log(r"GPU 2 .*NVML events 0x[0-9a-f]+ registered")
    state.set_failed(sim.state_dir, 1, True)
    agent.wait_for_log(r"GPU 1 .* is taken out of the NVML event set \(it answers GPU_IS_LOST\)")
    state.inject_xid(sim.state_dir, 0, 13)
    state.inject_ecc(sim.state_dir, 2, double_bit=False)

    def events(batches: dict[int, telemetry_pb2.SampleBatch]) -> list[tuple[int, int, int]]:
        return [(e.gpu_index, e.kind, e.data) for b in batches.values() for e in b.gpu_events]

    single = telemetry_pb2.GPU_EVENT_KIND_ECC_SINGLE_BIT
    wait_for_batches(
        receiver,
        lambda b: (0, XID, 13) in events(b) and any(e[:2] == (2, single) for e in events(b)),
        "GPU 0's XID and GPU 2's ECC event while GPU 1 is lost",
        agent=agent,
    )
    state.set_failed(sim.state_dir, 1, False)
    agent.wait_for_log(r"GPU 1 .* answers again: its NVML events are registered again")
    state.inject_xid(sim.state_dir, 1, 31)
    wait_for_batches(receiver, lambda b: (1, XID, 31) in events(b), "GPU 1's XID once it answers", agent=agent)
    assert agent.terminate() == 0
    assert agent.log().count("is taken out of the NVML event set") == 1
