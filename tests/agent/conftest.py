"""Fixtures for the agent's tests (helpers in agent_helpers.py).

Nothing is mocked: the agent runs as ``gpuprobe agent`` in its own process against the GPU
simulator (pynvml loads the simulated ``libnvidia-ml.so.1``), streams to ``tests/agent/receiver.py``
(a real gRPC server in its own process, so it can be killed with SIGKILL) and is stopped with real
signals.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from agent_helpers import AgentFactory, Receiver
from support import free_port


@pytest.fixture
def agent_factory(tmp_path: Path) -> Iterator[AgentFactory]:
    factory = AgentFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture
def receiver_factory(tmp_path: Path) -> Iterator[Callable[..., Receiver]]:
    made: list[Receiver] = []

    def make(*args: str, start: bool = True) -> Receiver:
        r = Receiver(tmp_path / f"receiver{len(made) + 1}", free_port(), list(args))
        made.append(r)
        return r.start() if start else r

    try:
        yield make
    finally:
        for r in made:
            r.stop()


@pytest.fixture
def receiver(receiver_factory: Callable[..., Receiver]) -> Receiver:
    return receiver_factory()
