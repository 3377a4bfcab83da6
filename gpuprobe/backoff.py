"""Part: core. Capped exponential backoff with jitter, for every retry loop in gpuprobe.

Each pause is drawn uniformly from the upper half of its ceiling ("equal jitter"): the ceiling
starts at ``initial_s`` and doubles after each failure up to ``max_s``; :meth:`Backoff.reset` after
a success starts again from ``initial_s``. The jitter keeps a fleet of agents (or a collector's
writers) that failed together from retrying in lockstep, and the lower bound keeps a retry from
following a failure at once.
"""

from __future__ import annotations

import asyncio
import random
import threading
from dataclasses import dataclass

_MAX_DOUBLINGS = 60  # 2**60 times any sane initial pause is beyond every cap


@dataclass
class Backoff:
    initial_s: float
    max_s: float
    failures: int = 0  # consecutive failures since the last reset

    def __post_init__(self) -> None:
        if not 0 < self.initial_s <= self.max_s:
            raise ValueError(f"backoff needs 0 < initial ({self.initial_s} s) <= max ({self.max_s} s)")

    def next_delay_s(self) -> float:
        """The pause after one more failure."""
        ceiling = min(self.max_s, self.initial_s * 2 ** min(self.failures, _MAX_DOUBLINGS))
        self.failures += 1
        return random.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.failures = 0

    async def wait(self, wake: asyncio.Event | None = None) -> bool:
        """Sleeps for the next pause; True when ``wake`` was set first (the pause was cut short)."""
        delay_s = self.next_delay_s()
        if wake is None:
            await asyncio.sleep(delay_s)
            return False
        try:
            await asyncio.wait_for(wake.wait(), delay_s)
        except TimeoutError:
            return False
        return True

    def wait_blocking(self, wake: threading.Event) -> bool:
        """:meth:`wait` for a thread: True when ``wake`` was set first."""
        return wake.wait(self.next_delay_s())
