"""Unsubscribes asked at the same moment, sent as one command: a crowd's departure costs a few.

Every client that leaves unsubscribes its own channel. One ``UNSUBSCRIBE`` per
client was a fifth of a replica's CPU while 10,000 clients left at once (each
command packed, written and drained on its own). The bus queues the channels
here instead; what one turn of the event loop queued goes out as one write,
``UNSUBSCRIBE`` naming them all (in the groups the dialect allows: an
``SUNSUBSCRIBE``'s channels share a slot). Redis still confirms each channel
on its own, and each caller still waits for its own confirmation.

The order Redis sees stays the order asked: whatever sends a ``SUBSCRIBE``
flushes this first, so that an unsubscribe never overtakes a later subscribe
of the same channel (which would leave a desired channel unwired until the
reconciler's next pass).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from switchboard.tasks import cancel_and_wait

logger = logging.getLogger(__name__)


class Outbox:
    """Channels waiting to be unsubscribed; ``send(channels)`` writes them (one write, however many)."""

    def __init__(self, send: Callable[[list[str]], Awaitable[None]]) -> None:
        self._send = send
        self._channels: list[str] = []
        self._task: asyncio.Task[None] | None = None
        self.writes = 0  # how many writes carried the unsubscribes so far (tests, benches)

    def __len__(self) -> int:
        return len(self._channels)

    def add(self, channel: str) -> None:
        """Queue ``channel``; it goes out on the loop's next turn, with whatever joins it meanwhile."""
        self._channels.append(channel)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._next_turn(), name="switchboard-bus-unsubscribe")

    async def flush(self) -> None:
        """Write what is queued now (before a ``SUBSCRIBE``: Redis sees the order it was asked in)."""
        channels, self._channels = self._channels, []
        if channels:
            self.writes += 1
            await self._send(channels)

    async def _next_turn(self) -> None:
        try:
            while self._channels:  # those queued while a write was on its way go in the next
                await self.flush()
        except Exception:  # a bug: logged, and the next channel queued starts a new turn
            logger.exception("unsubscribing failed")
        finally:
            self._task = None

    async def close(self) -> None:
        """Stop: what is still queued is not sent (the bus's connection goes anyway)."""
        self._channels = []
        if self._task is not None:
            await cancel_and_wait([self._task])
