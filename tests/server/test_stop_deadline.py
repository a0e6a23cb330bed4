"""A stop that does not end ends the process anyway, after saying where it hung."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time

from switchboard.config import Settings
from switchboard.hub.transit.drain import PATIENCE
from switchboard.server import runner
from switchboard.server.process.stop_deadline import REPORT_WAIT, StopDeadline

BUDGET = 0.2


class Exits:
    def __init__(self) -> None:
        self.codes: list[int] = []
        self.called = threading.Event()

    def __call__(self, code: int) -> None:
        self.codes.append(code)
        self.called.set()


async def test_a_stop_still_running_at_the_deadline_exits_1_and_logs_every_task(caplog) -> None:
    caplog.set_level(logging.ERROR, logger="switchboard.server.process.stop_deadline")
    exits = Exits()
    stuck = asyncio.create_task(asyncio.Event().wait(), name="the step that hangs")
    deadline = StopDeadline(BUDGET, exit=exits)
    deadline.start(asyncio.get_running_loop())
    try:
        assert await asyncio.to_thread(exits.called.wait, 5.0)
    finally:
        stuck.cancel()
    assert exits.codes == [1]
    text = caplog.text
    assert "still running 0.2 s after being told to stop" in text
    assert "task the step that hangs" in text, "the stuck task is named, with its stack"
    assert "in wait" in text, "down to what it awaits (asyncio.Event.wait), not only its outermost frame"
    assert "threads:" in text


def test_a_blocked_event_loop_does_not_keep_the_process_up(caplog) -> None:
    caplog.set_level(logging.ERROR, logger="switchboard.server.process.stop_deadline")
    exits = Exits()
    loop = asyncio.new_event_loop()  # never run: as blocked as a loop can be
    try:
        StopDeadline(BUDGET, exit=exits).start(loop)
        assert exits.called.wait(5.0)
    finally:
        loop.close()
    assert exits.codes == [1]
    assert "the event loop did not answer" in caplog.text


def test_a_stop_that_ends_in_time_cancels_the_watch() -> None:
    exits = Exits()
    deadline = StopDeadline(BUDGET, exit=exits)
    deadline.start()
    deadline.cancel()
    assert deadline.wait_ended(5.0), "the watch ends once cancelled"
    assert exits.codes == []


async def test_a_signal_arms_the_watch_at_once_not_after_the_drain() -> None:
    """The watch counts from the signal: a drain that overstays its bound is cut by it too
    (tests/cluster/test_stop_bound.py plays that with a real replica)."""
    from switchboard.server.runner import running
    from switchboard.testing.hub import settings_for_tests

    async with running(settings_for_tests()) as srv:
        armed: list[object] = []
        srv.server.deadline.start = lambda loop=None: armed.append(loop)  # type: ignore[method-assign]
        srv.server.handle_exit(signal.SIGTERM, None)
        assert armed == [asyncio.get_running_loop()], "armed by the signal handler itself, before any drain"
        await srv.server.stop()


async def test_a_stop_from_inside_the_process_never_arms_the_watch() -> None:
    """A server stopped inside a test's own process (``running()``) must never take it down."""
    from switchboard.server.runner import running
    from switchboard.testing.hub import settings_for_tests

    async with running(settings_for_tests()) as srv:
        armed: list[object] = []
        srv.server.deadline.start = lambda loop=None: armed.append(loop)  # type: ignore[method-assign]
        await srv.server.stop()
    assert armed == []


def test_the_budget_counts_the_drain_its_hand_over_and_the_exit_and_fits_kubernetes_default_grace() -> None:
    defaults = Settings()
    budget = runner.stop_budget(drain_timeout=defaults.drain_timeout, transit_grace=defaults.transit_grace)
    assert budget == defaults.drain_timeout + defaults.transit_grace + runner.AFTER_DRAIN
    assert budget + REPORT_WAIT < 30, "exits, saying what hung, within Kubernetes' default 30 s grace period"
    assert runner.stop_budget(drain_timeout=10, transit_grace=0) == 10 + PATIENCE + runner.AFTER_DRAIN


async def test_after_a_signal_the_leave_and_the_leftovers_get_what_is_left_of_the_budget() -> None:
    """Their ceilings (5 s, 8 s) are for a stop with time to spare; past the drain's bound they get
    what is left, minus what uvicorn's shutdown and the hub's stop keep, so a slow stop still
    ends by itself (status 0) rather than by the watch."""
    from switchboard.server.runner import running
    from switchboard.testing.hub import settings_for_tests

    async with running(settings_for_tests()) as srv:
        server = srv.server
        assert server._left(runner.PEERS_GRACE) == runner.PEERS_GRACE, "no signal: the ceiling"
        server._stop_by = time.monotonic() + 3.0 + runner.SHUTDOWN_RESERVE
        assert 2.5 < server._left(runner.LEFTOVER_GRACE) <= 3.0
        server._stop_by = time.monotonic()
        assert server._left(runner.PEERS_GRACE) == 0.0
        server._stop_by = None
