"""The harness itself: waits that say what they waited for, and the guard against sleeping on the clock."""

from __future__ import annotations

import asyncio
import time

import pytest
import support


def test_wait_until_returns_the_first_truthy_value_and_names_what_it_awaited_when_it_times_out() -> None:
    calls = iter([0, 0, 7])
    assert support.wait_until(lambda: next(calls), 5, "the third call") == 7
    with pytest.raises(AssertionError, match=r"waiting for the collector's log line; last seen: 'booting'"):
        support.wait_until(lambda: False, 0.1, "the collector's log line", describe=lambda: "booting")


def test_wait_until_async_awaits_coroutine_predicates() -> None:
    state = {"n": 0}

    async def ready() -> bool:
        state["n"] += 1
        return state["n"] >= 3

    assert asyncio.run(support.wait_until_async(ready, 5, "three polls")) is True
    with pytest.raises(AssertionError, match=r"timed out after 0\.1 s waiting for never"):
        asyncio.run(support.wait_until_async(lambda: 0, 0.1, "never"))


def test_a_test_that_sleeps_longer_than_the_limit_fails_with_the_advice() -> None:
    with pytest.raises(pytest.fail.Exception, match=r"sleeps 0.5 s at once .*support.wait_until"):
        time.sleep(0.5)
    with pytest.raises(pytest.fail.Exception, match=r"sleeps 1 s at once"):
        asyncio.run(asyncio.sleep(1))


def test_short_sleeps_and_the_products_own_sleeps_are_allowed() -> None:
    started = time.monotonic()
    time.sleep(support.MAX_TEST_SLEEP_S)
    asyncio.run(asyncio.sleep(0.01))
    assert time.monotonic() - started >= support.MAX_TEST_SLEEP_S
    # A call from outside tests/ (the product's backoff, a library) is not the test's clock-wait.
    support.check_sleep(30, "/usr/lib/python3/dist-packages/some_library.py")
    with pytest.raises(pytest.fail.Exception, match=r"agent/test_x.py sleeps 30 s"):
        support.check_sleep(30, support.TESTS_DIR + "agent/test_x.py")


def test_clean_env_drops_operator_settings_and_systemd_handover(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPROBE_COLLECTOR", "elsewhere:7447")
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/systemd/notify")
    env = support.clean_env(GPUPROBE_LOG_LEVEL="debug")
    assert "GPUPROBE_COLLECTOR" not in env and "NOTIFY_SOCKET" not in env
    assert env["GPUPROBE_LOG_LEVEL"] == "debug" and env["PATH"] == support.os.environ["PATH"]


def test_stays_fails_as_soon_as_the_claim_breaks() -> None:
    support.stays(lambda: True, 0.1, "a constant")
    seen = iter([True, True, False])
    started = time.monotonic()
    with pytest.raises(AssertionError, match="no new sample stopped holding before 30 s"):
        support.stays(lambda: next(seen), 30, "no new sample")
    assert time.monotonic() - started < 5


def test_pass_time_lets_a_phase_of_a_given_length_pass_in_steps_the_guard_allows() -> None:
    started = time.monotonic()
    support.pass_time(0.5)  # more than one step: each sleep stays within MAX_TEST_SLEEP_S
    asyncio.run(support.pass_time_async(0.3))
    assert 0.8 <= time.monotonic() - started < 2.0
