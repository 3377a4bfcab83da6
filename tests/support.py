"""The test harness's shared helpers: starting gpuprobe commands, clean environments, free ports and waiting on
conditions. One copy here; test folders import it as ``import support`` (``tests/`` is on ``sys.path``
because the root ``conftest.py`` lives there).

Tests wait on conditions, never on the clock: ``wait_until`` polls a predicate and, when the deadline
passes, fails with what was awaited and what was last seen. ``conftest.py`` fails any test that sleeps
longer than ``MAX_TEST_SLEEP_S`` at a time.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from gpuprobe.devservices.ports import free_port, free_ports

__all__ = [
    "MAX_TEST_SLEEP_S",
    "check_sleep",
    "clean_env",
    "free_port",
    "free_ports",
    "gpuprobe_command",
    "pass_time",
    "pass_time_async",
    "stays",
    "stays_async",
    "wait_until",
    "wait_until_async",
]

T = TypeVar("T")

# The longest single sleep a test may take; longer waits go through wait_until.
MAX_TEST_SLEEP_S = 0.2

# Variables that would make a child process behave unlike the documented defaults: the operator's own
# GPUPROBE_* settings, and systemd's hand-over variables (a child would think it runs under systemd).
_INHERITED_PREFIXES = ("GPUPROBE_", "NOTIFY_SOCKET", "WATCHDOG_")


TESTS_DIR = str(Path(__file__).resolve().parent) + os.sep


def check_sleep(seconds: float, caller_file: str) -> None:
    """Fail the running test when code under ``tests/`` sleeps longer than ``MAX_TEST_SLEEP_S`` at once."""
    if seconds > MAX_TEST_SLEEP_S and caller_file.startswith(TESTS_DIR):
        import pytest  # only the guard needs it; the helpers above run in test subprocesses too

        pytest.fail(
            f"{caller_file[len(TESTS_DIR) :]} sleeps {seconds:g} s at once (at most {MAX_TEST_SLEEP_S} s):"
            " wait on a condition with support.wait_until instead of on the clock"
        )


def gpuprobe_command() -> list[str]:
    """The installed ``gpuprobe`` console script of this interpreter (``python -m gpuprobe.app`` without one)."""
    script = Path(sys.executable).parent / "gpuprobe"
    return [str(script)] if script.exists() else [sys.executable, "-m", "gpuprobe.app"]


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without GPUPROBE_* settings or systemd's variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_INHERITED_PREFIXES)}
    env.update(extra)
    return env


def _seen(describe: Callable[[], object] | None, value: object) -> str:
    """What the failure shows: ``describe()`` when given (a log's tail), else the predicate's value."""
    text = repr(describe() if describe is not None else value)
    return text if len(text) <= 400 else text[:400] + "…"


def _timed_out(what: str, timeout_s: float, describe: Callable[[], object] | None, value: object) -> AssertionError:
    return AssertionError(f"timed out after {timeout_s:g} s waiting for {what}; last seen: {_seen(describe, value)}")


def _broke(what: str, duration_s: float, describe: Callable[[], object] | None, value: object) -> AssertionError:
    return AssertionError(f"{what} stopped holding before {duration_s:g} s had passed; seen: {_seen(describe, value)}")


def wait_until(
    predicate: Callable[[], T],
    timeout_s: float,
    what: str,
    *,
    interval_s: float = 0.05,
    describe: Callable[[], object] | None = None,
) -> T:
    """Poll ``predicate`` until it returns something truthy and return that; fail after ``timeout_s``.

    The failure says what was awaited (``what``) and what was seen last: ``describe()`` when given (for
    example the tail of a log), else the predicate's last value.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise _timed_out(what, timeout_s, describe, value)
        time.sleep(min(interval_s, MAX_TEST_SLEEP_S))


async def wait_until_async(
    predicate: Callable[[], T | Awaitable[T]],
    timeout_s: float,
    what: str,
    *,
    interval_s: float = 0.05,
    describe: Callable[[], object] | None = None,
) -> T:
    """``wait_until`` for coroutines: the predicate may be a plain function or return an awaitable."""
    deadline = time.monotonic() + timeout_s
    while True:
        value: Any = predicate()
        if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
            value = await value
        if value:
            return value  # type: ignore[no-any-return]
        if time.monotonic() >= deadline:
            raise _timed_out(what, timeout_s, describe, value)
        await asyncio.sleep(min(interval_s, MAX_TEST_SLEEP_S))


def stays(
    predicate: Callable[[], object],
    duration_s: float,
    what: str,
    *,
    interval_s: float = 0.05,
    describe: Callable[[], object] | None = None,
) -> None:
    """Check that ``predicate`` holds throughout ``duration_s`` (nothing more arrives, a process stays up).

    A negative claim needs a window of time; this one fails as soon as the claim breaks rather than at
    the end of a fixed sleep, and says what broke.
    """
    deadline = time.monotonic() + duration_s
    while True:
        value = predicate()
        if not value:
            raise _broke(what, duration_s, describe, value)
        if time.monotonic() >= deadline:
            return
        time.sleep(min(interval_s, MAX_TEST_SLEEP_S))


async def stays_async(
    predicate: Callable[[], object],
    duration_s: float,
    what: str,
    *,
    interval_s: float = 0.05,
    describe: Callable[[], object] | None = None,
) -> None:
    """``stays`` for coroutines (the predicate is a plain function, checked between event-loop turns)."""
    deadline = time.monotonic() + duration_s
    while True:
        value = predicate()
        if not value:
            raise _broke(what, duration_s, describe, value)
        if time.monotonic() >= deadline:
            return
        await asyncio.sleep(min(interval_s, MAX_TEST_SLEEP_S))


def pass_time(duration_s: float) -> None:
    """Let ``duration_s`` pass on the clock, in steps the guard allows.

    Only where the length of time is itself the behaviour under test (a workload phase of a given
    length, a producer's period, an outage of 60 s); to wait for something to happen use ``wait_until``,
    and to claim that nothing happens use ``stays``.
    """
    deadline = time.monotonic() + duration_s
    while (left_s := deadline - time.monotonic()) > 0:
        time.sleep(min(left_s, MAX_TEST_SLEEP_S))


async def pass_time_async(duration_s: float) -> None:
    """``pass_time`` for coroutines: the event loop keeps running meanwhile."""
    deadline = time.monotonic() + duration_s
    while (left_s := deadline - time.monotonic()) > 0:
        await asyncio.sleep(min(left_s, MAX_TEST_SLEEP_S))
