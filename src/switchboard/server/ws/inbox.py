"""A client's messages, handled the moment they arrive, in order.

Most frames are routed without waiting for anything (to a client here, or over
a direct link to another replica): those are handled inside the callback that
parsed them, with no task switch. A frame whose routing must wait (through
Redis, to the manager) leaves an awaitable: from then on the messages behind
it queue up, a task works through them in order, and reading from the client
pauses until the queue is empty, so that a client cannot pile up more than
one read's worth of messages here. What a client sent before it left is still
routed, within a grace period.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from switchboard.tasks import cancel_and_wait

log = logging.getLogger(__name__)

Handle = Callable[[bytes | str], Awaitable[None] | None]

# Seconds the frames a client sent before it left have to be routed (a publish
# through Redis takes milliseconds; one stuck on an outage is abandoned, as
# the frames of any lost connection are).
FINISH_GRACE = 2.0


class Inbox:
    """Messages of one client: handled now while nothing waits, else queued behind what does."""

    def __init__(
        self,
        handle: Handle,
        *,
        pause: Callable[[], None],
        resume: Callable[[], None],
        on_error: Callable[[BaseException], None],
    ) -> None:
        self._handle = handle
        self._pause = pause
        self._resume = resume
        self._on_error = on_error
        # messages, and the awaitable at the head; made when a message has to wait, and dropped
        # once worked through (an empty deque is 760 bytes, for each of thousands of idle clients)
        self._backlog: deque[Any] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._closed = False
        self._abandoned = False  # closed, and the worker outlived its cancellation: it stops itself

    def __call__(self, message: bytes | str) -> None:
        if self._closed:
            return  # the client is being detached: what it sends now is not routed
        if self._backlog:
            self._backlog.append(message)
            return
        try:
            rest = self._handle(message)
        except Exception as exc:  # a bug, not a bad frame (those are answered by the hub)
            self._on_error(exc)
            return
        if rest is not None:
            self._backlog = deque((rest,))
            self._pause()
            self._worker = asyncio.get_running_loop().create_task(self._work(), name="inbox")

    @property
    def waiting(self) -> int:
        """Messages (and the awaitable at the head) not yet handled."""
        return len(self._backlog or ())

    async def _work(self) -> None:
        """The backlog's only owner while it runs: nobody else drops it under its feet."""
        backlog = self._backlog
        try:
            while backlog and not self._abandoned:
                item = backlog[0]  # stays at the head while awaited: later arrivals queue behind it
                if isinstance(item, (bytes, str)):
                    item = self._handle(item)
                if item is not None:
                    await item
                backlog.popleft()
        except Exception as exc:
            self._drop()
            self._on_error(exc)
        finally:
            if backlog:
                self._drop()  # cancelled, or given up on: the client is gone
            else:
                self._backlog = self._worker = None  # worked through: neither is kept while idle
                self._resume()

    def _drop(self) -> None:
        backlog, self._backlog = self._backlog, None
        if backlog is not None:
            for item in backlog:
                if asyncio.iscoroutine(item):
                    item.close()  # never to be awaited: no "never awaited" warning either
            backlog.clear()

    async def settle(self) -> None:
        """The client is gone: :meth:`close` within :data:`FINISH_GRACE` (its session awaits this
        before it detaches the client)."""
        await self.close(FINISH_GRACE)

    async def close(self, grace: float) -> None:
        """The client is gone: finish routing what it sent before it left, for up to ``grace``
        seconds (a publish stuck on an unreachable Redis gets no longer), then drop the rest.

        A worker can outlive its cancellation (redis-py swallows a cancel that lands inside a
        command, and a starved loop leaves no time to cancel again): the backlog is then left
        to it, to drop itself as soon as what it awaits returns, never cleared under its feet.
        """
        self._closed = True
        worker = self._worker
        if worker is not None:
            await asyncio.wait({worker}, timeout=grace)
            if await cancel_and_wait([worker]):
                self._abandoned = True
                return
        self._drop()
