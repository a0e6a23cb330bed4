"""A replica's liveness work (its leader lease, its presence record) on a thread of its own.

Both say "this replica is alive" to the others, on deadlines of a few seconds:
a lease not renewed in time is lost (another replica takes over the
singleton work), a presence record not rewritten in time expires (the
replica counts as gone, a sibling's reaper probes its clients). Run on the
serving event loop, they missed those deadlines whenever client work starved
it: under a 6,000-client storm the lease went 14-15 s unrenewed. So they run
on an event loop of their own, on a thread, with Redis connections of their
own (only ever used there).

They must not outlive the loop they speak for, though: a replica whose loop
is hung serves nobody. The serving loop ticks a :class:`LoopBeat`; the
liveness work renews only while that tick is at most :data:`LOOP_STALL_LIMIT`
old (:func:`loop_alive`). A process that is stopped altogether (SIGSTOP, a
frozen VM) stops this thread as well, and loses both on their TTLs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from switchboard.clock import Clock
from switchboard.tasks import cancel_and_wait

log = logging.getLogger(__name__)

T = TypeVar("T")

# Seconds the serving loop may go without turning and still count as alive: a loop starved by
# a storm (both replicas' went 14-15 s without renewing their lease under 6,000 clients) keeps
# its lease and presence; one stuck longer is hung, and lets them lapse so that a sibling
# takes over its chores and its clients' fate. Kubernetes' liveness probe (3 x 10 s by
# default) restarts such a replica soon after.
LOOP_STALL_LIMIT = 15.0
BEAT_EVERY = 0.5  # seconds between the serving loop's ticks: small against the limit


def loop_alive(now: float, loop_tick: float, stall_limit: float = LOOP_STALL_LIMIT) -> bool:
    """Whether a loop that last ticked at ``loop_tick`` still counts as turning at ``now``."""
    return now - loop_tick <= stall_limit


class LoopBeat:
    """The serving loop's heartbeat: :meth:`run` there ticks :attr:`last` (read from any thread)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.last = clock.monotonic()

    def tick(self) -> None:
        self.last = self.clock.monotonic()

    async def run(self, every: float = BEAT_EVERY) -> None:
        while True:
            self.tick()
            await self.clock.sleep(every)


class LivenessThread:
    """An event loop on a daemon thread, for the coroutines that must keep their deadlines
    whatever the serving loop does. Everything it runs uses only objects made for it."""

    def __init__(self, name: str = "switchboard liveness") -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tasks: list[asyncio.Task[Any]] = []

    def start(self) -> None:
        if self._loop is not None:
            return
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=self.name, daemon=True)
        self._thread.start()

    async def call(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run ``coro`` on the thread's loop and wait (at most ``timeout``) for its result."""
        assert self._loop is not None, "start() first"
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.wrap_future(future)
        finally:
            future.cancel()  # no-op once done; else the thread's task is cancelled too

    async def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        """Start ``coro`` as a task of the thread's loop, ended by :meth:`stop`."""

        async def create() -> None:
            self._tasks.append(asyncio.create_task(coro, name=name))

        await self.call(create(), timeout=5)

    async def cancel_tasks(self, timeout: float = 2.0) -> None:
        """Cancel what :meth:`spawn` started, until it ended or ``timeout`` passed."""
        if self._loop is not None and self._tasks:
            with contextlib.suppress(TimeoutError):
                await self.call(cancel_and_wait(self._tasks, timeout), timeout + 1)

    async def stop(self, timeout: float = 2.0) -> None:
        """End the tasks, then the loop and the thread (each bounded by ``timeout``)."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        await self.cancel_tasks(timeout)
        loop.call_soon_threadsafe(loop.stop)
        await asyncio.to_thread(thread.join, timeout)
        if thread.is_alive():
            log.error("liveness thread did not stop within %.1f s", timeout)
            return
        loop.close()
        self._loop = self._thread = None
