"""The one backoff of every retry loop: equal jitter, doubling to a cap, reset, and a wake-up."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from gpuprobe.backoff import Backoff


def test_pauses_double_from_the_initial_pause_up_to_the_cap_each_in_the_upper_half() -> None:
    backoff = Backoff(0.5, 4.0)
    ceilings = [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    for ceiling in ceilings:
        delay = backoff.next_delay_s()
        assert ceiling / 2 <= delay <= ceiling
    assert backoff.failures == len(ceilings)
    backoff.reset()
    assert backoff.next_delay_s() <= 0.5


def test_many_failures_stay_at_the_cap_without_overflow() -> None:
    backoff = Backoff(0.1, 30.0, failures=10_000)
    assert 15.0 <= backoff.next_delay_s() <= 30.0


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="initial"):
        Backoff(0.0, 1.0)
    with pytest.raises(ValueError, match="initial"):
        Backoff(2.0, 1.0)


def test_a_wake_cuts_the_pause_short_in_a_loop_and_in_a_thread() -> None:
    async def woken() -> tuple[bool, float]:
        wake = asyncio.Event()
        asyncio.get_running_loop().call_later(0.05, wake.set)
        started = time.monotonic()
        return await Backoff(10.0, 10.0).wait(wake), time.monotonic() - started

    was_woken, took_s = asyncio.run(woken())
    assert was_woken and took_s < 2.0

    wake = threading.Event()
    threading.Timer(0.05, wake.set).start()
    started = time.monotonic()
    assert Backoff(10.0, 10.0).wait_blocking(wake) and time.monotonic() - started < 2.0
    assert not Backoff(0.01, 0.02).wait_blocking(threading.Event())  # not woken: the pause ran out
