"""A connection's send queue: bounded, in order, and it hands back what it never wrote."""

from __future__ import annotations

import asyncio

import pytest

from support.wire import Wire
from switchboard.hub.sessions.life import Life
from switchboard.hub.sessions.send_queue import SendQueue

pytestmark = pytest.mark.timeout(10)


def make_queue(conn: Wire, life: Life, max_bytes: int = 100) -> SendQueue:
    return SendQueue(conn, max_bytes=max_bytes, life=life, name="writer test")


async def test_past_its_bound_the_queue_refuses_and_keeps_nothing_more() -> None:
    queue = make_queue(Wire(), Life(), max_bytes=100)

    assert queue.push(b"x" * 60)  # waits: writing has not started
    assert not queue.push(b"y" * 60)
    assert queue.queued_bytes == 60


async def test_one_frame_larger_than_the_bound_still_goes_when_nothing_waits() -> None:
    """The bound is on what waits: a single large frame is the transport's to refuse, not the queue's."""
    queue = make_queue(Wire(), Life(), max_bytes=100)

    assert queue.push(b"z" * 500)


async def test_what_was_never_written_is_handed_back_once_binary_frames_only() -> None:
    queue = make_queue(Wire(), Life())
    queue.push(b"call")
    queue.push("text frame")
    queue.push(b"reply")

    assert queue.take_unsent() == [b"call", b"reply"]
    assert queue.take_unsent() == []
    assert queue.queued_bytes == 0


async def test_an_ended_connection_is_closed_with_its_code_and_its_waiting_frames_not_written() -> None:
    conn, life = Wire(), Life()
    queue = make_queue(conn, life)
    queue.start()
    queue.push(b"before")
    conn.paused = True  # the client stopped reading: the next frame waits
    queue.push(b"waiting")
    life.end(4000, "bye")
    conn.resume()
    queue.wake()
    for _ in range(20):  # bounded: the on-demand writer sends the close
        if conn.closed_with is not None:
            break
        await asyncio.sleep(0)

    assert conn.frames == [b"before"]
    assert conn.closed_with == (4000, "bye")
