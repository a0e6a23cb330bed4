"""The hub's async tests run on a loop in asyncio's debug mode (tests/support/debug_loop.py)."""

from __future__ import annotations

import asyncio


async def test_the_loop_of_an_async_test_here_is_in_debug_mode() -> None:
    """So a coroutine never awaited fails its test with where it was made, and a loop call from
    another thread raises instead of racing."""
    assert asyncio.get_running_loop().get_debug()
