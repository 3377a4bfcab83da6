"""Several collectors (``--collector a,b,c``): a stable hash of the agent id picks the first, the
others follow in order (issue 14)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter as Tally
from pathlib import Path

from gpuprobe.agent.metrics import Counters
from gpuprobe.agent.settings import UplinkSettings
from gpuprobe.agent.spool import AsyncSpool, Spool
from gpuprobe.agent.uplink import Uplink, first_choice
from gpuprobe.v1 import telemetry_pb2

TARGETS = ["a:7447", "b:7447", "c:7447"]


def test_twelve_agents_spread_over_three_collectors_and_the_same_id_always_picks_the_same_one() -> None:
    ids = [f"node-{i}" for i in range(1, 13)]
    picks = [first_choice(agent_id, 3) for agent_id in ids]
    tally = Tally(picks)
    assert set(tally) == {0, 1, 2}, tally  # not all on one; here every collector gets some
    assert max(tally.values()) <= 8, tally
    assert picks == [first_choice(agent_id, 3) for agent_id in ids]
    # a stable hash, not Python's salted hash(): another process with another hash seed agrees
    code = "from gpuprobe.agent.uplink import first_choice; print([first_choice(f'node-{i}', 3) for i in range(1, 13)])"
    for seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed}, capture_output=True, text=True
        )
        assert out.stdout.strip() == str(picks), out.stderr
    # a larger fleet spreads about evenly
    many = Tally(first_choice(f"gpu-host-{i:04d}", 3) for i in range(3000))
    assert all(900 <= n <= 1100 for n in many.values()), many
    assert first_choice("anything", 1) == 0


def test_the_uplink_starts_at_its_first_choice_and_fails_over_in_order(tmp_path: Path) -> None:
    import asyncio

    async def order(agent_id: str) -> list[str]:
        spool = AsyncSpool(Spool(tmp_path / agent_id))
        uplink = Uplink(
            UplinkSettings(targets=TARGETS, agent_id=agent_id), spool, lambda _: telemetry_pb2.Hello(), Counters()
        )
        tried = [TARGETS[(uplink.target_index + k) % 3] for k in range(4)]  # what run() tries, session by session
        await spool.close()
        return tried

    for agent_id in ("node-1", "node-2", "node-3", "node-4"):
        tried = asyncio.run(order(agent_id))
        first = first_choice(agent_id, 3)
        assert tried == [TARGETS[first], TARGETS[(first + 1) % 3], TARGETS[(first + 2) % 3], TARGETS[first]]


def test_the_agent_id_reaches_the_uplink_settings() -> None:
    import argparse

    from gpuprobe.agent.options import AGENT_OPTIONS
    from gpuprobe.agent.settings import AgentSettings
    from gpuprobe.config import resolve

    values = resolve(
        "agent",
        AGENT_OPTIONS,
        argparse.Namespace(),
        {},
        None,
        environ={"GPUPROBE_COLLECTOR": ",".join(TARGETS), "GPUPROBE_AGENT_ID": "node-7", "GPUPROBE_HOST": "h"},
    )
    settings = AgentSettings.from_values(values)
    assert settings.uplink.agent_id == "node-7" and settings.uplink.targets == TARGETS
