"""Frames reach a client in the order they were routed, whether written at once or queued."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc

import pytest

from support.wire import Wire
from switchboard.hub.identity.users import new_anonymous_user
from switchboard.hub.sessions.peer import Peer

pytestmark = pytest.mark.timeout(10)


def make_peer(conn: Wire) -> Peer:
    return Peer(workspace="ws", client_id="c", user=new_anonymous_user(), transport=conn, max_queue_bytes=1 << 20)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_frames_go_out_at_once_while_nothing_waits() -> None:
    conn = Wire()
    peer = make_peer(conn)
    writer = asyncio.create_task(peer.run_writer())
    await settle()
    peer.send(b"one")
    assert conn.frames == [b"one"]  # before any task switch
    assert conn.direct == 1
    peer.close()
    await writer


async def test_nothing_is_written_before_the_writer_runs() -> None:
    """The server writes connection_info itself before it starts the writer: a frame routed to
    the client in between (a call retried to a client that just reconnected) must wait."""
    conn = Wire()
    peer = make_peer(conn)
    peer.send(b"routed during the handshake")
    assert conn.frames == []
    await conn.send_text("connection_info")
    writer = asyncio.create_task(peer.run_writer())
    await settle()
    assert conn.frames == ["connection_info", b"routed during the handshake"]
    peer.close()
    await writer


async def test_a_frame_never_overtakes_one_the_writer_holds() -> None:
    conn = Wire()
    peer = make_peer(conn)
    writer = asyncio.create_task(peer.run_writer())
    await settle()
    conn.paused = True  # the client stopped reading for a moment
    peer.send(b"1")
    await settle()  # the writer took "1" (the queue is empty) and waits to write it
    conn.paused = False  # writable again, but the writer has not run yet
    peer.send(b"2")  # must not go straight out ahead of "1"
    peer.send(b"3")
    conn.resume()
    await settle()
    assert conn.frames == [b"1", b"2", b"3"]
    peer.send(b"4")
    assert conn.frames[-1] == b"4"
    assert conn.direct == 1  # nothing waits any more: at once again
    peer.close()
    await writer


async def test_a_peer_writing_on_demand_holds_a_writer_task_only_while_frames_wait() -> None:
    """Thousands of idle clients would each keep a writer task waiting for nothing (about a KiB)."""
    conn = Wire()
    peer = make_peer(conn)
    peer.send(b"routed during the handshake")
    await conn.send_text("connection_info")
    peer.start_writing()
    assert peer.writer is not None, "the frame that waited is written by a task"
    await settle()
    assert conn.frames == ["connection_info", b"routed during the handshake"]
    assert peer.writer is None, "the queue is empty: no task is kept"
    peer.send(b"direct")
    assert peer.writer is None
    conn.paused = True
    peer.send(b"waits")
    peer.send(b"behind it")
    assert peer.writer is not None
    conn.resume()
    await settle()
    assert conn.frames[-3:] == [b"direct", b"waits", b"behind it"]
    assert peer.writer is None


async def test_a_peer_writing_on_demand_still_sends_its_close() -> None:
    conn = Wire()
    peer = make_peer(conn)
    peer.start_writing()
    assert peer.writer is None
    peer.close(1008, "Send queue full")
    writer = peer.writer
    assert writer is not None
    await asyncio.wait_for(writer, 5)
    assert conn.closed_with == (1008, "Send queue full")


async def test_a_peer_whose_queue_was_written_out_keeps_no_queue() -> None:
    """An empty deque is 760 bytes: thousands of idle clients keep none, even those whose frames
    once had to wait."""
    conns = [Wire() for _ in range(200)]
    peers = [make_peer(conn) for conn in conns]
    for peer in peers:
        peer.start_writing()
    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for conn, peer in zip(conns, peers, strict=True):
            conn.paused = True
            peer.send(b"waits")
            assert peer.queued_bytes
        for conn in conns:
            conn.resume()
        await settle()
        assert all(peer.writer is None and not peer.queued_bytes for peer in peers)
        gc.collect()
        kept = (tracemalloc.get_traced_memory()[0] - before) / len(peers)
    finally:
        tracemalloc.stop()
    assert kept < 200, f"{kept:.0f} bytes kept per peer"
