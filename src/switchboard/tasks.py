"""Background tasks: kept while they run, and stopped for sure, even ones that swallow a cancellation.

redis-py's asyncio client can swallow a ``CancelledError`` that arrives in
the middle of a command (seen with redis 8.1: about two cancels in three
landing during ``PUBLISH`` were lost, and the task carried on). A loop that
runs Redis commands can therefore survive one ``cancel()``, and a shutdown
that gathers it would wait forever: a replica that burns its whole grace
period on SIGTERM. So: cancel, wait briefly, cancel again whatever still
runs, for a bounded time; report what would not stop instead of hanging.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterable
from typing import Any

log = logging.getLogger(__name__)

RECANCEL_EVERY = 0.05


def spawn(into: set[asyncio.Task[Any]], coro: Coroutine[Any, Any, Any], name: str | None = None) -> asyncio.Task[Any]:
    """Start ``coro`` as a task kept in ``into`` while it runs (the loop holds tasks only weakly),
    so that whoever owns ``into`` can stop them all with :func:`cancel_and_wait`."""
    task = asyncio.create_task(coro, name=name)
    into.add(task)
    task.add_done_callback(into.discard)
    return task


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any]], timeout: float = 2.0) -> set[asyncio.Task[Any]]:
    """Cancel ``tasks`` until they end or ``timeout`` passes; return those still running."""
    pending = {t for t in tasks if not t.done()}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while pending:
        for task in pending:
            task.cancel()
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=min(RECANCEL_EVERY, remaining))
    for task in pending:
        log.error("task %s did not stop within %.1f s of being cancelled", task.get_name(), timeout)
    return pending
