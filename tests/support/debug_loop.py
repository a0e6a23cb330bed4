"""asyncio's debug mode for the suite's async tests, except where it costs much or distorts what a test measures.

Debug mode names where a coroutine that was never awaited was made, raises on a loop call from
another thread, and times every callback the loop runs. Where it is off, and why:

- a folder in :data:`NO_DEBUG_FOLDERS`: the multi-process ones, and those where it costs more than the
  suite's time allows (it records a creation stack for every future, task and callback, which makes
  each many times dearer, so a folder's cost grows with its asyncio traffic);
- a test (or module, via ``pytestmark``) marked ``@pytest.mark.no_asyncio_debug("reason")``: a test that
  weighs memory (debug mode keeps a creation stack on every task, future and handle) or bounds CPU or
  time (it makes each callback several times dearer). The reason is required.

The loop is put in debug mode by the test's first fixture, on the loop the test runs on (a module's loop
for ``loop_scope="module"``), and the same fixture fails the test if the loop is not in the wanted mode
when the test ends, so "debug mode is on here" is checked by every async test rather than claimed.

A callback that holds the loop for :data:`SLOW_CALLBACK` seconds or more is listed at the end of the run
(:class:`SlowCallbacks`) with the test it ran in; it does not fail the test: on a shared 2-core machine a
callback's wall time depends on the machine as much as on the code, and the tests' own scaffolding (a
Valkey started inside a test) holds the loop on purpose.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from pytest_asyncio import is_async_test

import switchboard
from switchboard.testing.wait import scaled

MARKER = "no_asyncio_debug"
MARKER_HELP = f"{MARKER}(reason): run this async test's loop without asyncio's debug mode, for the reason given"

TESTS = Path(__file__).resolve().parents[1]
SOURCE = str(Path(switchboard.__file__).resolve().parent)
# Measured one run each on 2 cores (pytest --durations, before/after, 2 December 2026): on elsewhere it
# cost at most 1.2 s a folder (tests/replicas 10.4 -> 11.6 s, tests/client 15.0 -> 15.8 s); the whole
# suite has no time to spare (about 15 minutes on 2 cores)
NO_DEBUG_FOLDERS = {
    "cluster": "multi-process timing tests: the replicas run in their own processes anyway",
    "js": "multi-process timing tests: the replicas run in their own processes anyway",
    "server": "costs 12 % of the folder's time (137 -> 154 s), spread over its WebSocket and HTTP traffic",
    "backends": "costs 25 % of the folder's time (41 -> 51 s): every Redis command makes several futures",
}
# the reasons of the tests marked no_asyncio_debug
BOUNDS_TIME = (
    "bounds the wall time of work made of thousands of tasks, futures or callbacks: debug mode records a creation"
    " stack for each, which makes them many times dearer"
)
WEIGHS_MEMORY = "weighs the objects a connection keeps: debug mode adds a creation stack to every task and future"

# asyncio's default (100 ms) times the loop's work; doubled so that a callback listed is one that held
# the loop for longer than a loaded shared machine makes an ordinary one take, and scaled with the suite
SLOW_CALLBACK = scaled(0.2)


def debug_off_because(folders: tuple[str, ...], marker_reasons: list[str]) -> str | None:
    """Why a test's loop runs without debug mode (``None``: it runs with it).

    ``folders``: the test file's folders below tests/; ``marker_reasons``: the reasons of its
    ``no_asyncio_debug`` markers, nearest first.
    """
    if marker_reasons:
        return marker_reasons[0]
    if folders and folders[0] in NO_DEBUG_FOLDERS:
        return NO_DEBUG_FOLDERS[folders[0]]
    return None


def _marker_reasons(item: pytest.Item) -> list[str]:
    reasons = []
    for mark in item.iter_markers(MARKER):
        reason = mark.kwargs.get("reason") or (mark.args[0] if mark.args else "")
        if not isinstance(reason, str) or not reason.strip():
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{MARKER} needs a reason")
        reasons.append(reason)
    return reasons


def _folders(item: pytest.Item) -> tuple[str, ...]:
    try:
        return Path(item.path).resolve().relative_to(TESTS).parts[:-1]
    except ValueError:
        return ()


def debug_wanted(item: pytest.Item) -> bool:
    return debug_off_because(_folders(item), _marker_reasons(item)) is None


def _loop_scope(item: pytest.Item) -> str:
    mark = item.get_closest_marker("asyncio")
    scope = mark.kwargs.get("loop_scope") if mark is not None else None
    return str(scope or item.config.getini("asyncio_default_test_loop_scope") or "function")


def _loop_fixture(scope: str) -> Callable[..., Awaitable[None]]:
    @pytest_asyncio.fixture(loop_scope=scope, name=f"debug_mode_of_the_{scope}_loop")
    async def fixture(request: pytest.FixtureRequest) -> None:
        loop = asyncio.get_running_loop()
        wanted = debug_wanted(request.node)
        loop.set_debug(wanted)
        loop.slow_callback_duration = SLOW_CALLBACK

        def check() -> None:  # a plain finalizer: no second turn of the loop per test
            if loop.get_debug() != wanted:
                pytest.fail(f"the test's event loop ended with debug mode {'off' if wanted else 'on'}", pytrace=False)

        request.addfinalizer(check)

    return fixture


debug_mode_of_the_function_loop = _loop_fixture("function")
debug_mode_of_the_class_loop = _loop_fixture("class")
debug_mode_of_the_module_loop = _loop_fixture("module")
debug_mode_of_the_package_loop = _loop_fixture("package")
debug_mode_of_the_session_loop = _loop_fixture("session")


@pytest.fixture(autouse=True)
def asyncio_debug(request: pytest.FixtureRequest) -> None:
    """Debug mode as wanted on the loop of every async test; a sync test gets no event loop made for nothing."""
    if is_async_test(request.node):
        request.getfixturevalue(f"debug_mode_of_the_{_loop_scope(request.node)}_loop")


def in_the_hub(callback: str) -> bool:
    """Whether a callback asyncio describes (``<Task ... coro=<f() running at /path.py:12> ...>``,
    ``<Handle f() at /path.py:12 ...>``) is Switchboard's own code: its first source file is under src/."""
    found = re.search(r" at (/\S+?\.py):\d+", callback)
    return found is not None and found.group(1).startswith(SOURCE)


class SlowCallbacks(logging.Handler):
    """The callbacks asyncio's debug mode found holding the loop, each with the test it ran in."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.test = ""
        self.seen: list[tuple[bool, float, str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        args: Any = record.args  # asyncio's message: "Executing %s took %.3f seconds"
        if str(record.msg).startswith("Executing ") and isinstance(args, tuple) and len(args) == 2:
            callback = str(args[0])
            self.seen.append((in_the_hub(callback), float(args[1]), self.test, callback))

    def worst(self, limit: int) -> list[str]:
        """The hub's own slow callbacks first (the ones to look into), then the tests' (a blocking start
        of a Valkey or a replica, a test that starves the loop on purpose), longest first."""
        return [
            f"{'hub ' if hub else 'test'} {seconds:6.3f} s  {test}  {callback[:300]}"
            for hub, seconds, test, callback in sorted(self.seen, reverse=True)[:limit]
        ]


SLOW_CALLBACKS = pytest.StashKey[SlowCallbacks]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_HELP)
    handler = config.stash[SLOW_CALLBACKS] = SlowCallbacks()
    logging.getLogger("asyncio").addHandler(handler)


def pytest_unconfigure(config: pytest.Config) -> None:
    logging.getLogger("asyncio").removeHandler(config.stash[SLOW_CALLBACKS])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Any:
    item.config.stash[SLOW_CALLBACKS].test = item.nodeid
    try:
        return (yield)
    finally:
        item.config.stash[SLOW_CALLBACKS].test = ""


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    slow = config.stash[SLOW_CALLBACKS]
    if slow.seen:
        terminalreporter.section(f"callbacks that held the event loop for {SLOW_CALLBACK:g} s or more")
        for line in slow.worst(30):
            terminalreporter.write_line(line)
        if len(slow.seen) > 30:
            terminalreporter.write_line(f"... and {len(slow.seen) - 30} more")
