"""Bounded polling for tests: wait on a condition, never on a bare sleep.

Every wait is bounded, and every bound is scaled by one unit: set
``SWITCHBOARD_TEST_TIME_SCALE`` (default ``1``) to ``3`` on a slow or loaded
machine and each test allows three times as long before it fails. A condition
met early ends the wait early, so the scale costs a passing test nothing.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from switchboard.errors import ConfigError

T = TypeVar("T")

TIME_SCALE_VARIABLE = "SWITCHBOARD_TEST_TIME_SCALE"
DEFAULT_TIMEOUT = 5.0  # seconds (before scaling): ample for what a loopback test waits on
DEFAULT_INTERVAL = 0.01  # seconds between checks: cheap, and a met condition is seen at once


def time_scale() -> float:
    """The factor every test bound is multiplied by (``SWITCHBOARD_TEST_TIME_SCALE``)."""
    raw = os.environ.get(TIME_SCALE_VARIABLE, "1")
    try:
        scale = float(raw)
    except ValueError:
        scale = 0.0
    if not scale > 0:
        raise ConfigError(f"{TIME_SCALE_VARIABLE}={raw!r}: expected a number above 0")
    return scale


def scaled(seconds: float) -> float:
    """``seconds`` in this machine's test time: a bound a test may wait up to."""
    return seconds * time_scale()


async def eventually(
    check: Callable[[], Awaitable[T] | T],
    what: str,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = DEFAULT_INTERVAL,
) -> T:
    """Call ``check`` until it returns something truthy without raising; return that.

    ``check`` may be a plain or an async function. Gives up after ``timeout``
    seconds (scaled, see the module docstring) with an ``AssertionError``
    naming ``what`` and the last result or error seen, so a failing test says
    what it waited for.
    """
    loop = asyncio.get_running_loop()
    bound = scaled(timeout)
    deadline = loop.time() + bound
    last: Any = None
    while True:
        try:
            result = check()
            if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
                result = await result
            if result:
                return result  # type: ignore[return-value]  # awaited if it was awaitable
            last = result
        except Exception as exc:
            last = exc
        if loop.time() >= deadline:
            raise AssertionError(f"{what}: not within {bound:g} s (last: {last!r})")
        await asyncio.sleep(interval)


def eventually_blocking(
    check: Callable[[], T], what: str, *, timeout: float = DEFAULT_TIMEOUT, interval: float = DEFAULT_INTERVAL
) -> T:
    """:func:`eventually` for a test without an event loop: sleeps the thread between checks."""
    bound = scaled(timeout)
    deadline = time.monotonic() + bound
    last: Any = None
    while True:
        try:
            result = check()
            if result:
                return result
            last = result
        except Exception as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {bound:g} s (last: {last!r})")
        time.sleep(interval)
