"""A client's messages are handled the moment they arrive, and never out of order."""

from __future__ import annotations

import asyncio
import gc
import time
import tracemalloc
from typing import Any

import pytest

from switchboard.server.ws.inbox import Inbox

pytestmark = pytest.mark.timeout(10)

STOP_WITHIN = 2.0  # how long closing an inbox re-cancels a worker that outlived a cancel (tasks.cancel_and_wait)


class Recorder:
    """The handler and the reading switch an inbox drives, recording what it was told."""

    def __init__(self) -> None:
        self.handled: list[Any] = []
        self.later: dict[Any, asyncio.Future[None]] = {}  # message -> what its handling waits for
        self.fail_on: set[Any] = set()
        self.reading = True
        self.pauses = 0
        self.errors: list[BaseException] = []

    def handle(self, message: Any) -> Any:
        if message in self.fail_on:
            raise RuntimeError(f"bug while handling {message!r}")
        self.handled.append(message)
        if message in self.later:
            return self._finish(message)
        return None

    async def _finish(self, message: Any) -> None:
        await self.later[message]
        self.handled.append(f"{message} done")

    def pause(self) -> None:
        self.reading = False
        self.pauses += 1

    def resume(self) -> None:
        self.reading = True

    def inbox(self) -> Inbox:
        return Inbox(self.handle, pause=self.pause, resume=self.resume, on_error=self.errors.append)

    def inbox_waiting_on(self, first: bytes, *then: bytes) -> Inbox:
        """An inbox whose ``first`` message waits for ``self.later[first]``, with ``then`` behind it."""
        self.later[first] = asyncio.get_running_loop().create_future()
        inbox = self.inbox()
        for message in (first, *then):
            inbox(message)
        return inbox


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_message_that_needs_no_waiting_is_handled_before_the_call_returns() -> None:
    r = Recorder()
    inbox = r.inbox()
    inbox(b"one")
    inbox("two")
    assert r.handled == [b"one", "two"]
    assert r.reading
    assert inbox.waiting == 0


async def test_messages_behind_one_that_waits_are_handled_after_it_in_order() -> None:
    r = Recorder()
    inbox = r.inbox_waiting_on(b"slow", b"fast 1", b"fast 2")
    await settle()
    assert r.handled == [b"slow"]  # the others wait their turn, however quick they would be
    assert not r.reading
    assert r.pauses == 1
    r.later[b"slow"].set_result(None)
    await settle()
    assert r.handled == [b"slow", "b'slow' done", b"fast 1", b"fast 2"]
    assert r.reading
    assert inbox.waiting == 0
    inbox(b"fast 3")  # with nothing waiting, handled at once again
    assert r.handled[-1] == b"fast 3"


async def test_a_message_queued_behind_one_that_waits_may_wait_in_turn() -> None:
    r = Recorder()
    loop = asyncio.get_running_loop()
    r.later[b"a"], r.later[b"b"] = loop.create_future(), loop.create_future()
    inbox = r.inbox()
    for m in (b"a", b"b", b"c"):
        inbox(m)
    r.later[b"a"].set_result(None)
    await settle()
    assert r.handled == [b"a", "b'a' done", b"b"]
    assert not r.reading
    r.later[b"b"].set_result(None)
    await settle()
    assert r.handled == [b"a", "b'a' done", b"b", "b'b' done", b"c"]
    assert r.reading


async def test_a_bug_in_handling_is_reported_and_never_raised_into_the_reader() -> None:
    r = Recorder()
    r.fail_on.add(b"bad")
    inbox = r.inbox()
    inbox(b"bad")  # does not raise: the read callback must survive
    inbox(b"good")
    assert [str(e) for e in r.errors] == ["bug while handling b'bad'"]
    assert r.handled == [b"good"]


async def test_closing_gives_up_on_what_still_waits_after_the_grace() -> None:
    r = Recorder()
    inbox = r.inbox_waiting_on(b"slow", b"queued")  # never resolved: Redis is away
    await asyncio.wait_for(inbox.close(grace=0.05), 2)
    assert inbox.waiting == 0
    assert r.handled == [b"slow"]  # the slow one never finished, so nothing behind it ran
    inbox(b"after closing")
    assert r.handled == [b"slow"]  # the client is being detached: nothing more is routed


async def test_what_the_client_sent_before_it_left_is_still_handled_within_the_grace() -> None:
    r = Recorder()
    inbox = r.inbox_waiting_on(b"slow", b"sent just before leaving")
    asyncio.get_running_loop().call_later(0.05, r.later[b"slow"].set_result, None)
    await inbox.close(grace=5)
    assert r.handled == [b"slow", "b'slow' done", b"sent just before leaving"]


class LosesOneCancel:
    """The routing of one message, as a Redis command in redis-py: it swallows the first cancel
    that reaches it, and carries on to return normally (:mod:`switchboard.tasks`)."""

    def __init__(self, *, starve: float = 0.0) -> None:
        self.starve = starve
        self.release = asyncio.Event()
        self.swallowed = 0
        self.finished = asyncio.Event()

    async def __call__(self) -> None:
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.swallowed += 1
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            if self.starve:
                time.sleep(self.starve)  # noqa: ASYNC251 - a flood holds the loop: nobody gets to cancel again in time
            else:
                await self.release.wait()  # the command's reply is still to come
        self.finished.set()


async def test_a_worker_that_outlives_its_cancellation_never_touches_the_dropped_backlog() -> None:
    """Under a flood, closing an inbox cancels its worker while the loop is starved: the first
    routing swallows its cancel and the loop stalls past the re-cancelling deadline, the second
    swallows the last cancel, so the worker is still inside it when ``close`` gives up on it.
    When that routing returns, the worker must not pop from the emptied backlog (it raised
    ``IndexError: pop from an empty deque``) nor report an error: it just stops."""
    first, second = LosesOneCancel(starve=STOP_WITHIN + 0.1), LosesOneCancel()
    steps = {b"first": first, b"second": second}
    errors: list[BaseException] = []
    handled: list[bytes] = []

    def handle(message: bytes | str) -> Any:
        assert isinstance(message, bytes)
        handled.append(message)
        return steps[message]() if message in steps else None

    inbox = Inbox(handle, pause=lambda: None, resume=lambda: None, on_error=errors.append)
    for message in (b"first", b"second", b"third"):
        inbox(message)
    await settle()
    await asyncio.wait_for(inbox.close(grace=0.01), STOP_WITHIN + 5)
    assert first.swallowed == second.swallowed == 1
    second.release.set()  # the second routing ends after all, long after its cancel
    await asyncio.wait_for(second.finished.wait(), 2)
    await settle()
    assert errors == [], f"the worker failed after outliving its cancel: {errors!r}"
    assert handled == [b"first", b"second"]  # nothing behind it is routed once the inbox closed
    assert inbox.waiting == 0  # the worker dropped the rest itself


async def test_an_inbox_that_worked_through_its_backlog_keeps_nothing_of_it() -> None:
    """Its deque (760 bytes) and its worker task go once the backlog is empty: thousands of idle
    clients each had a backlog while their first messages waited for the manager."""
    ready = asyncio.get_running_loop().create_future()
    ready.set_result(None)

    def handle(message: bytes | str) -> asyncio.Future[None] | None:
        return ready if message == b"waits" else None

    def ignore(*_: object) -> None:
        pass

    inboxes = [Inbox(handle, pause=ignore, resume=ignore, on_error=ignore) for _ in range(200)]
    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for inbox in inboxes:
            inbox(b"waits")
            inbox(b"behind it")
        assert all(inbox.waiting == 2 for inbox in inboxes)
        await settle()
        assert all(inbox.waiting == 0 for inbox in inboxes)
        gc.collect()
        kept = (tracemalloc.get_traced_memory()[0] - before) / len(inboxes)
    finally:
        tracemalloc.stop()
    assert kept < 200, f"{kept:.0f} bytes kept per inbox"
