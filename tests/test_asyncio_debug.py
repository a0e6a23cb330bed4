"""The async tests run on a loop in asyncio's debug mode (tests/support/debug_loop.py), except where it
would distort what a test measures; every async test checks at its end that its loop was in the wanted mode."""

from __future__ import annotations

import asyncio

import pytest

from support.debug_loop import NO_DEBUG_FOLDERS, SOURCE, debug_off_because, in_the_hub


async def test_the_loop_of_an_async_test_is_in_debug_mode() -> None:
    """So a coroutine never awaited fails its test with where it was made, and a loop call from
    another thread raises instead of racing."""
    assert asyncio.get_running_loop().get_debug()


@pytest.mark.asyncio(loop_scope="module")
async def test_a_test_on_its_modules_loop_gets_debug_mode_there() -> None:
    """The mode is set on the loop the test runs on, not on a function loop made beside it."""
    assert asyncio.get_running_loop().get_debug()


async def test_a_loop_call_from_another_thread_raises() -> None:
    loop = asyncio.get_running_loop()

    def from_a_thread() -> None:
        loop.call_soon(lambda: None)

    with pytest.raises(RuntimeError, match="other than the current one"):
        await asyncio.to_thread(from_a_thread)


@pytest.mark.no_asyncio_debug("the marker's own test")
async def test_a_marked_test_runs_without_debug_mode() -> None:
    assert not asyncio.get_running_loop().get_debug()


@pytest.mark.parametrize(
    ("folders", "reasons", "off_because"),
    [
        ((), [], None),
        (("security",), [], None),
        (("hub", "deeper"), [], None),
        (("server",), [], NO_DEBUG_FOLDERS["server"]),
        (("backends",), [], NO_DEBUG_FOLDERS["backends"]),
        (("cluster",), [], NO_DEBUG_FOLDERS["cluster"]),
        (("js",), [], NO_DEBUG_FOLDERS["js"]),
        (("security",), ["weighs memory"], "weighs memory"),
        (("cluster",), ["the test's own"], "the test's own"),
        (("security", "cluster"), [], None),
    ],
)
def test_where_debug_mode_is_off_and_why(folders: tuple[str, ...], reasons: list[str], off_because: str | None) -> None:
    assert debug_off_because(folders, reasons) == off_because


@pytest.mark.parametrize(
    ("callback", "hub"),
    [
        (
            f"<Task pending name='inbox' coro=<Inbox._work() running at {SOURCE}/server/inbox.py:85> wait_for=<Future>",
            True,
        ),
        (
            f"<Handle Links._beat() at {SOURCE}/replicas/links.py:246 created at /usr/lib/python3.11/asyncio/x.py:1>",
            True,
        ),
        (
            "<Task pending name='Task-9' coro=<test_x() running at /repo/tests/server/test_x.py:12> wait_for=<Future>",
            False,
        ),
        (
            f"<Task pending coro=<setup() running at /venv/pytest_asyncio/plugin.py:410> created at {SOURCE}/hub/hub.py:1>",
            False,
        ),
        ("<Handle <lambda>>", False),
    ],
)
def test_a_slow_callback_is_told_apart_as_the_hubs_or_the_tests(callback: str, hub: bool) -> None:
    assert in_the_hub(callback) is hub
