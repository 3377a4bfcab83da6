"""An agent whose clock misbehaves (issue 28): run under Debian's ``faketime`` (libfaketime), a real
agent process against the GPU simulator."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from agent_helpers import AgentFactory, Receiver, machine, wait_until


def faketime_env(offset: str, *, real_monotonic: bool = False) -> dict[str, str]:
    """The environment ``faketime`` gives a program: libfaketime preloaded, the wall clock moved by
    ``offset`` (``+15m``); ``real_monotonic``: CLOCK_MONOTONIC left alone."""
    if shutil.which("faketime") is None:
        pytest.fail("faketime is missing: apt-get install faketime")
    library = next(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"), None)
    assert library is not None, "libfaketime.so.1 not found under /usr/lib/*/faketime"
    env = {"LD_PRELOAD": str(library), "FAKETIME": offset, "FAKETIME_DONT_RESET": "1"}
    if real_monotonic:
        env["FAKETIME_DONT_FAKE_MONOTONIC"] = "1"
    return env


def test_a_sampling_thread_that_dies_ends_the_agent_with_status_1_and_the_reason(
    tmp_path: Path, receiver: Receiver, agent_factory: AgentFactory
) -> None:
    """libfaketime with a real monotonic clock makes every ``time.sleep`` fail (``OSError: [Errno 22]``),
    the sampler's among them: the agent must not stream on with no samples."""
    sim = machine(tmp_path / "sim", ["H100-SXM5-80GB"])
    agent = agent_factory(sim, [receiver.address], env=faketime_env("+15m", real_monotonic=True))
    proc = agent.proc
    assert proc is not None
    wait_until(lambda: proc.poll() is not None, 30, what="the agent to exit")
    log = agent.log()
    assert proc.returncode == 1, log
    assert "the sampling thread died (OSError: [Errno 22] Invalid argument): stopping, exit status 1" in log, log
    # what it had sampled was still delivered on the way out
    taken = re.search(r"stopped: (\d+) samples taken, \d+ spooled, (\d+) acknowledged", log)
    assert taken is not None, log
    assert int(taken[1]) == int(taken[2])
