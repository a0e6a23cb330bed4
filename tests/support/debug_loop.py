"""asyncio's debug mode for the folders whose tests it costs little (about 6 % of their time).

Debug mode names where a coroutine that was never awaited was made, raises on a loop call from
another thread, and logs callbacks that hold the loop for more than 100 ms. It is set per folder
(``from support.debug_loop import asyncio_debug, debug_loop`` in its conftest.py), not for the whole
suite: on the server's tests it cost 30 %, and it keeps every task's creation stack, which the tests
that weigh a connection's objects would weigh too (tests/server/test_idle_connection.py).
"""

from __future__ import annotations

import asyncio

import pytest
from pytest_asyncio import is_async_test


@pytest.fixture
async def debug_loop() -> None:
    """The test's event loop in debug mode, from its first fixture on."""
    asyncio.get_running_loop().set_debug(True)


@pytest.fixture(autouse=True)
def asyncio_debug(request: pytest.FixtureRequest) -> None:
    """:func:`debug_loop` for every async test; a sync test gets no event loop made for nothing."""
    if is_async_test(request.node):
        request.getfixturevalue(debug_loop.__name__)
