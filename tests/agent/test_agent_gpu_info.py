"""The GPUs' static facts (``GpuInfo``) travel in the batches: every GPU's in the first batch after the
agent starts, and a GPU's again when they change (here: a GPU lost at start that answers later).
A real agent process against simulated GPUs, streaming to the test receiver (docs/wire.md)."""

from __future__ import annotations

import time
from pathlib import Path

from agent_helpers import AgentFactory, Receiver, machine, unique_batches, wait_for_batches
from support import wait_until

from gpuprobe.sim import state
from gpuprobe.sim.profiles import PROFILES
from gpuprobe.v1 import common_pb2, telemetry_pb2

NODE = ["H100-SXM5-80GB", "L4", "RTX-4090"]


def check_facts(info: common_pb2.GpuInfo) -> None:
    """The facts are the simulated GPU's (its profile's datasheet rows)."""
    p = PROFILES[NODE[info.index]]
    assert info.name == p.nvml_name and info.uuid.startswith("GPU-")
    assert info.temp_slowdown_c == p.slowdown_c and info.temp_shutdown_c == p.shutdown_c
    assert info.temp_gpu_max_c == p.gpu_max_c and info.temp_mem_max_c == p.mem_max_c
    assert info.power_limit_default_w == p.limit_default_w and info.power_limit_max_w == p.limit_max_w
    assert info.memory_total_bytes == p.memory_total_bytes
    assert info.vbios_version == "96.00.99.00.01" and info.driver_version == state.DRIVER_VERSION
    assert info.pcie_gen_max == p.pcie_gen and info.pcie_width_max == p.pcie_width
    if p.fan_count:
        assert info.fan_count == p.fan_count and not info.passive_cooling
    else:  # NVML answers NOT_SUPPORTED for the fans of a passive part
        assert not info.HasField("fan_count") and info.passive_cooling


def test_the_first_batch_carries_every_gpus_facts_and_a_change_is_sent_once_more(
    tmp_path: Path, receiver: Receiver, agent_factory: AgentFactory
) -> None:
    sim = machine(tmp_path / "sim", NODE)
    # GPU 2 is lost before the agent starts: the loss takes effect at the sim's next tick boundary
    effective_ns = sim.config().next_tick_ns(state.set_failed(sim.state_dir, 2, True))
    wait_until(lambda: time.time_ns() >= effective_ns, 5, "the tick at which GPU 2 is lost", interval_s=0.01)
    agent = agent_factory(sim, [receiver.address])
    agent.wait_for_log(r"GPU 2 is lost .*it joins when it answers")
    agent.wait_for_log("streaming to collector")
    # several batches (flush interval 1 s) without GPU 2
    wait_for_batches(receiver, lambda got: len(got) >= 3, "3 batches without GPU 2", agent=agent)
    back_at = state.set_failed(sim.state_dir, 2, False)
    agent.wait_for_log(r"GPU 2 \(NVIDIA GeForce RTX 4090, GPU-[0-9a-f-]+\) answers: sampling it begins")

    def gpu2_sampled(batches: dict[int, telemetry_pb2.SampleBatch]) -> bool:
        return any(s.gpu_index == 2 and s.time_unix_ns > back_at for b in batches.values() for s in b.gpu_samples)

    wait_for_batches(receiver, gpu2_sampled, "a batch with samples of GPU 2", agent=agent)
    assert agent.terminate() == 0
    assert "everything was delivered" in agent.log(), agent.log()

    batches = unique_batches(receiver.batches())
    seqs = sorted(batches)
    assert len(seqs) >= 4 and seqs[0] == 1
    first = batches[1]
    assert [i.index for i in first.gpu_info] == [0, 1], "every GPU known at start, in the first batch"
    for info in first.gpu_info:
        check_facts(info)
    carrying = [s for s in seqs if batches[s].gpu_info]
    assert len(carrying) == 2, f"facts only at start and on the change, not in every batch: {carrying}"
    (joined,) = batches[carrying[1]].gpu_info
    assert joined.index == 2
    check_facts(joined)
    assert batches[carrying[1]].created_unix_ns > back_at
    # GPU 2 has samples only from the batch that carries its facts on, and is in its GPU references
    for s in seqs:
        b = batches[s]
        has_gpu2 = any(x.gpu_index == 2 for x in b.gpu_samples)
        if s < carrying[1]:
            assert not has_gpu2, s
        elif s > carrying[1]:
            assert has_gpu2 or not b.gpu_samples, s
        # the batch with the facts may hold none of its samples: its `recovered` event flushed it at once
        assert (2 in [r.index for r in b.gpus]) == (s >= carrying[1]), s
    assert [r.index for r in batches[seqs[-1]].gpus] == [0, 1, 2]
    # the Hello of a later stream would carry it too; the first stream's Hello lists the GPUs known then
    assert [g.index for g in receiver.hellos()[0].gpus] == [0, 1]
