"""A stop that does not end ends the process anyway, after saying where it hung."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from switchboard.server import runner
from switchboard.server.stop_deadline import StopDeadline

BUDGET = 0.2


class Exits:
    def __init__(self) -> None:
        self.codes: list[int] = []
        self.called = threading.Event()

    def __call__(self, code: int) -> None:
        self.codes.append(code)
        self.called.set()


async def test_a_stop_still_running_at_the_deadline_exits_1_and_logs_every_task(caplog) -> None:
    caplog.set_level(logging.ERROR, logger="switchboard.server.stop_deadline")
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
    assert "threads:" in text


def test_a_blocked_event_loop_does_not_keep_the_process_up(caplog) -> None:
    caplog.set_level(logging.ERROR, logger="switchboard.server.stop_deadline")
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


@pytest.mark.parametrize("signalled", [True, False])
async def test_only_a_signalled_stop_arms_the_deadline(signalled: bool) -> None:
    """A process told to stop by a signal must exit; a server stopped inside a test's own
    process (``running()``) must never take that process down."""
    from switchboard.server.runner import running
    from switchboard.testing.hub import settings_for_tests

    async with running(settings_for_tests()) as srv:
        srv.server._signalled = signalled
        armed: list[bool] = []
        srv.server.deadline.start = lambda loop=None: armed.append(True)  # type: ignore[method-assign]
        await srv.server.stop()
    assert armed == ([True] if signalled else [])
    assert runner.SHUTDOWN_BUDGET < 30, "fires within Kubernetes' default grace period"
