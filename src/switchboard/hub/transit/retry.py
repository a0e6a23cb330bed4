"""Frames that reached nobody, retried for a short window before the caller is failed.

A publish that no replica received usually means the target's replica has
not (re)wired its subscription yet: a reconnect or a reconcile is seconds
away. Dropping the frame would make the caller wait its whole call timeout;
failing at once would turn a blip into an error. So frames for such a target
wait in order, are retried on the injected clock, and only after ``window``
seconds are the callers told "not connected". A target known to be in transit
(:mod:`switchboard.hub.sessions.in_transit`) is waited for until its grace ends
(``hold_until``), and no longer once it is known gone (:meth:`RetryWindow.fail`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from switchboard.clock import Clock
from switchboard.hub.routing.actions import Fail
from switchboard.hub.routing.retry_queue import RetryQueue
from switchboard.hub.routing.undelivered import Undelivered
from switchboard.tasks import cancel_and_wait, spawn

log = logging.getLogger(__name__)


# (target, frame as it travels between replicas, a point-to-point event?) -> did anyone receive it
Publish = Callable[[str, bytes, bool], Awaitable[bool]]
GiveUp = Callable[[str, Undelivered], None]


class RetryWindow:
    """Per-target FIFO queues drained by one task each, bounded in time and size.

    What to give up, and when, is each :class:`~switchboard.hub.routing.retry_queue.RetryQueue`'s
    decision; this publishes, sleeps, and fails what they return.
    """

    def __init__(
        self,
        *,
        clock: Clock,
        window: float,
        interval: float,
        publish: Publish,
        give_up: GiveUp,
        max_frames: int = 1000,
        hold_until: Callable[[str], float | None] | None = None,
    ) -> None:
        self._clock = clock
        self._hold_until = hold_until
        self.window = window
        self._interval = interval
        self._publish = publish
        self._give_up = give_up
        self._max = max_frames
        self._queues: dict[str, RetryQueue] = {}
        self._wakers: dict[str, asyncio.Event] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.recovered = 0
        self.expired = 0

    def pending(self, target: str) -> bool:
        return target in self._queues

    def idle(self) -> bool:
        """Nothing waits for any target."""
        return not self._queues

    def wake(self, target: str) -> None:
        """``target`` is reachable again (it came back from transit): try at once, not at the next interval."""
        waker = self._wakers.get(target)
        if waker is not None:
            waker.set()

    def fail(self, target: str) -> None:
        """``target`` is known to be gone: its callers are told now, not at the window's end."""
        queue = self._queues.get(target)
        if queue is not None:
            self._fail(queue.gone())

    def add(self, target: str, item: Undelivered) -> None:
        queue = self._queues.get(target)
        if queue is None:
            queue = self._queues[target] = RetryQueue(target, window=self.window, max_frames=self._max)
            spawn(self._tasks, self._drain(queue), f"retry {target}")
        overflow = queue.add(item)
        if overflow is not None:
            self._give_up(overflow.target, overflow.item)

    def _fail(self, failed: list[Fail]) -> None:
        for fail in failed:
            self.expired += 1
            self._give_up(fail.target, fail.item)

    async def _drain(self, queue: RetryQueue) -> None:
        target = queue.target
        queue.begin(self._clock.monotonic())
        try:
            while (head := queue.head) is not None:
                if await self._publish(target, head.frame, head.event):
                    queue.reached(head, self._clock.monotonic())
                    self.recovered += 1
                    continue
                held = self._hold_until(target) if self._hold_until is not None else None
                failed = queue.unreached(self._clock.monotonic(), held)
                if failed is not None:
                    log.info("%s unreachable for %.1fs: failing %d frames", target, self.window, len(failed))
                    self._fail(failed)
                    return
                await self._pause(target)
        finally:
            self._queues.pop(target, None)
            self._wakers.pop(target, None)

    async def _pause(self, target: str) -> None:
        """The retry interval, cut short by :meth:`wake`."""
        waker = self._wakers.setdefault(target, asyncio.Event())
        if waker.is_set():
            waker.clear()
            return
        sleeper = asyncio.ensure_future(self._clock.sleep(self._interval))
        woken = asyncio.ensure_future(waker.wait())
        try:
            await asyncio.wait({sleeper, woken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            woken.cancel()
            waker.clear()

    async def close(self) -> None:
        await cancel_and_wait(list(self._tasks))
