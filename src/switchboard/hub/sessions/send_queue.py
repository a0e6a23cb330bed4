"""A connection's outgoing frames: written at once when nothing waits, else queued in order.

Routing never awaits a client's socket. A frame goes straight to the
connection when nothing waits before it and the connection takes it at once
(no task switch on the hot path); otherwise it waits here, and one writer
task drains the queue in order. The bytes waiting are bounded: past the
bound the queue refuses, and its owner (:class:`~switchboard.hub.sessions.peer.Peer`)
drops the client, so that a client that stops reading cannot grow the
server's memory or slow anyone else.

The queue reads its connection's :class:`~switchboard.hub.sessions.life.Life` (an
ended connection is written nothing more, then closed with its code) and
never writes it: ending a connection is the peer's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Protocol

from switchboard.hub.sessions.life import Life

# Seconds the close of a connection may take: a client that stopped reading must not hold its writer.
CLOSE_TIMEOUT = 5.0


class ClientConnection(Protocol):
    """The I/O a peer needs: the server layer implements it per transport."""

    def try_send(self, frame: bytes | str) -> bool:
        """Write ``frame`` now if the connection takes it without waiting; ``False``: it did not."""
        ...

    async def send_bytes(self, data: bytes) -> None: ...

    async def send_text(self, text: str) -> None: ...

    async def close(self, code: int, reason: str) -> None: ...


class SendQueue:
    """The frames waiting for one connection, and the task that writes them."""

    # slots: thousands of idle clients have one each
    __slots__ = (
        "transport",
        "max_bytes",
        "life",
        "name",
        "_frames",
        "_bytes",
        "_wakeup",
        "_running",
        "_writing",
        "_writer",
    )

    def __init__(self, transport: ClientConnection, *, max_bytes: int, life: Life, name: str) -> None:
        self.transport = transport
        self.max_bytes = max_bytes
        self.life = life
        self.name = name  # the writer task's
        # made when a frame has to wait, dropped once the writer has emptied it: an empty deque is
        # 760 bytes, for each of thousands of idle clients
        self._frames: deque[bytes | str] | None = None
        self._bytes = 0
        # a future made when the writer waits, not an asyncio.Event (a deque of waiters, 760 bytes)
        self._wakeup: asyncio.Future[None] | None = None
        # frames wait until writing starts: the server writes connection_info first, and a frame
        # routed here before that must not overtake it
        self._running = False
        self._writing = False  # the writer holds a frame it took from the queue
        # the writer task started on demand (start), while frames wait or the close is sent
        self._writer: asyncio.Task[None] | None = None

    @property
    def queued_bytes(self) -> int:
        return self._bytes

    @property
    def writer(self) -> asyncio.Task[None] | None:
        """The task :meth:`start` runs while frames wait or the close is under way."""
        return self._writer

    def push(self, frame: bytes | str) -> bool:
        """Write ``frame`` now or queue it; ``False``: it would pass the bound (nothing is queued)."""
        size = len(frame)
        frames = self._frames
        if self._bytes + size > self.max_bytes and frames:
            return False
        if self._running and not frames and not self._writing and self.transport.try_send(frame):
            return True
        if frames is None:
            frames = self._frames = deque()
        frames.append(frame)
        self._bytes += size
        self.wake()
        return True

    def wake(self) -> None:
        """Frames wait or the connection ended: the writer has work."""
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)
        elif self._writer is None and self._running:  # started by start(), and none running
            self._writer = asyncio.get_running_loop().create_task(self._write_on_demand(), name=self.name)

    def take_unsent(self) -> list[bytes]:
        """The binary frames never handed to the connection, oldest first; the queue is emptied."""
        unsent = [frame for frame in self._frames or () if isinstance(frame, bytes)]
        self._frames = None
        self._bytes = 0
        return unsent

    def start(self) -> None:
        """Frames go to the transport from now on, with a writer task only while some must wait.

        :meth:`run` in a task of its own would do the same, with a task for every idle
        connection (about a KiB each, for thousands of idle clients). The task started here ends
        once the queue is empty (the next frame that has to wait starts another), and after
        sending the close; one whose send failed is kept, ended: nothing more is written, as
        when a writer task dies.
        """
        self._running = True
        if self._frames or self.life.ended:
            self.wake()

    async def _write_on_demand(self) -> None:
        idle = False
        try:
            await self._write_queued()
            idle = not self.life.ended
        finally:
            if idle:
                self._frames = self._writer = None  # see __init__
            else:
                await self._end()

    async def run(self) -> None:
        """Drain the queue into the transport until the connection ends (one task for its whole life)."""
        self._running = True
        self._writer = asyncio.current_task()
        try:
            while True:
                if not self._frames and not self.life.ended:
                    self._frames = None  # see __init__
                    self._wakeup = asyncio.get_running_loop().create_future()
                    try:
                        await self._wakeup
                    finally:
                        self._wakeup = None
                await self._write_queued()
                if self.life.ended:
                    break
        finally:
            await self._end()

    async def _write_queued(self) -> None:
        while self._frames and not self.life.ended:
            frame = self._frames.popleft()
            self._bytes -= len(frame)
            self._writing = True
            if isinstance(frame, str):
                await self.transport.send_text(frame)
            else:
                await self.transport.send_bytes(frame)
            self._writing = False

    async def _end(self) -> None:
        self._frames = None
        self._bytes = 0
        if self.life.code is not None:
            # bounded (a timeout, not wait_for: no task to start for each of a crowd's connections closing)
            with contextlib.suppress(Exception):
                async with asyncio.timeout(CLOSE_TIMEOUT):
                    await self.transport.close(self.life.code, self.life.reason)
