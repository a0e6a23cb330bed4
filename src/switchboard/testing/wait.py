"""Bounded polling for integration tests: wait on a condition, never on a bare sleep."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def eventually(check: Callable[[], Awaitable[T] | T], *, timeout: float, what: str, interval: float = 0.05) -> T:
    """Call ``check`` until it returns something truthy without raising, at most ``timeout`` s.

    Raises ``AssertionError`` naming ``what`` and the last error seen, so a
    failing test says what it waited for.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: Any = None
    while True:
        try:
            result = check()
            if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
                result = await result
            if result:
                return result  # type: ignore[return-value]
            last = result
        except Exception as exc:
            last = exc
        if loop.time() >= deadline:
            raise AssertionError(f"{what}: not within {timeout}s (last: {last!r})")
        await asyncio.sleep(interval)
