"""A last resort for a stop that does not end: the process exits anyway, saying what hung.

Every phase of a stop is bounded (the drain, the clients' leave, the
WebSockets left, the hub's own tasks, :mod:`switchboard.tasks`), yet a bug in
one (an await nobody completes, a loop that swallowed its cancel) would keep a
SIGTERMed replica up until the orchestrator kills it: a rollout that waits its
whole grace period for every replica, and no word of why. This watch runs on a
thread of its own, so it fires even when the event loop is blocked; it logs
the stack of every thread and, if the loop still turns, of every task, then
exits with status 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import sys
import threading
import traceback
from collections.abc import Callable

log = logging.getLogger(__name__)

# Seconds the loop gets to report its tasks once the deadline has passed.
REPORT_WAIT = 1.0


class StopDeadline:
    """Exit with status 1 if the process still runs ``budget`` seconds after :meth:`start`.

    ``exit`` is the way out (``os._exit``: nothing else may stand in the
    way of a process that is already stuck); tests give a recorder.
    """

    def __init__(self, budget: float, *, exit: Callable[[int], object] = os._exit) -> None:
        self.budget = budget
        self._exit = exit
        self._cancelled = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start the watch (once); ``loop``, if given, is asked for its tasks' stacks when it fires."""
        if self._thread is not None:
            return
        self._loop = loop
        self._thread = threading.Thread(target=self._watch, name="switchboard stop deadline", daemon=True)
        self._thread.start()

    def cancel(self) -> None:
        """The stop ended in time: the watch ends without a word."""
        self._cancelled.set()

    def wait_ended(self, timeout: float) -> bool:
        """Wait (bounded) for the watch to end; ``True`` once it has, or if it never started."""
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def _watch(self) -> None:
        if self._cancelled.wait(self.budget):
            return
        log.error("still running %.1f s after being told to stop: exiting with status 1", self.budget)
        log.error("threads:\n%s", _thread_stacks())
        reported = threading.Event()
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # closed in between
                self._loop.call_soon_threadsafe(_log_tasks, reported)
        if not reported.wait(REPORT_WAIT):
            log.error("the event loop did not answer within %.1f s: it is blocked", REPORT_WAIT)
        if not self._cancelled.is_set():
            self._exit(1)


def _thread_stacks() -> str:
    """Every thread's stack (``sys._current_frames`` is documented, for this kind of diagnosis)."""
    buffer = io.StringIO()
    for thread_id, frame in sys._current_frames().items():
        buffer.write(f"thread {thread_id}:\n{''.join(traceback.format_stack(frame))}\n")
    return buffer.getvalue()


def _log_tasks(reported: threading.Event) -> None:
    try:
        for task in asyncio.all_tasks():
            log.error("task %s:\n%s", task.get_name(), awaiting(task.get_coro()))
    finally:
        reported.set()


def awaiting(coro: object, limit: int = 40) -> str:
    """Where a suspended coroutine waits: its frame and those of what it awaits, down to the
    innermost (``Task.print_stack`` shows only the outermost: "await app(...)" says nothing)."""
    lines: list[str] = []
    for _ in range(limit):
        frame = next((f for a in ("cr_frame", "gi_frame", "ag_frame") if (f := getattr(coro, a, None))), None)
        if frame is None:
            break
        lines.extend(traceback.format_stack(frame, limit=1))
        coro = next((c for a in ("cr_await", "gi_yieldfrom", "ag_await") if (c := getattr(coro, a, None))), None)
    return "".join(lines) or f"{coro!r}\n"
